"""Stage 6: tune workloads with CALO-GNN and with TVM's XGBoost model on the same budget and seed.

Each run is a real `tune_tir` whose JSON database (and TVM's logs) are kept under
data/tune/<device>/<workload>/<model>/. The report gives, per model, the best latency found and
the trials needed to come within quality_eps of the best latency either model found.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path

import mlflow
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from calo import config as cfg
from calo import paths, plots, registry
from calo.artifact import TrainedModel
from calo.costmodel import CaloCostModel
from calo.devices import make_target, preload_tensor_intrinsics
from calo.errors import CaloError
from calo.log import get_logger
from calo.measure import close_builder, make_builder, make_runner
from calo.records import candidate_id, iter_records, latency_of
from calo.workloads import create_mod

MODELS = ("calo", "xgb")
TVM_LOGGER = "tvm.s_tir.meta_schedule"


def load_tuning_model(settings: cfg.Settings, device: str) -> CaloCostModel:
    model_dir = paths.calibrated_dir(device)
    if not model_dir.is_dir():
        raise CaloError(f"no calibrated model for '{device}': run `calo finetune` and "
                        "`calo calibrate` first")
    return CaloCostModel.from_settings(TrainedModel.load(model_dir), settings)


@derived_object
class Timeline(PyMeasureCallback):
    """Each measured batch's time since tuning started, its task, and its latencies; with
    `schedules=True` also, beside each batch, which schedules it measured (a candidate id per
    trial, in `schedules`)."""

    def __init__(self, schedules: bool = False) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.events: list[tuple[float, int, list[float | None]]] = []
        self.schedules: list[list[str]] | None = [] if schedules else None

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        secs = [latency_of(r) if r.error_msg is None else None for r in runner_results]
        self.events.append((time.monotonic() - self.start, int(task_id), secs))
        if self.schedules is not None:
            self.schedules.append([candidate_id(str(task_id), c.sch.trace)
                                   for c in measure_candidates])


def best_so_far(latencies: list[float | None]) -> list[float]:
    best, curve = math.inf, []
    for lat in latencies:
        if lat is not None:
            best = min(best, lat)
        curve.append(best)
    return curve


def trials_to_quality(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, b in enumerate(curve) if b <= target), None)


def quiet_tvm_logging() -> None:
    """Keep Meta-Schedule's log lines in its log files (work_dir/logs), off the terminal.

    tune_tir gives its console handler the level its logger has (DEBUG when unset) and re-lists
    every handler already on that logger by name. Dropping those handlers keeps lines from
    repeating once per earlier run (and an unnamed one, which Prefect can leave, from breaking
    tune_tir's logging set-up); the WARNING level keeps DEBUG and INFO lines in the files.
    """
    logger = logging.getLogger(TVM_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.WARNING)


def evolutionary_search(tune: cfg.Tune, cost_model) -> ms.search_strategy.EvolutionarySearch:
    """The search strategy of a tuning run with `cost_model`: TVM's evolutionary search at
    params.yaml's size, tune.calo_search for CALO's model and tune.search for any other."""
    search = tune.calo_search if isinstance(cost_model, CaloCostModel) else tune.search
    return ms.search_strategy.EvolutionarySearch(population_size=search.population_size,
                                                 genetic_num_iters=search.genetic_num_iters,
                                                 eps_greedy=search.eps_greedy)


def run_tuner(settings: cfg.Settings, device: str, workload: str, cost_model,
              work_dir: Path) -> dict:
    """One tune_tir run into a fresh database."""
    shutil.rmtree(work_dir, ignore_errors=True)  # a run is one fresh database, never a mix
    work_dir.mkdir(parents=True)
    quiet_tvm_logging()
    builder = make_builder(settings.harvest)
    timeline = Timeline()
    start = time.monotonic()
    try:
        ms.tune_tir(
            create_mod(settings.workload(workload)), make_target(settings.device(device)),
            str(work_dir), max_trials_global=settings.tune.max_trials,
            num_trials_per_iter=settings.tune.trials_per_iter, builder=builder,
            runner=make_runner(settings.device(device), settings.harvest),
            cost_model=cost_model, strategy=evolutionary_search(settings.tune, cost_model),
            seed=settings.tune.seed,
            num_tuning_cores=settings.harvest.build_workers,
            measure_callbacks=[*ms.MeasureCallback.create("default"), timeline],
        )
    finally:
        close_builder(builder)
    wall = time.monotonic() - start
    latencies = [r.latency for r in iter_records(work_dir)]
    # When each trial's result was in: wall-clock time to quality, measurement and search.
    seconds = [t for t, _, secs in timeline.events for _ in secs]
    if len(seconds) != len(latencies):
        raise CaloError(f"tuning {workload} timed {len(seconds)} measured trials but its "
                        f"database in {work_dir} holds {len(latencies)}")
    return {"wall_s": wall, "trials": len(latencies), "curve": best_so_far(latencies),
            "seconds": seconds}


def tune(settings: cfg.Settings, device: str, workload: str) -> dict:
    """Both models on one workload; per model: best latency, trials to quality, wall time, and
    the best-so-far curve (a list: the report keeps it out of the metrics file)."""
    settings.target_device(device)
    settings.workload(workload)
    log = get_logger()
    preload_tensor_intrinsics()  # so neither model's wall time includes the one-off import
    runs = {}
    for which in MODELS:
        cost_model = load_tuning_model(settings, device) if which == "calo" else "xgb"
        runs[which] = run_tuner(settings, device, workload, cost_model,
                                paths.tune_dir(device) / workload / which)
        log.info(f"tune {device}/{workload}: {which}, {runs[which]['trials']} trials in "
                 f"{runs[which]['wall_s']:.0f} s, best {runs[which]['curve'][-1] * 1e6:.1f} us")
    best = min(min(r["curve"], default=math.inf) for r in runs.values())
    if not math.isfinite(best):
        raise CaloError(f"tuning {workload} on {device} measured nothing successfully")
    target = best * (1 + settings.tune.quality_eps)
    report: dict = {}
    for which, run in runs.items():
        reached = trials_to_quality(run["curve"], target)
        report[which] = {
            "best_latency_us": run["curve"][-1] * 1e6,
            "trials_to_quality": reached,
            # what a user waits: measurement and search until that trial's result was in
            "seconds_to_quality": run["seconds"][reached - 1] if reached else None,
            "trials": run["trials"],
            "wall_s": run["wall_s"],
            "curve_us": [c * 1e6 if math.isfinite(c) else None for c in run["curve"]],
        }
    # A run that never came within quality_eps counts as needing one trial more than the budget:
    # a lower bound, flagged as censored, so a miss is never dropped from the comparison.
    reach = {m: report[m]["trials_to_quality"] or report[m]["trials"] + 1 for m in MODELS}
    report["trials_ratio_calo_vs_xgb"] = reach["calo"] / reach["xgb"]
    report["ratio_censored"] = any(report[m]["trials_to_quality"] is None for m in MODELS)
    return report


def write_report(settings: cfg.Settings, device: str, reports: dict[str, dict]) -> dict:
    """metrics/tune/<device>.json (the headline, for `dvc metrics show`), the full report and
    the curves beside it (for `calo summary` and `dvc plots show`), a PNG, and a calo-tune
    MLflow run."""
    path = paths.report_path("tune", device)
    rows = path.with_name(f"{device}-curves.json")
    curves = {f"{w} {m}": [c for c in r[m]["curve_us"] if c is not None]
              for w, r in reports.items() for m in MODELS}
    scalars = {w: {**{m: {k: v for k, v in r[m].items() if k != "curve_us"} for m in MODELS},
                   "trials_ratio_calo_vs_xgb": r["trials_ratio_calo_vs_xgb"],
                   "ratio_censored": r["ratio_censored"]}
               for w, r in reports.items()}
    ratios = [r["trials_ratio_calo_vs_xgb"] for r in scalars.values()]

    def reach(run: dict) -> float:
        return run["trials_to_quality"] or math.inf

    summary = {
        "workloads": len(scalars),
        "calo_reached_quality": sum(r["calo"]["trials_to_quality"] is not None
                                    for r in scalars.values()),
        "xgb_reached_quality": sum(r["xgb"]["trials_to_quality"] is not None
                                   for r in scalars.values()),
        "calo_reached_first_or_tied": sum(reach(r["calo"]) <= reach(r["xgb"])
                                          for r in scalars.values()),
        "geomean_trials_ratio_calo_vs_xgb": math.exp(sum(map(math.log, ratios)) / len(ratios)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "workloads": scalars}, indent=1))
    headline = {"workloads": summary["workloads"], "calo_reached": summary["calo_reached_quality"],
                "xgb_reached": summary["xgb_reached_quality"],
                "ratio": summary["geomean_trials_ratio_calo_vs_xgb"]}
    paths.metrics_path("tune", device).write_text(json.dumps(headline, indent=1))
    png = plots.best_so_far(path.with_name(f"{device}-curves.png"), curves,
                            f"tuning on {device}: CALO-GNN vs XGBoost")
    rows.write_text(json.dumps([{"trial": i + 1, "run": label, "best_us": c}
                                for label, curve in curves.items()
                                for i, c in enumerate(curve)], indent=0))
    with registry.start_run(settings, "tune", f"tune-{device}"):
        mlflow.log_params({"device": device, "workloads": ",".join(sorted(scalars)),
                           "max_trials": settings.tune.max_trials,
                           "trials_per_iter": settings.tune.trials_per_iter,
                           "kappa_c": settings.tune.kappa_c,
                           "kappa_offset": settings.tune.kappa_offset})
        mlflow.log_metrics({k: float(v) for k, v in summary.items()})
        for artifact in (path, paths.metrics_path("tune", device), png, rows):
            mlflow.log_artifact(str(artifact))
    return summary


def tune_device(settings: cfg.Settings, device: str,
                workloads: tuple[str, ...] | list[str] | None = None) -> dict:
    """The tune stage: every workload of tune.workloads (or those given), then the report."""
    names = list(workloads or settings.tune.workloads)
    return write_report(settings, device, {name: tune(settings, device, name) for name in names})
