"""Stage 6: tune workloads with CALO-GNN and with TVM's XGBoost model on the same budget and seed.

Each run is a real `tune_tir` whose JSON database is kept under data/tune/<device>/<workload>/.
The report gives, per model, the best latency found and the trials needed to come within
quality_eps of the best latency either model found.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path

import mlflow
from prefect import task
from prefect.cache_policies import NONE
from tvm.s_tir import meta_schedule as ms

from calo import plots, registry
from calo.config import CaloError, Params
from calo.costmodel import CaloCostModel
from calo.devices import make_target, preload_tensor_intrinsics
from calo.log import get_logger
from calo.measure import close_builder, make_builder, make_runner
from calo.records import iter_records
from calo.workloads import create_mod

MODELS = ("calo", "xgb")


def load_tuning_model(params: Params, device_name: str) -> CaloCostModel:
    model_dir, calib = params.model_dir(device_name), params.calibration_path(device_name)
    if not (model_dir / registry.WEIGHTS).is_file() or not calib.is_file():
        raise CaloError(f"no calibrated model for '{device_name}': run `calo finetune` and "
                        "`calo calibrate` first")
    model, config = registry.load_model(model_dir)
    tau = json.loads(calib.read_text())["temperature"]
    cfg = params["tune"]
    return CaloCostModel(model, tau, graph_kind=registry.graph_kind(config),
                         kappa_c=cfg["kappa_c"], kappa_offset=cfg["kappa_offset"],
                         update_steps=cfg["update_steps"], update_lr=cfg["update_lr"],
                         lam=params["train"]["lam"], rank_weight=cfg["update_rank_weight"],
                         head_only=cfg["update_layers"] == "head", seed=cfg["seed"])


def best_so_far(latencies: list[float | None]) -> list[float]:
    best, curve = math.inf, []
    for lat in latencies:
        if lat is not None:
            best = min(best, lat)
        curve.append(best)
    return curve


def trials_to_quality(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, b in enumerate(curve) if b <= target), None)


def _reset_tvm_logging() -> None:
    """Drop handlers left on Meta-Schedule's logger by earlier tuning runs in this process.

    tune_tir re-lists every handler already on that logger by name: without this, log lines
    repeat once per earlier run, and an unnamed handler (after another library reconfigures
    logging, as Prefect does) makes tune_tir fail while configuring its loggers.
    """
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def run_tuner(params: Params, device_name: str, workload_name: str, which: str,
              cost_model, work_dir: Path | None = None) -> dict:
    """One tune_tir run into a fresh database (default: the tune stage's directory)."""
    device, cfg = params.device(device_name), params["tune"]
    work_dir = work_dir or params.tune_dir(device_name) / workload_name / which
    shutil.rmtree(work_dir, ignore_errors=True)  # a run is one fresh database, never a mix
    work_dir.mkdir(parents=True)
    _reset_tvm_logging()
    builder = make_builder(params["harvest"])
    start = time.monotonic()
    ms.tune_tir(
        create_mod(params.workload(workload_name)), make_target(device), str(work_dir),
        max_trials_global=int(cfg["max_trials"]), num_trials_per_iter=int(cfg["trials_per_iter"]),
        builder=builder, runner=make_runner(device, params["harvest"]),
        cost_model=cost_model, seed=int(cfg["seed"]),
        num_tuning_cores=int(params["harvest"]["build_workers"]),
    )
    wall = time.monotonic() - start
    close_builder(builder)
    latencies = [r.latency for r in iter_records(work_dir)]
    return {"wall_s": wall, "trials": len(latencies), "curve": best_so_far(latencies)}


@task(name="tune", cache_policy=NONE)
def tune(params: Params, device_name: str, workload_name: str) -> dict:
    params.target_device(device_name)
    params.workload(workload_name)
    log = get_logger()
    preload_tensor_intrinsics()  # so neither model's wall time includes the one-off import
    runs = {}
    for which in MODELS:
        cost_model = load_tuning_model(params, device_name) if which == "calo" else "xgb"
        log.info(f"tune {device_name}/{workload_name}: {which} model, "
                 f"{params['tune']['max_trials']} trials")
        runs[which] = run_tuner(params, device_name, workload_name, which, cost_model)
    best = min(min(r["curve"], default=math.inf) for r in runs.values())
    if not math.isfinite(best):
        raise CaloError(f"tuning {workload_name} on {device_name} measured nothing successfully")
    target = best * (1 + params["tune"]["quality_eps"])
    report = {}
    for which, run in runs.items():
        report[which] = {
            "best_latency_us": run["curve"][-1] * 1e6,
            "trials_to_quality": trials_to_quality(run["curve"], target),
            "trials": run["trials"],
            "wall_s": run["wall_s"],
            "curve_us": [c * 1e6 if math.isfinite(c) else None for c in run["curve"]],
        }
    # A run that never came within quality_eps counts as needing one trial more than the budget:
    # a lower bound, flagged as censored, so a miss is never dropped from the comparison.
    reach = {m: report[m]["trials_to_quality"] or report[m]["trials"] + 1 for m in MODELS}
    report["trials_ratio_calo_vs_xgb"] = reach["calo"] / reach["xgb"]
    report["ratio_censored"] = any(report[m]["trials_to_quality"] is None for m in MODELS)
    log.info(f"tune {device_name}/{workload_name}: {json.dumps(report)}")
    return report


@task(name="tune-report", cache_policy=NONE)
def write_report(params: Params, device_name: str, reports: dict[str, dict]) -> dict:
    """Merge per-workload reports into metrics/tune/<device>.json, with a summary across them."""
    path = params.metrics_path("tune", device_name)
    merged = json.loads(path.read_text()).get("workloads", {}) if path.is_file() else {}
    merged.update(reports)
    ratios = [r["trials_ratio_calo_vs_xgb"] for r in merged.values()]

    def reach(run: dict) -> float:
        return run["trials_to_quality"] or math.inf

    summary = {
        "workloads": len(merged),
        "calo_reached_quality": sum(r["calo"]["trials_to_quality"] is not None
                                    for r in merged.values()),
        "xgb_reached_quality": sum(r["xgb"]["trials_to_quality"] is not None
                                   for r in merged.values()),
        "calo_reached_first_or_tied": sum(reach(r["calo"]) <= reach(r["xgb"])
                                          for r in merged.values()),
        "geomean_trials_ratio_calo_vs_xgb": math.exp(sum(map(math.log, ratios)) / len(ratios)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "workloads": merged}, indent=1))
    curves = {f"{w} {m}": [c for c in r[m].get("curve_us", []) if c is not None]
              for w, r in merged.items() for m in MODELS}
    png = plots.best_so_far(path.with_name(f"{device_name}-curves.png"), curves,
                            f"tuning on {device_name}: CALO-GNN vs XGBoost")
    rows = path.with_name(f"{device_name}-curves.json")
    rows.write_text(json.dumps([{"trial": i + 1, "run": label, "best_us": c}
                                for label, curve in curves.items()
                                for i, c in enumerate(curve)], indent=0))
    with registry.start_run(params, "tune", f"tune-{device_name}"):
        mlflow.log_params({"device": device_name, "workloads": ",".join(sorted(merged)),
                           **{k: params["tune"][k] for k in ("max_trials", "trials_per_iter",
                                                             "kappa_c", "kappa_offset")}})
        mlflow.log_metrics({k: float(v) for k, v in summary.items()})
        for artifact in (path, png, rows):
            mlflow.log_artifact(str(artifact))
    return summary
