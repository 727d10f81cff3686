"""Measure a pool's candidates again, in sessions apart in time, and see how much order survives.

`label_noise.py` compares the repeated runs of one measurement: consecutive runs of one loaded
module, which share the machine's state at that moment (clock, cache, neighbours' load). A
search measures its candidates minutes apart, so a label also carries whatever changed in
between. This builds the chosen records of a pool (TVM JSON database or packed pool) for a
device of this machine and measures each in several sessions, one after another: in each, a
workload's candidates of one source are measured together, as a harvest measures them, in a
shuffled order (of the groups, and within each). Per workload and candidate source it reports
Kendall tau, top-1 and top-5 of one run ranked against

  within   the mean of the other runs of its own session (label_noise's figure, again here),
  between  the mean of another session's runs (the same candidate, measured at another time),
  pool     the pool's label (another session, and another machine where the pool was made
           elsewhere),
  between_averaged  (three sessions or more) the mean of all the other sessions: a label
           measured in several sessions.

Where `between` is far below `within`, a label holds less order than its repeats suggest. From
the same measurements it estimates what a model that knew each candidate's latency would reach
against one session's label and against the pool's (`perfect_model`, under a stated noise model).
Measurements append to OUT_DIR/runs.jsonl as they come, so an interrupted run resumes where it
stopped. Run from the repository root:

    python benchmarks/remeasure.py --pool benchmarks/data/POOL.tar.gz --device cpu-generic-1core \
        --source evolved [--workload W ...] --out-dir DIR

Writes DIR/remeasure.json (and prints the table); with --stores, DIR/sessionN/: the pool with
session N's runs as the measured-again records' labels, a TVM database any evaluation scores
(`offline_eval.py --held-out DIR/session0/POOL`).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
from harvest_pools import open_pool, overrides
from label_noise import KEYS, mean_scores, single_run_scores
from scipy import stats

from calo import measure, records
from calo.config import Settings, load_settings
from calo.devices import make_target
from calo.errors import CaloError
from calo.evaluation import ranking
from calo.log import Progress, get_logger

MIN_CANDIDATES = 8
LABELS = {"within": "the other runs of its session",  # figures(): what one run is ranked against
          "between": "another session",
          "between_averaged": "the other sessions, averaged",
          "pool": "the pool's label"}


def chosen(store: Path, source: str | None, workloads: list[str] | None) -> list:
    """The pool's successful records of `source` (all, if None), of `workloads` (all, if None)."""
    out = [r for r in records.iter_records(store)
           if r.latency is not None and source in (None, r.source)
           and (not workloads or r.workload_name in workloads)]
    what = f"successful {source} records" if source else "successful records"
    if workloads and (missing := set(workloads) - {r.workload_name for r in out}):
        raise CaloError(f"no {what} of {', '.join(sorted(missing))} in {store}")
    if not out:
        raise CaloError(f"no {what} in {store}")
    return out


def load_runs(file: Path) -> dict[tuple[int, int], dict]:
    """Measurements already made: (session, record index) -> line. A torn last line is dropped."""
    if not file.exists():
        return {}
    done = {}
    for line in records.complete_lines(file):
        row = json.loads(line)
        done[(row["session"], row["record"])] = row
    return done


def session_order(recs: list, seed: int) -> list:
    """A session's order: each workload's candidates of one source together, as a harvest
    measures them (so drift acts over the same stretch of time), the groups and the records in
    each shuffled, so no candidate keeps its place from one session to the next."""
    rng = np.random.default_rng(seed)
    groups: dict[tuple[str, str], list] = {}
    for rec in recs:
        groups.setdefault((rec.workload_name, rec.source), []).append(rec)
    keys = sorted(groups)
    return [groups[keys[g]][i] for g in rng.permutation(len(keys))
            for i in rng.permutation(len(groups[keys[g]]))]


def measure_sessions(settings: Settings, recs: list, device: str, sessions: int,
                     runs_file: Path, seed: int) -> None:
    """Measure every record once per session, sessions one after another."""
    dev, harvest = settings.devices[device], settings.harvest
    target = make_target(dev)
    records.recover_torn_tail(runs_file)  # an interrupted run's half-written line
    done = load_runs(runs_file)
    builder, runner = measure.make_builder(harvest), measure.make_runner(dev, harvest)
    try:
        for session in range(sessions):
            todo = [r for r in session_order(recs, seed + session)
                    if (session, r.index) not in done]
            if todo:
                get_logger().info(f"session {session}: {len(todo)} of {len(recs)} records "
                                  "to measure")
                measure_session(session, todo, builder, runner, target, harvest.batch_size,
                                runs_file)
    finally:
        measure.close_builder(builder)


def measure_session(session: int, todo: list, builder, runner, target, batch_size: int,
                    runs_file: Path) -> None:
    """Measure `todo` in batches, appending each result to runs_file as it comes."""
    progress = Progress(f"session {session}", len(todo), "records")
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]

        def keep(i: int, result, batch: list = batch) -> None:
            rec = batch[i]
            row = {"session": session, "record": rec.index, "workload": rec.workload_name,
                   "source": rec.source, "run_secs": [float(x) for x in result.run_secs or []],
                   "error": result.error_msg}
            with runs_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
            progress.advance()

        measure.measure(builder, runner, target, [r.record.as_measure_candidate() for r in batch],
                        keep)


def write_stores(store: Path, done: dict, sessions: int, out_dir: Path) -> list[Path]:
    """Per session, a copy of the pool whose measured-again records carry that session's runs
    as their label (the others keep the pool's): any evaluation then scores a model against
    another measurement of the same candidates (done: load_runs')."""
    lines = records.complete_lines(store / records.RECORD_FILE)
    out = []
    for session in range(sessions):
        dest = out_dir / f"session{session}" / store.name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(store, dest)
        with open(dest / records.RECORD_FILE, "w") as f:
            for index, line in enumerate(lines):
                row = done.get((session, index))
                if row and row["run_secs"]:
                    workload, body = json.loads(line)
                    body[1] = row["run_secs"]  # TVM's record: [trace, run_secs, target, args]
                    line = json.dumps([workload, body])
                f.write(line + "\n")
        out.append(dest)
    return out


def check_out_dir(out_dir: Path, what: dict) -> None:
    """Runs resume only into a directory of the same pool, device, selection and shuffles."""
    file = out_dir / "what.json"
    if file.exists() and (before := json.loads(file.read_text())) != what:
        changed = ", ".join(k for k in what if before.get(k) != what[k])
        raise SystemExit(f"{out_dir} holds measurements of another run (its {changed} differ: "
                         f"{before}); choose another --out-dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(what) + "\n")


def figures(runs: np.ndarray, pool_label: np.ndarray) -> dict[str, dict[str, float]]:
    """runs: (candidates, sessions, repeats). Each single run ranked against the other runs of
    its session, against each other session's mean, and against the pool's label."""
    n_sessions, n_repeats = runs.shape[1], runs.shape[2]
    means = runs.mean(axis=2)
    within, between, pool, averaged = [], [], [], []
    for s in range(n_sessions):
        within.append(single_run_scores(runs[:, s, :])["single_run_vs_other_runs"])
        others = np.delete(means, s, axis=1)
        for r in range(n_repeats):
            one = runs[:, s, r]
            pool.append(ranking(pool_label, one))
            between += [ranking(other, one) for other in others.T]
            if others.shape[1] >= 2:
                averaged.append(ranking(others.mean(axis=1), one))
    out = {"within": mean_scores(within), "between": mean_scores(between),
           "pool": mean_scores(pool)}
    if averaged:  # a label measured in several sessions, averaged
        out["between_averaged"] = mean_scores(averaged)
    return out


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation implied by Kendall's tau where the two are jointly Gaussian after
    a monotone map of each (Greiner's relation)."""
    return math.sin(math.pi / 2 * stats.kendalltau(a, b).statistic)


def correlations(runs: np.ndarray, pool_label: np.ndarray) -> dict[str, float]:
    """Rank-implied correlations of the session means: between two sessions, and of a session
    with the pool's label (each averaged over the pairs)."""
    means = runs.mean(axis=2)
    n = means.shape[1]
    return {"sessions": float(np.mean([_rank_correlation(means[:, i], means[:, j])
                                       for i in range(n) for j in range(i + 1, n)])),
            "session_pool": float(np.mean([_rank_correlation(means[:, i], pool_label)
                                           for i in range(n)]))}


def perfect_model(corr: dict[str, float]) -> dict[str, float]:
    """Kendall tau a model that knew each candidate's latency would reach against one session's
    label and against the pool's, if every label is that latency plus noise of its own
    (independent between sessions and Gaussian after ranks): a session's share of signal is
    the correlation of two sessions; the pool's follows from the session-to-pool correlation.
    Where the pool was measured on another CPU, whose order differs, that one reads low."""
    session, to_pool = corr["sessions"], corr["session_pool"]
    if session <= 0:
        return {"session_label": math.nan, "pool_label": math.nan}
    return {"session_label": _tau_of_share(session),
            "pool_label": _tau_of_share(max(to_pool, 0.0) ** 2 / session)}


def _tau_of_share(share: float) -> float:
    """Kendall tau between a latency and a label whose variance it explains `share` of."""
    return 2 / math.pi * math.asin(math.sqrt(min(max(share, 0.0), 1.0)))


def report(recs: list, done: dict, sessions: int, min_candidates: int = MIN_CANDIDATES) -> dict:
    """figures per workload and source (those with min_candidates records measured in every
    session of `done`, load_runs'), and averaged per source."""
    groups: dict[tuple[str, str], list] = {}
    for rec in recs:
        rows = [done.get((s, rec.index)) for s in range(sessions)]
        secs = [row["run_secs"] for row in rows if row and row["run_secs"]]
        if len(secs) == sessions and len({len(s) for s in secs}) == 1 and len(secs[0]) >= 2:
            groups.setdefault((rec.workload_name, rec.source), []).append((secs, rec.latency))
    per_workload = {}
    for (name, source), rows in sorted(groups.items()):
        if len(rows) >= min_candidates:
            runs = np.array([secs for secs, _ in rows])
            label = np.array([lat for _, lat in rows])
            per_workload[f"{name} ({source})"] = {
                "candidates": len(rows), "source": source, **figures(runs, label),
                "correlations": correlations(runs, label)}
    by_source = {}
    for source in sorted({w["source"] for w in per_workload.values()}):
        mine = [w for w in per_workload.values() if w["source"] == source]
        corr = {k: float(np.mean([w["correlations"][k] for w in mine]))
                for k in ("sessions", "session_pool")}
        by_source[source] = {"workloads": len(mine),
                             **{f: mean_scores([w[f] for w in mine])
                                for f in LABELS if f in mine[0]},
                             "correlations": corr,
                             # from the mean correlations: one workload's are too few to
                             # divide by
                             "perfect_model_tau": perfect_model(corr)}
    return {"sessions": sessions, "by_source": by_source, "per_workload": per_workload}


def print_table(rep: dict) -> None:
    for source, row in rep["by_source"].items():
        print(f"{source}, {row['workloads']} workloads:")
        for f in LABELS:
            if f in row:
                print(f"  {LABELS[f]:42s} " + " / ".join(f"{row[f][k]:.3f}" for k in KEYS))
    print("(Kendall tau / top-1 / top-5 of one run ranked against each label)")
    for source, row in rep["by_source"].items():
        est = row["perfect_model_tau"]
        print(f"{source}: a model knowing each latency would reach Kendall tau "
              f"~{est['session_label']:.2f} against one session's label, "
              f"~{est['pool_label']:.2f} against the pool's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool", type=Path, required=True, help="TVM JSON database or packed pool")
    ap.add_argument("--device", required=True, help="params.yaml device to measure on (local)")
    ap.add_argument("--source", choices=["random", "evolved"], default=None,
                    help="only candidates of this source (default: all)")
    ap.add_argument("--workload", nargs="*", default=None, help="only these workloads")
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="the sessions' shuffles")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a params.yaml value, e.g. harvest.min_repeat_ms=100")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--show", action="store_true", help="report what is measured, measure nothing")
    ap.add_argument("--stores", action="store_true",
                    help="also write OUT_DIR/sessionN/: the pool with each session's runs as "
                         "the measured-again records' labels, for scoring models against them")
    args = ap.parse_args()
    if args.sessions < 2:
        raise SystemExit("--sessions: at least 2 (the point is to compare them)")
    settings = load_settings().override(overrides(args.set))
    if args.device not in settings.devices:
        raise SystemExit(f"--device: unknown device '{args.device}' (params.yaml devices: "
                         f"{', '.join(settings.devices)})")
    if not args.pool.exists():
        raise SystemExit(f"--pool {args.pool}: no such file or directory")
    runs_file = args.out_dir / "runs.jsonl"
    check_out_dir(args.out_dir, {"pool": args.pool.name, "device": args.device,
                                 "source": args.source, "workloads": args.workload,
                                 "seed": args.seed, "settings": args.set})
    with tempfile.TemporaryDirectory(prefix="calo-remeasure-") as tmp:
        store = open_pool(args.pool, Path(tmp))
        try:
            recs = chosen(store, args.source, args.workload)
        except CaloError as err:
            raise SystemExit(f"--pool {args.pool}: {err}") from None
        if not args.show:
            measure_sessions(settings, recs, args.device, args.sessions, runs_file, args.seed)
        done = load_runs(runs_file)
        rep = {"pool": args.pool.name, "device": args.device, "source": args.source or "all",
               "settings": args.set, "records": len(recs),
               **report(recs, done, args.sessions)}
        if args.stores:
            for dest in write_stores(store, done, args.sessions, args.out_dir):
                print(f"wrote {dest}")
    (args.out_dir / "remeasure.json").write_text(json.dumps(rep, indent=1) + "\n")
    print_table(rep)


if __name__ == "__main__":
    main()
