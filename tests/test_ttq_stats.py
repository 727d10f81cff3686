import json
from pathlib import Path

import pytest
from ttq import (
    MAIN,
    live_report,
    save_runs,
    saved_runs,
    summarize,
    ttq,
    wall_ttq,
    welch_p,
)


def test_ttq_counts_trials_to_five_percent_and_censors_a_miss():
    assert ttq([3.0, 2.0, 1.04], oracle=1.0, budget=3) == 3
    assert ttq([3.0, 2.0, 1.2], oracle=1.0, budget=3) == 4


def test_welch_handles_unequal_seed_counts_and_constant_samples():
    assert 0 < welch_p([10, 12, 11], [30, 31, 29, 33, 30, 28, 32, 30, 31, 29]) < 0.01
    assert welch_p([161, 161, 161], [161] * 10) == 1.0
    assert welch_p([1, 1, 1], [63] * 10) == 0.0


def test_summary_mixes_ablations_with_fewer_seeds():
    report = summarize({"w": {"calo": [10] * 10, "xgb": [20, 22, 18, 20, 21, 19, 20, 20, 20, 20],
                              "kappa=1": [15, 16, 14]}})
    assert abs(report["geomean_ratio_vs_xgb"]["calo"] - 0.5) < 1e-9
    assert report["per_workload"]["w"]["kappa=1"]["welch_p"] < 0.05


def _run(curve, seconds, wall):
    return {"curve": curve, "seconds": seconds, "wall_s": wall, "trials": len(curve)}


def test_wall_clock_ttq_is_the_time_the_reaching_result_came_in_or_the_whole_run():
    assert wall_ttq(_run([3.0, 1.04, 1.0], [5.0, 9.0, 12.0], 15.0), oracle=1.0) == 9.0
    assert wall_ttq(_run([3.0, 2.0], [5.0, 9.0], 15.0), oracle=1.0) == 15.0  # censored
    assert wall_ttq(_run([3.0, 2.0], [5.0, 9.0], 15.0), oracle=1.0, censored_at=40.0) == 40.0
    assert wall_ttq(_run([3.0, 1.0], [5.0, 9.0], 15.0), oracle=1.0, censored_at=40.0) == 9.0


def test_a_live_report_scores_only_workloads_whose_runs_are_all_in():
    runs = {f"w {m} 0": _run([2.0, 1.0], [4.0, 8.0], 10.0) for m in MAIN}
    runs["w calo 0"] = _run([1.0, 1.0], [3.0, 6.0], 7.0)
    runs["v calo 0"] = _run([1.0], [1.0], 1.0)  # v's XGBoost runs are still to come
    report = live_report(runs, ["w", "v"], seeds=1, budget=2, device="d", model_source="m")
    assert report["workloads_done"] == ["w"] and report["workloads_pending"] == ["v"]
    assert report["ttq_trials"]["geomean_ratio_vs_xgb"] == 0.5
    assert report["ttq_seconds"]["geomean_ratio_vs_xgb"] == 3.0 / 8.0
    assert report["tuning_seconds_ratio_calo_vs_xgb"] == 0.7


def test_a_run_that_stops_sooner_without_reaching_quality_gains_nothing_by_even_censoring():
    """CALO's run ends early at a worse kernel; XGBoost's runs, longer, reach the best. Counted
    at its own length CALO looks faster; counted at the workload's longest run it does not."""
    runs = {f"w {m} 0": _run([2.0, 1.0], [4.0, 20.0], 20.0) for m in MAIN}
    runs["w calo 0"] = _run([2.0, 1.5], [3.0, 6.0], 6.0)
    report = live_report(runs, ["w"], seeds=1, budget=2, device="d", model_source="m")
    assert report["ttq_seconds"]["geomean_ratio_vs_xgb"] == 6.0 / 20.0
    assert report["ttq_seconds_even_censoring"]["geomean_ratio_vs_xgb"] == 1.0
    assert report["ttq_seconds_even_censoring"]["calo_faster_than_xgb"] == 0
    assert report["reached_quality"]["w"] == {"calo": 0, "xgb": 1, MAIN[2]: 1}


def test_saved_live_runs_resume_only_under_the_same_configuration(tmp_path):
    path = tmp_path / "runs.json"
    assert saved_runs(path, {"budget": 200}) == {}
    path.write_text(json.dumps({"config": {"budget": 200}, "runs": {"w calo 0": {}}}))
    assert saved_runs(path, {"budget": 200}) == {"w calo 0": {}}
    with pytest.raises(SystemExit, match="differs in: budget"):
        saved_runs(path, {"budget": 64})
    path.write_text(json.dumps({"w calo 0": {}}))  # the format before resuming existed
    with pytest.raises(SystemExit, match="another configuration"):
        saved_runs(path, {"budget": 200})


def test_live_runs_are_keyed_by_the_model_and_tuning_settings_but_not_the_seed():
    from argparse import Namespace

    from ttq import live_config

    from calo.config import load_settings

    settings = load_settings(Path(__file__).resolve().parents[1] / "params.yaml")
    args = Namespace(budget=200)

    def config(overrides):
        return live_config(args, settings.override(overrides), "cpu-generic-1core", "m")

    base = config({})
    assert config({"tune.seed": 3}) == base  # each run sets its own seed
    assert config({"tune.update_steps": 0}) != base  # the online update is part of the model
    assert config({"finetune.batch_size": 16}) != base
    assert config({"model.hidden": 8})["model_recipe"] != base["model_recipe"]


def test_live_runs_of_another_machine_are_refused(tmp_path, monkeypatch):
    import ttq
    import tvm

    path = tmp_path / "ttq_live_runs.json"
    here = {"machine": ttq.machine(), "budget": 200}
    save_runs(path, here, {"w calo 0": {"trials": 200}})
    assert saved_runs(path, json.loads(json.dumps(here))) == {"w calo 0": {"trials": 200}}
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "other-cpu")
    elsewhere = {"machine": ttq.machine(), "budget": 200}
    with pytest.raises(SystemExit, match="differs in: machine"):
        saved_runs(path, json.loads(json.dumps(elsewhere)))


def test_replay_runs_of_another_configuration_are_set_aside_not_refused(tmp_path, capsys):
    path = tmp_path / "ttq_replay_runs.json"
    old = {"config": {"budget": 160}, "runs": {"w calo 0": {"ttq": 3}}}
    path.write_text(json.dumps(old))
    assert saved_runs(path, {"budget": 160}, set_aside=True) == {"w calo 0": {"ttq": 3}}
    assert saved_runs(path, {"budget": 64}, set_aside=True) == {}
    assert not path.exists()  # the stage starts afresh, and the old runs are still there
    assert json.loads((tmp_path / "ttq_replay_runs.stale.json").read_text()) == old
    assert "differs in: budget" in capsys.readouterr().out


def test_a_measurement_below_the_repeat_floor_costs_the_floor_whatever_its_latency():
    from live_ranking import running_seconds

    from calo.config import load_settings

    harvest = load_settings(Path(__file__).resolve().parents[1] / "params.yaml").harvest
    floor = harvest.min_repeat_ms / 1e3
    fast, slow = floor / 100 / harvest.number, 3 * floor / harvest.number
    assert running_seconds([fast] * 3, harvest) == pytest.approx((3 * floor, 0.0))
    assert running_seconds([fast, slow], harvest) == pytest.approx((4 * floor, 2 * floor))


def test_the_kept_donors_stamp_changes_with_their_code_and_nothing_else(tmp_path, monkeypatch):
    import ttq

    for d in ttq.DONOR_CODE:
        path = tmp_path / d
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x = 1\n")
        else:
            (path / "sub").mkdir(parents=True)
            (path / "sub" / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(ttq, "ROOT", tmp_path / "benchmarks")
    before = ttq.code_hash()
    assert ttq.code_hash() == before
    (tmp_path / "models" / "sub" / "notes.txt").write_text("not code")
    assert ttq.code_hash() == before
    (tmp_path / "models" / "sub" / "m.py").write_text("x = 2\n")
    assert ttq.code_hash() != before


def test_live_selection_compares_each_variant_with_the_baseline_seed_by_seed():
    from live_selection import BUDGET, report

    def run(*curve):
        return {"curve": [c * 1e-6 for c in curve]}

    runs = {"w base 0": run(130, 120), "w base 1": run(140, 110), "w new 0": run(125, 100),
            "w new 1": run(150, 150), "w new 2": run(90, 80)}  # seed 2: no baseline to pair
    rep = report(runs, {"base": {}, "new": {"tune.kappa_c": 0}}, "base")
    rows = rep["per_workload"]["w"]["variants"]
    assert rep["per_workload"]["w"]["best_us"] == pytest.approx(80)
    assert rows["new"]["final_over_best"][0] == pytest.approx(100 / 80)
    assert rows["base"]["trials_to_quality"] == {0: BUDGET + 1, 1: BUDGET + 1}  # never within 5%
    assert rows["new"]["trials_to_quality"][2] == 2
    assert rep["versus_baseline"]["new"]["pairs"] == 2
    assert rep["versus_baseline"]["new"]["ahead"] == 1


def test_a_report_is_made_from_saved_live_runs_alone(tmp_path):
    from argparse import Namespace

    from ttq import saved_live_report

    args = Namespace(out_dir=tmp_path, workload=["w"], seeds=1, budget=None)
    with pytest.raises(SystemExit, match="no saved live runs"):
        saved_live_report(args)
    runs = {f"w {m} 0": _run([2.0, 1.0], [4.0, 8.0], 10.0) for m in MAIN}
    config = {"budget": 2, "device": "d", "model": "5 donors", "model_recipe": "gone"}
    save_runs(tmp_path / "ttq_live_runs.json", config, runs)
    report = saved_live_report(args)
    assert report["workloads_done"] == ["w"] and report["model"] == "5 donors"
    assert report["budget"] == 2 and report["ttq_trials"]["geomean_ratio_vs_xgb"] == 1.0
