import json
import math
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch
import tvm
from mlflow.tracking import MlflowClient
from tvm.s_tir import meta_schedule as ms

from calo import costmodel, native, paths
from calo.records import iter_records
from calo.tasks.tune import (
    best_so_far,
    evolutionary_search,
    load_tuning_model,
    trials_to_quality,
    write_report,
)
from calo.workloads import create_mod
from tests.conftest import TARGET


def test_tune_compares_both_models_on_the_same_budget(params, tuned):
    report = tuned["report"]
    for which in ("calo", "xgb"):
        run = report[which]
        assert run["trials"] == 8
        assert run["best_latency_us"] > 0
        store = paths.tune_dir(TARGET) / "mm-64" / which
        assert len(list(iter_records(store))) == 8
    best = min(report["calo"]["best_latency_us"], report["xgb"]["best_latency_us"])
    winner = "calo" if report["calo"]["best_latency_us"] == best else "xgb"
    assert report[winner]["trials_to_quality"] is not None
    assert 0 < report[winner]["seconds_to_quality"] <= report[winner]["wall_s"]
    loser = "xgb" if winner == "calo" else "calo"
    assert (report[loser]["seconds_to_quality"] is None) == (
        report[loser]["trials_to_quality"] is None)
    report = json.loads(paths.report_path("tune", TARGET).read_text())
    assert report["workloads"]["mm-64"]["calo"]["trials"] == 8
    assert "curve_us" not in report["workloads"]["mm-64"]["calo"]  # curves are plots, below
    # the metrics file holds a few headline scalars (`dvc metrics show` stays readable)
    metrics = json.loads(paths.metrics_path("tune", TARGET).read_text())
    assert set(metrics) == {"workloads", "calo_reached", "xgb_reached", "ratio"}
    assert metrics["ratio"] == report["summary"]["geomean_trials_ratio_calo_vs_xgb"]
    # best-so-far curves: a DVC plot, and with the report an artifact of a calo-tune run
    path = paths.metrics_path("tune", TARGET)
    rows = json.loads(path.with_name(f"{TARGET}-curves.json").read_text())
    assert {r["run"] for r in rows} == {"mm-64 calo", "mm-64 xgb"}
    assert max(r["trial"] for r in rows) == 8
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("calo-tune").experiment_id])
    logged = {a.path for a in client.list_artifacts(runs[0].info.run_id)}
    assert {f"{TARGET}.json", f"{TARGET}-report.json", f"{TARGET}-curves.png",
            f"{TARGET}-curves.json"} <= logged


def test_calo_searches_with_tune_calo_search_and_any_other_model_with_tune_search(
        params, calibrated):
    tune = params.override({"tune.calo_search.eps_greedy": 0.25}).tune
    calo = evolutionary_search(tune, load_tuning_model(params, TARGET))
    xgb = evolutionary_search(tune, "xgb")
    # conftest's sizes; the random share of each round's picks is CALO's own too
    assert (calo.population_size, calo.genetic_num_iters, calo.eps_greedy) == (64, 1, 0.25)
    assert (xgb.population_size, xgb.genetic_num_iters, xgb.eps_greedy) == (64, 2, 0.05)


def test_quality_helpers():
    curve = best_so_far([None, 5.0, 7.0, 4.0, None, 3.0])
    assert curve == [math.inf, 5.0, 5.0, 4.0, 4.0, 3.0]
    assert trials_to_quality(curve, 4.1) == 4
    assert trials_to_quality(curve, 1.0) is None


def test_report_counts_a_miss_as_budget_plus_one(params):
    def run(reach):
        return {"trials_to_quality": reach, "trials": 100, "best_latency_us": 1.0, "wall_s": 1.0,
                "curve_us": [2.0, 1.0]}

    reports = {"hit": {"calo": run(10), "xgb": run(40), "trials_ratio_calo_vs_xgb": 0.25,
                       "ratio_censored": False},
               "miss": {"calo": run(None), "xgb": run(101), "trials_ratio_calo_vs_xgb": 1.0,
                        "ratio_censored": True}}
    summary = write_report(params, "report-check", reports)
    assert summary["calo_reached_quality"] == 1 and summary["xgb_reached_quality"] == 2
    assert summary["calo_reached_first_or_tied"] == 1
    assert math.isclose(summary["geomean_trials_ratio_calo_vs_xgb"], 0.5)


def _mm64_candidates(params) -> tuple:
    mod = create_mod(params.workload("mm-64"))
    ctx = ms.TuneContext(mod=mod, target=tvm.target.Target({"kind": "llvm", "num-cores": 1}),
                         space_generator="post-order-apply", search_strategy="replay-trace",
                         rand_state=3)
    ctx.pre_tuning(max_trials=6, num_trials_per_iter=6)
    cands = ctx.generate_measure_candidates()
    results = [ms.runner.RunnerResult([1e-4 * (i + 1)], None) for i in range(len(cands))]
    return ctx, cands, results


def _weights_changed_by_update(model, ctx, cands, results) -> set[str]:
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    model.update(ctx, cands, results)
    return {k for k in before if not torch.equal(before[k], model.model.state_dict()[k])}


def test_cost_model_scores_and_decaying_kappa(params, calibrated):
    assert load_tuning_model(params, TARGET).kappa() == params.tune.kappa_c / math.sqrt(
        params.tune.kappa_offset)
    model = load_tuning_model(params.override({"tune.kappa_c": 1.5}), TARGET)
    assert math.isclose(model.kappa(), 1.5 / math.sqrt(50))
    ctx, cands, results = _mm64_candidates(params)
    scores = model.predict(ctx, cands)
    assert scores.dtype == np.float64 and scores.shape == (len(cands),)
    assert np.all(np.isfinite(scores)) and np.all(scores > 0) and scores.max() == 1.0
    # A later generation of the same round, without the best: scored on the first one's
    # scale, as TVM's search compares them in one heap.
    best = int(scores.argmax())
    rest = model.predict(ctx, cands[:best] + cands[best + 1:])
    assert rest.max() < 1.0 and np.allclose(rest, np.delete(scores, best), rtol=1e-5)
    changed = _weights_changed_by_update(model, ctx, cands, results)
    assert model.round == 1 and len(model.measured) == len(cands)
    assert model.predict(ctx, cands[1:]).max() == 1.0   # a new round: a new scale
    assert model.kappa() < 1.5 / math.sqrt(50)
    # The fine-tune rule's row for a few records: every layer adapts.
    assert any(k.startswith("head.") for k in changed)
    assert any(not k.startswith("head.") for k in changed)


_MAPPED_BYTES = """
import ctypes, sys, torch
from calo import memory
class Info(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena ordblks smblks hblks hblkhd usmblks "
                                              "fsmblks uordblks fordblks keepcost").split()]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
if sys.argv[1] == "keep":
    assert memory.keep_freed_memory()
before = mallinfo2().hblkhd
block = torch.ones(2 << 20)
print(mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_cost_model_keeps_freed_memory_for_the_next_population(params, calibrated):
    from calo import memory

    load_tuning_model(params, TARGET)
    assert memory._done
    # An 8 MiB tensor gets a fresh mapping (its pages fault in on every use) unless the
    # thresholds are raised; with them it comes from the heap.
    mapped = {how: int(subprocess.run([sys.executable, "-c", _MAPPED_BYTES, how], check=True,
                                      capture_output=True, text=True).stdout)
              for how in ("default", "keep")}
    assert mapped["default"] >= 8 << 20 and mapped["keep"] == 0


def test_cost_model_extracts_each_program_once_per_search(params, calibrated, monkeypatch):
    """With the Python walker: programs are hashed and each one's graph made once."""
    monkeypatch.setattr(native, "_walker", None)
    model = load_tuning_model(params, TARGET)
    ctx, cands, results = _mm64_candidates(params)
    first = model.predict(ctx, cands)
    extracted = []
    real = costmodel.of_candidates

    def counted(kind, mod, target, candidates):
        extracted.extend(candidates)
        return real(kind, mod, target, candidates)

    monkeypatch.setattr(costmodel, "of_candidates", counted)
    again = model.predict(ctx, cands + cands[:2])   # programs scored before, two twice
    assert extracted == []
    # The same graphs; a batch of another size may round differently in the last digits.
    assert np.allclose(again, np.concatenate([first, first[:2]]), rtol=1e-5)
    model.update(ctx, cands, results)   # what was measured was scored: nothing to extract
    assert extracted == [] and len(model.measured) == len(cands)
    fresh = real(model.trained.graph_kind, ctx.mod, ctx.target, cands)
    assert all(np.array_equal(a.x, b.x) and np.array_equal(a.edge_index, b.edge_index)
               for a, b in zip(model.featurize(ctx, cands), fresh))


def test_with_the_native_walker_scoring_walks_every_candidate_and_hashes_none(
        params, calibrated, monkeypatch):
    if native.walker() is None:
        pytest.skip("the native walker does not build here")
    model = load_tuning_model(params, TARGET)
    ctx, cands, results = _mm64_candidates(params)
    hashed = []
    real = costmodel.program_keys
    monkeypatch.setattr(costmodel, "program_keys", lambda c: hashed.extend(c) or real(c))
    first = model.predict(ctx, cands)
    assert hashed == [] and not model.graphs_of   # nothing looked up, nothing kept
    with native.off():
        python_scores = load_tuning_model(params, TARGET).predict(ctx, cands)
    assert np.array_equal(first, python_scores)
    hashed.clear()   # the Python walker's scoring hashed them
    model.update(ctx, cands, results)   # the measured candidates' graphs, kept for updates
    assert len(hashed) == len(cands) and len(model.graphs_of) == len(set(real(cands)))


def test_online_updates_take_the_finetune_rules_row_for_what_was_measured(params, calibrated):
    head_first = params.override({"finetune.rule": [
        {"up_to": 4, "layers": "head", "epochs": 1, "lr": 1.0e-3},
        {"up_to": None, "layers": "all", "epochs": 1, "lr": 1.0e-3}]})
    ctx, cands, results = _mm64_candidates(params)
    model = load_tuning_model(head_first, TARGET)
    changed = _weights_changed_by_update(model, ctx, cands[:4], results[:4])
    assert changed and all(k.startswith("head.") for k in changed)   # 4 measured: head only
    changed = _weights_changed_by_update(model, ctx, cands[4:], results[4:])
    assert model.step.layers == "all" and any(not k.startswith("head.") for k in changed)


def test_a_networks_online_update_counts_records_per_task(params, calibrated):
    """Four records of each of two tasks are four per task: the rule's head-only row, as the
    fine-tune would take it for that warm-up, not the row for eight."""
    head_first = params.override({"finetune.rule": [
        {"up_to": 4, "layers": "head", "epochs": 1, "lr": 1.0e-3},
        {"up_to": None, "layers": "all", "epochs": 1, "lr": 1.0e-3}]})
    ctx, cands, results = _mm64_candidates(params)
    other = ms.TuneContext(mod=ctx.mod, target=ctx.target, task_name="other")
    model = load_tuning_model(head_first, TARGET)
    model.update(ctx, cands[:4], results[:4])
    changed = _weights_changed_by_update(model, other, cands[:4], results[:4])
    assert model.tasks == [str(ctx.task_name)] * 4 + ["other"] * 4
    assert changed and model.step.layers == "head"
    assert all(k.startswith("head.") for k in changed)


def test_online_updates_pull_toward_the_donor_as_the_rules_row_says(params, calibrated):
    """At lr * anchor = 1 each step's pull lands back on the weights tuning started from."""
    ctx, cands, results = _mm64_candidates(params)
    moved = {}
    for anchor in (0.0, 1.0e3):
        pulled = params.override({"finetune.rule": [
            {"up_to": None, "layers": "all", "epochs": 1, "lr": 1.0e-3, "anchor": anchor}]})
        model = load_tuning_model(pulled, TARGET)
        start = {k: v.clone() for k, v in model.model.state_dict().items()}
        model.update(ctx, cands, results)
        moved[anchor] = max(float((model.model.state_dict()[k] - v).abs().max())
                            for k, v in start.items() if v.is_floating_point())
    assert moved[0.0] > 1.0e-4 and moved[1.0e3] < 1.0e-6, moved


def test_cost_model_save_load_keeps_its_whole_state(params, calibrated, tmp_path):
    """As TVM's XGBModel does: a loaded model scores exactly as the saved one would."""
    ctx, cands, results = _mm64_candidates(params)
    model = load_tuning_model(params, TARGET)
    model.update(ctx, cands[:3], results[:3])
    model.save(str(tmp_path / "saved"))
    fresh = load_tuning_model(params, TARGET)
    fresh.load(str(tmp_path / "saved"))
    assert fresh.round == model.round == 1 and len(fresh.measured) == len(model.measured)
    assert fresh.tasks == model.tasks
    assert fresh.trained.temperature == model.trained.temperature
    assert np.array_equal(fresh.predict(ctx, cands), model.predict(ctx, cands))


def test_the_summary_fits_a_screen_and_names_the_runs_figures(params, tuned, promoted):
    from calo.summary import format_summary

    text = format_summary(params, [TARGET])
    assert max(map(len, text.splitlines())) <= 120 and len(text.splitlines()) < 40
    report = json.loads(paths.report_path("tune", TARGET).read_text())
    calo = report["workloads"]["mm-64"]["calo"]
    assert f"{calo['best_latency_us']:.1f}" in text
    assert f"version {promoted['version']}" in text and "ECE before" in text
    # one search's ratio is not the model's speed-up, and the summary says so
    assert "each row is one search, one draw" in text
