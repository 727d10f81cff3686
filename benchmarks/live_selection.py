"""Choose a search setting by live tuning runs of CALO alone, on workloads the live benchmark
does not judge.

Each variant is params.yaml with `--set SECTION.KEY=VALUE` overrides (none: params.yaml as it
is). A run is `ttq.py --mode live`'s CALO run: the same donors (tuning seed s uses donor
s % 5, from --donors-dir), tune_tir, budget and device. Runs save as they end, keyed by
workload, variant and seed, so a second start goes on with the missing ones; a variant name
saved with other overrides is refused. The report compares every variant with --baseline, seed
by seed: each run's final best and trials to within 5% of the best any run of the workload
found, and a sign test over the (workload, seed) pairs. Run from the repository root:

    python benchmarks/live_selection.py --variant NAME [--set K=V ...] [--workload W ...]
                                        [--seeds 5] [--donors-dir DIR]
    python benchmarks/live_selection.py --report [--baseline NAME]

Writes benchmarks/results/live_selection_runs.json (the runs) and live_selection.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harvest_pools import overrides  # noqa: E402
from ttq import (  # noqa: E402
    calo_models,
    donor_recipe,
    live_settings,
    make_calo,
    save_runs,
    saved_runs,
    ttq,
)

from calo.config import load_settings  # noqa: E402
from calo.costmodel import CaloCostModel  # noqa: E402
from calo.environment import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent
# A suite shape the donor has records of and an operator it has none of; neither is among the
# live benchmark's workloads (ttq.LIVE_WORKLOADS), which judge the setting chosen here.
SELECTION_WORKLOADS = ["matmul-relu", "transpose-batch-matmul@96x6x48"]
BUDGET = 200
DONORS = 5


def run_variants(args, runs_path: Path) -> None:
    from calo.tasks.tune import run_tuner

    base = load_settings(Path("params.yaml").resolve())
    config = {"machine": machine(), "budget": BUDGET, "model_recipe": donor_recipe(base)}
    config = json.loads(json.dumps(config))
    done = saved_runs(runs_path, config)
    variants = json.loads(runs_path.read_text()).get("variants", {}) if done else {}
    changes = overrides(args.set or [])
    if variants.get(args.variant, changes) != changes:
        raise SystemExit(f"variant '{args.variant}' was run with {variants[args.variant]}, "
                         f"not {changes}: give it another name")
    variants[args.variant] = changes
    tuned = live_settings(base, BUDGET, changes)
    work = Path(tempfile.mkdtemp(prefix="calo-selection-"))
    cwd = Path.cwd()
    donors = calo_models(base, work, {"evidential": DONORS}, args.donors_dir)["evidential"]
    os.chdir(cwd)  # training the donors runs in the work directory
    for seed in range(args.seeds):  # seeds outermost: a stop leaves every workload compared
        for workload in args.workload or SELECTION_WORKLOADS:
            key = f"{workload} {args.variant} {seed}"
            if key in done:
                continue
            settings = tuned.override({"tune.seed": seed})
            model = make_calo(settings, donors[seed % DONORS], cls=CaloCostModel, seed=seed)
            run = run_tuner(settings, settings.targets[0], workload, model,
                            work / workload / f"{args.variant}-{seed}")
            done[key] = {k: run[k] for k in ("curve", "seconds", "wall_s", "trials")}
            save_runs(runs_path, config, done, variants=variants)
            print(f"{key}: best {run['curve'][-1] * 1e6:.1f} us after {run['trials']} trials, "
                  f"{run['wall_s']:.0f} s", flush=True)


def report(runs: dict[str, dict], variants: dict, baseline: str) -> dict:
    """Per workload and variant: each seed's final best / the workload's best and trials to
    quality; per variant, the pairs (workload, seed) it ended ahead of the baseline on."""
    by: dict[str, dict[str, dict[int, dict]]] = {}
    for key, run in runs.items():
        workload, variant, seed = key.rsplit(" ", 2)
        by.setdefault(workload, {}).setdefault(variant, {})[int(seed)] = run
    per_workload, pairs = {}, {}
    for workload, of in sorted(by.items()):
        best = min(min(r["curve"]) for seeds in of.values() for r in seeds.values())
        rows = {}
        for variant, seeds in sorted(of.items()):
            final = {s: r["curve"][-1] / best for s, r in sorted(seeds.items())}
            reach = {s: ttq(r["curve"], best, BUDGET)
                     for s, r in sorted(seeds.items())}
            rows[variant] = {"final_over_best": final, "trials_to_quality": reach,
                             "geomean_final_over_best": float(np.exp(np.mean(np.log(
                                 list(final.values())))))}
            if variant != baseline and baseline in of:
                for s in set(seeds) & set(of[baseline]):
                    ours, theirs = seeds[s]["curve"][-1], of[baseline][s]["curve"][-1]
                    if ours != theirs:
                        pairs.setdefault(variant, []).append(ours < theirs)
        per_workload[workload] = {"best_us": best * 1e6, "variants": rows}
    versus = {v: {"pairs": len(w), "ahead": int(sum(w)),
                  "sign_test_p": float(stats.binomtest(int(sum(w)), len(w)).pvalue)}
              for v, w in pairs.items()}
    return {"baseline": baseline, "budget": BUDGET, "variants": variants,
            "per_workload": per_workload, "versus_baseline": versus}


def print_report(rep: dict) -> None:
    for workload, row in rep["per_workload"].items():
        print(f"{workload} (best {row['best_us']:.1f} us): final best / best, per seed; "
              "trials to within 5% of it")
        for variant, r in row["variants"].items():
            finals = " ".join(f"{x:.3f}" for x in r["final_over_best"].values())
            reach = " ".join(str(x) for x in r["trials_to_quality"].values())
            print(f"  {variant:<12} {finals}  (geo-mean {r['geomean_final_over_best']:.3f}); "
                  f"{reach}")
    for variant, v in rep["versus_baseline"].items():
        print(f"{variant} ended ahead of {rep['baseline']} in {v['ahead']} of {v['pairs']} "
              f"(workload, seed) pairs, sign test p = {v['sign_test_p']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", help="a name for params.yaml with the --set overrides")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE")
    parser.add_argument("--workload", action="append")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--donors-dir", type=Path)
    parser.add_argument("--report", action="store_true", help="only report the saved runs")
    parser.add_argument("--baseline", default="params")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    if not args.report and not args.variant:
        parser.error("name the variant to run (--variant), or ask for --report")
    runs_path = args.out_dir.resolve() / "live_selection_runs.json"
    if args.donors_dir is not None:
        args.donors_dir = args.donors_dir.resolve()
    if not args.report:
        run_variants(args, runs_path)
    if not runs_path.exists():
        raise SystemExit(f"no runs saved in {runs_path} yet: run a --variant first")
    saved = json.loads(runs_path.read_text())
    rep = report(saved["runs"], saved.get("variants", {}), args.baseline)
    print_report(rep)
    out = runs_path.with_name("live_selection.json")
    out.write_text(json.dumps(rep, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
