"""Where a live tuning run's wall time goes: CALO-GNN against TVM's XGBoost, same trials.

Each model tunes one workload with a real `tune_tir` (as `calo tune` runs it) on the first
target device, for the same number of trials and seed. The cost models' methods are timed from
the inside: `predict` (scoring search populations; ours split into `batch`, the graphs of a
population from the native walker where it builds, and the rest), `update` (learning from each
round's measurements; ours extracts their graphs in `featurize`); TVM's own profiler times the
rest: the builds (`SendToBuilder`), the measurements (`SendToRunner`) and the search's scopes
(sampling the initial population, mutation with post-processing, bookkeeping). Run from the
repository root:

    python benchmarks/live_profile.py --model DIR [--workload matmul] [--trials 64] [--seeds 1]
                                      [--python-walker-too]

DIR is a saved model (a donor or a device's model, `calo.artifact`). Writes
benchmarks/results/live_profile.json (or --out) and prints a table per model.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported, and outside any timing

from tvm.s_tir import meta_schedule as ms  # noqa: E402

from calo import native  # noqa: E402
from calo.artifact import TrainedModel  # noqa: E402
from calo.config import load_settings  # noqa: E402
from calo.costmodel import CaloCostModel  # noqa: E402
from calo.tasks.tune import run_tuner  # noqa: E402

ROOT = Path(__file__).resolve().parent
SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
SCORED: dict[str, int] = defaultdict(int)   # candidates passed to predict


def timed(cls: type, name: str, label: str) -> None:
    """Accumulate the time spent in cls.name under label, patched on the Python class that
    TVM's derived_object wraps (its wrapper looks the method up there at each call)."""
    cls = getattr(cls, "_cls", cls)
    method = getattr(cls, name)

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        if name == "predict":
            SCORED[label.split(".")[0]] += len(args[2])
        try:
            return method(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - start
            CALLS[label] += 1

    setattr(cls, name, wrapper)


def instrument() -> None:
    timed(CaloCostModel, "predict", "calo.predict")
    timed(CaloCostModel, "update", "calo.update")
    timed(CaloCostModel, "batch", "calo.batch")          # a population's graphs, batched
    timed(CaloCostModel, "featurize", "calo.featurize")  # graphs of the measured candidates
    timed(ms.cost_model.XGBModel, "predict", "xgb.predict")
    timed(ms.cost_model.XGBModel, "update", "xgb.update")


def breakdown(method: str, wall: float, scopes: dict[str, float]) -> dict:
    """Seconds per part of one run: the cost model's methods (timed here), the builds and
    measurements and the search proper (TVM's scopes; the search's scoring calls the model's
    predict, so it is left out of `search_s`), and what none of them covers."""
    own = {k.split(".", 1)[1]: v for k, v in SPENT.items() if k.startswith(f"{method}.")}
    calls = {k.split(".", 1)[1]: v for k, v in CALLS.items() if k.startswith(f"{method}.")}
    parts = {"build_s": scopes.get("SendToBuilder", 0.0),
             "measure_s": scopes.get("SendToRunner", 0.0),
             "search_s": sum(v for k, v in scopes.items() if k.startswith("EvoSearch/")
                             and k != "EvoSearch/Evolve/PredictNormalizedScore")}
    timed_parts = own.get("predict", 0.0) + own.get("update", 0.0) + sum(parts.values())
    return {"wall_s": wall, **{f"{k}_s": v for k, v in own.items()},
            **{f"{k}_calls": v for k, v in calls.items()}, **parts,
            "other_s": wall - timed_parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a saved model directory")
    parser.add_argument("--workload", default="matmul")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--python-walker-too", action="store_true",
                        help="also run CALO with the Python schedule-graph walker (calo.native "
                             "off), after the native one, each seed")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "live_profile.json")
    args = parser.parse_args()
    settings = load_settings(Path("params.yaml").resolve())
    settings.workload(args.workload)
    device = settings.targets[0]
    trained = TrainedModel.load(args.model.resolve())
    instrument()
    work = Path(tempfile.mkdtemp(prefix="calo-live-profile-"))
    report = {"workload": args.workload, "device": device, "trials": args.trials,
              "model": str(args.model), "runs": {}}
    for seed in range(args.seeds):
        seeded = settings.override({"tune.max_trials": args.trials, "tune.seed": seed})
        for method in ["xgb", "calo"] + (["calo-python"] if args.python_walker_too else []):
            SPENT.clear()
            CALLS.clear()
            SCORED.clear()
            owner = method.split("-")[0]   # whose methods were timed
            model = (CaloCostModel.from_settings(copy.deepcopy(trained), seeded)
                     if owner == "calo"
                     else ms.cost_model.XGBModel(num_tuning_cores=os.cpu_count() or 1))
            walker = native.off() if method == "calo-python" else contextlib.nullcontext()
            with walker, ms.Profiler() as profiler:  # TVM's own scopes inside the search
                run = run_tuner(seeded, device, args.workload, model, work / f"{method}-{seed}")
                walked = "native" if native.walker() is not None else "python"
            scopes = {k: float(v) for k, v in profiler.get().items()}
            row = {**breakdown(owner, run["wall_s"], scopes), "trials": run["trials"],
                   "best_us": run["curve"][-1] * 1e6, "tvm_scopes_s": dict(sorted(scopes.items()))}
            if owner == "calo":
                row["candidates_scored"] = SCORED["calo"]
                row["walker"] = walked
            report["runs"][f"{method}-{seed}"] = row
            print(f"{method:<5} seed {seed}: " + ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                if k != "tvm_scopes_s"), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
