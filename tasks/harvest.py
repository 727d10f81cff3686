"""Stage 1: build and measure candidates of each workload on a device, for real.

Two candidate sources: random samples of the design space (coverage of the whole space) and
candidates evolved by Meta-Schedule's evolutionary search with an XGBoost model trained on the
records so far (coverage of the fast region). Each record's source is stored with it.

Harvesting tops up: each workload gets measured until the device's store holds
`candidates_per_workload` records of it (the evolved share of them from the search), so a second
run measures nothing and an interrupted run continues where it stopped. Every result is stored
as soon as it exists, so a killed harvest loses only the candidate being measured; Ctrl-C stops
it after the batch in flight (calo.interrupt). Build errors, run errors and timeouts are stored
as failed records with their kind (never used as labels).
"""

from __future__ import annotations

from tvm.s_tir import meta_schedule as ms

from calo import config as cfg
from calo import locks, paths, records
from calo.baselines import train_on, xgb_model
from calo.config import Workload
from calo.devices import make_target, preload_tensor_intrinsics
from calo.errors import reason
from calo.interrupt import StopRequest, stop_on_interrupt
from calo.log import Progress, get_logger
from calo.measure import close_builder, make_builder, make_runner, measure, status_of
from calo.workloads import create_mod, workload_key

OVERSAMPLE = 8      # candidates a search may propose per one still needed
DRY_BATCHES = 3     # batches in a row with nothing new: the design space is exhausted


def _fresh(batch, key: str, seen: set[str]) -> list:
    fresh = []
    for cand in batch:
        cid = records.candidate_id(key, cand.sch.trace)
        if cid not in seen:
            seen.add(cid)
            fresh.append(cand)
    return fresh


def plan(count: int, evolved_fraction: float, have: int, have_evolved: int) -> dict[str, int]:
    """How many random and evolved candidates a workload still needs; random ones come first."""
    want_evolved = round(count * evolved_fraction)
    need_random = max(count - want_evolved - (have - have_evolved), 0)
    need_evolved = max(min(want_evolved - have_evolved, count - have - need_random), 0)
    return {records.RANDOM: need_random, records.EVOLVED: need_evolved}


def _search(harvest: cfg.Harvest, source: str) -> tuple[object, object]:
    """The search strategy (and, for evolution, a cost model trained on the stored records)."""
    if source == records.RANDOM:
        return "replay-trace", None
    evo = harvest.evolution
    # Evolution is guided from the first candidate on: no random warm-up predictions.
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=evo.population_size,
        init_min_unmeasured=min(evo.population_size, 50),
        genetic_num_iters=evo.genetic_num_iters)
    return strategy, xgb_model(harvest.build_workers)


def harvest(settings: cfg.Settings, device_name: str, workload_names: list[str] | None = None,
            count: int | None = None) -> dict:
    """Measure candidates on a device until each workload has `count` records; returns counts.
    Holds the device's lock throughout (calo.locks): one harvest per device at a time."""
    with locks.device_lock(device_name, "calo harvest"):
        return _harvest(settings, device_name, workload_names, count)


def _harvest(settings: cfg.Settings, device_name: str, workload_names: list[str] | None = None,
             count: int | None = None) -> dict:
    log = get_logger()
    device = settings.device(device_name)
    workloads = settings.workloads_named(workload_names or settings.harvest.workloads)
    count = count if count is not None else device.candidates_per_workload
    fraction = (device.evolved_fraction if device.evolved_fraction is not None
                else settings.harvest.evolved_fraction)
    target = make_target(device)
    store = paths.records_dir(device_name)
    records.check_target(store, target, f"harvest {device_name}")
    db = records.open_store(store)
    have = records.count_by_workload(store)
    have_evolved = records.count_by_source(store, records.EVOLVED)
    mods = {w.name: create_mod(w) for w in workloads}
    keys = {name: workload_key(mod) for name, mod in mods.items()}
    todo = {w.name: plan(count, fraction, have.get(keys[w.name], 0),
                         have_evolved.get(keys[w.name], 0)) for w in workloads}
    summary = {"device": device_name, "measured": 0, "failed": 0,
               records.RANDOM: 0, records.EVOLVED: 0,
               "existing": sum(min(have.get(k, 0), count) for k in keys.values()), "skipped": {}}
    pending = [name for name, t in todo.items() if sum(t.values())]
    if not pending:
        log.info(f"harvest {device_name}: every workload already has {count} records")
        return summary
    # Every search context needs TVM's tensor intrinsics: imported once, only when there is work.
    preload_tensor_intrinsics()
    for name in pending:
        why = design_space_error(mods[name], target, name)
        if why is not None:  # the rest of the workloads are still harvested
            log.warning(f"harvest {device_name}: {name} skipped, TVM has no design space for "
                        f"it on this target: {why}")
            summary["skipped"][name] = why
            todo[name] = dict.fromkeys(todo[name], 0)
    total = sum(sum(t.values()) for t in todo.values())
    if total == 0:
        return summary
    builder, runner = make_builder(settings.harvest), make_runner(device, settings.harvest)
    progress = Progress(f"harvest {device_name}", total, "candidates")
    with stop_on_interrupt(f"harvest {device_name}") as stop:
        try:
            for wl in workloads:
                for source, need in todo[wl.name].items():
                    if need and not stop.requested:
                        _harvest_source(settings.harvest, wl, mods[wl.name], source, need, db,
                                        store, target, builder, runner, summary, progress, stop)
        finally:
            close_builder(builder)
    if stop.requested:
        summary["interrupted"] = True
        log.warning(f"harvest {device_name}: interrupted; run it again to continue")
    log.info(f"harvest {device_name}: {summary['measured']} measured ({summary['random']} random, "
             f"{summary['evolved']} evolved), {summary['failed']} failed, "
             f"{summary['existing']} already stored")
    return summary


def design_space_error(mod, target, name: str) -> str | None:
    """Why TVM cannot generate a workload's design space on a target, or None. Its schedule
    rules fail on some operators for some targets (attention on CUDA, for one)."""
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy="replay-trace", task_name=name)
    try:
        ctx.generate_design_space()
    except Exception as err:  # TVM raises its own errors and Python's alike
        return reason(err)
    return None


def _harvest_source(harvest: cfg.Harvest, wl: Workload, mod, source: str, need: int, db, store,
                    target, builder, runner, summary: dict, progress: Progress,
                    stop: StopRequest) -> None:
    key = workload_key(mod)
    records.save_name(store, key, wl.name)
    strategy, model = _search(harvest, source)
    # The seed moves with what is already stored, so a resumed harvest draws new candidates.
    stored = records.count_by_workload(store).get(key, 0)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=strategy, task_name=wl.name,
                         rand_state=harvest.seed + stored, num_threads=harvest.build_workers)
    workload = db.commit_workload(mod)
    if model is not None:
        train_on(model, ctx, list(records.iter_records(store, key)))
    # Random sampling repeats itself on small design spaces: ask for more than needed and skip
    # what the store already holds, so no schedule is measured twice.
    ctx.pre_tuning(max_trials=need * OVERSAMPLE, num_trials_per_iter=harvest.batch_size,
                   design_spaces=ctx.generate_design_space(), database=db, cost_model=model)
    seen, done, dry = records.candidate_ids(store, key), 0, 0
    while (done < need and dry < DRY_BATCHES and not stop.requested
           and (batch := ctx.generate_measure_candidates())):
        batch = _fresh(batch, key, seen)[: need - done]
        dry = 0 if batch else dry + 1
        if not batch:
            continue

        def commit(i: int, res: ms.runner.RunnerResult, batch=batch) -> None:
            if res.error_msg is not None and stop.requested:
                return  # likely the Ctrl-C itself, which reaches the workers too
            # Stored the moment it exists: a kill loses only the measurement in flight.
            secs = res.run_secs if res.error_msg is None else [records.FAILED_SECS]
            trace = batch[i].sch.trace
            record = ms.database.TuningRecord(trace, workload, secs, target, batch[i].args_info)
            db.commit_tuning_record(record)
            records.append_meta(store, key, trace, source, status_of(res.error_msg),
                                res.error_msg, records.spread_of(record))
            summary["failed"] += res.error_msg is not None
            summary["measured"] += 1
            summary[source] += 1

        results = measure(builder, runner, target, batch, commit)
        if stop.requested:
            break
        ctx.notify_runner_results(batch, results)
        if model is not None:
            model.update(ctx, batch, results)
        done += len(batch)
        progress.advance(len(batch), note=f"{wl.name} ({source}), {summary['failed']} failed")
    if done < need and not stop.requested:
        get_logger().info(f"harvest: {wl.name} has no more distinct {source} candidates "
                          f"({done} of {need} found)")
        progress.advance(need - done, note="design space exhausted")
    ctx.post_tuning()
