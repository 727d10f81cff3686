"""A device entry of params.yaml turned into a TVM target (builders and runners: calo.measure)."""

from __future__ import annotations

import inspect
import linecache
import sys

import tvm

from calo.config import Device
from calo.errors import CaloError, reason

HOST_CPU = "host"


def make_target(device: Device) -> tvm.target.Target:
    spec = dict(device.target)
    if spec.get("mcpu") == HOST_CPU:
        spec["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
    try:
        return tvm.target.Target(spec)
    except Exception as err:  # TVM raises several error types for bad targets
        raise CaloError(
            f"device '{device.name}': invalid target {device.target}: {reason(err)}") from None


def preload_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics, which every TuneContext needs, once and cheaply.

    The import parses TVMScript functions, and TVMScript's decorator calls inspect.stack(). That
    reads every frame's source line through inspect.getmodule, which scans all of sys.modules
    for each frame of the import machinery (frozen modules have no file to match): the longest
    part of a tuning process's start, and longer the more modules are loaded. During this one
    import inspect.stack is a walk that gives the same fields (frame, file, line number,
    function, the line's source) from linecache alone; the intrinsics it registers are the same.
    Commands that tune or harvest call this first, outside any timed tuning run.
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    full_stack = inspect.stack
    inspect.stack = _cheap_stack
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = full_stack


def _cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """inspect.stack() of the caller, each frame with its one source line (context=1)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames
