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

TTQ counts measured trials; a run that never gets within 5% counts as budget + 1 (censored).
Live runs also count it in wall-clock seconds (measurement and search, from the start of tuning
until that trial's result was in; a censored run counts its whole time). Counted so, a search
that stops sooner without reaching quality looks faster; `ttq_seconds_even_censoring` counts
every censored run of a workload at the longest run of that workload instead, and
`reached_quality` says how many runs of each model got there at all. The report gives the
geo-mean of per-workload TTQ ratios (ours / XGBoost), per-workload means, wins and Welch's
t-test over seeds, and the ablations (replay): constant kappa, deterministic head, zero-shot (no
online updates), no calibration (temperature 1). Without a pipeline model (or with
--model donors), our runs use donor models trained here with --donors training seeds; tuning
seed s uses donor s % donors, so the spread over seeds includes the donor's. Run from the
repository root:

    python benchmarks/ttq.py --mode replay --pool DIR_OR_TAR [--seeds 10] [--donors 10]
                             [--donors-dir DIR]
    python benchmarks/ttq.py --mode live [--model donors] [--workload W ...] [--seeds 5]
                             [--budget 200] [--donors-dir DIR]

Writes benchmarks/results/ttq_<mode>.json and ttq_<mode>.png (best-so-far latency / oracle
against trials; live also ttq_live_time.png, against seconds). Both save every run to
ttq_<mode>_runs.json as it ends (live also its report after every workload); run again with the
same settings, they go on with the runs still missing.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # once, outside any timing

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from calo import plots, records  # noqa: E402
from calo.artifact import CONFIG, TrainedModel  # noqa: E402
from calo.baselines import xgb_model  # noqa: E402
from calo.config import Settings, load_settings  # noqa: E402
from calo.costmodel import CaloCostModel  # noqa: E402
from calo.environment import machine  # noqa: E402
from calo.tasks.extract import extract  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harvest_pools import heldout_workloads, unpack  # noqa: E402
from offline_eval import POOLS, train_donor, with_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parent
QUALITY = 0.05
XGB_NO_WARMUP = "xgb-no-warmup"
MAIN = ("calo", "xgb", XGB_NO_WARMUP)  # run with --seeds; the ablations with --ablation-seeds
# Three suite workloads the donor has records of, each followed by a shape it has none of (the
# offline evaluation's held-out shapes), so a report of the first workloads has both kinds.
LIVE_WORKLOADS = ["matmul", "matmul@384x192x320", "dense-bias-relu", "conv2d-nhwc@20x20x48x96",
                  "conv1d", "batch-matmul@6x96x160x96"]


# The params.yaml sections a donor model depends on (a kept donor is reused while they hold).
DONOR_SETTINGS = ("split", "labels", "graph", "model", "train", "calibrate")
# ... and the code (offline_eval.py trains them).
DONOR_CODE = ("calo", "models", "tasks", "benchmarks/offline_eval.py")

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


def replay_runs(pool: dict[str, list], target, methods: dict[str, Callable], seeds: dict[str, int],
                batch: int, budget: int, done: dict[str, dict], saved: Callable[[str], None],
                keeps_curve: Callable[[str], bool] = lambda method: False
                ) -> Iterator[tuple[str, str, list[dict], float]]:
    """Each workload's and method's runs over its seeds (a method with 0 seeds is skipped),
    with the workload's best latency: saved runs as they are, missing ones replayed and handed
    to `saved` (by key) as each ends, so an interrupted replay goes on where it stopped. A run
    keeps its best-so-far curve, padded to the budget, where `keeps_curve` says."""
    for workload, recs in pool.items():
        cands = [r.record.as_measure_candidate() for r in recs]
        latencies = np.array([math.inf if r.latency is None else r.latency for r in recs])
        oracle = float(latencies.min())
        ctx = ms.TuneContext(mod=recs[0].record.workload.mod, target=target,
                             task_name=workload)
        for method, build in methods.items():
            if not seeds[method]:
                continue
            for seed in range(seeds[method]):
                key = f"{workload} {method} {seed}"
                if key not in done:
                    curve, spent = replay_run(build(seed), cands, latencies, ctx, seed, batch,
                                              budget)
                    curve = curve + [curve[-1]] * (budget - len(curve))
                    done[key] = {"ttq": ttq(curve, oracle, budget), "seconds": spent,
                                 **({"curve": curve} if keeps_curve(method) else {})}
                    saved(key)
            yield workload, method, [done[f"{workload} {method} {s}"]
                                     for s in range(seeds[method])], oracle


def load_pool(path: Path, min_pool: int) -> dict[str, list]:
    """The pool's records by workload, read into memory (an unpacked tar is deleted after)."""
    pool: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="calo-ttq-pool-") as tmp:
        store = path
        if path.is_file():
            with tarfile.open(path) as tar:
                tar.extractall(tmp, filter="data")
            store = next(p.parent for p in Path(tmp).rglob(records.RECORD_FILE))
        for rec in records.iter_records(store):  # failed candidates stay: the tuner may pick them
            pool.setdefault(rec.workload_name, []).append(rec)
    small = {w: len(r) for w, r in pool.items() if len(r) < min_pool}
    for name in small:
        del pool[name]
    if not pool:
        raise SystemExit(f"no workload in {path} has {min_pool} or more candidates "
                         f"(largest: {max(small.values(), default=0)}); harvest a pool with "
                         "`calo harvest --device D --workload W --count N`, or lower --min-pool")
    return pool


def code_hash() -> str:
    """The project's code a donor is made by (any change there trains the kept donors anew)."""
    paths = [ROOT.parent / d for d in DONOR_CODE]
    # .cc: the native schedule-graph walker (calo/native)
    files = sorted(f for p in paths for f in ([*p.rglob("*.py"), *p.rglob("*.cc")]
                                              if p.is_dir() else [p]))
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(ROOT.parent)).encode() + f.read_bytes())
    return digest.hexdigest()


def donor_recipe(settings: Settings) -> dict:
    return {"pool": pool_digest(POOLS["cpu-host"]), "code": code_hash(),
            **{k: settings.raw[k] for k in DONOR_SETTINGS}}


def pool_digest(path: Path) -> str:
    """The content of a pool (a .tar.gz, or a database directory's record files)."""
    files = [path] if path.is_file() else sorted(path.rglob(records.RECORD_FILE))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


def calo_models(settings: Settings, work: Path, counts: dict[str, int],
                keep: Path | None = None) -> dict[str, list[TrainedModel]]:
    """Donor models trained on the committed cpu-host suite pool, `counts[head]` of each head
    (evidential, deterministic), one per training seed: tuning seed s uses donor s, so a figure
    is not one donor's luck (donors of different seeds moved replay TTQs by a factor of two on
    single workloads). With `keep`, donors trained there from the same pool, settings and code
    are loaded instead of trained again."""
    models = keep or work / "models"
    recipe = donor_recipe(settings)
    stamp = models / "recipe.json"
    names = [f"{head}-{seed}" for head, count in counts.items() for seed in range(count)]
    reuse = stamp.exists() and json.loads(stamp.read_text()) == json.loads(json.dumps(recipe))
    if not reuse and models.is_dir():  # donors of another recipe are never reused
        stamp.unlink(missing_ok=True)
        for old in models.glob("*-*"):
            if (old / CONFIG).is_file():
                shutil.rmtree(old)
    # A donor counts once its config is written (TrainedModel.save writes it last).
    missing = [n for n in names if not (models / n / CONFIG).is_file()]
    if missing:
        os.chdir(work)
        (work / "data" / "records").mkdir(parents=True, exist_ok=True)
        unpack(POOLS["cpu-host"], work / "pools").rename(work / "data" / "records" / "cpu-host")
        # Head and training seed leave the graphs as they are: extract once for all donors.
        extract(with_overrides(settings, "cpu-host", []), "cpu-host")
        models.mkdir(parents=True, exist_ok=True)
        # Stamped before training, so each donor saved is kept if the run stops after it.
        stamp.write_text(json.dumps(recipe, indent=1))
        for k, name in enumerate(missing, 1):
            head, seed = name.rsplit("-", 1)
            sets = [f"model.head={head}", f"train.seed={seed}"]
            started = time.perf_counter()
            train_donor(with_overrides(settings, "cpu-host", sets), models / name)
            print(f"donors: {name} trained in {time.perf_counter() - started:.0f} s "
                  f"({k}/{len(missing)}, {len(names) - len(missing)} reused)", flush=True)
    else:
        print(f"donors: reusing {len(names)} from {models}", flush=True)
    out: dict[str, list[TrainedModel]] = {}
    for name in names:
        out.setdefault(name.rsplit("-", 1)[0], []).append(TrainedModel.load(models / name))
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
    with warnings.catch_warnings():  # near-equal samples: scipy warns, the p-value is still fine
        warnings.simplefilter("ignore", RuntimeWarning)
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
                                        "deterministic": min(args.donors, args.ablation_seeds)},
                         args.donors_dir)

    def donor(kind: str, seed: int) -> TrainedModel:
        return donors[kind][seed % len(donors[kind])]

    # Every run is saved as it ends: an interrupted replay goes on with the runs still missing.
    runs_path = args.out_dir / "ttq_replay_runs.json"
    config = replay_config(args, settings)
    done = saved_runs(runs_path, config, set_aside=True)
    if done:
        print(f"replay: resuming, {len(done)} runs already saved in {runs_path}", flush=True)

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
    seeds = {m: args.seeds if m in MAIN else args.ablation_seeds for m in variants}
    ttqs: dict[str, dict[str, list[int]]] = {}
    curves: dict[str, list[float]] = {}
    timing: dict[str, float] = {}
    wide = max(26, *map(len, pool)) + 1  # a plain database's names carry the whole workload
    for workload, method, runs, oracle in replay_runs(
            pool, target, variants, seeds, args.batch, args.budget, done,
            lambda key: save_runs(runs_path, config, done), keeps_curve=MAIN.__contains__):
        ttqs.setdefault(workload, {})[method] = [run["ttq"] for run in runs]
        timing[method] = timing.get(method, 0.0) + sum(run["seconds"] for run in runs)
        if method in MAIN:
            curves[f"{workload} {method}"] = (
                np.mean([run["curve"] for run in runs], axis=0) / oracle).tolist()
        print(f"{workload:<{wide}}{method:<15} mean TTQ {np.mean(ttqs[workload][method]):7.1f} "
              f"trials (seeds: {ttqs[workload][method]})", flush=True)
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


def wall_ttq(run: dict, oracle: float, censored_at: float | None = None) -> float:
    """Seconds from the start of tuning until the result that came within QUALITY of the oracle
    was in; a run that never did counts `censored_at`, by default its whole wall time (a lower
    bound, like TTQ's)."""
    reached = ttq(run["curve"], oracle, len(run["curve"]))
    if reached <= len(run["curve"]):
        return run["seconds"][reached - 1]
    return run["wall_s"] if censored_at is None else censored_at


def mean_over_time(runs: list[dict], oracle: float, points: int = 200
                   ) -> list[tuple[float, float]]:
    """Mean over seeds of best-so-far / oracle on a common time grid; a run that ended holds
    its last value."""
    end = max(r["wall_s"] for r in runs)
    grid = np.linspace(0.0, end, points)
    means = []
    for t in grid:
        values = [r["curve"][i - 1] / oracle
                  for r in runs if (i := int(np.searchsorted(r["seconds"], t, side="right")))]
        if len(values) == len(runs):  # from the moment every seed has a measurement
            means.append((float(t), float(np.mean(values))))
    return means


def live_settings(settings: Settings, budget: int, changes: dict | None = None) -> Settings:
    """The settings live runs tune with: the budget, the unseen-shape workloads (defined by the
    offline evaluation's held-out pools) and any `changes` (dotted keys)."""
    shapes = {n: w for n, w in heldout_workloads().items() if n not in settings.raw["workloads"]}
    return settings.override({"tune.max_trials": budget,
                              **{f"workloads.{n}": w for n, w in shapes.items()},
                              **(changes or {})})


def live_config(args, settings: Settings, device: str, model_source: str) -> dict:
    """What a resumed run must share with the runs already saved: the machine, the tuning
    settings (the seed aside: each run sets its own) and the code, pool and settings models
    are made by (the donors' recipe), so runs of an older model are never counted with a
    newer one's."""
    tune = {k: v for k, v in settings.raw["tune"].items() if k != "seed"}
    config = {"machine": machine(), "device": device,
              "device_settings": settings.raw["devices"][device],
              "budget": args.budget, "tune": tune, "model": model_source,
              "model_recipe": donor_recipe(settings), "finetune": settings.raw["finetune"]}
    return json.loads(json.dumps(config))  # as it reads back from the runs file


def replay_config(args, settings: Settings) -> dict:
    """What a resumed replay must share with the runs already saved (more seeds may follow)."""
    config = {"pool": pool_digest(args.pool), "min_pool": args.min_pool, "budget": args.budget,
              "batch": args.batch, "donors": args.donors, "kappas": args.kappas,
              "donor_recipe": donor_recipe(settings), "tune": settings.raw["tune"],
              "replay_code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    return json.loads(json.dumps(config))  # as it reads back from the runs file


def saved_runs(path: Path, config: dict, set_aside: bool = False) -> dict[str, dict]:
    """The runs an interrupted benchmark saved under the same configuration. Runs of another
    configuration are refused, or with `set_aside` moved to a `.stale.json` beside it (a replay
    of changed code must start afresh, and its stage must still run)."""
    if not path.exists():
        return {}
    saved = json.loads(path.read_text())
    old = (saved.get("config") if isinstance(saved, dict) else None) or {}
    if old != config:
        differ = ", ".join(sorted(k for k in config if old.get(k) != config[k])) or "format"
        if set_aside:
            stale = path.with_suffix(".stale.json")
            path.replace(stale)
            print(f"{path.name}: its runs are of another configuration (differs in: {differ}); "
                  f"moved to {stale.name}, starting afresh", flush=True)
            return {}
        raise SystemExit(f"{path} holds runs of another configuration (differs in: {differ}); "
                         "move it away to start afresh, or give --out-dir a new folder")
    return saved["runs"]


def save_runs(path: Path, config: dict, runs: dict[str, dict], **extra) -> None:
    """Rewrite the runs file after each run (what saved_runs reads back), with any `extra`
    top-level entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config, "runs": runs, **extra}))


def live_report(runs: dict[str, dict], workloads: list[str], seeds: int, budget: int,
                device: str, model_source: str) -> dict:
    """TTQ in trials and in seconds over the workloads whose runs are all done."""
    ttqs: dict[str, dict[str, list[int]]] = {}
    seconds: dict[str, dict[str, list[float]]] = {}
    even: dict[str, dict[str, list[float]]] = {}
    reached: dict[str, dict[str, int]] = {}
    curves: dict[str, list[float]] = {}
    time_curves: dict[str, list[tuple[float, float]]] = {}
    for workload in workloads:
        by = {m: [runs.get(f"{workload} {m} {s}") for s in range(seeds)] for m in MAIN}
        if any(r is None for rs in by.values() for r in rs):
            continue
        oracle = min(min(r["curve"]) for rs in by.values() for r in rs)
        longest = max(r["wall_s"] for rs in by.values() for r in rs)
        ttqs[workload], seconds[workload], even[workload], reached[workload] = {}, {}, {}, {}
        for method, rs in by.items():
            padded = [r["curve"] + [r["curve"][-1]] * (budget - len(r["curve"])) for r in rs]
            ttqs[workload][method] = [ttq(c, oracle, budget) for c in padded]
            seconds[workload][method] = [wall_ttq(r, oracle) for r in rs]
            even[workload][method] = [wall_ttq(r, oracle, longest) for r in rs]
            reached[workload][method] = sum(t <= budget for t in ttqs[workload][method])
            curves[f"{workload} {method}"] = (np.mean(padded, axis=0) / oracle).tolist()
            time_curves[f"{workload} {method}"] = mean_over_time(rs, oracle)
    report: dict = {"mode": "live", "device": device, "model": model_source, "seeds": seeds,
                    "budget": budget, "workloads_done": list(ttqs),
                    "workloads_pending": [w for w in workloads if w not in ttqs]}
    if not ttqs:
        return {**report, "curves": curves, "time_curves": time_curves}
    report["reached_quality"] = reached
    for unit, table in (("trials", ttqs), ("seconds", seconds),
                        ("seconds_even_censoring", even)):
        weak = summarize(table)
        strong = summarize({w: {"calo": by["calo"], "xgb": by[XGB_NO_WARMUP]}
                            for w, by in table.items()})
        report[f"ttq_{unit}"] = {
            "geomean_ratio_vs_xgb": weak["geomean_ratio_vs_xgb"]["calo"],
            "geomean_ratio_vs_xgb_no_warmup": strong["geomean_ratio_vs_xgb"]["calo"],
            "calo_faster_than_xgb": sum(r["calo"]["mean_ttq"] < r["xgb"]["mean_ttq"]
                                        for r in weak["per_workload"].values()),
            "per_workload": weak["per_workload"],
            "welch_p_vs_xgb_no_warmup": {w: row["calo"]["welch_p"]
                                         for w, row in strong["per_workload"].items()}}
    wall = {m: sum(runs[f"{w} {m} {s}"]["wall_s"] for w in ttqs for s in range(seeds))
            for m in MAIN}
    return {**report, "tuning_seconds": wall,
            "tuning_seconds_ratio_calo_vs_xgb": wall["calo"] / wall["xgb"],
            "curves": curves, "time_curves": time_curves}


def run_live(args, settings: Settings, work: Path) -> dict:
    from calo.errors import CaloError
    from calo.tasks.tune import load_tuning_model, run_tuner

    settings = live_settings(settings, args.budget)
    device = settings.targets[0]
    workloads = args.workload or LIVE_WORKLOADS
    try:
        settings.workloads_named(workloads)  # an unknown name fails here, before any tuning
    except CaloError as err:
        raise SystemExit(str(err)) from None
    # The pipeline's fine-tuned, calibrated model when `make run` has made one (--model auto)
    # or when asked; otherwise the replay's donor models, trained on the committed cpu-host pool.
    model_source = f"{args.donors} donors (cpu-host pool)"
    if args.model != "donors":
        try:
            load_tuning_model(settings, device)
            model_source = f"pipeline model of {device}"
        except CaloError as err:
            if args.model == "pipeline":
                raise SystemExit(str(err)) from None
    runs_path = args.out_dir / "ttq_live_runs.json"
    config = live_config(args, settings, device, model_source)
    done = saved_runs(runs_path, config)
    if done:
        print(f"live: resuming, {len(done)} runs already saved in {runs_path}", flush=True)
    total = len(workloads) * args.seeds * len(MAIN)
    finished = sum(f"{w} {m} {s}" in done for w in workloads for m in MAIN
                   for s in range(args.seeds))
    pending = total - finished
    donors = None
    if pending and not model_source.startswith("pipeline"):
        cwd = Path.cwd()
        donors = calo_models(settings, work, {"evidential": args.donors},
                             args.donors_dir)["evidential"]
        os.chdir(cwd)
    print(f"live: tuning {len(workloads)} workloads x {args.seeds} seeds on {device} with the "
          f"{model_source}, {args.budget} trials a run; {pending} of {total} runs to go",
          flush=True)
    for workload in workloads:
        ran = False
        for seed in range(args.seeds):
            seeded = settings.override({"tune.seed": seed})
            for method in MAIN:
                key = f"{workload} {method} {seed}"
                if key in done:
                    continue
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
                done[key] = {k: run[k] for k in ("curve", "seconds", "wall_s", "trials")}
                save_runs(runs_path, config, done)
                finished, ran = finished + 1, True
                print(f"[{finished}/{total}] {workload:<26}{method:<15}seed {seed}: best "
                      f"{run['curve'][-1] * 1e6:.1f} us after {run['trials']} trials, "
                      f"{run['wall_s']:.0f} s", flush=True)
        if ran:  # a report after every workload that measured: an interruption keeps one
            write_report(args, live_report(done, workloads, args.seeds, args.budget, device,
                                           model_source))
    return live_report(done, workloads, args.seeds, args.budget, device, model_source)


def saved_live_report(args) -> dict:
    """The report of the live runs saved in --out-dir, made from the runs file alone: the
    figures and plots of a benchmark whose code, donors or machine are not here any more
    (the runs file names them)."""
    path = args.out_dir / "ttq_live_runs.json"
    if not path.exists():
        raise SystemExit(f"{path}: no saved live runs to report on")
    saved = json.loads(path.read_text())
    config = saved.get("config") if isinstance(saved, dict) else None
    if not config or "runs" not in saved:
        raise SystemExit(f"{path}: not a live benchmark's runs file (no config and runs)")
    return live_report(saved["runs"], args.workload or LIVE_WORKLOADS, args.seeds,
                       config["budget"], config["device"], config["model"])


def write_report(args, report: dict) -> Path:
    """ttq_<mode>.json and the best-so-far PNG against trials (and, live, against seconds)."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report = dict(report)
    plots.best_so_far(args.out_dir / f"ttq_{args.mode}.png", report.pop("curves"),
                      f"TTQ {args.mode}: mean best-so-far / oracle",
                      ylabel="best latency so far / oracle")
    if "time_curves" in report:
        plots.latency_over_time(args.out_dir / f"ttq_{args.mode}_time.png",
                                report.pop("time_curves"),
                                f"TTQ {args.mode}: mean best-so-far / oracle over seeds",
                                ylabel="best latency so far / oracle")
    out = args.out_dir / f"ttq_{args.mode}.json"
    out.write_text(json.dumps(report, indent=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("replay", "live"), required=True)
    parser.add_argument("--pool", type=Path, help="replay: TVM database dir or .tar.gz")
    parser.add_argument("--min-pool", type=int, default=1000)
    parser.add_argument("--workload", action="append", help="live: workloads (default: "
                        "LIVE_WORKLOADS, three at the suite's shapes and three unseen)")
    parser.add_argument("--seeds", type=int, default=None, help="10 replay, 5 live")
    parser.add_argument("--budget", type=int, default=None, help="trials: 160 replay, 200 live")
    parser.add_argument("--ablation-seeds", type=int, default=5)
    parser.add_argument("--donors", type=int, default=None,
                        help="donor models, one per training seed (default: one per seed)")
    parser.add_argument("--model", choices=("auto", "pipeline", "donors"), default="auto",
                        help="live: the pipeline's model of the first target device, donors "
                             "trained on the committed pool, or the first when there is one")
    parser.add_argument("--donors-dir", type=Path, default=None,
                        help="keep the donor models here and reuse them when run again "
                             "(a resumed live run needs no retraining)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--kappas", type=float, nargs="*", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results")
    parser.add_argument("--report-only", action="store_true",
                        help="live: write the report and plots from the runs saved in "
                             "--out-dir, running nothing")
    args = parser.parse_args()
    args.seeds = args.seeds or (10 if args.mode == "replay" else 5)
    args.budget = args.budget or (160 if args.mode == "replay" else 200)
    # Given its donor, a replay run hardly depends on the tuning seed (ties and update batches
    # only): one donor per seed makes the seeds independent samples for Welch's test.
    args.donors = args.donors or args.seeds
    if args.mode == "replay" and args.pool is None:
        parser.error("--mode replay needs --pool")
    if args.report_only and args.mode != "live":
        parser.error("--report-only reports saved live runs: use it with --mode live")
    args.out_dir = args.out_dir.resolve()
    if args.pool is not None:
        args.pool = args.pool.resolve()
    if args.donors_dir is not None:  # training runs in a work directory of its own
        args.donors_dir = args.donors_dir.resolve()
    settings = load_settings(Path("params.yaml").resolve())
    if args.report_only:
        report = saved_live_report(args)
    else:
        work = Path(tempfile.mkdtemp(prefix="calo-ttq-"))
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
        try:
            report = (run_replay if args.mode == "replay" else run_live)(args, settings, work)
        finally:
            if args.mode == "replay":  # nothing there outlives the run (--donors-dir: donors)
                os.chdir(ROOT.parent)
                shutil.rmtree(work, ignore_errors=True)
    out = write_report(args, report)
    if args.mode == "replay":
        print(f"\ngeo-mean TTQ ratio (CALO / XGBoost): {report['geomean_ttq_ratio']:.3f}")
        for name, ratio in report["ablations"].items():
            print(f"  ablation {name:<16} geo-mean ratio vs XGBoost {ratio:.3f}")
    else:
        for unit in ("trials", "seconds", "seconds_even_censoring"):
            if f"ttq_{unit}" in report:
                row = report[f"ttq_{unit}"]
                print(f"geo-mean TTQ ratio in {unit.replace('_', ' ')}: "
                      f"{row['geomean_ratio_vs_xgb']:.3f} vs "
                      f"XGBoost, {row['geomean_ratio_vs_xgb_no_warmup']:.3f} vs XGBoost "
                      f"without warm-up; CALO faster on {row['calo_faster_than_xgb']} of "
                      f"{len(row['per_workload'])} workloads")
        for workload, by in report.get("reached_quality", {}).items():
            print(f"  {workload}: runs within {QUALITY:.0%} of the best, "
                  + ", ".join(f"{m} {n}/{args.seeds}" for m, n in by.items()))
        if "tuning_seconds" in report:
            print(f"tuning wall time CALO / XGBoost: "
                  f"{report['tuning_seconds_ratio_calo_vs_xgb']:.2f}")
        if not args.report_only:
            print(f"tuning databases kept in {work} (benchmarks/live_ranking.py reads them)")
    print(f"wrote {out} and its PNG")

if __name__ == "__main__":
    main()
