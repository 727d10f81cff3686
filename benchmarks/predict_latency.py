"""Cost-model prediction latency inside the search: CALO-GNN's predict vs TVM's XGBModel.predict.

Both score the same populations of 512 Meta-Schedule candidates of one task (random samples of
its design space, post-processed as the search sees them), featurization included: what one
generation of the evolutionary search costs. Every repetition uses a fresh population, so no
cache of earlier candidates helps either model. XGBModel is trained on the task's measured
records from benchmarks/data (it predicts at random until trained); our model's weights do not
change its cost. Run from the repository root:

    python benchmarks/predict_latency.py [--workload gelu-mlp] [--population 512] [--repeat 7]
                                          [--compile] [--model DIR]

Prints both medians, their ratio and CALO's breakdown (graph extraction vs batching + forward),
with the native schedule-graph walker (calo.native, as a search uses it) and with the Python
walker it replaces, in the same run, and whether their scores are the same;
with the residual correction a search fits once it has measured enough (here fitted on the
task's measured records), its cost when it scores every candidate and when it scores only the
network's best `tune.correct_top` (the drafts), and the share of the first's top-16 the drafts
keep; then the forward alone in the variants one could run instead (per-relation SAGEConv calls,
bf16/fp16 autocast, and with --compile torch.compile), each with its ranking's Kendall tau vs
the fp32 forward. Last, a draft-then-verify path measured but not used in tuning: a draft
scorer reads each candidate's trace decisions (tile factors, categorical choices) and boosted
trees fitted to the network's scores of the warm-up population rank them; the network scores
only the drafts' best k. It reports what reading the decisions costs (the floor of any scorer
that reads them), the whole path's cost and the share of the network's top-16 it keeps.
Writes benchmarks/results/predict_latency.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # once, outside any timing

import numpy as np  # noqa: E402
import torch  # noqa: E402
import xgboost  # noqa: E402
from harvest_pools import unpack  # noqa: E402
from scipy import stats  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from calo import native, records  # noqa: E402
from calo.artifact import TrainedModel  # noqa: E402
from calo.baselines import train_on, xgb_model  # noqa: E402
from calo.config import load_settings  # noqa: E402
from calo.correction import fit_correction  # noqa: E402
from calo.costmodel import CaloCostModel  # noqa: E402
from calo.dataset import collate  # noqa: E402
from calo.devices import make_target  # noqa: E402
from calo.graphs import graph_set, of_candidates, union_of_candidates  # noqa: E402
from calo.workloads import create_mod  # noqa: E402

ROOT = Path(__file__).resolve().parent
POOL = ROOT / "data" / "suite-cpu-host.tar.gz"
DRAFT_KEEP = (32, 64)   # candidates the network verifies in the draft-then-verify path


def populations(ctx: ms.TuneContext, size: int, count: int) -> list[list]:
    """`count` populations of `size` random candidates (post-processed), sampled up front."""
    ctx.pre_tuning(max_trials=size * count, num_trials_per_iter=size,
                   design_spaces=ctx.generate_design_space(), database=ms.database.MemoryDatabase(),
                   cost_model=None)
    out = []
    while len(out) < count and (batch := ctx.generate_measure_candidates()):
        out.append(list(batch))
    ctx.post_tuning()
    if len(out) < count:
        raise SystemExit(f"the design space gave {len(out)} populations of {size}, not {count}")
    return out


def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


@torch.inference_mode()
def forward_variants(model: torch.nn.Module, batches: list[tuple], compile_too: bool) -> dict:
    """The forward alone, as used (fp32, fused relations) and as the alternatives would run it."""
    def per_relation(*batch):
        model.fuse_relations = False
        try:
            return model(*batch)
        finally:
            model.fuse_relations = True

    def autocast(dtype):
        def run(*batch):
            with torch.autocast("cpu", dtype=dtype):
                return model(*batch)
        return run

    variants = {"fp32 (used)": model, "fp32 per-relation": per_relation,
                "bf16 autocast": autocast(torch.bfloat16),
                "fp16 autocast": autocast(torch.float16)}
    out = {}
    if compile_too:
        start = time.perf_counter()
        compiled = torch.compile(model, dynamic=True)
        compiled(*batches[0])
        variants["torch.compile"] = compiled
        out["torch.compile"] = {"compile_s": time.perf_counter() - start}
    reference = [model(*b).gamma for b in batches]
    for name, fn in variants.items():
        fn(*batches[0])  # warm-up
        times = [time_ms(lambda b=b, fn=fn: fn(*b)) for b in batches]
        tau = statistics.mean(stats.kendalltau(fn(*b).gamma.float(), ref)[0]
                              for b, ref in zip(batches, reference))
        out[name] = {**out.get(name, {}), "median_ms": statistics.median(times),
                     "tau_vs_fp32": float(tau)}
    return out


def graphs(trained: TrainedModel, ctx: ms.TuneContext, pop: list):
    """What scoring a population extracts: the native walker's concatenated graphs, or the
    Python walker's graphs one candidate at a time where it is off."""
    return (union_of_candidates(trained.graph_kind, ctx.target, pop)
            or of_candidates(trained.graph_kind, ctx.mod, ctx.target, pop))


def decisions(candidates: list, width: int | None = None) -> np.ndarray:
    """Each candidate's sampled decisions in trace order, one row each (log2 tile factors,
    categorical and compute-location indices), `width` columns (default: the longest trace's;
    shorter rows padded with NaN, longer ones cut)."""
    rows = []
    for cand in candidates:
        row = []
        for value in cand.sch.trace.decisions.values():
            if isinstance(value, int):
                row.append(float(value))
            else:
                row.extend(math.log2(max(int(v), 1)) for v in value)
        rows.append(row)
    out = np.full((len(rows), width or max(map(len, rows))), np.nan, dtype=np.float32)
    for i, row in enumerate(rows):
        row = row[:out.shape[1]]
        out[i, :len(row)] = row
    return out


def draft_then_verify(calo: CaloCostModel, ctx, pops: list[list], scores: list[np.ndarray]
                      ) -> dict:
    """The draft-then-verify path on pops[1:], its draft fitted to the network's bounds of
    pops[0]; scores are the network's full scores of each population (what the search ranks:
    the bound is -log score)."""
    draft = xgboost.XGBRegressor(n_estimators=100, max_depth=6, learning_rate=0.2, n_jobs=1)
    draft.fit(decisions(pops[0]), -np.log(scores[0]))
    times: dict[str, list[float]] = {"decisions": [], "draft": [],
                                     **{f"verify_{k}": [] for k in DRAFT_KEEP}}
    kept: dict[int, list[float]] = {k: [] for k in DRAFT_KEEP}
    for pop, score in zip(pops[1:], scores[1:]):
        start = time.perf_counter()
        features = decisions(pop, draft.n_features_in_)  # the columns the draft was fitted on
        times["decisions"].append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        order = np.argsort(draft.predict(features), kind="stable")
        times["draft"].append((time.perf_counter() - start) * 1e3)
        full = set(np.argsort(-score, kind="stable")[:16])
        for k in DRAFT_KEEP:
            chosen = [pop[i] for i in order[:k]]
            times[f"verify_{k}"].append(time_ms(lambda c=chosen: calo.predict(ctx, c)))
            kept[k].append(len(full & set(order[:k])) / 16)
    med = {name: statistics.median(v) for name, v in times.items()}
    return {"decisions_ms": med["decisions"], "draft_predict_ms": med["draft"],
            "path_ms": {k: med["decisions"] + med["draft"] + med[f"verify_{k}"]
                        for k in DRAFT_KEEP},
            "keeps_top16": {k: statistics.mean(v) for k, v in kept.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gelu-mlp")
    parser.add_argument("--population", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile'd forward (compiling takes ~30 s)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a saved model (default: untrained weights, which cost the same; "
                             "a trained one makes the drafts' top-16 share meaningful)")
    parser.add_argument("--correct-top", type=int, default=None,
                        help="drafts the correction scores (default: params.yaml tune.correct_top)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "predict_latency.json")
    args = parser.parse_args()
    settings = load_settings(Path("params.yaml").resolve())
    if args.correct_top is not None:
        settings = settings.override({"tune.correct_top": args.correct_top})
    target = make_target(settings.device(settings.donor))
    mod = create_mod(settings.workload(args.workload))
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy="replay-trace", task_name=args.workload, rand_state=0,
                         num_threads=os.cpu_count() or 1)
    pops = populations(ctx, args.population, args.repeat + 1)   # +1: warm-up call, untimed

    with tempfile.TemporaryDirectory() as tmp:
        measured = [r for r in records.iter_records(unpack(POOL, Path(tmp)))
                    if r.workload_name == args.workload and r.latency is not None]
    xgb = train_on(xgb_model(os.cpu_count() or 1), ctx, measured)
    trained = TrainedModel.load(args.model.resolve()) if args.model else TrainedModel.new(settings)
    trained.net.eval()
    model = trained.net
    calo = CaloCostModel.from_settings(trained, settings, update_steps=0)
    python_calo = CaloCostModel.from_settings(trained, settings, update_steps=0)
    # With the correction a search refits once it has measured enough: fitted here on the
    # task's measured records, scoring every candidate or only the network's best drafts.
    last = settings.finetune.rule[-1]
    corrected = copy.deepcopy(trained)
    corrected.correction = fit_correction(
        corrected.net, settings.finetune.correction, last.correction,
        graph_set(trained.graph_kind, measured, stores=True).graphs,
        [str(ctx.task_name)] * len(measured), settings.train.seed, last.blend)
    variants = {"calo": calo}
    full, fast = "calo_corrected_all", f"calo_corrected_top{settings.tune.correct_top}"
    if corrected.correction is not None:
        for name, top in ((full, 0), (fast, settings.tune.correct_top)):
            variants[name] = CaloCostModel.from_settings(corrected, settings, update_steps=0,
                                                         correct_top=top, trees=True)

    first = {name: scorer.predict(ctx, pops[0])  # first calls pay one-time costs
             for name, scorer in (*variants.items(), ("xgb", xgb))}
    with native.off():  # the same first call: its best bound is the reference of the scores
        python_calo.predict(ctx, pops[0])
    calo_scores = [first["calo"]]   # the network's full scores of each population
    times: dict[str, list[float]] = {**{k: [] for k in variants}, "calo_graphs": [],
                                     "calo_python_walker": [], "calo_python_graphs": [],
                                     "xgb": []}
    kept = []   # share of the fully corrected top-16 that the drafts' scoring keeps
    python_same = True   # the Python walker's scores equal the native one's
    for pop in pops[1:]:
        scores = {}
        for name, scorer in variants.items():
            start = time.perf_counter()
            scores[name] = scorer.predict(ctx, pop)
            times[name].append((time.perf_counter() - start) * 1e3)
        calo_scores.append(scores["calo"])
        times["calo_graphs"].append(time_ms(lambda pop=pop: graphs(trained, ctx, pop)))
        with native.off():
            start = time.perf_counter()
            python_same &= bool(np.array_equal(python_calo.predict(ctx, pop), scores["calo"]))
            times["calo_python_walker"].append((time.perf_counter() - start) * 1e3)
            times["calo_python_graphs"].append(time_ms(lambda pop=pop: graphs(trained, ctx, pop)))
        times["xgb"].append(time_ms(lambda pop=pop: xgb.predict(ctx, pop)))
        if fast in scores:
            top16 = {n: set(np.argsort(-scores[n], kind="stable")[:16]) for n in (full, fast)}
            kept.append(len(top16[full] & top16[fast]) / 16)
    med = {k: statistics.median(v) for k, v in times.items()}
    forward = forward_variants(model, [collate(calo.featurize(ctx, pop)) for pop in pops[1:]],
                               args.compile)
    drafts = draft_then_verify(calo, ctx, pops, calo_scores)
    result = {
        "workload": args.workload, "population": args.population, "repeat": args.repeat,
        "graph_kind": trained.graph_kind, "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "xgb_trained_on": len(measured),
        "walker": "native" if native.walker() is not None else "python",
        "calo": {"median_ms": med["calo"], "graphs_median_ms": med["calo_graphs"],
                 "times_ms": times["calo"]},
        "calo_python_walker": {"median_ms": med["calo_python_walker"],
                               "graphs_median_ms": med["calo_python_graphs"],
                               "same_scores": python_same,
                               "times_ms": times["calo_python_walker"]},
        "xgb": {"median_ms": med["xgb"], "times_ms": times["xgb"]},
        "ratio_calo_vs_xgb": med["calo"] / med["xgb"],
        "model": str(args.model) if args.model else "untrained",
        "corrected": {name: {"median_ms": med[name], "ratio_vs_xgb": med[name] / med["xgb"],
                             "times_ms": times[name]}
                      for name in variants if name != "calo"},
        "drafts_keep_top16": statistics.mean(kept) if kept else None,
        "forward_variants": forward,
        "draft_then_verify": drafts,
        "budget_ms": 20.0,
    }
    print(f"{args.population} candidates of {args.workload}, median of {args.repeat} fresh "
          f"populations on {os.cpu_count()} CPU cores:")
    for name, graphs_ms, label in (
            ("calo", med["calo_graphs"], f"calo ({result['walker']} walker)"),
            ("calo_python_walker", med["calo_python_graphs"], "calo (Python walker)")):
        print(f"  {label:<24}{med[name]:8.1f} ms  (graphs {graphs_ms:.1f} ms, batching + "
              f"forward {med[name] - graphs_ms:.1f} ms)")
    print(f"  {'xgb':<24}{med['xgb']:8.1f} ms")
    print(f"  the two walkers' scores are {'the same' if python_same else 'DIFFERENT'}")
    for name, row in result["corrected"].items():
        print(f"  {name:<24}{row['median_ms']:8.1f} ms ({row['ratio_vs_xgb']:.2f}x xgb)")
    if kept:
        print(f"  the drafts keep {result['drafts_keep_top16']:.0%} of the fully corrected "
              "top-16")
    print(f"  ratio calo / xgb = {result['ratio_calo_vs_xgb']:.2f}; budget 20 ms: "
          f"{'met' if med['calo'] <= 20 else 'missed by %.1f ms' % (med['calo'] - 20)}")
    print("  forward alone (same batches), and how far each variant's ranking is from fp32's:")
    for name, row in forward.items():
        print(f"    {name:<22}{row['median_ms']:7.1f} ms   Kendall tau vs fp32 "
              f"{row['tau_vs_fp32']:.3f}" + (f"   (compiling: {row['compile_s']:.0f} s)"
                                             if "compile_s" in row else ""))
    print(f"  draft-then-verify (not used in tuning): reading the trace decisions "
          f"{drafts['decisions_ms']:.1f} ms, the draft's trees {drafts['draft_predict_ms']:.1f} ms")
    for k in DRAFT_KEEP:
        print(f"    network verifies the best {k}: {drafts['path_ms'][k]:6.1f} ms in all, keeps "
              f"{drafts['keeps_top16'][k]:.0%} of full scoring's top-16")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
