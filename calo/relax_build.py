"""A PyTorch network through Relax: import, tuning tasks, compilation with a tuning database,
and the compiled network's outputs and end-to-end latency.

Extraction and compilation prepare the module the same way (parameters bound, operators
legalized and fused, as `ms.relax_integration.compile_relax` does), so the database's records
match the functions the compiler looks up.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from calo.errors import CaloError, reason
from calo.networks import Network

TVM_NOISE = ("Fast mode segfaults when there are out-of-bounds indices",)


class RelaxProgram(NamedTuple):
    mod: tvm.IRModule         # weights as constants, ready for compile_relax
    inputs: list              # the example inputs as TVM tensors
    expected: list[np.ndarray]  # PyTorch's outputs on them


class Task(NamedTuple):
    name: str
    weight: float             # how many times the network calls it
    flops: float
    context: ms.TuneContext | None  # None: not tuned (no arithmetic, or it failed to schedule)
    why_skipped: str | None


def import_network(net: Network) -> RelaxProgram:
    """torch.export, then TVM's ExportedProgram importer."""
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad(), warnings.catch_warnings():
        # torch's deprecation notices from inside export and import: nothing a user can change
        warnings.simplefilter("ignore", FutureWarning)
        expected = net.module(*net.inputs)
        try:
            exported = torch.export.export(net.module, net.inputs)
        except Exception as err:  # torch raises many kinds; the user needs the first line
            raise CaloError(f"the network does not export with torch.export: {reason(err)}"
                            ) from None
        try:  # weights as constants: compiled in, as a deployed network has them
            mod = from_exported_program(exported, keep_params_as_input=False)
        except Exception as err:
            raise CaloError(f"TVM cannot import the exported network: {reason(err)}") from None
    mod = tvm.transform.Sequential([relax.transform.DecomposeOpsForInference(),
                                    relax.transform.CanonicalizeBindings()])(mod)
    outputs = expected if isinstance(expected, (tuple, list)) else (expected,)
    return RelaxProgram(mod, [tvm.runtime.tensor(t.numpy()) for t in net.inputs],
                        [t.numpy() for t in outputs])


def _fused(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The preparation compile_relax applies before it looks functions up in the database."""
    with target:
        return tvm.transform.Sequential([
            *relax.pipeline.library_dispatch_passes(target), relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
            relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)


def extract_tasks(program: RelaxProgram, target: tvm.target.Target, work_dir: Path,
                  seed: int, num_threads: int) -> list[Task]:
    """The network's tuning tasks; each tuning run searches a clone of their contexts with its
    own strategy (`with_search`). Those without arithmetic (reshapes, transposes, gathers)
    have next to nothing to tune and each would still take a round of measurements: they keep
    their default schedules. A task whose design space cannot be generated is skipped too."""
    with _native_stderr_without(TVM_NOISE):
        extracted = ms.relax_integration.extract_tasks(_fused(program.mod, target), target)
    flops = [float(estimate_tir_flops(task.dispatched[0])) for task in extracted]
    arithmetic = [task for task, f in zip(extracted, flops) if f > 0]
    # One call for all of them: each call reconfigures Meta-Schedule's loggers.
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        arithmetic, str(work_dir), seed=seed, num_threads=num_threads)
    context_of = dict(zip([t.task_name for t in arithmetic], contexts))
    tasks = []
    for task, f in zip(extracted, flops):
        context, why = context_of.get(task.task_name), None if f > 0 else "no arithmetic"
        if context is not None:
            try:
                context.generate_design_space()  # fails here, not half-way through tuning
            except Exception as err:
                context, why = None, reason(err)
        tasks.append(Task(task.task_name, float(task.weight), f, context, why))
    return tasks


def with_search(tasks: list[Task], strategy: ms.search_strategy.SearchStrategy,
                work_dir: Path) -> list[ms.TuneContext]:
    """Fresh contexts of tuned tasks that search with `strategy` and log under work_dir/logs,
    so that each tuning run has a search and logs of its own."""
    loggers = ms.logging.get_loggers_from_work_dir(str(work_dir), [t.name for t in tasks])
    return [ms.TuneContext(mod=c.mod, target=c.target, space_generator=c.space_generator,
                           search_strategy=strategy, task_name=c.task_name, logger=logger,
                           rand_state=c.rand_state, num_threads=c.num_threads).clone()
            for c, logger in zip((t.context for t in tasks), loggers)]


@contextlib.contextmanager
def _native_stderr_without(noise: tuple[str, ...]):
    """TVM's C++ warnings go straight to file descriptor 2; keep the lines that are not noise.

    Legalizing an embedding lookup (`take`, mode fast) warns once per lookup and compilation
    that out-of-bounds indices would crash: PyTorch's own bounds are what the network was
    exported with, so the line says nothing to act on.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured:
                if not any(n in line for n in noise):
                    sys.stderr.write(line)


def compile_network(program: RelaxProgram, target: tvm.target.Target,
                    database: ms.database.Database | None, library: Path) -> Path:
    """The network compiled with a tuning database (None: every function's default schedule),
    exported as a shared library a TVM user loads with tvm.runtime.load_module."""
    database = database or ms.database.MemoryDatabase()
    with _native_stderr_without(TVM_NOISE):
        executable = ms.relax_integration.compile_relax(database, program.mod, target, None)
    library.parent.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(library))
    return library


def run_networks(libraries: dict[str, Path], program: RelaxProgram, work: Path, *,
                 threads: int | None, rtol: float, atol: float, repeat: int,
                 min_repeat_ms: int) -> dict[str, dict]:
    """Run compiled networks in one fresh process with the device's thread count (as the
    runner measures candidates), check each one's outputs against PyTorch's, and time them.

    The timings interleave: each of `repeat` rounds times every library once (as many runs as
    fill min_repeat_ms), so a busy spell of the machine slows all of them alike instead of
    whichever ran then. Returns per library the median and minimum of its timings and the
    largest absolute difference from PyTorch; raises CaloError naming the library whose output
    is not allclose or that does not run.
    """
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "inputs.npz", *[t.numpy() for t in program.inputs])
    np.savez(work / "expected.npz", *program.expected)
    env = {**os.environ, **({"TVM_NUM_THREADS": str(threads)} if threads else {})}
    args = [sys.executable, "-m", "calo.relax_build", str(work), str(rtol), str(atol),
            str(repeat), str(min_repeat_ms), *(f"{name}={lib}" for name, lib in libraries.items())]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        raise CaloError(lines[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _checked_vm(name: str, library: str, inputs: list, expected: list[np.ndarray], rtol: float,
                atol: float) -> tuple[relax.VirtualMachine, float]:
    """The library's VM, once its outputs are allclose to PyTorch's; and the largest
    difference. Errors name the variant (every library's file is network.so)."""
    try:
        vm = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
        out = vm["main"](*inputs)
    except Exception as err:  # noqa: BLE001 (the parent reports it as one line)
        raise SystemExit(f"{name}: does not run: {reason(err)}") from err
    outputs = ([out.numpy()] if isinstance(out, tvm.runtime.Tensor)
               else [out[i].numpy() for i in range(len(out))])
    if len(outputs) != len(expected):
        raise SystemExit(f"{name}: the compiled network gives {len(outputs)} outputs, "
                         f"PyTorch {len(expected)}")
    worst = 0.0
    for got, want in zip(outputs, expected):
        if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
            diff = np.abs(got - want).max() if got.shape == want.shape else float("nan")
            raise SystemExit(f"{name}: the compiled network's output differs from PyTorch's "
                             f"(largest difference {diff:.3g})")
        worst = max(worst, float(np.abs(got - want).max()))
    return vm, worst


def _time_libraries(work: str, rtol: float, atol: float, repeat: int, min_repeat_ms: int,
                    libraries: dict[str, str]) -> dict[str, dict]:
    with np.load(Path(work) / "inputs.npz") as f:
        inputs = [tvm.runtime.tensor(f[k]) for k in f.files]
    with np.load(Path(work) / "expected.npz") as f:
        expected = [f[k] for k in f.files]
    timers, worst = {}, {}
    for name, library in libraries.items():
        vm, worst[name] = _checked_vm(name, library, inputs, expected, rtol, atol)
        timers[name] = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=1,
                                         min_repeat_ms=min_repeat_ms)
    timings: dict[str, list[float]] = {name: [] for name in libraries}
    for _ in range(repeat):
        for name, timer in timers.items():
            timings[name] += timer(*inputs).results
    return {name: {"median_s": float(np.median(t)), "min_s": float(np.min(t)),
                   "repeats": len(t), "max_abs_diff": worst[name]}
            for name, t in timings.items()}


if __name__ == "__main__":
    work_dir, rtol_, atol_, repeat_, min_ms, *libs = sys.argv[1:]
    print(json.dumps(_time_libraries(work_dir, float(rtol_), float(atol_), int(repeat_),
                                     int(min_ms), dict(lib.split("=", 1) for lib in libs))))
