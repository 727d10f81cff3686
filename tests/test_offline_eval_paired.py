import shutil
import sys
import tempfile

import numpy as np
import pytest
from offline_eval import (
    across_donors,
    clear_work,
    joined,
    main,
    paired,
    with_donor_records,
)

from calo import paths
from calo.artifact import TrainedModel
from calo.correction import store_devices, store_rows
from calo.dataset import load_graphs
from tests.conftest import DONOR


def _scores(tau: float, top1: float) -> dict:
    return {"kendall_tau": tau, "top1": top1, "top5": top1}


def test_paired_compares_per_workload_with_the_best_tvm_model_on_each_metric():
    # xgb has the best mean top-1 (0.8 against mlp's 0.5), mlp the best mean tau.
    per = {"a": {"calo": _scores(0.5, 1.0), "xgb": _scores(0.1, 0.6), "mlp": _scores(0.4, 0.5)},
           "b": {"calo": _scores(0.3, 0.7), "xgb": _scores(0.2, 1.0), "mlp": _scores(0.4, 0.5)},
           "c": {"calo": _scores(0.2, 0.9), "xgb": _scores(0.0, 0.8), "mlp": _scores(0.1, 0.5)}}
    out = paired({"per_workload": per})
    top1 = out["top1"]
    assert top1["rival"] == "xgb" and top1["ahead"] == 2 and top1["workloads"] == 3
    assert top1["mean_diff"] == pytest.approx((0.4 - 0.3 + 0.1) / 3)
    diffs = [0.4, -0.3, 0.1]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    assert top1["se"] == pytest.approx(sd / 3 ** 0.5)
    assert out["kendall_tau"]["rival"] == "mlp" and out["kendall_tau"]["ahead"] == 2


def test_paired_needs_two_workloads_and_a_rival():
    assert paired({"per_workload": {"a": {"calo": _scores(0.5, 1.0)}}}) == {}
    assert paired({"per_workload": {"a": {"calo": _scores(0.5, 1.0)},
                                    "b": {"calo": _scores(0.1, 1.0)}}}) == {}


def _report(calo_top1: float, xgb_top1: float, held: int = 100, split: str = "unseen-shape"
            ) -> dict:
    table = {"calo": _scores(0.3, calo_top1), "xgb": _scores(0.2, xgb_top1),
             "mlp": _scores(0.4, 0.1)}
    cell = {"overall": table, "by_source": {"evolved": table}, "held_out_records": held}
    return {"split": split, "donor_records": 10, "settings": [],
            "splits": {"cpu-host@8": cell, "cpu-host@0": cell}}


def test_across_donors_compares_the_mean_over_donors_with_the_best_tvm_models_mean():
    # top-1: donors 0.5 and 0.7 (mean 0.6) against xgb's 0.6 and 0.7 (mean 0.65): not won by
    # the mean; the second donor alone is ahead of it. tau: mlp's 0.4 beats every donor's 0.3.
    summary = across_donors([_report(0.5, 0.6), _report(0.7, 0.7)])
    top1 = summary["cells"]["cpu-host@8"]["all"]["top1"]
    assert top1["rival"] == "xgb" and top1["rival_mean"] == pytest.approx(0.65)
    assert top1["mean"] == pytest.approx(0.6)
    assert top1["sd"] == pytest.approx(0.2 / 2 ** 0.5)
    tau = summary["cells"]["cpu-host@8"]["all"]["kendall_tau"]
    assert tau["rival"] == "mlp"
    # 2 cells x 2 parts x 3 figures; top-5 (= top-1 here) is won by neither mean nor donor 0
    assert summary["comparisons"] == 12
    assert summary["won_by_mean"] == 0 and summary["won_by_each"] == [0, 8]
    summary = across_donors([_report(0.9, 0.6), _report(0.8, 0.7)])
    assert summary["won_by_mean"] == 8 and summary["won_by_mean_after_warmup"] == 4


@pytest.mark.parametrize("other, problem", [
    (_report(0.5, 0.6, split="dev-shape"), "differ in split"),
    (_report(0.5, 0.6, held=99), "holds out different records"),
])
def test_across_donors_refuses_reports_of_different_splits(other, problem):
    with pytest.raises(SystemExit, match=problem):
        across_donors([_report(0.5, 0.6), other])


def _half(pool: str, workloads: dict[str, tuple[float, float]], evolved_top1: float) -> dict:
    """A report scoring one pool at 8 records: per workload (calo top-1, xgb top-1)."""
    per = {w: {"calo": _scores(0.3, c), "xgb": _scores(0.2, x)} for w, (c, x) in
           workloads.items()}
    mean = lambda m: {k: sum(t[m][k] for t in per.values()) / len(per)  # noqa: E731
                      for k in ("kendall_tau", "top1", "top5")}
    evolved = {"calo": _scores(0.1, evolved_top1), "xgb": _scores(0.1, 0.5)}
    cell = {"records": pool, "overall": {"calo": mean("calo"), "xgb": mean("xgb")},
            "by_source": {"evolved": evolved}, "per_workload": per}
    return {"split": "unseen-shape", "settings": [], "donor_records": 10, "device_records": False,
            "donor": {"val_nll": 1.0}, "splits": {f"{pool}@8": cell}}


def test_joined_pools_compare_over_all_their_workloads():
    # Alone, the first half loses top-1 (0.5 against 0.6); joined with the second, the mean over
    # its three workloads and the second's one is ahead (0.65 against 0.6).
    first = _half("heldout-cpu-host", {"a": (0.5, 0.6), "b": (0.5, 0.6), "c": (0.5, 0.6)}, 0.4)
    second = _half("heldout-cpu-host-second", {"d": (1.1, 0.6)}, 0.8)
    summary = joined([first, second])
    (name, cell), = summary["cells"].items()
    assert name == "heldout-cpu-host+heldout-cpu-host-second@8" and cell["workloads"] == 4
    assert cell["all"]["calo"]["top1"] == pytest.approx(0.65)
    assert cell["all"]["xgb"]["top1"] == pytest.approx(0.6)
    # evolved: each report's mean weighted by its workloads (0.4 x 3 + 0.8) / 4
    assert cell["evolved"]["calo"]["top1"] == pytest.approx(0.5)
    assert cell["paired"]["top1"]["ahead"] == 1 and cell["paired"]["top1"]["workloads"] == 4
    # won: tau, top-1 and top-5 on all; on the evolved ones level with xgb, so not won
    assert summary["comparisons"] == 6 and summary["won"] == 3


@pytest.mark.parametrize("change, problem", [
    (lambda r: r["splits"]["heldout-cpu-host-second@8"]["per_workload"].update(
        a=r["splits"]["heldout-cpu-host-second@8"]["per_workload"]["d"]), "a is held out in more"),
    (lambda r: r["donor"].update(val_nll=2.0), "not one evaluation"),
])
def test_joined_refuses_reports_that_are_not_halves_of_one_evaluation(change, problem):
    second = _half("heldout-cpu-host-second", {"d": (1.1, 0.6)}, 0.8)
    change(second)
    with pytest.raises(SystemExit, match=problem):
        joined([_half("heldout-cpu-host", {"a": (0.5, 0.6)}, 0.4), second])


@pytest.mark.parametrize("argv, problem", [
    (["--selection-pool", "p.tar.gz"], "is for a selection split"),
    (["--split", "dev-shape", "--selection-pool", "p.tar.gz"], "is for a selection split"),
    (["--split", "dev-shape", "--devices", "cpu-host", "cpu-generic-1core", "--selection-pool",
      "p.tar.gz"], "the one device it was measured on"),
    (["--split", "dev", "--devices", "cpu-generic-1core", "--selection-pool", "nowhere.tar.gz"],
     "no pool at nowhere.tar.gz"),
])
def test_a_selection_pool_is_refused_where_nothing_would_read_it(argv, problem, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr(sys, "argv", ["offline_eval.py", *argv])
    with pytest.raises(SystemExit):
        main()
    assert problem in capsys.readouterr().err


def test_a_runs_work_directory_goes_and_a_donor_trained_there_stays(tmp_path):
    work = tmp_path / "work"
    for part in ("pools/suite-cpu-host", "data/graphs", "models/donor", "models/donor-rows"):
        (work / part).mkdir(parents=True)
    (work / "mlflow.db").write_text("")
    (work / "models/donor/model.json").write_text("{}")
    clear_work(work, keep_donor=True)
    assert sorted(p.name for p in work.iterdir()) == ["models"]
    assert (work / "models/donor/model.json").is_file()
    clear_work(work, keep_donor=False)  # the donor was --donor-model's, elsewhere
    assert not work.exists()


def test_a_run_that_fails_leaves_no_work_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["offline_eval.py", "--donor-pool",
                                      str(tmp_path / "no-such-pool.tar.gz"), "--out",
                                      str(tmp_path / "report.json")])
    with pytest.raises(Exception, match="no-such-pool"):
        main()
    assert list(tmp_path.iterdir()) == []


def test_a_saved_donor_takes_the_rules_weight_for_its_own_trees(params, pretrained, tmp_path):
    saved = tmp_path / "donor"
    shutil.copytree(paths.model_dir(DONOR).resolve(), saved)
    (saved / "donor.json").write_text("{}")
    donor = TrainedModel.load(saved)
    assert donor.correction is not None and donor.donor_rows is not None
    row = {"up_to": None, "layers": "head", "epochs": 1, "lr": 1.0e-3, "correction": 30,
           "blend": donor.correction.blend, "donor_records": True}
    settings = params.override({"finetune.rule": [row]})
    assert with_donor_records(settings, saved, tmp_path / "copy", 0) == saved
    weight = 1 - donor.correction.blend / 2
    settings = params.override({"finetune.rule": [{**row, "blend": weight}]})
    copied = TrainedModel.load(with_donor_records(settings, saved, tmp_path / "copy", 0))
    assert copied.correction.blend == weight and TrainedModel.load(saved).correction.blend \
        == donor.correction.blend
    # the same trees, only weighed otherwise
    graphs = load_graphs(paths.graphs_path(DONOR), "schedule")
    rows, devices = store_rows(graphs.graphs), store_devices(graphs.graphs)
    assert np.array_equal(copied.correction.predict(rows, devices, graphs.workload),
                          donor.correction.predict(rows, devices, graphs.workload))
    assert (tmp_path / "copy" / "donor.json").read_text() == "{}"
    # trees of the donor's records weighed otherwise than the settings say are fitted again
    weighed = params.override({"finetune.rule": [row],
                               "finetune.correction.zero_shot_row_weight": "throughput"})
    refitted = TrainedModel.load(with_donor_records(weighed, saved, tmp_path / "weighed", 0))
    assert refitted.correction.row_weight == "throughput"
    assert not np.allclose(refitted.correction.predict(rows, devices, graphs.workload),
                           donor.correction.predict(rows, devices, graphs.workload))
