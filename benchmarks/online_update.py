"""Replay time-to-quality at several online-update step counts (`tune.update_steps`).

The online update fine-tunes the tuning model on each round's measurements. Whether that helps
is measured here the way `ttq.py --mode replay` measures everything else: the same donors (one
per seed, kept in --donors-dir), the same replay, the same seeds, one run per step count, with
TVM's XGBoost as the yardstick. Runs save as they end and a second start resumes after them.

    python benchmarks/online_update.py --pool benchmarks/data/heldout-cpu-host.tar.gz \
        --min-pool 256 --steps 0 5 20 --donors-dir benchmarks/.donors

Other settings of the update are compared the same way, each a named variant of params.yaml
(`--variant NAME SECTION.KEY=VALUE ...`, values read as YAML), e.g. the fine-tune rule that the
update follows with a higher learning rate:

    python benchmarks/online_update.py --pool ... --steps 20 \
        --variant lr-x3 'finetune.rule=[{up_to: 16, layers: all, epochs: 10, lr: 1.0e-3, ...}]'
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harvest_pools import overrides  # noqa: E402
from ttq import (  # noqa: E402
    calo_models,
    load_pool,
    make_calo,
    pool_digest,
    replay_config,
    replay_runs,
    save_runs,
    saved_runs,
    summarize,
)

from calo.baselines import xgb_model  # noqa: E402
from calo.config import load_settings  # noqa: E402

ROOT = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=Path, required=True, help="TVM database dir or .tar.gz")
    parser.add_argument("--min-pool", type=int, default=256)
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 5, 20])
    parser.add_argument("--variant", nargs="+", action="append", default=[],
                        metavar=("NAME", "SECTION.KEY=VALUE"),
                        help="also replay params.yaml with these overrides, under NAME")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=160)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--donors-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: results/online_update_<pool name>.json")
    args = parser.parse_args()
    args.pool, args.donors, args.kappas = args.pool.resolve(), args.seeds, []
    name = args.pool.name.removesuffix(".tar.gz")
    out = (args.out or ROOT / "results" / f"online_update_{name}.json").resolve()
    runs_path = out.with_suffix(".runs.json")
    settings = load_settings(Path("params.yaml").resolve())
    variants = {name: settings.override(overrides(sets)) for name, *sets in args.variant}
    config = {**replay_config(args, settings), "steps": args.steps,
              **({"variants": args.variant} if args.variant else {})}
    done = saved_runs(runs_path, config, set_aside=True)
    pool = load_pool(args.pool, args.min_pool)
    work = Path(tempfile.mkdtemp(prefix="calo-online-update-"))
    cwd = Path.cwd()
    try:
        donors = calo_models(settings, work, {"evidential": args.seeds},
                             args.donors_dir and args.donors_dir.resolve())["evidential"]
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    methods = {f"steps={n}": (lambda s, n=n: make_calo(settings, donors[s], seed=s,
                                                       update_steps=n)) for n in args.steps}
    methods.update({name: (lambda s, v=v: make_calo(v, donors[s], seed=s))
                    for name, v in variants.items()})
    methods["xgb"] = lambda s: xgb_model(os.cpu_count() or 1, warmup=True)
    target = next(iter(pool.values()))[0].record.target
    total, fresh, started = len(pool) * len(methods) * args.seeds, 0, time.perf_counter()

    def saved(key: str) -> None:
        nonlocal fresh
        save_runs(runs_path, config, done)
        fresh += 1
        rate = fresh / (time.perf_counter() - started)
        print(f"[{len(done)}/{total}] {key}: {done[key]['ttq']} trials "
              f"({rate * 60:.1f} runs/min)", flush=True)

    ttqs: dict[str, dict[str, list[int]]] = {}
    for workload, method, runs, _ in replay_runs(pool, target, methods,
                                                 dict.fromkeys(methods, args.seeds),
                                                 args.batch, args.budget, done, saved):
        ttqs.setdefault(workload, {})[method] = [run["ttq"] for run in runs]
    summary = summarize(ttqs)
    report = {"pool": str(args.pool), "pool_digest": pool_digest(args.pool),
              "seeds": args.seeds, "budget": args.budget, "batch": args.batch, **summary}
    out.write_text(json.dumps(report, indent=1))
    print(f"\n{'workload':<32}" + "".join(f"{m:>12}" for m in methods))
    for workload, row in summary["per_workload"].items():
        print(f"{workload:<32}" + "".join(f"{row[m]['mean_ttq']:>12.1f}" for m in methods))
    print("geo-mean TTQ ratio vs XGBoost: " + ", ".join(
        f"{m} {r:.3f}" for m, r in summary["geomean_ratio_vs_xgb"].items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
