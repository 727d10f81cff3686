"""Write a TVM database the way TVM's own tuner writes one, on programs the suite lacks.

The hold-out entry points (`calo evaluate --records`, `offline_eval.py --held-out`,
`ttq.py --mode replay --pool`) must read any TVM JSON database, not only pools calo harvested:
no side file saying which records were random samples, workloads named by TVM alone, the
records of failed builds beside the measured ones. The workloads below are written afresh in
TE, not taken from calo's suite, at shapes no pool holds. This tunes each with plain
`ms.tune_tir` (TVM's XGBoost cost model, evolutionary search, its local builder and runner) for
a device of params.yaml, all into one database. A workload is marked done in OUT_DIR/done.txt
once tuned, so a run started again skips it; an interrupted workload is tuned again, adding its
records beside those already there. Run from the repository root:

    python benchmarks/foreign_database.py --out-dir DIR [--device cpu-host] [--trials 96]
    calo evaluate --model benchmarks/data/donor-unseen-shape --records DIR --warmup 8
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from calo.config import load_settings
from calo.devices import make_target
from calo.errors import CaloError
from calo.log import get_logger


def max_pool() -> tvm.tirx.PrimFunc:
    x = te.placeholder((1, 64, 56, 56), name="X")
    rh, rw = te.reduce_axis((0, 3), "rh"), te.reduce_axis((0, 3), "rw")
    y = te.compute((1, 64, 27, 27), lambda n, c, i, j: te.max(
        x[n, c, i * 2 + rh, j * 2 + rw], axis=[rh, rw]), name="pool")
    return te.create_prim_func([x, y])


def batch_matmul() -> tvm.tirx.PrimFunc:
    a, b = te.placeholder((12, 96, 80), name="A"), te.placeholder((12, 80, 112), name="B")
    k = te.reduce_axis((0, 80), "k")
    c = te.compute((12, 96, 112), lambda n, i, j: te.sum(a[n, i, k] * b[n, k, j], axis=k),
                   name="bmm")
    return te.create_prim_func([a, b, c])


def conv1d() -> tvm.tirx.PrimFunc:
    x, w = te.placeholder((4, 48, 130), name="X"), te.placeholder((64, 48, 3), name="W")
    rc, rk = te.reduce_axis((0, 48), "rc"), te.reduce_axis((0, 3), "rk")
    y = te.compute((4, 64, 128), lambda n, o, t: te.sum(x[n, rc, t + rk] * w[o, rc, rk],
                                                        axis=[rc, rk]), name="conv1d")
    return te.create_prim_func([x, w, y])


WORKLOADS = {"max_pool": max_pool, "batch_matmul": batch_matmul, "conv1d": conv1d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, required=True, help="the database's directory")
    ap.add_argument("--device", default="cpu-host", help="a device of params.yaml")
    ap.add_argument("--trials", type=int, default=96, help="tune_tir's trials per workload")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.trials < 1:
        raise SystemExit(f"--trials must be >= 1, got {args.trials}")
    try:
        target = make_target(load_settings().device(args.device))
    except CaloError as err:
        raise SystemExit(f"--device: {err}") from None
    log = get_logger()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    done_file = args.out_dir / "done.txt"
    done = set(done_file.read_text().split()) if done_file.exists() else set()
    for i, (name, build) in enumerate(WORKLOADS.items(), 1):
        if name in done:
            log.info(f"{name}: tuned already ({i}/{len(WORKLOADS)})")
            continue
        start = time.perf_counter()
        mod = tvm.IRModule({"main": build().with_attr("global_symbol", "main")})
        ms.tune_tir(mod, target, str(args.out_dir), max_trials_global=args.trials,
                    num_trials_per_iter=32, seed=args.seed)
        with done_file.open("a") as f:
            f.write(name + "\n")
        log.info(f"{name}: tuned in {time.perf_counter() - start:.0f} s ({i}/{len(WORKLOADS)})")


if __name__ == "__main__":
    main()
