"""The schedule-graph walker in C++ (schedule_graph.cc), built on first use and cached.

The same graphs as calo.schedule_graph.extract_graph, bit for bit, several times faster: a
search scores hundreds of candidates a generation, and reading their TIR through the FFI from
Python is most of what scoring costs. It compiles against the headers of the installed tvm-ffi
wheel alone (one C++17 compiler, a few seconds, once per source and tvm-ffi version) into
`$CALO_CACHE/native/` (default ~/.cache/calo). Where it cannot build, the Python walker runs
instead, after one log line that says why; CALO_NATIVE=0 turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tvm_ffi
from tvm_ffi import libinfo

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("schedule_graph.cc")
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-pthread")
# Tried first: the walk's threads are then the OpenMP runtime's that torch runs (see
# ExtractGraphs); a compiler without OpenMP builds it with threads of its own.
OPENMP = ("-fopenmp",)
# Fewer graphs than this per thread are walked on one: handing a slice to another thread costs
# about as much.
GRAPHS_PER_THREAD = 32


class Union(NamedTuple):
    """Many graphs concatenated: rows and edges in graph order, node ids local to their graph."""
    x: np.ndarray            # [nodes, features] float32
    edge_index: np.ndarray   # [2, edges] int64
    edge_type: np.ndarray    # [edges] int64
    nodes: np.ndarray        # [graphs] int64, rows of each graph
    edges: np.ndarray        # [graphs] int64, edges of each graph


_walker: object | None = None
_tried = False


def cache_dir() -> Path:
    return Path(os.environ.get("CALO_CACHE", Path.home() / ".cache" / "calo")) / "native"


def library_path() -> Path:
    """Where the walker built from this source for this tvm-ffi lives."""
    key = hashlib.sha256(SOURCE.read_bytes() + tvm_ffi.__version__.encode()
                         + " ".join(FLAGS + OPENMP).encode()).hexdigest()[:16]
    return cache_dir() / f"schedule_graph-{key}.so"


def build() -> Path:
    """Compile the walker unless this source's build is cached; return the library's path.
    Raises RuntimeError with the compiler's message when it does not build."""
    path = library_path()
    if path.exists():
        return path
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++ on PATH, or CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and renamed: processes that build at once each get a whole
    # library, never a half-written one.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        # Where both builds fail, the second's message is the one that says why: the first
        # may only have lacked OpenMP.
        error = _compile(compiler, FLAGS + OPENMP, tmp)
        if error is not None:
            error = _compile(compiler, FLAGS, tmp)
        if error is not None:
            raise RuntimeError(f"{compiler} failed:\n{error}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _compile(compiler: str, flags: tuple[str, ...], out: str) -> str | None:
    """Compile the walker into out; the compiler's message where it fails."""
    ffi_lib = Path(libinfo.find_libtvm_ffi())
    command = [compiler, *flags, f"-I{libinfo.find_include_path()}",
               f"-I{libinfo.find_dlpack_include_path()}", str(SOURCE), "-o", out,
               f"-L{ffi_lib.parent}", f"-l{ffi_lib.stem.removeprefix('lib')}",
               f"-Wl,-rpath,{ffi_lib.parent}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as err:
        return str(err)
    return None if done.returncode == 0 else done.stderr.strip()[-2000:]


def walker():
    """The native walker's function, or None where it is off or does not build."""
    global _walker, _tried
    if not _tried:
        _tried = True
        if os.environ.get("CALO_NATIVE", "1") == "0":
            return None
        try:
            _walker = tvm_ffi.load_module(str(build()))["extract_graphs"]
        except Exception as err:  # noqa: BLE001 - any failure leaves the Python walker
            log.warning("schedule graphs use the Python walker (the native one did not "
                        "build: %s)", str(err).splitlines()[0])
    return _walker


@contextlib.contextmanager
def off() -> Iterator[None]:
    """The Python walker runs within (benchmarks and tests compare the two)."""
    global _walker
    saved, _walker = walker(), None
    try:
        yield
    finally:
        _walker = saved


def extract(programs: list, features: list[str], cores: int, vector_bytes: int,
            with_device: bool) -> Union:
    """Graphs of programs (PrimFuncs, IRModules or MeasureCandidates: their "main" function)
    in one call (walker() must not be None), over the machine's cores where there are enough
    of them to share."""
    threads = min(os.cpu_count() or 1, max(len(programs) // GRAPHS_PER_THREAD, 1))
    out = walker()(programs, features, cores, vector_bytes, with_device, threads)
    x, src, dst, edge_type, nodes, edges = (  # copies: arrays over bytes are read-only
        np.frombuffer(part, dtype=np.float32 if i == 0 else np.int64).copy()
        for i, part in enumerate(out))
    return Union(x.reshape(-1, len(features)), np.stack([src, dst]), edge_type, nodes, edges)
