import sys

import numpy as np
import pytest
from tree_weight_scan import (
    WEIGHTS,
    entry_label,
    entry_run,
    joined,
    main,
    print_summary,
    summary_rows,
    unpaired,
)

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

    return {"weight": rule, "probe_records": 10, "per_workload": {},
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


def test_two_pools_scans_join_weighted_by_the_workloads_each_scored():
    first = scan_entry({0.5: 1.0}, {0.5: 1.0}, rule=0.25)
    first["per_workload"] = {"a": {}}
    second = scan_entry({0.5: 0.4}, {0.5: 0.0}, rule=0.5)
    second["per_workload"] = {"b": {}, "c": {}}
    (name, entry), = joined({"r: llvm -mcpu=znver3 -num-cores=2 a@26": first},
                            {"r: llvm -mcpu=znver3 -num-cores=2 b@25": second}).items()
    assert entry["held_out"]["shipped@0.5"]["all"]["kendall_tau"] == pytest.approx(0.6)
    assert entry["probes"]["shipped@0.5"]["kendall_tau"] == pytest.approx(0.5)
    assert entry["weight"] == 0.5 and set(entry["per_workload"]) == {"a", "b", "c"}
    assert summary_rows({name: entry})[0]["sums"][0.5] == pytest.approx(1.2)


def test_a_join_refuses_scans_of_other_runs():
    entry = scan_entry({}, {}, rule=0.5)
    host, gen = ({"r: llvm -mcpu=znver3 -num-cores=2 a@26": entry},
                 {"r: llvm -mcpu=x86-64 -num-cores=1 b@26": entry})
    assert joined(host, gen) == {}
    assert unpaired(host, gen) == ["r on llvm -mcpu=x86-64 -num-cores=1",
                                   "r on llvm -mcpu=znver3 -num-cores=2"]
    with pytest.raises(SystemExit, match="has 1 entries in one scan and 2 in the other"):
        joined({"r: a@26": entry}, {"r: b@26": entry, "r: b@76": entry})
    assert entry_run("sel: llvm -mcpu=znver4 -num-cores=2 sdp-attention @ llvm -mcpu=znver4 "
                     "-num-cores=2@25") == ("sel", "llvm -mcpu=znver4 -num-cores=2")


def test_a_zero_shot_entry_has_no_probes_and_no_tvm_kind(capsys):
    entry = scan_entry({0.0: 1.0, 0.5: 2.0}, {}, rule=0.25)
    entry["probes"] = {}
    entry["held_out"] = {k: v for k, v in entry["held_out"].items() if k.startswith("shipped")}
    (row,) = summary_rows({"zs: llvm -mcpu=x86-64 -num-cores=1 gemv@0": entry})
    assert row["probes_choose"] is None and row["tvm"] is None
    assert row["sums"][0.5] == 4.0 and row["sums"][0.25] == 0.0
    print_summary({"zs: llvm -mcpu=x86-64 -num-cores=1 gemv@0": entry})
    assert capsys.readouterr().out.splitlines()[-1].split()[-2:] == ["-", "-"]


def test_a_join_pairs_runs_whatever_order_the_devices_were_scanned_in():
    host, gen = scan_entry({0.5: 1.0}, {}, rule=0.5), scan_entry({0.5: 0.0}, {}, rule=0.5)
    for entry in (host, gen):
        entry["per_workload"] = {"w": {}}
    first = {"r: llvm -mcpu=znver3 -num-cores=2 a@26": host,
             "r: llvm -mcpu=x86-64 -num-cores=1 a@26": gen}
    second = {"r: llvm -mcpu=x86-64 -num-cores=1 b@26": gen,
              "r: llvm -mcpu=znver3 -num-cores=2 b@26": host}
    out = joined(first, second)
    assert [e["held_out"]["shipped@0.5"]["all"]["kendall_tau"] for e in out.values()] == [1.0, 0.0]
