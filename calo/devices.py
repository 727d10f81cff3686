"""A device entry of params.yaml turned into TVM objects: target, builder and runner."""

from __future__ import annotations

import os

import tvm
from tvm.s_tir import meta_schedule as ms

from calo import build
from calo.config import CaloError, Device, reason

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


def make_builder(harvest: dict) -> ms.builder.LocalBuilder:
    return ms.builder.LocalBuilder(
        f_build=build.build,
        max_workers=int(harvest["build_workers"]),
        timeout_sec=float(harvest["build_timeout_s"]),
    )


def make_runner(device: Device, harvest: dict) -> ms.runner.Runner:
    """Measure on this machine; the runtime thread count follows the device's runner entry."""
    kind = device.runner.get("kind", "local")
    if kind != "local":
        raise CaloError(f"device '{device.name}': runner kind '{kind}' is not supported (local)")
    threads = device.runner.get("num_threads")
    if threads:
        # Runner workers are spawned after this and inherit the environment.
        os.environ["TVM_NUM_THREADS"] = str(threads)
    config = ms.runner.EvaluatorConfig(
        number=int(harvest["number"]),
        repeat=int(harvest["repeat"]),
        min_repeat_ms=int(harvest["min_repeat_ms"]),
        enable_cpu_cache_flush=False,
    )
    return ms.runner.LocalRunner(timeout_sec=float(harvest["run_timeout_s"]),
                                 evaluator_config=config)


def preload_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics, which every TuneContext needs, while few modules are loaded.

    The import parses ~30k TVMScript functions, each scanning sys.modules via inspect.getmodule:
    27 s in a bare process, 53 s once torch_geometric's modules are loaded. Commands that tune or
    harvest call this first, so the cost is paid once, cheaply, and outside any timed tuning run.
    """
    import tvm.s_tir.tensor_intrin  # noqa: F401


def device_type(target: tvm.target.Target) -> str:
    return "cuda" if target.kind.name == "cuda" else "cpu"
