"""A device entry of params.yaml turned into a TVM target (builders and runners: calo.measure)."""

from __future__ import annotations

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
    """Import TVM's tensor intrinsics, which every TuneContext needs, while few modules are loaded.

    The import parses ~30k TVMScript functions, each scanning sys.modules via inspect.getmodule:
    27 s in a bare process, 53 s once torch_geometric's modules are loaded. Commands that tune or
    harvest call this first, so the cost is paid once, cheaply, and outside any timed tuning run.
    """
    import tvm.s_tir.tensor_intrin  # noqa: F401

