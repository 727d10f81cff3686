"""Building and measuring candidates: a warm parallel builder, local or RPC runners, fault kinds.

TVM's LocalBuilder starts fresh worker processes for every batch (each pays Python and TVM
start-up); ``WarmBuilder`` keeps its workers between batches and recycles them every few hundred
builds, which bounds the worker memory growth that made TVM restart them. Measurement stays one
candidate at a time: on a CPU device a build running beside a measurement would steal its cores.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Sequence

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import remove_build_dir
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from calo import build
from calo.config import Device, Harvest
from calo.errors import CaloError, reason

OK, BUILD_ERROR, RUN_ERROR, TIMEOUT = "ok", "build_error", "run_error", "timeout"
RECYCLE_BUILDS = 256


@derived_object
class WarmBuilder(ms.builder.PyBuilder):
    """Parallel builds in worker processes that outlive a batch."""

    def __init__(self, max_workers: int, timeout_sec: float) -> None:
        super().__init__()
        self.max_workers, self.timeout_sec = max_workers, timeout_sec
        self.pool: PopenPoolExecutor | None = None
        self.builds = 0

    def build(self, build_inputs: list[ms.builder.BuilderInput]) -> list[ms.builder.BuilderResult]:
        if self.pool is None or self.builds >= RECYCLE_BUILDS:
            self.shutdown()
            self.pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec)
        self.builds += len(build_inputs)
        results = []
        # The folders are made here, not in the workers: one killed on a build timeout cannot
        # remove its own, and a long harvest would collect them.
        folders = [build.artifact_folder() for _ in build_inputs]
        jobs = [(inp.mod, inp.target, f) for inp, f in zip(build_inputs, folders)]
        try:
            for folder, res in zip(folders, self.pool.map_with_error_catching(
                    lambda job: build.build_and_export(*job), jobs)):
                if res.status == StatusKind.COMPLETE:
                    results.append(ms.builder.BuilderResult(res.value, None))
                    continue
                shutil.rmtree(folder, ignore_errors=True)
                if res.status == StatusKind.TIMEOUT:
                    results.append(ms.builder.BuilderResult(
                        None, f"build: Timeout, killed after {self.timeout_sec} seconds"))
                else:
                    results.append(ms.builder.BuilderResult(None, f"build: {res.value}"))
        except BaseException:  # an interrupted batch: none of its artifacts will be run
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        return results

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
            self.builds = 0


def make_builder(harvest: Harvest) -> ms.builder.Builder:
    """The warm builder, or (warm_builders: false) TVM's LocalBuilder with the same settings."""
    workers, timeout = harvest.build_workers, harvest.build_timeout_s
    if harvest.warm_builders:
        return WarmBuilder(workers, timeout)
    return ms.builder.LocalBuilder(f_build=build.build, max_workers=workers, timeout_sec=timeout)


def close_builder(builder: ms.builder.Builder) -> None:
    if isinstance(builder, WarmBuilder):
        builder.shutdown()


def evaluator_config(harvest: Harvest) -> ms.runner.EvaluatorConfig:
    return ms.runner.EvaluatorConfig(
        number=harvest.number, repeat=harvest.repeat, min_repeat_ms=harvest.min_repeat_ms,
        enable_cpu_cache_flush=False)


def make_runner(device: Device, harvest: Harvest) -> ms.runner.Runner:
    """A device's runner: local (this machine) or rpc (a TVM tracker, host/port/key)."""
    kind = device.runner.get("kind", "local")
    timeout = harvest.run_timeout_s
    if kind == "local":
        threads = device.runner.get("num_threads")
        if threads:
            # Runner workers are spawned after this and inherit the environment.
            os.environ["TVM_NUM_THREADS"] = str(threads)
        return ms.runner.LocalRunner(timeout_sec=timeout,
                                     evaluator_config=evaluator_config(harvest))
    if kind == "rpc":
        host, port, key = rpc_address(device)
        check_tracker(device.name, host, port, key)
        config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                     session_timeout_sec=int(max(timeout, 1)))
        return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator_config(harvest),
                                   max_workers=1)
    raise CaloError(f"device '{device.name}': runner kind '{kind}' is not supported "
                    "(local, rpc)")


def rpc_address(device: Device) -> tuple[str, int, str]:
    runner = device.runner
    missing = [k for k in ("host", "port", "key") if k not in runner]
    if missing:
        raise CaloError(f"device '{device.name}': rpc runner needs {', '.join(missing)}")
    try:
        port = int(runner["port"])
    except (TypeError, ValueError):
        raise CaloError(f"device '{device.name}': rpc port must be a number, "
                        f"got {runner['port']!r}") from None
    return str(runner["host"]), port, str(runner["key"])


def check_tracker(device: str, host: str, port: int, key: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any work, when the tracker is unreachable or has no server for the key."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        summary = tvm.rpc.connect_tracker(host, port).summary()
    except Exception as err:  # refused, timed out, or not speaking the tracker protocol
        raise CaloError(f"device '{device}': RPC tracker {host}:{port} unreachable: "
                        f"{reason(err)[:120]}") from None
    keys = {info.get("key", "").split(":")[-1] for info in summary.get("server_info", [])}
    if key not in keys:
        raise CaloError(f"device '{device}': RPC tracker {host}:{port} has no server with key "
                        f"'{key}' (has: {', '.join(sorted(k for k in keys if k)) or 'none'})")


def device_type(target: tvm.target.Target) -> str:
    return "cuda" if target.kind.name == "cuda" else "cpu"


def status_of(error: str | None) -> str:
    if error is None:
        return OK
    if "Timeout" in error:
        return TIMEOUT
    return BUILD_ERROR if error.startswith("build") or "Builder" in error else RUN_ERROR


def measure(builder: ms.builder.Builder, runner: ms.runner.Runner, target: tvm.target.Target,
            candidates: Sequence[ms.MeasureCandidate],
            on_result: Callable[[int, ms.runner.RunnerResult], None] = lambda i, r: None,
            ) -> list[ms.runner.RunnerResult]:
    """Build a batch in parallel, then run it one candidate at a time.

    on_result sees each result the moment it exists (failures included), so a caller can store
    it before the next measurement starts.
    """
    built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in candidates])
    results: list[ms.runner.RunnerResult | None] = [None] * len(candidates)
    inputs, slots = [], []
    for i, (cand, b) in enumerate(zip(candidates, built)):
        if b.error_msg is not None:
            msg = b.error_msg if b.error_msg.startswith("build") else f"build: {b.error_msg}"
            results[i] = ms.runner.RunnerResult(None, msg)
            on_result(i, results[i])
        else:
            inputs.append(ms.runner.RunnerInput(b.artifact_path, device_type(target),
                                                cand.args_info))
            slots.append(i)
    for i, inp, future in zip(slots, inputs, runner.run(inputs) if inputs else []):
        results[i] = future.result()
        # Builders write each artifact to its own temporary directory and nothing else removes
        # it: a long harvest would otherwise leave thousands behind.
        remove_build_dir(inp.artifact_path)
        on_result(i, results[i])
    return results  # type: ignore[return-value]
