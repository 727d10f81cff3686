"""Graph datasets: a device's measured records' graphs, their workloads and splits (on disk in a
sharded store, calo.graph_store)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from calo.config import Split
from calo.errors import CaloError
from calo.graph_store import MANIFEST, GraphStore, ShardedGraphs, StoreWriter
from calo.native import Union
from calo.schedule_graph import Device, ScheduleGraph

SPLITS = ("train", "val", "test")


def to_data(graph: ScheduleGraph, log_latency: float | None = None) -> Data:
    data = Data(
        x=torch.from_numpy(graph.x),
        edge_index=torch.from_numpy(graph.edge_index),
        edge_type=torch.from_numpy(graph.edge_type),
    )
    if graph.stores is not None:
        if graph.device is None:
            raise ValueError("store rows without the Device of the target they were extracted for")
        data.store_rows = torch.from_numpy(graph.stores)
        data.store_device = device_row(graph.device)
    if log_latency is not None:
        data.y = torch.tensor([log_latency], dtype=torch.float32)
    return data


def device_row(device: Device) -> torch.Tensor:
    """[1, 2]: a Device's cores and vector bytes, as a graph keeps them beside its store rows
    (one row per graph, so a batch of graphs stacks them)."""
    return torch.tensor([[device.cores, device.vector_bytes]], dtype=torch.float32)


def collate(graphs: list[ScheduleGraph]) -> tuple:
    """One disjoint-union batch of many graphs: (x, edge_index, edge_type, batch, num_graphs,
    stores, stores_batch), the last two None for graphs without per-store features.

    What PyG's Batch.from_data_list builds, from the numpy arrays directly: at a search
    population's size (hundreds of small graphs) the generic collation costs more than the
    model's forward pass.
    """
    union = Union(np.concatenate([g.x for g in graphs]),
                  np.concatenate([g.edge_index for g in graphs], axis=1),
                  np.concatenate([g.edge_type for g in graphs]),
                  np.array([len(g.x) for g in graphs]),
                  np.array([g.edge_index.shape[1] for g in graphs]))
    stores = stores_batch = None
    if graphs and graphs[0].stores is not None:
        stores = torch.from_numpy(np.concatenate([g.stores for g in graphs]))
        stores_batch = torch.from_numpy(np.repeat(np.arange(len(graphs)),
                                                  [len(g.stores) for g in graphs]))
    return (*collate_union(union)[:5], stores, stores_batch)


def collate_union(union: Union) -> tuple:
    """collate's batch from graphs the native walker concatenated (calo.native.Union)."""
    offsets = np.repeat(np.cumsum(union.nodes) - union.nodes, union.edges)
    return (torch.from_numpy(union.x), torch.from_numpy(union.edge_index + offsets),
            torch.from_numpy(union.edge_type),
            torch.from_numpy(np.repeat(np.arange(len(union.nodes)), union.nodes)),
            len(union.nodes), None, None)


@dataclass
class GraphSet:
    graphs: Sequence[Data]      # y = natural log of the measured seconds; a list, or lazily
                                # read graphs of a store (calo.graph_store)
    workload: list[str]         # workload names (params.yaml), or structural keys if unnamed
    record: list[int]           # index of the record in its store
    kind: str = "schedule"      # graph kind (calo.graphs)

    def select(self, keep: list[bool]) -> GraphSet:
        if isinstance(self.graphs, ShardedGraphs):  # a view: nothing is loaded
            graphs = self.graphs.subset(np.flatnonzero(np.asarray(keep, dtype=bool)))
        else:
            graphs = [g for g, k in zip(self.graphs, keep) if k]
        return GraphSet(graphs, *([v for v, k in zip(values, keep) if k]
                                  for values in (self.workload, self.record)), self.kind)

    def split(self, name: str, fractions: Split) -> GraphSet:
        return self.select([split_of(w, r, fractions) == name
                            for w, r in zip(self.workload, self.record)])

    def by_workload(self) -> list[GraphSet]:
        """One GraphSet per workload, in name order."""
        return [self.select([w == name for w in self.workload])
                for name in sorted(set(self.workload))]

    def workload_share(self, share: float) -> set[str]:
        """A share of the workload names (at least one, none of a single workload), chosen by a
        stable hash of the name."""
        names = sorted(set(self.workload), key=_unit)
        return set(names[:max(1, round(share * len(names)))] if len(names) > 1 else ())

    def held_out_workloads(self, fractions: Split) -> tuple[GraphSet, GraphSet, GraphSet]:
        """(train, val, test) where validation is whole workloads, a share `val` of them (at
        least one, chosen by a stable hash of the name); the rest split by record."""
        held = self.workload_share(fractions.val)
        rest = self.select([w not in held for w in self.workload])
        no_val = Split(val=0.0, test=fractions.test)
        return (rest.split("train", no_val), self.select([w in held for w in self.workload]),
                rest.split("test", no_val))

    def steady(self, max_spread: float | None) -> tuple[GraphSet, int]:
        """The graphs whose label's repeated runs agree within max_spread (unknown spread
        counts as agreeing), and how many were dropped."""
        if max_spread is None:
            return self, 0
        spread = (self.graphs.spread.tolist() if isinstance(self.graphs, ShardedGraphs)
                  else [float(getattr(g, "spread", torch.tensor([0.0]))[0]) for g in self.graphs])
        keep = [not s > max_spread for s in spread]
        return self.select(keep), keep.count(False)

    def __len__(self) -> int:
        return len(self.graphs)

    def labels(self) -> torch.Tensor:
        """Every graph's y (natural log of seconds), without loading a store's shards."""
        if isinstance(self.graphs, ShardedGraphs):
            return self.graphs.y
        return torch.cat([g.y for g in self.graphs]) if self.graphs else torch.zeros(0)

    def per_workload(self) -> float:
        """Graphs per workload: the warm-up size the fine-tune rule is keyed by."""
        return len(self.graphs) / max(len(set(self.workload)), 1)


def _unit(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") / 2**64


def split_of(workload: str, record: int, fractions: Split) -> str:
    """Stable assignment of a record to train/val/test: appending records never moves old ones."""
    u = _unit(f"{workload}/{record}")
    if u < fractions.test:
        return "test"
    if u < fractions.test + fractions.val:
        return "val"
    return "train"


def save_graphs(path: Path, graphs: GraphSet, shard_size: int) -> None:
    """A new store at path holding these graphs (calo.graph_store), replacing any there."""
    stores = bool(graphs.graphs) and "store_rows" in graphs.graphs[0]
    writer = StoreWriter(path, graphs.kind, stores, shard_size)
    for data, workload, record in zip(graphs.graphs, graphs.workload, graphs.record):
        writer.add(data.x, data.edge_index, data.edge_type,
                   data.store_rows if stores else None,
                   data.store_device if stores else None, data.y.item(),
                   float(getattr(data, "spread", torch.tensor([float("nan")]))[0]),
                   workload, record)
        if writer.full:
            writer.commit(0, "")
    writer.commit(0, "")


def load_graphs(path: Path, kind: str, stores: bool = False) -> GraphSet:
    """The graphs at path, read lazily (calo.graph_store), which must be of the kind the
    reader's model expects (and carry per-store features if it reads them: `stores`; they are
    loaded wherever present)."""
    if not (path / MANIFEST).is_file() and path.with_suffix(".pt").is_file():
        raise CaloError(f"{path.with_suffix('.pt')} is a graph file of an older version: "
                        "re-run `calo extract` to build the sharded store")
    store = GraphStore(path)
    if store.kind != kind:
        raise CaloError(f"{path} holds {store.kind} graphs but the model reads "
                        f"{kind} graphs: re-run `calo extract` (and pretrain) after changing "
                        "graph.kind")
    if stores and not store.has_stores:
        raise CaloError(f"{path} holds graphs without per-store features, which the model "
                        "(graph.stores) or its residual correction (finetune.rule) reads: re-run "
                        "`calo extract` with these params.yaml")
    return GraphSet(ShardedGraphs(store), list(store.workload), list(store.record), kind)
