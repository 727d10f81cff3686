"""A scheduled TIR PrimFunc as a typed, directed multigraph.

Nodes are loops, blocks and buffers (memory scopes). Edges:
  nest      enclosing loop/block -> loop/block directly inside it; along a loop nest the
            chain of nest edges is the loop order (outermost first), which reorder changes
  dataflow  buffer -> block that reads it, block -> buffer it writes
  sequence  a statement -> the next one in the same sequence (sibling order)
  fusion    between consecutive blocks that share an enclosing loop (compute-at / fused nests)

Continuous features come twice: in absolute log2 units (the model predicts absolute latency, so
sizes matter) and normalized per workload, divided by the same quantity of the workload itself
(its largest block's iteration count, its largest buffer). Those denominators do not depend on
the schedule, so every candidate of a workload shares them and a single candidate can be
featurized alone; the normalized columns make the same tiling look the same on a small and on a
large operator.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from tvm import s_tir, tirx

from calo import native

EDGE_TYPES = ("nest", "dataflow", "sequence", "fusion")
NEST, DATAFLOW, SEQUENCE, FUSION = range(4)

# Feature columns. Counts and sizes enter as log2(1 + x) so they are comparable across shapes.
FEATURES = (
    "is_loop", "is_block", "is_buffer",
    "log_extent",           # loop extent / block iteration domain / buffer elements
    "serial", "parallel", "vectorized", "unrolled", "thread_bound",
    "log_unroll_step",      # pragma_auto_unroll_max_step on the loop
    "depth",                # loops and blocks above this node
    "log_trip_count",       # iterations of this node's body: product of enclosing extents
    "log_bytes",            # buffer bytes
    "scope_global", "scope_local", "scope_shared",
    "is_reduction",         # block has a reduction iterator
    "thread_tag",           # 1 + index of the thread tag (blockIdx.x, ..., threadIdx.z), else 0
    "log_vector_width",     # lanes of a vectorized loop
    "innermost",            # loop with no loop inside it
    "log_inner_dim_accesses",  # accesses whose last (contiguous) index this loop's variable drives
    "log_accesses",         # block: buffer regions it reads and writes
    "rel_extent",           # log_extent / the workload's log iteration count (or largest buffer)
    "rel_trip_count",       # log_trip_count / the workload's log iteration count
    "rel_bytes",            # log_bytes / the workload's largest buffer's log bytes
    "log_footprint",        # loop: bytes its whole run touches, over the blocks beneath it
    "rel_footprint",        # log_footprint / the workload's largest buffer's log bytes
    # The same program costs differently on another CPU: these read the loops against the
    # device's cores and vector registers (calo.schedule_graph.Device), so a model trained on
    # several devices sees how much of a schedule's parallelism and vector width each can use
    # (graph kind device-schedule; zero without a target).
    "log_core_trip_count",  # log_trip_count with parallel loops split over the cores and
                            #   vectorized ones counted in vector instructions
    "rel_core_trip_count",  # log_core_trip_count / the workload's log iteration count
    "log_parallel_ways",    # parallel loop: cores it keeps busy, min(extent, cores)
    "log_vector_ops",       # vectorized loop: vector instructions per element op
)
NUM_FEATURES = len(FEATURES)
_COL = {name: i for i, name in enumerate(FEATURES)}
DEVICE_COLUMNS = [_COL[name] for name in ("log_core_trip_count", "rel_core_trip_count",
                                          "log_parallel_ways", "log_vector_ops")]
_THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y",
                "threadIdx.z", "vthread")
_LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread_bound")


class Device(NamedTuple):
    """What of a target the graph reads: cores a parallel loop is split over, and the bytes of
    one vector register (SIMD width). GPUs and unknown targets read as one core and scalar
    code: their parallelism is in the thread-bound loops the graph marks already."""
    cores: int = 1
    vector_bytes: int = 0


_DEVICES: dict[str, Device] = {}
# x86 vector extensions, widest first, and their register bytes (LLVM feature names)
_VECTOR_FEATURES = (("avx512f", 64), ("avx", 32), ("sse2", 16), ("neon", 16))


def device_of(target) -> Device:
    """The Device of a TVM target (None: the scalar default), read from TVM once per target."""
    if target is None:
        return Device()
    key = str(target)
    if key not in _DEVICES:
        from tvm.target import codegen

        device = Device()
        if target.kind.name == "llvm":
            cores = target.attrs.get("num-cores")
            vector = next((size for feature, size in _VECTOR_FEATURES
                           if codegen.llvm_cpu_has_features(feature, target)), 0)
            device = Device(int(cores) if cores else 1, vector)
        _DEVICES[key] = device
    return _DEVICES[key]


@dataclass
class ScheduleGraph:
    x: np.ndarray            # [num_nodes, NUM_FEATURES] float32
    edge_index: np.ndarray   # [2, num_edges] int64
    edge_type: np.ndarray    # [num_edges] int64
    # TVM's per-store feature rows (calo.store_features), when the model reads them, and the
    # Device of the target they were extracted for (the trees read it beside them)
    stores: np.ndarray | None = None
    device: Device | None = None


@dataclass
class _Builder:
    rows: list[np.ndarray] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    etype: list[int] = field(default_factory=list)
    buffers: dict[str, int] = field(default_factory=dict)
    loop_of_var: dict[int, int] = field(default_factory=dict)  # hash(loop var) -> loop node
    loops: int = 0
    # (loop node, extent) of the loops around the walk, outermost first
    enclosing: list[tuple[int, int]] = field(default_factory=list)
    device: Device = Device()
    vector_lanes: int = 1    # elements of the program's widest type in one vector register
    core_trips: int = 1      # trips of the walk's position per core, in vector instructions

    def node(self, **values: float) -> int:
        row = np.zeros(NUM_FEATURES, dtype=np.float32)
        for name, value in values.items():
            row[_COL[name]] = value
        self.rows.append(row)
        return len(self.rows) - 1

    def edge(self, src: int, dst: int, kind: int) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.etype.append(kind)

    def buffer(self, buf) -> int:
        info = _buffer_info(buf)
        if info.name not in self.buffers:
            self.rows.append(info.row.copy())
            self.buffers[info.name] = len(self.rows) - 1
        return self.buffers[info.name]


class _BufferInfo(NamedTuple):
    buf: object              # held so the cache key (the node's address) stays in use
    name: str
    row: np.ndarray          # the buffer's node features
    shape: tuple[int, ...]   # static sizes (symbolic dimensions count as 1)
    elem_bytes: float


# Buffer -> what the graph reads of it. All candidates of a task share the workload's buffer
# objects (a schedule rewrites loops, not the function's parameters), so their features are
# read from TVM once per task. TIR nodes are immutable and the entry holds its buffer, so the
# key (the node's address) cannot be reused while the entry lives.
_BUFFERS: dict[int, _BufferInfo] = {}
_BUFFER_CACHE_SIZE = 4096


def _buffer_info(buf) -> _BufferInfo:
    """A buffer's name, features, shape and element size, read from TVM once per task."""
    key = hash(buf)
    hit = _BUFFERS.get(key)
    if hit is None:
        elems, nbytes = buffer_size(buf)
        scope = buf.scope()
        row = np.zeros(NUM_FEATURES, dtype=np.float32)
        for column, value in (("is_buffer", 1.0), ("log_extent", _log(elems)),
                              ("log_bytes", _log(nbytes)),
                              ("scope_global", scope == "global"),
                              ("scope_local", scope.startswith("local")),
                              ("scope_shared", scope.startswith("shared"))):
            row[_COL[column]] = value
        if len(_BUFFERS) >= _BUFFER_CACHE_SIZE:
            _BUFFERS.clear()
        shape = tuple(_int(size) for size in buf.shape[:])
        hit = _BUFFERS[key] = _BufferInfo(buf, buf.name, row, shape, nbytes / max(elems, 1))
    return hit


def buffer_size(buf) -> tuple[int, float]:
    """Elements and bytes of a buffer (symbolic dimensions count as 1)."""
    elems = math.prod(_int(s) for s in buf.shape[:])
    width = re.search(r"(\d+)$", str(buf.dtype))  # float32 -> 32
    return elems, elems * (int(width.group(1)) if width else 32) / 8


def _int(expr) -> int:
    try:
        return int(expr)
    except (TypeError, ValueError):
        return 1  # symbolic extent: no static size to report


def _log(value: float) -> float:
    return math.log2(1.0 + max(value, 0.0))


def extract_graph(func: tirx.PrimFunc, target=None) -> ScheduleGraph:
    """Walk a scheduled PrimFunc once and return its schedule graph, its loops read against
    the target's cores and vector width (device_of); without a target those columns are zero
    (graph kind "schedule": a donor of one device learns nothing from them)."""
    g = _Builder(device=device_of(target))
    elem_bytes = 4.0
    for param in func.params:
        if hasattr(param, "shape"):
            g.buffer(param)
            elem_bytes = max(elem_bytes, _buffer_info(param).elem_bytes)
    g.vector_lanes = max(int(g.device.vector_bytes // elem_bytes), 1)
    _walk(g, func.body, parent=None, depth=0, trips=1, loop_blocks=[])
    x = np.stack(g.rows) if g.rows else np.zeros((0, NUM_FEATURES), np.float32)
    _normalize_per_workload(x)
    if target is None:
        x[:, DEVICE_COLUMNS] = 0.0
    return ScheduleGraph(
        x=x,
        edge_index=np.array([g.src, g.dst], dtype=np.int64).reshape(2, -1),
        edge_type=np.array(g.etype, dtype=np.int64),
    )


def extract_graphs(funcs: list[tirx.PrimFunc], target=None) -> list[ScheduleGraph]:
    """extract_graph of each func, in one call to the native walker where it builds."""
    union = extract_union(funcs, target)
    if union is None:
        return [extract_graph(func, target) for func in funcs]
    rows, edges = np.cumsum(union.nodes), np.cumsum(union.edges)
    return [ScheduleGraph(x=union.x[r - n:r].copy(), edge_index=union.edge_index[:, e - m:e].copy(),
                          edge_type=union.edge_type[e - m:e].copy())
            for r, n, e, m in zip(rows, union.nodes, edges, union.edges)]


def extract_union(programs: list, target=None) -> native.Union | None:
    """The graphs of programs (PrimFuncs, or MeasureCandidates: their scheduled "main")
    concatenated, from the native walker (None where it does not build): what a batch is made
    of, without a Python object per graph."""
    if native.walker() is None:
        return None
    device = device_of(target)
    return native.extract(programs, list(FEATURES), device.cores, device.vector_bytes,
                          target is not None)


def _normalize_per_workload(x: np.ndarray) -> None:
    """Fill the rel_* columns: each size over the workload's own (schedule-independent) size."""
    if not len(x):
        return
    blocks, buffers = x[:, _COL["is_block"]] == 1, x[:, _COL["is_buffer"]] == 1
    def largest(rows: np.ndarray, column: str) -> float:
        return max(float(x[rows, _COL[column]].max()) if rows.any() else 0.0, 1.0)

    size = largest(blocks, "log_extent")
    x[:, _COL["rel_extent"]] = x[:, _COL["log_extent"]] / np.where(
        buffers, largest(buffers, "log_extent"), size)
    x[:, _COL["rel_trip_count"]] = x[:, _COL["log_trip_count"]] / size
    x[:, _COL["rel_core_trip_count"]] = x[:, _COL["log_core_trip_count"]] / size
    x[:, _COL["rel_bytes"]] = x[:, _COL["log_bytes"]] / largest(buffers, "log_bytes")
    x[:, _COL["rel_footprint"]] = x[:, _COL["log_footprint"]] / largest(buffers, "log_bytes")


def _walk(g: _Builder, stmt, parent: int | None, depth: int, trips: int,
          loop_blocks: list[int]) -> list[int]:
    """Add stmt's nodes; return the ids of the top-level nodes it produced (for sequence edges).

    loop_blocks collects the block ids found under the innermost enclosing loop, for fusion edges.
    """
    if isinstance(stmt, s_tir.SBlockRealize):
        return _walk_block(g, stmt, parent, depth, trips, loop_blocks)
    if isinstance(stmt, tirx.For):
        return [_walk_loop(g, stmt, parent, depth, trips, loop_blocks)]
    if isinstance(stmt, tirx.SeqStmt):
        heads: list[int] = []
        previous: int | None = None
        for child in stmt.seq[:]:  # a slice reads the FFI array in one pass
            produced = _walk(g, child, parent, depth, trips, loop_blocks)
            if produced:
                if previous is not None:
                    g.edge(previous, produced[0], SEQUENCE)
                previous = produced[-1]
                heads.extend(produced)
        return heads
    if isinstance(stmt, tirx.IfThenElse):
        produced = _walk(g, stmt.then_case, parent, depth, trips, loop_blocks)
        if stmt.else_case is not None:
            produced += _walk(g, stmt.else_case, parent, depth, trips, loop_blocks)
        return produced
    body = getattr(stmt, "body", None)
    if isinstance(body, tirx.Stmt):
        return _walk(g, body, parent, depth, trips, loop_blocks)
    return []


def _walk_loop(g: _Builder, loop: tirx.For, parent: int | None, depth: int, trips: int,
               loop_blocks: list[int]) -> int:
    extent = _int(loop.extent)
    kind = _LOOP_KINDS[int(loop.kind)] if int(loop.kind) < len(_LOOP_KINDS) else "serial"
    tag = loop.thread_binding.thread_tag if loop.thread_binding is not None else ""
    unroll = loop.annotations.get("pragma_auto_unroll_max_step", 0) if loop.annotations else 0
    ways = min(extent, g.device.cores) if kind == "parallel" else 1
    lanes = g.vector_lanes if kind == "vectorized" else 1
    core_extent = -(-extent // (ways * lanes))  # ceil: the busiest core's share
    node = g.node(
        is_loop=1,
        log_extent=_log(extent),
        depth=depth,
        log_trip_count=_log(trips * extent),
        log_unroll_step=_log(_int(unroll)),
        thread_tag=_THREAD_TAGS.index(tag) + 1 if tag in _THREAD_TAGS else 0,
        log_vector_width=_log(extent) if kind == "vectorized" else 0.0,
        log_core_trip_count=_log(g.core_trips * core_extent),
        log_parallel_ways=_log(ways) if kind == "parallel" else 0.0,
        log_vector_ops=_log(core_extent) if kind == "vectorized" else 0.0,
        **{kind: 1.0},
    )
    if parent is not None:
        g.edge(parent, node, NEST)
    g.loop_of_var[hash(loop.loop_var)] = node
    g.loops += 1
    inner_blocks: list[int] = []
    loops_before = g.loops
    g.enclosing.append((node, extent))
    outer_core_trips, g.core_trips = g.core_trips, g.core_trips * core_extent
    _walk(g, loop.body, node, depth + 1, trips * extent, inner_blocks)
    g.enclosing.pop()
    g.core_trips = outer_core_trips
    g.rows[node][_COL["innermost"]] = float(g.loops == loops_before)
    # Blocks computed inside the same loop nest are fused: link them in program order.
    for a, b in zip(inner_blocks, inner_blocks[1:]):
        g.edge(a, b, FUSION)
    loop_blocks.extend(inner_blocks)
    return node


def _walk_block(g: _Builder, realize: s_tir.SBlockRealize, parent: int | None, depth: int,
                trips: int, loop_blocks: list[int]) -> list[int]:
    block = realize.block
    for buf in block.alloc_buffers[:]:
        g.buffer(buf)
    if block.name_hint == "root" and parent is None:
        return _walk(g, block.body, None, depth, trips, loop_blocks)
    iter_vars, reads, writes = block.iter_vars[:], block.reads[:], block.writes[:]
    domain = math.prod(_int(iv.dom.extent) for iv in iter_vars)
    reduction = any(int(iv.iter_type) == 2 for iv in iter_vars)  # CommReduce
    node = g.node(
        is_block=1,
        log_extent=_log(domain),
        depth=depth,
        log_trip_count=_log(trips),
        log_core_trip_count=_log(g.core_trips),
        is_reduction=float(reduction),
        log_accesses=_log(len(reads) + len(writes)),
    )
    if parent is not None:
        g.edge(parent, node, NEST)
    _mark_accesses(g, iter_vars, realize.iter_values[:], reads + writes)
    for region in reads:
        g.edge(g.buffer(region.source), node, DATAFLOW)
    for region in writes:
        g.edge(node, g.buffer(region.source), DATAFLOW)
    loop_blocks.append(node)
    _walk(g, block.body, node, depth + 1, trips, loop_blocks)
    return [node]


def _mark_accesses(g: _Builder, iter_vars: list, iter_values: list, regions: list) -> None:
    """Per enclosing loop: the block's accesses whose contiguous index it drives, and the bytes
    the block touches over the loop's whole run (its footprint: what decides the cache level a
    tile lives in).

    The last index is the contiguous one, so a vectorized or innermost loop that drives it walks
    memory with unit stride: the access pattern that caches and vector units reward. A region's
    span along one dimension under a loop is the product of the extents of the loops, at or
    inside it, that drive that dimension (exact for the splits a schedule makes), at most the
    buffer's size there.
    """
    drivers: dict[int, list[int]] = {}  # hash(block iter var) -> loop nodes its binding reads
    for iv, value in zip(iter_vars, iter_values):
        drivers[hash(iv.var)] = [g.loop_of_var[h] for h in map(hash, _vars(value))
                                 if h in g.loop_of_var]
    inner_dim: dict[int, int] = {}
    touched: dict[str, list[float]] = {}  # buffer -> its bytes under each enclosing loop
    for region in regions:
        info = _buffer_info(region.source)
        dims = []  # per dimension: (loop nodes driving it, extent of one access, buffer size)
        for rng, size in zip(region.region[:], info.shape):
            loops = [loop for v in _vars(rng.min) for loop in drivers.get(hash(v), ())]
            dims.append((loops, _int(rng.extent), size))
        if not dims:
            continue
        for loop in dims[-1][0]:
            inner_dim[loop] = inner_dim.get(loop, 0) + 1
        spans = [min(float(extent), size) for _, extent, size in dims]
        elems = math.prod(spans)
        per_loop = touched.setdefault(info.name, [0.0] * len(g.enclosing))
        for k in range(len(g.enclosing) - 1, -1, -1):  # innermost loop first
            loop, extent = g.enclosing[k]
            for d, (loops, _, size) in enumerate(dims):
                if loop in loops and spans[d] < size:
                    grown = min(spans[d] * extent, size)
                    elems *= grown / spans[d]
                    spans[d] = grown
            per_loop[k] = max(per_loop[k], elems * info.elem_bytes)
    for loop, uses in inner_dim.items():
        _add_log(g.rows[loop], "log_inner_dim_accesses", uses)
    for k, (loop, _) in enumerate(g.enclosing):
        _add_log(g.rows[loop], "log_footprint", sum(b[k] for b in touched.values()))


def _add_log(row: np.ndarray, column: str, value: float) -> None:
    """Add value to a count kept in log2(1 + x) units."""
    row[_COL[column]] = _log(2 ** float(row[_COL[column]]) - 1 + value)


def _vars(expr) -> list:
    """The variables an index expression reads (most are one variable: no call into TVM)."""
    if isinstance(expr, tirx.Var):
        return [expr]
    if isinstance(expr, tirx.IntImm):
        return []
    return tirx.analysis.undefined_vars(expr)[:]


__all__ = ["EDGE_TYPES", "FEATURES", "NUM_FEATURES", "Device", "ScheduleGraph", "buffer_size",
           "device_of", "extract_graph", "extract_graphs", "extract_union"]
