import sys

import numpy as np
import pytest
from tree_weight_scan import WEIGHTS, entry_label, main, summary_rows

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
    scanned = 0.25 * mu + 0.75 * trees.log_latency(rows, workloads)
    assert np.allclose(trees.adjust(mu, rows, workloads), scanned)


def test_the_scan_needs_somewhere_to_write(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tree_weight_scan.py", "--split", "dev-shape"])
    with pytest.raises(SystemExit, match="--scan-out F is required"):
        main()


def scan_entry(held: dict[float, float], probes: dict[float, float], rule: float) -> dict:
    def cell(value: float) -> dict:
        return {"kendall_tau": value, "top1": 0.0, "top5": 0.0}

    return {"weight": rule,
            "probes": {f"shipped@{w}": cell(probes.get(w, 0.0)) for w in WEIGHTS},
            "held_out": {f"{kind}@{w}": {"all": cell(held.get(w, 0.0)),
                                         "evolved": cell(held.get(w, 0.0))}
                         for kind in ("shipped", "tvm") for w in WEIGHTS}}


def test_the_probes_keep_the_rules_weight_on_a_tie_and_move_only_for_a_better_one():
    tie = scan_entry({0.25: 1.0, 0.75: 2.0}, {0.25: 0.5, 0.75: 0.5}, rule=0.75)
    better = scan_entry({0.25: 1.0, 0.75: 2.0}, {0.25: 0.6, 0.75: 0.5}, rule=0.75)
    rows = summary_rows({"r: llvm -mcpu=znver4 -num-cores=2 mm@8": tie,
                         "r: llvm -mcpu=znver4 -num-cores=2 mm@9": better})
    assert [r["probes_choose"] for r in rows] == [0.75, 0.25]
    # Held-out sums count all and evolved candidates: 2 x tau here.
    assert rows[1]["sums"][0.25] == 2.0 and rows[1]["sums"][0.75] == 4.0


def test_entry_labels_name_report_cpu_first_workload_and_size():
    assert entry_label("unseen_shape_96: llvm -mcpu=znver4 -num-cores=2 matmul@384x192x320@79") \
        == "unseen_shape_96  znver4  matmul@384x192x320  @79"
    assert entry_label("sel: llvm -mcpu=znver4 -num-cores=2 sdp-attention @ llvm -mcpu=znver4 "
                       "-num-cores=2@25") == "sel  znver4  sdp-attention  @25"
    assert entry_label("r: gemv@medium@8") == "r  -  gemv@medium  @8"


def test_show_refuses_a_missing_scan(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["tree_weight_scan.py", "--scan-out",
                                      str(tmp_path / "none.json"), "--show"])
    with pytest.raises(SystemExit, match="no scan in"):
        main()
