"""A device's graphs on disk, in shards of a fixed size, read lazily: memory follows the shard
and batch size, not the dataset.

  <dir>/manifest.json        kind, per-store features or not, shard size, the shards and how
                             many graphs each holds, the index file, and which records the
                             graphs cover (a count of record lines and a hash of those lines,
                             so a top-up extracts only the records appended since)
  <dir>/index-<gen>.pt       per graph: log latency, spread, workload, record index, and the
                             device its store rows were extracted for (small)
  <dir>/shard-<k>.pt         its graphs' x, edge_index, edge_type (and store rows), each
                             concatenated over the graphs with the offsets where each starts:
                             a shard loads as a few large tensors, not thousands of small ones

The manifest is the commit point: it is replaced atomically after the files it names are
written. A shard only ever grows (the last, partial one is rewritten with more graphs) and a
reader takes the manifest's count of it, so a crash between the two leaves a readable store.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from calo.errors import CaloError

MANIFEST = "manifest.json"
# Raised whenever what a graph holds changes (3: schedule graphs gained loop footprints, 4:
# their loops read against the device, 5: store rows' tied buffers in one order, 6: the
# device beside the store rows), so a store of older graphs is rebuilt, not read with columns
# a model does not expect.
FORMAT = 6
NO_DEVICE = (math.nan, math.nan)  # a graph without store rows keeps no device
Array = torch.Tensor | np.ndarray
SHARD_CACHE = 2  # shards a reader keeps loaded: the one it reads and the one before


def _save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def read_manifest(root: Path) -> dict | None:
    file = root / MANIFEST
    return json.loads(file.read_text()) if file.is_file() else None


class GraphStore:
    """A store opened for reading: the index in memory, shards loaded on demand."""

    def __init__(self, root: Path):
        self.root = root
        manifest = read_manifest(root)
        if manifest is None:
            raise CaloError(f"no graphs at {root}: run `calo extract` for this device first")
        if manifest.get("format") != FORMAT:
            raise CaloError(f"{root} holds graphs in format {manifest.get('format')}, this "
                            f"version reads {FORMAT}: re-run `calo extract`")
        self.manifest = manifest
        index = torch.load(root / manifest["index"], weights_only=True)
        self.y, self.spread, self.device = index["y"], index["spread"], index["device"]
        self.workload, self.record = list(index["workload"]), list(index["record"])
        counts = [s["graphs"] for s in manifest["shards"]]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.starts[-1] != len(self.y):
            raise CaloError(f"{root}: the index lists {len(self.y)} graphs, the shards "
                            f"{self.starts[-1]}: re-run `calo extract`")
        self._cache: OrderedDict[int, dict] = OrderedDict()

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def has_stores(self) -> bool:
        return self.manifest["stores"]

    def __len__(self) -> int:
        return len(self.y)

    def shard_of(self, i: np.ndarray | int) -> np.ndarray:
        return np.searchsorted(self.starts, i, side="right") - 1

    def _shard(self, k: int) -> dict:
        if k in self._cache:
            self._cache.move_to_end(k)
            return self._cache[k]
        shard = torch.load(self.root / self.manifest["shards"][k]["file"], weights_only=True)
        shard["ptr"] = {key: shard[f"{key}_ptr"].tolist() for key in PARTS
                        if shard.get(f"{key}_ptr") is not None}
        self._cache[k] = shard
        while len(self._cache) > SHARD_CACHE:
            self._cache.popitem(last=False)
        return shard

    def graph(self, i: int) -> Data:
        k = int(self.shard_of(i))
        shard, j = self._shard(k), i - int(self.starts[k])
        part = {key: _piece(shard, key, j) for key in shard["ptr"]}
        data = Data(x=part["x"], edge_index=part["edge_index"], edge_type=part["edge_type"],
                    y=self.y[i].reshape(1), spread=self.spread[i].reshape(1))
        if "stores" in part:
            data.store_rows, data.store_device = part["stores"], self.device[i].reshape(1, 2)
        return data


# What a shard holds per graph, and the dimension its pieces are concatenated along.
PARTS = {"x": 0, "edge_index": 1, "edge_type": 0, "stores": 0}


def _piece(shard: dict, key: str, j: int) -> torch.Tensor:
    start, end = shard["ptr"][key][j:j + 2]
    return shard[key].narrow(PARTS[key], start, end - start).contiguous()


def _concatenated(pieces: list[torch.Tensor], key: str) -> dict:
    sizes = [t.shape[PARTS[key]] for t in pieces]
    return {key: torch.cat(pieces, PARTS[key]),
            f"{key}_ptr": torch.tensor([0, *np.cumsum(sizes).tolist()], dtype=torch.long)}


class ShardedGraphs(Sequence):
    """Some graphs of a store (a split, a workload), in store order, loaded as they are read.

    Reading in order loads each shard once; `windows` hands out a bounded number of graphs at
    a time, whole shards in a random order, for training on more graphs than fit in memory.
    """

    def __init__(self, store: GraphStore, indices: np.ndarray | None = None):
        self.store = store
        self.indices = np.arange(len(store)) if indices is None else np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ShardedGraphs(self.store, self.indices[i])
        return self.store.graph(int(self.indices[i]))

    def __iter__(self) -> Iterator[Data]:
        return (self.store.graph(int(i)) for i in self.indices)

    def subset(self, positions: np.ndarray) -> ShardedGraphs:
        return ShardedGraphs(self.store, self.indices[positions])

    @property
    def y(self) -> torch.Tensor:
        """Every graph's label, without loading a shard."""
        return self.store.y[torch.from_numpy(self.indices)]

    @property
    def spread(self) -> torch.Tensor:
        """Every graph's label spread (NaN: unknown), without loading a shard."""
        return self.store.spread[torch.from_numpy(self.indices)]

    @property
    def device(self) -> torch.Tensor:
        """[graphs, 2]: the device each graph's store rows were extracted for (cores, vector
        bytes; NaN: no store rows), without loading a shard."""
        return self.store.device[torch.from_numpy(self.indices)]

    def window_positions(self, size: int, generator: torch.Generator | None = None
                         ) -> Iterator[np.ndarray]:
        """Positions of at most about `size` graphs at a time (whole shards; one shard may
        exceed it), every graph once: shards in a random order with a generator, else in store
        order."""
        shards = self.store.shard_of(self.indices)
        order = np.unique(shards)
        if generator is not None:
            order = order[torch.randperm(len(order), generator=generator).numpy()]
        window: list[np.ndarray] = []
        for k in order:
            part = np.flatnonzero(shards == k)
            if window and sum(map(len, window)) + len(part) > size:
                yield np.concatenate(window)
                window = []
            window.append(part)
        if window:
            yield np.concatenate(window)

    def windows(self, size: int, generator: torch.Generator | None = None
                ) -> Iterator[list[Data]]:
        """The graphs of window_positions, loaded."""
        for positions in self.window_positions(size, generator):
            yield list(self.subset(positions))


class StoreWriter:
    """Appends graphs to a store (a new one, or an existing one being topped up) and commits
    what it has written: after every full shard, so a long extraction resumes where it stopped."""

    def __init__(self, root: Path, kind: str, stores: bool, shard_size: int,
                 start: GraphStore | None = None):
        if shard_size < 1:
            raise CaloError(f"shard size must be at least 1, got {shard_size}")
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.kind, self.stores, self.shard_size = root, kind, stores, shard_size
        self.shards: list[dict] = []
        self.y, self.spread, self.workload, self.record = [], [], [], []
        self.device: list = []
        self.generation = 0
        self.committed: tuple[int, int] | None = None  # (graphs, records) on disk now
        self.pending: dict[str, list] = {"x": [], "edge_index": [], "edge_type": [],
                                         "stores": []}
        if start is not None:
            self._continue(start)
        else:  # a new store replaces what is there: its shards are overwritten from here on
            (root / MANIFEST).unlink(missing_ok=True)

    def _continue(self, store: GraphStore) -> None:
        """Start from an existing store: its full shards stay as they are; the last one, if
        partial, is reopened so new graphs fill it."""
        self.shards = list(store.manifest["shards"])
        self.y, self.spread = store.y.tolist(), store.spread.tolist()
        self.device = store.device.tolist()
        self.workload, self.record = list(store.workload), list(store.record)
        self.generation = store.manifest["generation"]
        self.committed = (len(store), store.manifest["records"])
        if self.shards and self.shards[-1]["graphs"] < self.shard_size:
            last = self.shards.pop()
            shard = store._shard(len(self.shards))
            for key in shard["ptr"]:
                self.pending[key] = [_piece(shard, key, j) for j in range(last["graphs"])]

    def add(self, x: Array, edge_index: Array, edge_type: Array, stores: Array | None,
            device: Sequence[float] | Array | None, log_latency: float, spread: float,
            workload: str, record: int) -> None:
        """One graph: its arrays (torch tensors or numpy arrays), the device (cores, vector
        bytes) its store rows were extracted for, and its label."""
        for key, value in (("x", x), ("edge_index", edge_index), ("edge_type", edge_type)):
            self.pending[key].append(torch.as_tensor(value))
        if self.stores:
            self.pending["stores"].append(torch.as_tensor(stores))
        self.device.append(NO_DEVICE if device is None
                           else [float(v) for v in torch.as_tensor(device).reshape(2)])
        self.y.append(log_latency)
        self.spread.append(spread)
        self.workload.append(workload)
        self.record.append(record)

    @property
    def full(self) -> bool:
        return len(self.pending["x"]) >= self.shard_size

    def commit(self, records: int, records_sha256: str) -> None:
        """Write the pending graphs and a manifest covering the first `records` record lines
        (whose hash is records_sha256). A partial shard stays pending: later graphs fill it.
        Nothing new, nothing written: the store's files (and DVC's hash of them) stay."""
        if self.committed == (len(self.y), records):
            return
        self.committed = (len(self.y), records)
        shards = list(self.shards)
        if count := len(self.pending["x"]):
            name = f"shard-{len(self.shards):05d}.pt"
            _save({k: v for key, pieces in self.pending.items() if pieces
                   for k, v in _concatenated(pieces, key).items()}, self.root / name)
            shards.append({"file": name, "graphs": count})
        self.generation += 1
        index = f"index-{self.generation:06d}.pt"
        _save({"y": torch.tensor(self.y, dtype=torch.float32),
               "spread": torch.tensor(self.spread, dtype=torch.float32),
               "device": torch.tensor(self.device, dtype=torch.float32).reshape(-1, 2),
               "workload": self.workload, "record": self.record}, self.root / index)
        manifest = {"format": FORMAT, "kind": self.kind, "stores": self.stores,
                    "shard_size": self.shard_size, "generation": self.generation,
                    "graphs": len(self.y), "records": records,
                    "records_sha256": records_sha256, "index": index, "shards": shards}
        tmp = self.root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        tmp.replace(self.root / MANIFEST)
        if self.full:
            self.shards = shards
            self.pending = {key: [] for key in self.pending}
        # What the manifest no longer names: an older index, shards of a store rebuilt smaller.
        keep = {index, *(shard["file"] for shard in shards)}
        for old in (*self.root.glob("index-*.pt"), *self.root.glob("shard-*.pt")):
            if old.name not in keep:
                old.unlink(missing_ok=True)
