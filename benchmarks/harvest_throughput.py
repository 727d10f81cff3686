"""Harvest throughput: records/s and efficiency, warm build workers vs TVM's LocalBuilder.

Both modes harvest random candidates (same seed, random sampling only; sampling runs on two
threads, so the two runs' candidates may overlap rather than coincide) of the same suite
workloads on this machine's CPU, in fresh stores. Efficiency = (sum over those candidates
of their pure build time + pure run time, each timed alone in this process) / harvest wall time:
1.0 means the harvest costs no more than building and measuring back to back; above 1.0, parallel
builds are hiding work. Run from the repository root:

    python benchmarks/harvest_throughput.py [--count 32] [--workload NAME ...]

Prints a table and writes benchmarks/results/harvest_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported, outside any timing

from calo import paths, records  # noqa: E402
from calo.build import build_and_export  # noqa: E402
from calo.config import Settings, load_settings  # noqa: E402
from calo.devices import make_target  # noqa: E402
from calo.measure import evaluator_config  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEVICE = "bench-cpu"
WORKLOADS = ["matmul", "conv2d", "depthwise-conv2d", "layer-norm", "sdp-attention", "mlp2"]


def bench_settings(base: Settings, warm: bool) -> Settings:
    donor = base.device(base.donor)
    return base.override({f"devices.{DEVICE}": {"target": donor.target, "runner": donor.runner,
                                                "evolved_fraction": 0.0},
                          "harvest.warm_builders": warm})


def harvest_once(settings: Settings, workloads: list[str], count: int, root: Path) -> dict:
    from calo.tasks.harvest import harvest

    os.chdir(root)  # data/ is relative to the working directory: a fresh store per mode
    start = time.perf_counter()
    summary = harvest(settings, DEVICE, workloads, count)
    wall = time.perf_counter() - start
    recs = list(records.iter_records(paths.records_dir(DEVICE)))
    return {"wall_s": wall, "records": len(recs), "failed": summary["failed"],
            "records_per_s": len(recs) / wall, "recs": recs}


def pure_costs(settings: Settings, recs: list[records.Record]) -> tuple[float, float]:
    """Build, then load and measure, each candidate alone in this process."""
    import tvm
    from tvm.s_tir.meta_schedule.runner import local_runner
    from tvm.s_tir.meta_schedule.utils import remove_build_dir

    target = make_target(settings.device(DEVICE))
    config = evaluator_config(settings.harvest)
    dev = tvm.cpu(0)
    build_s = run_s = 0.0
    for i, rec in enumerate(recs):
        cand = rec.record.as_measure_candidate()
        t0 = time.perf_counter()
        artifact = build_and_export(cand.sch.mod, target)
        t1 = time.perf_counter()
        module = tvm.runtime.load_module(artifact)
        args = local_runner.default_alloc_argument(
            dev, [a.as_json() for a in cand.args_info], 1)
        local_runner.default_run_evaluator(module, dev, config, args)
        t2 = time.perf_counter()
        remove_build_dir(artifact)
        if i > 0:  # the first build pays one-off imports that a worker pays once, too
            build_s, run_s = build_s + t1 - t0, run_s + t2 - t1
    scale = len(recs) / max(len(recs) - 1, 1)
    return build_s * scale, run_s * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16, help="candidates per workload")
    parser.add_argument("--workload", action="append", help="suite workload (repeatable)")
    args = parser.parse_args()
    workloads = args.workload or WORKLOADS
    base = load_settings(Path("params.yaml").resolve())
    threads = base.device(base.donor).runner.get("num_threads")
    if threads:
        os.environ["TVM_NUM_THREADS"] = str(threads)  # pure runs use the device's threads too

    runs = {}
    for mode, warm in (("localbuilder", False), ("warm", True)):
        with tempfile.TemporaryDirectory(prefix=f"calo-bench-{mode}-") as root:
            runs[mode] = harvest_once(bench_settings(base, warm), workloads, args.count, Path(root))
    ids = [{records.candidate_id(r.workload_key, r.record.trace) for r in run["recs"]}
           for run in runs.values()]
    same = len(ids[0] & ids[1]) / max(len(ids[0] | ids[1]), 1)
    ok = [r for r in runs["warm"]["recs"] if r.latency is not None]
    build_s, run_s = pure_costs(bench_settings(base, True), ok)
    # Failed candidates are rare and cheap; efficiency counts the successful ones only.
    pure = build_s + run_s
    report = {"workloads": workloads, "candidates_per_workload": args.count,
              "shared_candidates_fraction": same, "cpu_count": os.cpu_count(),
              "build_workers": base.harvest.build_workers,
              "pure_build_s": build_s, "pure_run_s": run_s, "successful_records": len(ok)}
    print(f"{len(workloads)} workloads x {args.count} candidates, {same:.0%} of them the same "
          f"in both modes; pure build {build_s:.1f} s + pure run {run_s:.1f} s")
    print(f"{'mode':<14}{'records':>8}{'wall s':>9}{'records/s':>11}{'efficiency':>12}")
    for mode, run in runs.items():
        run["efficiency"] = pure / run["wall_s"]
        report[mode] = {k: run[k] for k in ("records", "failed", "wall_s", "records_per_s",
                                            "efficiency")}
        print(f"{mode:<14}{run['records']:>8}{run['wall_s']:>9.1f}{run['records_per_s']:>11.2f}"
              f"{run['efficiency']:>12.2f}")
    report["speedup"] = runs["localbuilder"]["wall_s"] / runs["warm"]["wall_s"]
    print(f"warm workers: {report['speedup']:.2f}x the records/s of TVM's LocalBuilder")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "harvest_throughput.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
