"""How noisy the latency labels are, and how far that noise alone moves the ranking metrics.

Every record measured with repeated runs (harvest.repeat >= 2) keeps them all. Per workload,
this ranks the candidates by one run and scores that ranking against the label (the mean of the
runs) with the metrics the evaluations use (Kendall tau, top-1, top-5): how far the noise of
one measurement moves them. The run is part of that label; scored against the mean of the
other runs alone (`single_run_vs_other_runs`), its own run's noise is shared with nothing. That
is no floor on what a model that knew each candidate's latency would score: the runs of one
measurement share the machine's state at that moment, and a candidate measured again later
moves further (`remeasure.py` measures how far).
Both are also given per candidate source (random samples, evolved candidates: the fast region
a search visits, where the order is finest), for workloads with enough records of it. It also
reports the spread of the repeated runs ((slowest - fastest) / mean) and how many records a
given `labels.max_spread` would drop. Run from the repository root:

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
KEYS = ("kendall_tau", "top1", "top5")
SOURCES = ("random", "evolved")
FIGURES = ("single_run_vs_label", "single_run_vs_other_runs")  # single_run_scores's two


def runs_by_workload(store: Path) -> dict[tuple[str, str], list[list[float]]]:
    """Per workload and candidate source, the repeated runs of each record measured with them."""
    out: dict[tuple[str, str], list] = {}
    for rec in records.iter_records(store):
        secs = [float(s) for s in rec.record.run_secs]
        if rec.latency is not None and len(secs) >= 2:
            out.setdefault((rec.workload_name, rec.source), []).append(secs[:3])
    return out


def runs_of(runs: dict[tuple[str, str], list], source: str | None = None
            ) -> dict[str, np.ndarray]:
    """Per workload, a (candidates, runs) array of its records (those of `source` alone, if
    given), for workloads with enough of them, all measured with the same number of runs."""
    out: dict[str, list] = {}
    for (name, src), rows in runs.items():
        if source in (None, src):
            out.setdefault(name, []).extend(rows)
    return {name: np.array(rows) for name, rows in out.items()
            if len(rows) >= MIN_CANDIDATES and len({len(r) for r in rows}) == 1}


def mean_scores(scores: list[dict]) -> dict[str, float]:
    """The ranking metrics averaged over several scorings."""
    return {k: float(np.mean([s[k] for s in scores])) for k in KEYS}


def single_run_scores(runs: np.ndarray) -> dict[str, dict[str, float]]:
    """Ranking by each single run, scored against the mean of all runs and against the mean
    of the other runs; each averaged over runs."""
    label = runs.mean(axis=1)
    single = [ranking(label, runs[:, i]) for i in range(runs.shape[1])]
    others = [ranking(np.delete(runs, i, axis=1).mean(axis=1), runs[:, i])
              for i in range(runs.shape[1])]
    return dict(zip(FIGURES, (mean_scores(single), mean_scores(others))))


def noise_figures(groups: dict[str, np.ndarray]) -> dict:
    """single_run_scores's figures per workload and averaged over the workloads."""
    per_workload = {name: {"candidates": len(g), **single_run_scores(g)}
                    for name, g in sorted(groups.items())}
    return {"workloads": len(groups),
            **{f: mean_scores([w[f] for w in per_workload.values()]) for f in FIGURES},
            "per_workload": per_workload}


def _line(scores: dict[str, float]) -> str:
    return "Kendall tau {kendall_tau:.3f}, top-1 {top1:.3f}, top-5 {top5:.3f}".format(**scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default=str(POOL),
                        help="a TVM JSON database directory, or a packed pool (.tar.gz)")
    parser.add_argument("--out", default=str(ROOT / "results" / "label_noise.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pool = Path(args.pool)
        store = unpack(pool, Path(tmp)) if pool.is_file() else pool
        runs = runs_by_workload(store)
    groups = runs_of(runs)
    by_source = {source: runs_of(runs, source) for source in SOURCES}
    if not groups:
        raise SystemExit(f"{args.pool}: no workload has {MIN_CANDIDATES} records with repeated "
                         "runs (harvest with harvest.repeat >= 2)")
    spreads = np.concatenate([(g.max(1) - g.min(1)) / g.mean(1) for g in groups.values()])
    overall = noise_figures(groups)
    result = {
        "pool": str(args.pool), "records": int(len(spreads)),
        "spread": {"median": float(np.median(spreads)), "p90": float(np.quantile(spreads, 0.9)),
                   "max": float(spreads.max())},
        "dropped_at_max_spread": {str(t): int((spreads > t).sum()) for t in THRESHOLDS},
        **overall,
        "by_source": {source: noise_figures(g) for source, g in by_source.items() if g},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{result['records']} records of {result['workloads']} workloads with repeated runs")
    print("spread (slowest - fastest) / mean: median {median:.3f}, p90 {p90:.3f}, "
          "max {max:.3f}".format(**result["spread"]))
    print("records a labels.max_spread would drop: " + ", ".join(
        f"{t}: {n}" for t, n in result["dropped_at_max_spread"].items()))
    print("one run ranked against the label (all runs' mean | the other runs'), mean over "
          "workloads:")
    for name, part in [("all candidates", overall), *result["by_source"].items()]:
        print(f"  {name}, {part['workloads']} workloads: {_line(part['single_run_vs_label'])}"
              f" | {_line(part['single_run_vs_other_runs'])}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
