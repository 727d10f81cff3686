"""Harvest the measured pools the benchmarks train and evaluate on (benchmarks/data/).

Two kinds of pool, each measured on a device of params.yaml into its own store
(`data/records/<pool>`), so the pipeline's own stores are never touched:

  donor     every operator of the built-in suite at its small, medium and large shapes
            (`--count` records each, half random and half evolved): what donors pre-train on.
  heldout   the workloads of the unseen-shape split (HELD_OUT below): shapes of suite
            operators that no donor record has, and operators the split keeps from the donor.

Harvesting tops up, so an interrupted run continues where it stopped; run it in chunks with
`--shape`. `--pack` writes the store as benchmarks/data/<pool>.tar.gz. Run from the root:

    python benchmarks/harvest_pools.py donor --device cpu-host --count 160 --shape small
    python benchmarks/harvest_pools.py heldout --device cpu-host --count 256 --pack

On a machine with an NVIDIA GPU, `--device cuda` measures with params.yaml's cuda template
(`suite-cuda`); `--build-workers` uses its cores for the builds.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import time
from pathlib import Path

import yaml

from calo import paths, suite
from calo.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"

# Operators the unseen-shape split keeps out of the donor's training entirely (one per family
# with a rich design space), and held-out shapes: none of them is a suite shape.
UNSEEN_OPERATORS = ("conv2d-transpose", "transpose-batch-matmul", "dcn-cross")
HELD_OUT: dict[str, dict] = {
    "matmul@384x192x320": {"n": 384, "m": 192, "k": 320},
    "conv2d-nhwc@20x20x48x96": {"H": 20, "W": 20, "CI": 48, "CO": 96},
    "batch-matmul@6x96x160x96": {"B": 6, "N": 96, "M": 160, "K": 96},
    "softmax@384x768": {"m": 384, "n": 768},
    "depthwise-conv2d@40x40x48": {"H": 40, "W": 40, "C": 48},
    "conv2d-transpose@12x12x48x24": {"H": 12, "W": 12, "CI": 48, "CO": 24},
    "transpose-batch-matmul@96x6x48": {"seq_len": 96, "n_head": 6, "n_dim": 48},
    "dcn-cross@384x192": {"B": 384, "D": 192},
    # A second eight, measured on the Emerald Rapids pools and in the *-second pools of the two
    # CPU devices (benchmarks/data/README.md): more workloads narrow what one workload's top-1
    # moves a mean by.
    "gelu-mlp@48x384x384": {"B": 48, "D": 384, "H": 384},
    "group-conv2d@20x20x96": {"H": 20, "W": 20, "CI": 96, "CO": 96, "groups": 12},
    "conv1d@512x48": {"L": 512, "CI": 48, "CO": 48},
    "dense-bias-relu@24x768x384": {"B": 24, "D": 768, "H": 384},
    "matmul-relu@192x320x96": {"n": 192, "m": 320, "k": 96},
    "conv2d@40x40x24x48": {"h": 40, "w": 40, "ci": 24, "co": 48},
    "conv3d@12x12x12x16x24": {"D": 12, "H": 12, "W": 12, "CI": 16, "CO": 24},
    "mlp2@96x192x384x96": {"B": 96, "D": 192, "H": 384, "O": 96},
}


def pool_name(kind: str, device: str) -> str:
    return f"{'suite' if kind == 'donor' else 'heldout'}-{device}"


def heldout_workloads() -> dict[str, dict]:
    """HELD_OUT as params.yaml workload entries (the suite operator's small shape, changed)."""
    out = {}
    for name, changes in HELD_OUT.items():
        op, args = suite.resolve(suite.operator(name))
        out[name] = {"op": op, "args": {**args, **changes}}
    return out


def overrides(items: list[str]) -> dict:
    """`--set SECTION.KEY=VALUE` arguments as settings overrides, each value read as YAML."""
    return {key: yaml.safe_load(value) for key, _, value in (i.partition("=") for i in items)}


def pool_settings(base: Settings, kind: str, device: str, build_workers: int | None = None,
                  pool: str | None = None) -> Settings:
    """Settings with the pool as a device measured exactly like `device`: one of params.yaml's
    devices, or one of its device_templates (cuda) on a machine that has such a device."""
    entry = base.raw["devices"].get(device) or base.raw.get("device_templates", {}).get(device)
    if entry is None:
        raise SystemExit(f"unknown device '{device}': not among params.yaml's devices or "
                         "device_templates")
    changes = {f"devices.{pool or pool_name(kind, device)}": entry}
    if build_workers:
        changes["harvest.build_workers"] = build_workers
    if kind == "heldout":
        changes.update({f"workloads.{n}": w for n, w in heldout_workloads().items()})
    return base.override(changes)


def unpack(pool: Path, into: Path) -> Path:
    """Unpack a committed pool; returns the store directory it holds."""
    with tarfile.open(pool) as tar:
        (top,) = {Path(m.name).parts[0] for m in tar.getmembers()}
        tar.extractall(into, filter="data")
    return into / top


def open_pool(pool: Path, into: Path) -> Path:
    """A pool's store directory: a packed pool unpacked into `into`, a directory as it is."""
    return pool if pool.is_dir() else unpack(pool, into)


def pack(store: Path, out: Path) -> None:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(store, arcname=store.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["donor", "heldout"])
    parser.add_argument("--device", required=True,
                        help="a device of params.yaml, or a template of its device_templates")
    parser.add_argument("--build-workers", type=int,
                        help="parallel builds (default: params.yaml's harvest.build_workers)")
    parser.add_argument("--count", type=int, required=True, help="records wanted per workload")
    parser.add_argument("--shape", default="all", choices=[*suite.SHAPES, "all"],
                        help="donor pool: which suite shapes this run tops up")
    parser.add_argument("--workload", action="append", default=None,
                        help="only these of the pool's workloads (repeatable; default: all "
                             "of the --shape, or all of HELD_OUT)")
    parser.add_argument("--pool", default=None,
                        help="name of the store (data/records/<pool>) and packed file instead "
                             "of suite-<device> or heldout-<device>: e.g. the selection "
                             "split's workloads on a new device, apart from its suite pool")
    parser.add_argument("--pack", action="store_true",
                        help="write the store to benchmarks/data/<pool>.tar.gz afterwards")
    args = parser.parse_args()

    from calo.tasks.harvest import harvest

    pool = args.pool or pool_name(args.kind, args.device)
    settings = pool_settings(load_settings(), args.kind, args.device, args.build_workers, pool)
    names = suite.names(args.shape) if args.kind == "donor" else list(HELD_OUT)
    if args.workload:
        unknown = sorted(set(args.workload) - set(names))
        if unknown:
            raise SystemExit(f"not a workload of the {args.kind} pool: {', '.join(unknown)}")
        names = [n for n in names if n in args.workload]
    start = time.perf_counter()
    summary = harvest(settings, pool, names, args.count)
    wall = time.perf_counter() - start
    summary.update(wall_s=wall, records_per_s=summary["measured"] / wall if wall else 0.0)
    print(json.dumps(summary, indent=1))
    if args.pack:
        out = DATA / f"{pool}.tar.gz"
        pack(paths.records_dir(pool), out)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
