"""Stage 1: sample candidates from each workload's design space, build and measure them for real.

Harvesting tops up: each workload gets measured until the device's store holds
`candidates_per_workload` records of it, so a second run measures nothing and an interrupted run
continues where it stopped. Every result is appended to the store as soon as it exists, so a
killed harvest loses only the candidate being measured. Failed builds and runs are stored as
failed records (never labels).
"""

from __future__ import annotations

from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NONE
from tvm.s_tir import meta_schedule as ms

from calo import records
from calo.config import Params
from calo.devices import device_type, make_builder, make_runner, make_target
from calo.log import Progress, get_logger
from calo.workloads import create_mod, workload_key


def _measure(builder, runner, target, dev_type: str, candidates,
             on_result: Callable[[int, ms.runner.RunnerResult], None]
             ) -> list[ms.runner.RunnerResult]:
    """Build the batch in parallel, run one at a time; on_result sees each result as it lands."""
    built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in candidates])
    results: list[ms.runner.RunnerResult | None] = [None] * len(candidates)
    inputs, slots = [], []
    for i, (cand, b) in enumerate(zip(candidates, built)):
        if b.error_msg is not None:
            results[i] = ms.runner.RunnerResult(None, f"build: {b.error_msg}")
            on_result(i, results[i])
        else:
            inputs.append(ms.runner.RunnerInput(b.artifact_path, dev_type, cand.args_info))
            slots.append(i)
    for i, future in zip(slots, runner.run(inputs) if inputs else []):
        results[i] = future.result()
        on_result(i, results[i])
    return results


@task(name="harvest", cache_policy=NONE)
def harvest(params: Params, device_name: str, workload_names: list[str] | None = None,
            count: int | None = None) -> dict:
    """Measure candidates on a device until each workload has `count` records; returns counts."""
    log = get_logger()
    device = params.device(device_name)
    cfg = params["harvest"]
    workloads = params.workloads(workload_names or cfg["workloads"])
    count = count if count is not None else device.candidates_per_workload
    target = make_target(device)
    store = params.records_dir(device_name)
    db = records.open_store(store)
    have = records.count_by_workload(store)
    mods = {w.name: create_mod(w) for w in workloads}
    todo = {w.name: max(count - have.get(workload_key(mods[w.name]), 0), 0) for w in workloads}
    total = sum(todo.values())
    summary = {"device": device_name, "measured": 0, "failed": 0,
               "existing": sum(min(have.get(workload_key(m), 0), count) for m in mods.values())}
    if total == 0:
        log.info(f"harvest {device_name}: every workload already has {count} records")
        return summary
    builder, runner = make_builder(cfg), make_runner(device, cfg)
    progress = Progress(f"harvest {device_name}", total, "candidates")
    for wl in workloads:
        need, mod = todo[wl.name], mods[wl.name]
        key = workload_key(mod)
        if need == 0:
            continue
        records.save_name(store, key, wl.name)
        # The seed moves with what is already stored, so a resumed harvest draws new candidates.
        ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                             search_strategy="replay-trace", task_name=wl.name,
                             rand_state=int(cfg["seed"]) + have.get(key, 0),
                             num_threads=int(cfg["build_workers"]))
        ctx.pre_tuning(max_trials=need, num_trials_per_iter=int(cfg["batch_size"]),
                       design_spaces=ctx.generate_design_space(), database=db)
        workload = db.commit_workload(mod)
        done = 0
        while done < need and (batch := ctx.generate_measure_candidates()):
            batch = batch[: need - done]

            def commit(i: int, res: ms.runner.RunnerResult, batch=batch,
                       workload=workload) -> None:
                # Each result is stored the moment it exists: a kill loses only the run in flight.
                secs = res.run_secs if res.error_msg is None else [records.FAILED_SECS]
                db.commit_tuning_record(ms.database.TuningRecord(
                    batch[i].sch.trace, workload, secs, target, batch[i].args_info))
                summary["failed"] += res.error_msg is not None

            results = _measure(builder, runner, target, device_type(target), batch, commit)
            ctx.notify_runner_results(batch, results)
            done += len(batch)
            summary["measured"] += len(batch)
            progress.advance(len(batch), note=f"{wl.name}, {summary['failed']} failed")
        ctx.post_tuning()
    log.info(f"harvest {device_name}: {summary}")
    return summary
