"""Workloads: a named TE operator (calo.operators or TVM's te_workload) as a PrimFunc module."""

from __future__ import annotations

import inspect

import tvm
import tvm_ffi
from tvm import te
from tvm.s_tir.meta_schedule.testing import te_workload

from calo import operators
from calo.config import CaloError, Workload


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
