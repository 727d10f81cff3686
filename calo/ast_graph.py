"""A scheduled TIR PrimFunc as its syntax tree: every TIR statement and expression is a node.

The alternative to the schedule graph (params.yaml `graph.kind: ast`), after the AST-level cost
models that learn from the program text itself rather than from hand-chosen loop features. A
node's features are a one-hot of its type (the model's first linear layer turns it into a
learned node-type embedding) and its constant value, if it is one. Edges:
  child   parent -> child in the syntax tree, in field order
  buffer  buffer -> every load and store of it (one node per buffer, shared)
  var     the statement that binds a variable (loop, block iterator) -> every use of it

Loop kinds are part of the type ("For:vectorized"), so the schedule's decisions show up as
node types (loop kinds), constants (extents, tile factors) and tree shape (loop order, fusion).
"""

from __future__ import annotations

import math

import numpy as np
from tvm import s_tir, tirx

from calo.schedule_graph import ScheduleGraph, buffer_size

EDGE_TYPES = ("child", "buffer", "var")
CHILD, BUFFER, VAR = range(3)

NODE_TYPES = (
    "For:serial", "For:parallel", "For:vectorized", "For:unrolled", "For:thread_bound",
    "SBlockRealize", "SBlock", "SeqStmt", "BufferStore", "IfThenElse", "Evaluate", "LetStmt",
    "AttrStmt", "BufferLoad", "Var", "IntImm", "FloatImm", "Add", "Sub", "Mul", "Div", "Mod",
    "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Not",
    "Select", "Cast", "Call", "Ramp", "Broadcast", "Let", "Buffer", "other",
)
FEATURES = tuple(f"type:{t}" for t in NODE_TYPES) + ("log_value", "log_bytes")
NUM_FEATURES = len(FEATURES)
_TYPE = {t: i for i, t in enumerate(NODE_TYPES)}
_VALUE, _BYTES = len(NODE_TYPES), len(NODE_TYPES) + 1
_LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread_bound")
# Fields that hold child nodes, in the order they appear in TVMScript.
_CHILD_FIELDS = ("iter_values", "predicate", "block", "min", "extent", "condition", "init",
                 "indices", "a", "b", "args", "true_value", "false_value", "base", "stride",
                 "value", "then_case", "else_case", "seq", "body")
_ALIASES = {"TensorLoad": "BufferLoad"}  # TVM 0.27's class name for a buffer load
_fields_of: dict[type, tuple[str, ...]] = {}  # per node class: which of _CHILD_FIELDS it has


def _fields(node) -> tuple[str, ...]:
    cls = type(node)
    if cls not in _fields_of:
        _fields_of[cls] = tuple(f for f in _CHILD_FIELDS if hasattr(node, f))
    return _fields_of[cls]


def _type_name(node) -> str:
    if isinstance(node, tirx.For):
        kind = int(node.kind)
        return "For:" + (_LOOP_KINDS[kind] if kind < len(_LOOP_KINDS) else "serial")
    name = _ALIASES.get(type(node).__name__, type(node).__name__)
    return name if name in _TYPE else "other"


def _signed_log(value: float) -> float:
    return math.copysign(math.log2(1.0 + abs(value)), value)


class _Builder:
    def __init__(self) -> None:
        self.types: list[int] = []
        self.values: list[float] = []
        self.bytes: list[float] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.etype: list[int] = []
        self.buffers: dict[str, int] = {}
        self.binder: dict[int, int] = {}  # hash(var) -> node that binds it

    def node(self, type_name: str, value: float = 0.0, nbytes: float = 0.0) -> int:
        self.types.append(_TYPE[type_name])
        self.values.append(value)
        self.bytes.append(nbytes)
        return len(self.types) - 1

    def edge(self, src: int, dst: int, kind: int) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.etype.append(kind)

    def buffer(self, buf) -> int:
        if buf.name not in self.buffers:
            _, nbytes = buffer_size(buf)
            self.buffers[buf.name] = self.node("Buffer", 0.0, math.log2(1 + nbytes))
        return self.buffers[buf.name]

    def visit(self, node, parent: int | None) -> None:
        if isinstance(node, (list, tuple)) or type(node).__name__ == "Array":
            for item in node:
                self.visit(item, parent)
            return
        if not isinstance(node, (tirx.Stmt, tirx.Expr)):
            return  # strings, ints, buffer regions: not syntax-tree nodes here
        value = float(node.value) if isinstance(node, (tirx.IntImm, tirx.FloatImm)) else 0.0
        type_name = _type_name(node)
        me = self.node(type_name, _signed_log(value))
        if parent is not None:
            self.edge(parent, me, CHILD)
        if isinstance(node, tirx.Var):
            binder = self.binder.get(hash(node))
            if binder is not None:
                self.edge(binder, me, VAR)
            return
        if isinstance(node, tirx.For):
            self.binder[hash(node.loop_var)] = me
        elif isinstance(node, s_tir.SBlock):
            for iv in node.iter_vars:
                self.binder[hash(iv.var)] = me
            for buf in node.alloc_buffers:
                self.buffer(buf)
        if type_name in ("BufferLoad", "BufferStore"):
            # TVM 0.27 names a load's buffer `source`, a store's `buffer`
            buf = node.buffer if type_name == "BufferStore" else node.source
            self.edge(self.buffer(buf), me, BUFFER)
        for name in _fields(node):
            child = getattr(node, name)
            if child is not None:
                self.visit(child, me)


def extract_graph(func: tirx.PrimFunc, target=None) -> ScheduleGraph:
    """Every statement and expression of the scheduled PrimFunc's body as a graph node (the
    target is not read: the AST carries no device features)."""
    g = _Builder()
    for param in func.params:
        if hasattr(param, "shape"):
            g.buffer(param)
    g.visit(func.body, None)
    x = np.zeros((len(g.types), NUM_FEATURES), dtype=np.float32)
    x[np.arange(len(g.types)), g.types] = 1.0
    x[:, _VALUE] = g.values
    x[:, _BYTES] = g.bytes
    return ScheduleGraph(
        x=x,
        edge_index=np.array([g.src, g.dst], dtype=np.int64).reshape(2, -1),
        edge_type=np.array(g.etype, dtype=np.int64),
    )
