"""Tune a whole network on a device: PyTorch -> Relax -> tuning tasks -> tuned, compiled network.

The network's tasks are tuned twice under one trial budget and TVM's gradient task scheduler:
with the device's registered model (UEC-UCB with online updates) and with TVM's XGBoost. The
network is then compiled three times (default schedules, CALO's database, XGBoost's), each
library's outputs checked against PyTorch's and its end-to-end latency measured. Outputs under
data/networks/<device>/<network>/: per model the tuning database (a TVM JSON database) and the
compiled libraries; metrics/tune-network/<device>.json; a calo-tune-network MLflow run.

While tuning, the tuned tasks' latency (the sum over tasks of weight x best latency so far, what
the task scheduler minimizes) is followed against tuning time, once every tuned task has a
measurement: "time to XGBoost's final latency" compares it, and the best-so-far plot shows the
end-to-end latency it implies (the measured final network minus its tuned tasks, plus them).
A schedule both runs measured counts in both at the mean of all its measurements: one
schedule's latency can differ by a third between two measurement sessions, and a task with a
single schedule (nothing for a model to choose) would otherwise decide the comparison.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import mlflow
from tvm.s_tir import meta_schedule as ms

from calo import config as cfg
from calo import paths, plots, registry
from calo.costmodel import CaloCostModel
from calo.devices import make_target, preload_tensor_intrinsics
from calo.errors import CaloError
from calo.log import get_logger
from calo.measure import close_builder, make_builder, make_runner
from calo.networks import load_network
from calo.relax_build import (
    Task,
    compile_network,
    extract_tasks,
    import_network,
    run_networks,
    with_search,
)
from calo.tasks.tune import Timeline, evolutionary_search, quiet_tvm_logging

MODELS = ("calo", "xgb")
VARIANTS = ("untuned", *MODELS)


def pooled_latencies(runs: dict[str, dict]) -> dict[tuple[int, str], float]:
    """Each (task, schedule)'s mean latency over every successful measurement of it, by any
    of the runs."""
    measured: dict[tuple[int, str], list[float]] = {}
    for run in runs.values():
        for (_, task_id, secs), ids in zip(run["events"], run["schedules"]):
            for s, sid in zip(secs, ids):
                if s is not None:
                    measured.setdefault((task_id, sid), []).append(s)
    return {key: sum(v) / len(v) for key, v in measured.items()}


def pooled_events(run: dict, pooled: dict[tuple[int, str], float]) -> list:
    """The run's events with each successful measurement replaced by its schedule's pooled
    latency."""
    return [(t, task_id, [None if s is None else pooled[task_id, sid]
                          for s, sid in zip(secs, ids)])
            for (t, task_id, secs), ids in zip(run["events"], run["schedules"])]


def weighted_curve(events: list, weights: list[float]) -> list[tuple[float, float]]:
    """(seconds, sum of weight x best latency) after each measured batch, from the first
    moment every task has a successful measurement."""
    best = [math.inf] * len(weights)
    curve = []
    for seconds, task_id, secs in events:
        found = [s for s in secs if s is not None]
        if found:
            best[task_id] = min(best[task_id], min(found))
        if all(math.isfinite(b) for b in best):
            curve.append((seconds, sum(w * b for w, b in zip(weights, best))))
    return curve


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, value in curve if value <= target * (1 + 1e-9)), None)


def _tune(settings: cfg.Settings, device: str, tuned: list[Task], cost_model, work_dir: Path,
          trials: int) -> dict:
    """One tune_tasks run of the tuned tasks into a fresh database."""
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    quiet_tvm_logging()
    contexts = with_search(tuned, evolutionary_search(settings.tune, cost_model), work_dir)
    timeline = Timeline(schedules=True)  # pooling needs each trial's schedule
    builder = make_builder(settings.harvest)
    start = time.monotonic()
    try:
        database = ms.tune.tune_tasks(
            tasks=contexts, task_weights=[t.weight for t in tuned], work_dir=str(work_dir),
            max_trials_global=trials, num_trials_per_iter=settings.networks.trials_per_iter,
            builder=builder, runner=make_runner(settings.device(device), settings.harvest),
            cost_model=cost_model,
            measure_callbacks=[*ms.MeasureCallback.create("default"), timeline])
    finally:
        close_builder(builder)
    wall = time.monotonic() - start
    return {"database": database, "wall_s": wall, "events": timeline.events,
            "schedules": timeline.schedules,
            "trials": sum(len(secs) for _, _, secs in timeline.events)}


def scored(runs: dict[str, dict], weights: list[float], pool: bool = True) -> dict[str, dict]:
    """Per run, on pooled latencies (pool=False: each run's own measurements): the tuned
    tasks' latency against time, and per task its trials and best latency."""
    pooled = pooled_latencies(runs) if pool else None
    out = {}
    for model, run in runs.items():
        events = pooled_events(run, pooled) if pooled is not None else run["events"]
        per_task = [[s for _, i, secs in events if i == k for s in secs]
                    for k in range(len(weights))]
        out[model] = {"curve": weighted_curve(events, weights),
                      "task_trials": [len(m) for m in per_task],
                      "best_s": [min((s for s in m if s is not None), default=None)
                                 for m in per_task]}
    return out


def tune_network(settings: cfg.Settings, device: str, network: str, trials: int | None = None,
                 batch: int | None = None) -> dict:
    """The stage for one network; returns its report."""
    log = get_logger()
    net_settings = settings.networks
    trials = trials or net_settings.trials
    batch = batch or net_settings.batch
    if trials < 1:
        raise CaloError(f"--trials must be >= 1, got {trials}")
    dev = settings.device(device)
    if dev.runner.get("kind", "local") != "local":
        raise CaloError(f"device '{device}': tune-network measures the compiled network on "
                        "this machine, so it needs a local runner")
    trained, version = registry.load_registered(settings, device)
    preload_tensor_intrinsics()
    target = make_target(dev)
    out = paths.network_dir(device, network)
    start = time.monotonic()
    quiet_tvm_logging()
    program = import_network(load_network(network, batch, settings.tune.seed))
    tasks = extract_tasks(program, target, out / "extract", settings.tune.seed,
                          settings.harvest.build_workers)
    tuned = [t for t in tasks if t.context is not None]
    log.info(f"tune-network {device}/{network}: {len(tasks)} tasks, {len(tuned)} tuned "
             f"({time.monotonic() - start:.1f} s to import and extract)")
    for t in tasks:
        if t.context is None and t.why_skipped != "no arithmetic":
            log.warning(f"tune-network {network}: task {t.name} skipped: {t.why_skipped}")
    if not tuned:
        raise CaloError(f"network '{network}' has no task to tune")

    runs = {}
    # Whichever model tunes first meets a colder machine (caches, page cache, a fresh builder
    # pool): the order alternates with the seed so that repeated runs cancel it out.
    for model in MODELS if settings.tune.seed % 2 == 0 else MODELS[::-1]:
        cost_model = (CaloCostModel.from_settings(trained, settings) if model == "calo"
                      else "xgb")
        runs[model] = _tune(settings, device, tuned, cost_model, out / model, trials)
        log.info(f"tune-network {device}/{network}: {model}, {runs[model]['trials']} trials in "
                 f"{runs[model]['wall_s']:.0f} s")

    databases = {model: run["database"] for model, run in runs.items()}  # untuned: none
    libraries = {variant: compile_network(program, target, databases.get(variant),
                                          out / variant / "network.so")
                 for variant in VARIANTS}
    latency = run_networks(libraries, program, out, threads=dev.runner.get("num_threads"),
                           rtol=net_settings.rtol, atol=net_settings.atol,
                           repeat=net_settings.repeat, min_repeat_ms=net_settings.min_repeat_ms)
    log.info(f"tune-network {device}/{network}: end to end " + ", ".join(
        f"{v} {latency[v]['median_s'] * 1e6:.1f} us" for v in VARIANTS)
        + " (outputs match PyTorch's; timings interleaved)")
    return _report(network, batch, trials, tasks, tuned, runs, latency, version)


def _report(network: str, batch: int, trials: int, tasks: list[Task], tuned: list[Task],
            measured: dict, latency: dict, version: str) -> dict:
    untuned = latency["untuned"]["median_s"]
    weights = [t.weight for t in tuned]
    runs = scored(measured, weights)
    reach, unpooled = (calo_time_to_xgb_final(r)
                       for r in (runs, scored(measured, weights, pool=False)))
    return {
        "network": network, "batch": batch, "trials_budget": trials, "model_version": version,
        "tasks": [_task_row(t, tuned, runs) for t in tasks],
        "end_to_end_us": {v: latency[v]["median_s"] * 1e6 for v in VARIANTS},
        "speedup_vs_untuned": {m: untuned / latency[m]["median_s"] for m in MODELS},
        "tuning_wall_s": {m: measured[m]["wall_s"] for m in MODELS},
        "trials": {m: measured[m]["trials"] for m in MODELS},
        "max_abs_diff": {v: latency[v]["max_abs_diff"] for v in VARIANTS},
        "calo_time_to_xgb_final_s": reach,
        "calo_time_ratio_vs_xgb": (reach / measured["xgb"]["wall_s"] if reach is not None
                                   else None),
        # the same on each run's own measurements, as reported before pooling
        "calo_time_ratio_vs_xgb_unpooled": (unpooled / measured["xgb"]["wall_s"]
                                            if unpooled is not None else None),
        "curves": {m: _curve_rows(runs[m]["curve"], latency[m]["median_s"]) for m in MODELS},
    }


def calo_time_to_xgb_final(runs: dict[str, dict]) -> float | None:
    xgb = runs["xgb"]["curve"]
    return time_to_reach(runs["calo"]["curve"], xgb[-1][1]) if xgb else None


def _curve_rows(curve: list[tuple[float, float]], end_to_end: float) -> list[dict]:
    """The tuned tasks' latency against time, and the network's end-to-end latency estimated
    from it: the measured final network minus its tuned tasks, plus the tasks at each point."""
    rest = end_to_end - curve[-1][1] if curve else 0.0
    return [{"seconds": t, "tasks_latency_us": v * 1e6, "end_to_end_us": (v + rest) * 1e6}
            for t, v in curve]


def _task_row(task: Task, tuned: list[Task], runs: dict) -> dict:
    row = {"name": task.name, "weight": task.weight, "flops": task.flops,
           "tuned": task.context is not None, "why_not_tuned": task.why_skipped}
    if task in tuned:
        k = tuned.index(task)
        for m in MODELS:
            best = runs[m]["best_s"][k]
            row[f"{m}_trials"] = runs[m]["task_trials"][k]
            row[f"{m}_best_us"] = best * 1e6 if best is not None else None
    return row


def write_report(settings: cfg.Settings, device: str, reports: dict[str, dict]) -> dict:
    """metrics/tune-network/<device>.json (headline), the full report, a PNG of the tuned
    tasks' latency against tuning time, and an MLflow run with all three."""
    path = paths.report_path("tune-network", device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reports, indent=1))
    headline = {name: {"untuned_us": r["end_to_end_us"]["untuned"],
                       "calo_us": r["end_to_end_us"]["calo"],
                       "xgb_us": r["end_to_end_us"]["xgb"],
                       "calo_time_ratio_vs_xgb": r["calo_time_ratio_vs_xgb"]}
                for name, r in reports.items()}
    metrics = paths.metrics_path("tune-network", device)
    metrics.write_text(json.dumps(headline, indent=1))
    curves = {f"{name} {m}": [(p["seconds"], p["end_to_end_us"]) for p in r["curves"][m]]
              for name, r in reports.items() for m in MODELS}
    png = plots.latency_over_time(path.with_name(f"{device}-curves.png"), curves,
                                  f"network tuning on {device}: CALO-GNN vs XGBoost",
                                  "end-to-end latency, best so far (us, estimated)")
    with registry.start_run(settings, "tune-network", f"tune-network-{device}"):
        mlflow.log_params({"device": device, "networks": ",".join(sorted(reports))})
        for name, r in reports.items():
            mlflow.log_metrics({f"{name}.{k}_us": v for k, v in r["end_to_end_us"].items()})
            mlflow.log_metrics({f"{name}.{m}_tuning_s": v for m, v in r["tuning_wall_s"].items()})
        for artifact in (path, metrics, png):
            mlflow.log_artifact(str(artifact))
    return headline


def tune_networks(settings: cfg.Settings, device: str, networks: list[str] | None = None,
                  trials: int | None = None, batch: int | None = None) -> dict:
    """The tune-network stage: each network of networks.tune (or those given), then the
    report. A network that fails is reported and the others still tuned."""
    log = get_logger()
    reports, failed = {}, {}
    for name in networks or settings.networks.tune:
        try:
            reports[name] = tune_network(settings, device, name, trials, batch)
        except CaloError as err:
            if networks and len(networks) == 1:
                raise
            failed[name] = str(err)
            log.error(f"tune-network {device}/{name}: {err}")
    if not reports:
        raise CaloError(f"no network tuned on {device}: " + "; ".join(
            f"{n}: {why}" for n, why in failed.items()))
    return {"networks": write_report(settings, device, reports), "failed": failed}
