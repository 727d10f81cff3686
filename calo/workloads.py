"""Workloads: a named TE operator (calo.operators or TVM's te_workload) as a PrimFunc module."""

from __future__ import annotations

import inspect

import tvm
import tvm_ffi
from tvm import te
from tvm.s_tir import SBlock
from tvm.s_tir.meta_schedule.testing import te_workload

from calo import operators
from calo.config import Workload
from calo.errors import CaloError


def create_mod(workload: Workload) -> tvm.IRModule:
    fn = getattr(operators, workload.op, None) or getattr(te_workload, workload.op, None)
    if fn is None or not inspect.isfunction(fn) or workload.op.startswith("_"):
        raise CaloError(f"workload '{workload.name}': unknown operator '{workload.op}'")
    try:
        tensors = fn(**workload.args)
    except TypeError as err:
        raise CaloError(
            f"workload '{workload.name}': bad arguments for {workload.op}: {err}") from None
    return tvm.IRModule({"main": te.create_prim_func(list(tensors))})


def workload_key(mod: tvm.IRModule) -> str:
    """Identity of a workload across databases: Meta-Schedule's own structural hash."""
    return str(tvm_ffi.structural_hash(mod))


def describe(mod: tvm.IRModule) -> str:
    """A workload named by its content, for databases that carry no names: the block with the
    largest iteration space and its extents, then the other blocks, e.g. `C 128x128x128` or
    `dense 16x256x256 +bias_add+gelu`."""
    blocks: list = []
    tvm_ffi.structural_walk(mod["main"].body, [(SBlock, blocks.append)], order="pre")
    blocks = [b for b in blocks if b.iter_vars]
    if not blocks:
        return "main"

    def size(block) -> int:
        total = 1
        for iv in block.iter_vars:
            total *= int(iv.dom.extent)
        return total

    main = max(blocks, key=size)
    extents = "x".join(str(int(iv.dom.extent)) for iv in main.iter_vars)
    others = [b.name_hint for b in blocks if b is not main]
    return (f"{main.name_hint} {extents}" + (" +" + "+".join(others) if others else ""))[:60]
