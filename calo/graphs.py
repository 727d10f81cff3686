"""The graph kinds a model can learn from (params.yaml `graph.kind`), behind one interface.

  schedule  loops, blocks and buffers with hand-chosen schedule features (calo.schedule_graph)
  ast       every TIR statement and expression, typed, with its constants (calo.ast_graph)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import get_args

import torch

from calo import ast_graph, native, schedule_graph, store_features
from calo.config import GraphKind
from calo.dataset import GraphSet, to_data
from calo.errors import CaloError
from calo.schedule_graph import ScheduleGraph

# device-schedule: the schedule graph with its loops read against the record's target (cores,
# vector width), for a donor trained on several devices; schedule leaves those columns zero.
KINDS: dict[str, ModuleType] = {"schedule": schedule_graph, "device-schedule": schedule_graph,
                                "ast": ast_graph}
DEVICE_KINDS = {"device-schedule"}
assert set(KINDS) == set(get_args(GraphKind)), "calo.config.GraphKind names the graph kinds"


def _module(kind: str) -> ModuleType:
    if kind not in KINDS:
        raise CaloError(f"unknown graph kind '{kind}' (known: {', '.join(KINDS)})")
    return KINDS[kind]


def schema(kind: str) -> tuple[list[str], list[str]]:
    """Feature names and edge type names of a graph kind."""
    module = _module(kind)
    return list(module.FEATURES), list(module.EDGE_TYPES)


def of_record(kind: str, record, stores: bool = False) -> ScheduleGraph:
    """The graph of a TuningRecord's scheduled program (its trace replayed on its workload),
    with TVM's per-store features if `stores`."""
    return of_candidates(kind, record.workload.mod, record.target,
                         [record.as_measure_candidate()], stores)[0]


def of_candidates(kind: str, mod, target, candidates: list, stores: bool = False
                  ) -> list[ScheduleGraph]:
    """Graphs of MeasureCandidates of one workload (mod) on target, with TVM's per-store
    features and the target's Device if `stores` (extracted in one call for all of them)."""
    device = target if kind in DEVICE_KINDS else None
    funcs = [c.sch.mod["main"] for c in candidates]
    module = _module(kind)
    graphs = (schedule_graph.extract_graphs(funcs, device) if module is schedule_graph
              else [module.extract_graph(func, device) for func in funcs])
    if stores:
        for graph, rows in zip(graphs, store_features.of_candidates(mod, target, candidates)):
            graph.stores, graph.device = rows, schedule_graph.device_of(target)
    return graphs


def union_of_candidates(kind: str, target, candidates: list) -> native.Union | None:
    """The graphs of candidates concatenated by the native walker; None for a kind it does not
    walk or where it does not build."""
    if _module(kind) is not schedule_graph:
        return None
    return schedule_graph.extract_union(candidates, target if kind in DEVICE_KINDS else None)


def graph_set(kind: str, records: Iterable, on_graph: Callable[[], None] = lambda: None,
              stores: bool = False) -> GraphSet:
    """Graphs of measured records (calo.records.Record), labelled with their log latency."""
    graphs = GraphSet([], [], [], kind)
    for rec in records:
        data = to_data(of_record(kind, rec.record, stores), math.log(rec.latency))
        data.spread = torch.tensor([math.nan if rec.spread is None else rec.spread])
        graphs.graphs.append(data)
        graphs.workload.append(rec.workload_name)
        graphs.record.append(rec.index)
        on_graph()
    return graphs
