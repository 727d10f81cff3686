"""Whether a pool's extracted inputs come out the same in every process.

Each run extracts every successful record of the pool in a process of its own (the graph the
network reads and TVM's per-store rows the device's trees read) and the runs are compared
program by program. TVM's PerStoreFeature orders a store's buffers by cache lines, bytes and
name; where two tie on all three their order follows memory, so a few programs' rows
differed between processes, and so did every figure the trees feed, until the extractor put
tied buffers in an order of its own (calo.store_features.canonical; docs/ranking.md, "Where a
run's figures come from"). This checks that it holds on any pool. Run from the repository root:

    python benchmarks/feature_stability.py [--pool benchmarks/data/heldout-cpu-host.tar.gz] \
        [--runs 3] [--kind device-schedule]

Prints the programs whose inputs differ and writes benchmarks/results/feature_stability.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from calo.devices import preload_tensor_intrinsics

preload_tensor_intrinsics()  # before torch_geometric is imported

import numpy as np  # noqa: E402
from harvest_pools import open_pool  # noqa: E402

from calo.graphs import KINDS, graph_set  # noqa: E402
from calo.log import Progress, get_logger  # noqa: E402
from calo.tasks.evaluate import scored_records  # noqa: E402

ROOT = Path(__file__).resolve().parent
POOL = ROOT / "data" / "heldout-cpu-host.tar.gz"
PARTS = ("x", "edge_index", "edge_type", "store_rows")  # what a program's inputs are


def dump(store: Path, kind: str, out: Path) -> None:
    """Every successful record's inputs, in store order, into one .npz."""
    recs = scored_records(store)
    progress = Progress("extract", len(recs), "records")
    graphs = graph_set(kind, recs, progress.advance, True).graphs
    arrays = {f"{part}_{i}": g[part].numpy() for i, g in enumerate(graphs)
              for part in PARTS if part in g}
    np.savez(out, names=np.array([r.workload_name for r in recs]), **arrays)


def differing(runs: list[Path]) -> dict[int, list[str]]:
    """Program index -> the parts of its inputs that are not the same in every run."""
    loaded = [np.load(p) for p in runs]
    out: dict[int, list[str]] = {}
    for key in loaded[0].files:
        if key == "names":
            continue
        first = loaded[0][key]
        if any(not np.array_equal(first, other[key]) for other in loaded[1:]):
            part, index = key.rsplit("_", 1)
            out.setdefault(int(index), []).append(part)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=Path, default=POOL,
                        help="a packed pool (.tar.gz) or a store directory (any TVM database)")
    parser.add_argument("--runs", type=int, default=3, help="processes to compare (>= 2)")
    parser.add_argument("--kind", choices=KINDS, default="device-schedule",
                        help="graph kind (the unseen-shape donors read device-schedule)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "feature_stability.json")
    parser.add_argument("--dump", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.pool.exists():
        parser.error(f"--pool: no pool at {args.pool}")
    if args.runs < 2:
        parser.error(f"--runs must be >= 2 to compare anything, got {args.runs}")
    log = get_logger()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_pool(args.pool.resolve(), Path(tmp))
        if args.dump:  # one run, in the process the parent started
            dump(store, args.kind, args.dump)
            return
        runs = [Path(tmp) / f"run{i}.npz" for i in range(args.runs)]
        for i, run in enumerate(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--pool", str(store), "--kind", args.kind,
                            "--dump", str(run)], check=True)
            log.info(f"feature stability: run {i + 1}/{args.runs} extracted in "
                     f"{time.perf_counter() - start:.0f} s")
        names = np.load(runs[0])["names"]
        diff = differing(runs)
    by_workload = Counter(str(names[index]) for index in diff)
    report = {"pool": args.pool.name, "kind": args.kind, "runs": args.runs,
              "programs": len(names), "differing": len(diff),
              "differing_parts": {str(i): parts for i, parts in sorted(diff.items())},
              "differing_by_workload": dict(by_workload)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{len(diff)} of {len(names)} programs' inputs differ between {args.runs} processes")
    for index, parts in sorted(diff.items()):
        print(f"  #{index} {names[index]}: {', '.join(parts)}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
