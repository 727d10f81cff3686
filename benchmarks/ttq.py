"""Time-to-quality: measurements until the best kernel found is within 5% of the oracle.

Two modes, both comparing CALO-GNN (UEC-UCB, kappa_t = c / sqrt(t + offset)) with TVM's
XGBModel as tune_tir configures it by default (random scores until 100 measurements), and with
XGBModel without that warm-up (`xgb-no-warmup`), the stronger baseline:

  replay  on measured pools (a TVM database per device, >= --min-pool records per workload): each
          round the cost model scores every unmeasured candidate of the pool, the best-scored
          batch is "measured" (its stored latency revealed) and fed back to the model. Fast and
          deterministic, so many seeds and the ablations are affordable. The oracle is the pool's
          best latency.
  live    real tune_tir runs with each cost model, same budget and seed; the oracle is the best
          latency any run found.

TTQ counts measured trials; a run that never gets within 5% counts as budget + 1 (censored). The
report gives the geo-mean of per-workload TTQ ratios (ours / XGBoost), per-workload means, wins
and Welch's t-test over seeds, and the ablations (replay): constant kappa, deterministic head,
zero-shot (no online updates), no calibration (temperature 1). Without a pipeline model, our
runs use donor models trained here with --donors training seeds; tuning seed s uses donor
s % donors, so the spread over seeds includes the donor's. Run from the repository root:

    python benchmarks/ttq.py --mode replay --pool DIR_OR_TAR [--seeds 10] [--donors 10]
    python benchmarks/ttq.py --mode live [--workload W ...] [--seeds 3] [--donors 3]

Writes benchmarks/results/ttq_<mode>.json and ttq_<mode>.png (best-so-far latency / oracle).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # once, outside any timing

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from calo import plots, records  # noqa: E402
from calo.artifact import TrainedModel  # noqa: E402
from calo.baselines import xgb_model  # noqa: E402
from calo.config import Settings, load_settings  # noqa: E402
from calo.costmodel import CaloCostModel  # noqa: E402
from calo.tasks.extract import extract  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harvest_pools import unpack  # noqa: E402
from offline_eval import POOLS, train_donor, with_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parent
QUALITY = 0.05
XGB_NO_WARMUP = "xgb-no-warmup"
MAIN = ("calo", "xgb", XGB_NO_WARMUP)  # run with --seeds; the ablations with --ablation-seeds
LIVE_WORKLOADS = ["matmul", "conv2d-nhwc", "batch-matmul", "dense-bias-relu", "conv1d"]


# id of a pool candidate -> (candidate, graph), shared by all runs; holding the candidate keeps
# its id from being reused by another object.
GRAPHS: dict[int, tuple] = {}


class CachedCalo(CaloCostModel):
    """Replay scores the same pool candidates in every round and run: graphs are built once."""

    def featurize(self, context, candidates, stores=None):
        missing = [c for c in candidates if id(c) not in GRAPHS]
        # Cached with store rows whenever a correction may read them, now or after an update.
        every = super().featurize(context, missing, self.learns_stores)
        for cand, graph in zip(missing, every):
            GRAPHS[id(cand)] = (cand, graph)
        return [GRAPHS[id(c)][1] for c in candidates]


def ttq(curve: list[float], oracle: float, budget: int) -> int:
    target = oracle * (1 + QUALITY)
    return next((i + 1 for i, best in enumerate(curve) if best <= target), budget + 1)


def replay_run(model, cands: list, latencies: np.ndarray, ctx, seed: int, batch: int,
               budget: int) -> tuple[list[float], float]:
    """Best-so-far latency per measured trial, and the cost model's total predict+update time."""
    np.random.seed(seed)  # TVM's XGBModel draws its warm-up scores from numpy's global RNG
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    tie = rng.permutation(len(cands))  # random order among equal scores (an untrained model)
    unmeasured, curve, best, spent = set(range(len(cands))), [], math.inf, 0.0
    while unmeasured and len(curve) < budget:
        idx = np.array(sorted(unmeasured))
        start = time.perf_counter()
        scores = np.asarray(model.predict(ctx, [cands[i] for i in idx]), dtype=np.float64)
        spent += time.perf_counter() - start
        order = np.lexsort((tie[idx], -scores))  # highest score first, ties by the seed
        picked = idx[order[: min(batch, budget - len(curve))]]
        # A candidate that failed when the pool was harvested costs its trial here too.
        results = [ms.runner.RunnerResult([float(latencies[i])], None) if np.isfinite(latencies[i])
                   else ms.runner.RunnerResult(None, "failed when the pool was measured")
                   for i in picked]
        start = time.perf_counter()
        model.update(ctx, [cands[i] for i in picked], results)
        spent += time.perf_counter() - start
        for i in picked:
            unmeasured.discard(int(i))
            best = min(best, float(latencies[i]))
            curve.append(best)
    return curve, spent


def load_pool(path: Path, min_pool: int) -> dict[str, list]:
    if path.is_file():
        tmp = Path(tempfile.mkdtemp(prefix="calo-ttq-pool-"))
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        path = next(p.parent for p in tmp.rglob(records.RECORD_FILE))
    pool: dict[str, list] = {}
    for rec in records.iter_records(path):  # failed candidates stay: the tuner may pick them
        pool.setdefault(rec.workload_name, []).append(rec)
    small = {w: len(r) for w, r in pool.items() if len(r) < min_pool}
    for name in small:
        del pool[name]
    if not pool:
        raise SystemExit(f"no workload in {path} has {min_pool} or more candidates "
                         f"(largest: {max(small.values(), default=0)}); harvest a pool with "
                         "`calo harvest --device D --workload W --count N`, or lower --min-pool")
    return pool


def calo_models(settings: Settings, work: Path, counts: dict[str, int]
                ) -> dict[str, list[TrainedModel]]:
    """Donor models trained on the committed cpu-host suite pool, `counts[head]` of each head
    (evidential, deterministic), one per training seed: tuning seed s uses donor s, so a figure
    is not one donor's luck (donors of different seeds moved replay TTQs by a factor of two on
    single workloads)."""
    os.chdir(work)
    (work / "data" / "records").mkdir(parents=True, exist_ok=True)
    unpack(POOLS["cpu-host"], work / "pools").rename(work / "data" / "records" / "cpu-host")
    # Head and training seed leave the graphs as they are: extract the store once for all donors.
    extract(with_overrides(settings, "cpu-host", []), "cpu-host")
    out: dict[str, list[TrainedModel]] = {}
    for head, count in counts.items():
        for seed in range(count):
            sets = [f"model.head={head}", f"train.seed={seed}"]
            train_donor(with_overrides(settings, "cpu-host", sets),
                        work / "models" / f"{head}-{seed}")
            out.setdefault(head, []).append(
                TrainedModel.load(work / "models" / f"{head}-{seed}"))
    return out


def make_calo(settings: Settings, donor: TrainedModel, cls=CachedCalo, temperature=None,
              **overrides) -> CaloCostModel:
    """A fresh copy of the donor as the tuning model (temperature: the no-calibration
    ablation's override)."""
    trained = copy.deepcopy(donor)
    if temperature is not None:
        trained.temperature = temperature
    return cls.from_settings(trained, settings, **overrides)


def welch_p(a: list[int], b: list[int]) -> float:
    """Welch's t-test p-value; samples of different sizes are fine, constant ones are decided."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.std() + b_.std() == 0:  # no spread on either side: the test is undefined
        return 1.0 if a_.mean() == b_.mean() else 0.0
    return float(stats.ttest_ind(a_, b_, equal_var=False).pvalue)


def summarize(ttqs: dict[str, dict[str, list[int]]], baseline: str = "xgb") -> dict:
    """Per workload: mean TTQ per method, ratio to XGBoost, Welch's t-test of ours vs it."""
    per_workload, ratios = {}, {}
    for workload, by_method in ttqs.items():
        row = {m: {"mean_ttq": float(np.mean(v)), "ttq": v} for m, v in by_method.items()}
        base = row[baseline]["mean_ttq"]
        for method, values in by_method.items():
            if method == baseline:
                continue
            row[method]["ratio_vs_xgb"] = row[method]["mean_ttq"] / base
            ratios.setdefault(method, []).append(row[method]["ratio_vs_xgb"])
            row[method]["welch_p"] = welch_p(values, by_method[baseline])
        per_workload[workload] = row
    geomean = {m: float(math.exp(np.mean(np.log(r)))) for m, r in ratios.items()}
    return {"per_workload": per_workload, "geomean_ratio_vs_xgb": geomean}


def run_replay(args, settings: Settings, work: Path) -> dict:
    pool = load_pool(args.pool, args.min_pool)
    donors = calo_models(settings, work, {"evidential": args.donors,
                                        "deterministic": min(args.donors, args.ablation_seeds)})

    def donor(kind: str, seed: int) -> TrainedModel:
        return donors[kind][seed % len(donors[kind])]

    target = next(iter(pool.values()))[0].record.target  # the pool's, for the tuning context
    # Each builder takes the run's seed: it orders ties, and our online updates' batches.
    variants = {
        "calo": lambda s: make_calo(settings, donor("evidential", s), seed=s),
        **{f"kappa={k:g}": (lambda s, k=k: make_calo(settings, donor("evidential", s), seed=s,
                                                     constant_kappa=k)) for k in args.kappas},
        "deterministic": lambda s: make_calo(settings, donor("deterministic", s), seed=s),
        "zero-shot": lambda s: make_calo(settings, donor("evidential", s), seed=s,
                                         update_steps=0),
        "no-calibration": lambda s: make_calo(settings, donor("evidential", s), seed=s,
                                              temperature=1.0),
        # TVM's defaults, as tune_tir uses them: random scores until 100 measurements.
        "xgb": lambda s: xgb_model(os.cpu_count() or 1, warmup=True),
        # The stronger baseline: XGBoost's own predictions from the first measurement on.
        XGB_NO_WARMUP: lambda s: xgb_model(os.cpu_count() or 1),
    }
    ttqs: dict[str, dict[str, list[int]]] = {}
    curves: dict[str, list[float]] = {}
    timing: dict[str, float] = {}
    for workload, recs in pool.items():
        cands = [r.record.as_measure_candidate() for r in recs]
        latencies = np.array([math.inf if r.latency is None else r.latency for r in recs])
        oracle = float(latencies.min())
        ctx = ms.TuneContext(mod=recs[0].record.workload.mod, target=target,
                             task_name=workload)
        ttqs[workload] = {}
        for method, build in variants.items():
            values, mean_curve = [], np.zeros(args.budget)
            seeds = args.seeds if method in MAIN else args.ablation_seeds
            if not seeds:  # --ablation-seeds 0: the main comparison only
                continue
            for seed in range(seeds):
                curve, spent = replay_run(build(seed), cands, latencies, ctx, seed,
                                          args.batch, args.budget)
                curve = curve + [curve[-1]] * (args.budget - len(curve))
                values.append(ttq(curve, oracle, args.budget))
                mean_curve += np.array(curve) / oracle / seeds
                timing[method] = timing.get(method, 0.0) + spent
            ttqs[workload][method] = values
            if method in MAIN:
                curves[f"{workload} {method}"] = mean_curve.tolist()
            print(f"{workload:<24}{method:<16} mean TTQ {np.mean(values):7.1f} trials "
                  f"(seeds: {values})", flush=True)
        # Per-seed TTQs as they come: a later failure never costs the measured runs.
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "ttq_replay_seeds.json").write_text(json.dumps(ttqs, indent=1))
    report = summarize(ttqs)
    strong = summarize({w: {"calo": by["calo"], "xgb": by[XGB_NO_WARMUP]}
                        for w, by in ttqs.items()})
    return {
        "mode": "replay", "pool": args.pool.name,
        "pool_sizes": {w: {"candidates": len(r),
                           "measured": sum(x.latency is not None for x in r)}
                       for w, r in pool.items()},
        "seeds": args.seeds, "ablation_seeds": args.ablation_seeds, "donors": args.donors,
        "budget": args.budget,
        "batch": args.batch,
        "geomean_ttq_ratio": report["geomean_ratio_vs_xgb"]["calo"],
        "geomean_ttq_ratio_vs_xgb_no_warmup": strong["geomean_ratio_vs_xgb"]["calo"],
        "per_workload": {w: {m: v for m, v in row.items() if m in MAIN}
                         for w, row in report["per_workload"].items()},
        "welch_p_vs_xgb_no_warmup": {w: row["calo"]["welch_p"]
                                     for w, row in strong["per_workload"].items()},
        "ablations": {m: r for m, r in report["geomean_ratio_vs_xgb"].items()
                      if m not in MAIN},
        "ablations_per_workload": {w: {m: v for m, v in row.items() if m not in MAIN}
                                   for w, row in report["per_workload"].items()},
        "model_seconds": timing, "curves": curves,
    }


def run_live(args, settings: Settings, work: Path) -> dict:
    from calo.errors import CaloError
    from calo.tasks.tune import load_tuning_model, run_tuner

    settings = settings.override({"tune.max_trials": args.budget})
    device = settings.targets[0]
    # The pipeline's fine-tuned, calibrated model when `make run` has made one; otherwise the
    # replay's donor model, trained here on the committed cpu-host suite pool.
    try:
        load_tuning_model(settings, device)
        donors, model_source = None, f"pipeline model of {device}"
    except CaloError:
        cwd = Path.cwd()
        donors = calo_models(settings, work, {"evidential": args.donors})["evidential"]
        model_source = f"{args.donors} donors (cpu-host pool)"
        os.chdir(cwd)
    print(f"live: tuning on {device} with the {model_source}", flush=True)
    ttqs: dict[str, dict[str, list[int]]] = {}
    curves: dict[str, list[float]] = {}
    workloads = args.workload or LIVE_WORKLOADS
    try:
        settings.workloads_named(workloads)  # an unknown name fails here, before any tuning
    except CaloError as err:
        raise SystemExit(str(err)) from None
    done: dict[str, dict] = {}  # per-run curves and wall times, saved as they come
    for workload in workloads:
        runs: dict[str, list[list[float]]] = {m: [] for m in MAIN}
        for seed in range(args.seeds):
            seeded = settings.override({"tune.seed": seed})
            for method in runs:
                if method == "xgb":
                    model = "xgb"  # tune_tir's own default
                elif method == XGB_NO_WARMUP:
                    model = xgb_model(os.cpu_count() or 1)
                elif donors is None:
                    model = load_tuning_model(seeded, device)
                else:  # live candidates are new objects every round: no graph cache
                    model = make_calo(seeded, donors[seed % len(donors)], cls=CaloCostModel,
                                      seed=seed)
                run = run_tuner(seeded, device, workload, model,
                                work / workload / f"{method}-{seed}")
                runs[method].append(run["curve"] + [run["curve"][-1]] * (
                    args.budget - len(run["curve"])))
                done[f"{workload} {method} {seed}"] = run
                print(f"{workload:<24}{method:<16}seed {seed}: best {run['curve'][-1] * 1e6:.1f} us"
                      f" after {run['trials']} trials, {run['wall_s']:.0f} s", flush=True)
                args.out_dir.mkdir(parents=True, exist_ok=True)
                (args.out_dir / "ttq_live_runs.json").write_text(json.dumps(done))
        oracle = min(min(c) for rs in runs.values() for c in rs)
        ttqs[workload] = {m: [ttq(c, oracle, args.budget) for c in rs] for m, rs in runs.items()}
        for method, rs in runs.items():
            curves[f"{workload} {method}"] = (np.mean(rs, axis=0) / oracle).tolist()
            print(f"{workload:<24}{method:<16}TTQ {ttqs[workload][method]}", flush=True)
    report = summarize(ttqs)
    strong = summarize({w: {"calo": by["calo"], "xgb": by[XGB_NO_WARMUP]}
                        for w, by in ttqs.items()})
    wall = {m: sum(r["wall_s"] for k, r in done.items() if k.split()[1] == m) for m in MAIN}
    return {"mode": "live", "device": device, "model": model_source, "seeds": args.seeds,
            "budget": args.budget,
            "geomean_ttq_ratio": report["geomean_ratio_vs_xgb"]["calo"],
            "geomean_ttq_ratio_vs_xgb_no_warmup": strong["geomean_ratio_vs_xgb"]["calo"],
            "per_workload": report["per_workload"],
            "welch_p_vs_xgb_no_warmup": {w: row["calo"]["welch_p"]
                                         for w, row in strong["per_workload"].items()},
            "tuning_seconds": wall, "ablations": {}, "curves": curves}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("replay", "live"), required=True)
    parser.add_argument("--pool", type=Path, help="replay: TVM database dir or .tar.gz")
    parser.add_argument("--min-pool", type=int, default=1000)
    parser.add_argument("--workload", action="append", help="live: workloads (default: "
                        "the replay pool's five)")
    parser.add_argument("--seeds", type=int, default=None, help="10 replay, 3 live")
    parser.add_argument("--budget", type=int, default=None, help="trials: 160 replay, 64 live")
    parser.add_argument("--ablation-seeds", type=int, default=5)
    parser.add_argument("--donors", type=int, default=None,
                        help="donor models, one per training seed (default: one per seed)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--kappas", type=float, nargs="*", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    args.seeds = args.seeds or (10 if args.mode == "replay" else 3)
    args.budget = args.budget or (160 if args.mode == "replay" else 64)
    # Given its donor, a replay run hardly depends on the tuning seed (ties and update batches
    # only): one donor per seed makes the seeds independent samples for Welch's test.
    args.donors = args.donors or args.seeds
    if args.mode == "replay" and args.pool is None:
        parser.error("--mode replay needs --pool")
    args.out_dir = args.out_dir.resolve()
    if args.pool is not None:
        args.pool = args.pool.resolve()
    settings = load_settings(Path("params.yaml").resolve())
    work = Path(tempfile.mkdtemp(prefix="calo-ttq-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    report = (run_replay if args.mode == "replay" else run_live)(args, settings, work)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    png = plots.best_so_far(args.out_dir / f"ttq_{args.mode}.png", report.pop("curves"),
                            f"TTQ {args.mode}: mean best-so-far / oracle",
                            ylabel="best latency so far / oracle")
    out = args.out_dir / f"ttq_{args.mode}.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"\ngeo-mean TTQ ratio (CALO / XGBoost): {report['geomean_ttq_ratio']:.3f}")
    for name, ratio in report["ablations"].items():
        print(f"  ablation {name:<16} geo-mean ratio vs XGBoost {ratio:.3f}")
    print(f"wrote {out} and {png}")
    if args.mode == "live":
        print(f"tuning databases and the donor model kept in {work} "
              "(benchmarks/live_ranking.py reads them)")


if __name__ == "__main__":
    main()
