import sys

import numpy as np
import pytest
from tree_weight_scan import main, trees_log_latency

from calo import store_features
from calo.correction import Corrector


def test_the_scan_blends_as_the_shipped_order_does(params):
    # At the rule's weight the scan's order must be the one calo.evaluation ranks by.
    rng = np.random.default_rng(0)
    rows = [rng.random((int(rng.integers(1, 4)), store_features.NUM_FEATURES)) for _ in range(40)]
    workloads = ["a"] * 20 + ["b"] * 20
    throughput = rng.random(40) + 0.01
    trees = Corrector.fit(params.finetune.correction, 5, rows, throughput, blend=0.75,
                          best={"a": -3.0, "b": -5.0})
    mu = rng.normal(size=40)
    scanned = 0.25 * mu + 0.75 * trees_log_latency(trees, rows, workloads)
    assert np.allclose(trees.adjust(mu, rows, workloads), scanned)


def test_the_scan_needs_somewhere_to_write(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tree_weight_scan.py", "--split", "dev-shape"])
    with pytest.raises(SystemExit, match="--scan-out F is required"):
        main()
