"""How noisy the latency labels are, and how far that noise alone moves the ranking metrics.

Every record measured with repeated runs (harvest.repeat >= 2) keeps them all. Per workload,
this ranks the candidates by one run and scores that ranking against the label (the mean of the
runs) with the metrics the evaluations use (Kendall tau, top-1, top-5): what a perfect model of
a single measurement would score, the ceiling noise puts on any cost model. It also reports the
spread of the repeated runs ((slowest - fastest) / mean) and how many records a given
`labels.max_spread` would drop. Run from the repository root:

    python benchmarks/label_noise.py [--pool DIR | --pool benchmarks/data/suite-cpu-host.tar.gz]

Writes benchmarks/results/label_noise.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from harvest_pools import unpack

from calo import records
from calo.evaluation import ranking

ROOT = Path(__file__).resolve().parent
POOL = ROOT / "data" / "suite-cpu-host.tar.gz"
MIN_CANDIDATES = 8          # workloads with fewer repeated-run records are left out
THRESHOLDS = (0.05, 0.1, 0.25, 0.5)


def runs_by_workload(store: Path) -> dict[str, np.ndarray]:
    """Per workload, a (candidates, runs) array of the records measured with repeated runs."""
    out: dict[str, list] = {}
    for rec in records.iter_records(store):
        secs = [float(s) for s in rec.record.run_secs]
        if rec.latency is not None and len(secs) >= 2:
            out.setdefault(rec.workload_name, []).append(secs[:3])
    return {name: np.array(rows) for name, rows in out.items()
            if len(rows) >= MIN_CANDIDATES and len({len(r) for r in rows}) == 1}


def noise_ceiling(runs: np.ndarray) -> dict[str, float]:
    """Ranking by each single run, scored against the mean of the runs; averaged over runs."""
    label = runs.mean(axis=1)
    scores = [ranking(label, runs[:, i]) for i in range(runs.shape[1])]
    return {k: float(np.mean([s[k] for s in scores])) for k in ("kendall_tau", "top1", "top5")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default=str(POOL),
                        help="a TVM JSON database directory, or a packed pool (.tar.gz)")
    parser.add_argument("--out", default=str(ROOT / "results" / "label_noise.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pool = Path(args.pool)
        store = unpack(pool, Path(tmp)) if pool.is_file() else pool
        groups = runs_by_workload(store)
    if not groups:
        raise SystemExit(f"{args.pool}: no workload has {MIN_CANDIDATES} records with repeated "
                         "runs (harvest with harvest.repeat >= 2)")
    spreads = np.concatenate([(g.max(1) - g.min(1)) / g.mean(1) for g in groups.values()])
    per_workload = {name: {"candidates": len(g), **noise_ceiling(g)}
                    for name, g in sorted(groups.items())}
    ceiling = {k: float(np.mean([w[k] for w in per_workload.values()]))
               for k in ("kendall_tau", "top1", "top5")}
    result = {
        "pool": str(args.pool), "workloads": len(groups), "records": int(len(spreads)),
        "spread": {"median": float(np.median(spreads)), "p90": float(np.quantile(spreads, 0.9)),
                   "max": float(spreads.max())},
        "dropped_at_max_spread": {str(t): int((spreads > t).sum()) for t in THRESHOLDS},
        "single_run_vs_label": ceiling, "per_workload": per_workload,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{result['records']} records of {result['workloads']} workloads with repeated runs")
    print("spread (slowest - fastest) / mean: median {median:.3f}, p90 {p90:.3f}, "
          "max {max:.3f}".format(**result["spread"]))
    print("records a labels.max_spread would drop: " + ", ".join(
        f"{t}: {n}" for t, n in result["dropped_at_max_spread"].items()))
    print("one run ranked against the label, mean over workloads: Kendall tau "
          "{kendall_tau:.3f}, top-1 {top1:.3f}, top-5 {top5:.3f}".format(**ceiling))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
