"""Stage 2: a schedule graph for every successfully measured record of a device.

Incremental: the graph store (calo.graph_store) remembers how many record lines it covers and
a hash of them, so after a top-up harvest only the appended records are extracted; a store
whose records changed otherwise, or whose graph settings did, is rebuilt. Records are handed out
in chunks to `extract.workers` processes, or to a Dask cluster's workers (`extract.cluster`),
and the graphs come back in record order; the store commits after every full shard, so an
interrupted extraction resumes there.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from itertools import islice
from multiprocessing import get_context
from pathlib import Path

from calo import config as cfg
from calo import paths
from calo.errors import CaloError
from calo.graph_store import FORMAT, GraphStore, StoreWriter, read_manifest
from calo.log import Progress, get_logger
from calo.records import (
    RECORD_FILE,
    StoreContext,
    records_of_lines,
    store_context,
    stream_lines,
)

CHUNK = 64               # record lines per task handed to a worker
POOL_MIN_RECORDS = 2048  # fewer new records are extracted here: starting workers costs more


def extract(settings: cfg.Settings, device: str) -> dict:
    settings.device(device)
    store, out = paths.records_dir(device), paths.graphs_path(device)
    kind, stores = settings.graph.kind, settings.extracts_stores(device)
    total = sum(1 for _ in stream_lines(store / RECORD_FILE))
    writer, done, hasher, why = _resume(out, store, kind, stores, settings.extract.shard_size)
    new = total - done
    if why:
        get_logger().info(f"extract {device}: rebuilding the graph store ({why})")
    elif done:
        get_logger().info(f"extract {device}: {done} records already extracted, {new} new")
    progress = Progress(f"extract {device}", new, "records")
    lines = islice(enumerate(stream_lines(store / RECORD_FILE)), done, None)
    built = skipped = 0
    with _executor(settings.extract, new) as pool:
        for chunk, rows in _graphs_in_order(pool, store, kind, stores, lines):
            by_record = {row[-1]: row for row in rows}
            for index, line in chunk:
                hasher.update(line.encode() + b"\n")
                if index in by_record:
                    writer.add(*by_record[index])
                    built += 1
                else:
                    skipped += 1
                done = index + 1
                if writer.full:
                    writer.commit(done, hasher.hexdigest())
            progress.advance(len(chunk))
    writer.commit(done, hasher.hexdigest())
    graphs_total = len(writer.y)
    if not graphs_total:
        raise CaloError(f"no successful measurements in {store}: run `calo harvest` first")
    summary = {"device": device, "graphs": graphs_total, "new_graphs": built, "kind": kind,
               "failed_records_skipped": skipped, "shards": len(read_manifest(out)["shards"])}
    get_logger().info(f"extract {device}: {built} new {kind} graphs ({graphs_total} in "
                      f"{summary['shards']} shards), {skipped} failed records skipped")
    return summary


def _resume(out: Path, store: Path, kind: str, stores: bool, shard_size: int):
    """(writer, record lines already covered, hash of them, why the store is rebuilt or '')."""
    manifest, why = read_manifest(out), ""
    hasher = hashlib.sha256()
    if manifest is not None:
        covered = manifest.get("records", 0)
        for line in islice(stream_lines(store / RECORD_FILE), covered):
            hasher.update(line.encode() + b"\n")
        settings_now = (kind, stores, shard_size)
        if manifest.get("format") != FORMAT:
            why = f"it is in format {manifest.get('format')}, this version writes {FORMAT}"
        elif (manifest.get("kind"), manifest.get("stores"),
                manifest.get("shard_size")) != settings_now:
            why = "graph settings changed"
        elif hasher.hexdigest() != manifest.get("records_sha256"):
            why = "the records it was built from changed"
        else:
            return (StoreWriter(out, kind, stores, shard_size, GraphStore(out)), covered,
                    hasher, "")
        hasher = hashlib.sha256()
    return StoreWriter(out, kind, stores, shard_size), 0, hasher, why


@contextmanager
def _executor(extract: cfg.Extract, new: int) -> Iterator[Executor | None]:
    if extract.cluster:
        from dask.distributed import Client

        with Client(extract.cluster) as client:
            yield client.get_executor()
    elif extract.workers > 1 and new >= POOL_MIN_RECORDS:
        # spawn: TVM's thread pools in this process must not be copied into a fork
        with ProcessPoolExecutor(min(extract.workers, os.cpu_count() or 1),
                                 mp_context=get_context("spawn")) as pool:
            yield pool
    else:
        yield None


def _graphs_in_order(pool: Executor | None, store: Path, kind: str, stores: bool, lines):
    """(chunk of (index, line), its graph rows) in record order, at most a few chunks per
    worker in flight so memory stays bounded."""
    chunks = iter(lambda: list(islice(lines, CHUNK)), [])
    if pool is None:
        for chunk in chunks:
            yield chunk, graphs_of_lines(str(store), kind, stores, chunk)
        return
    ahead = 4 * max(getattr(pool, "_max_workers", 2), 2)
    pending = []
    for chunk in chunks:
        pending.append((chunk, pool.submit(graphs_of_lines, str(store), kind, stores, chunk)))
        if len(pending) >= ahead:
            chunk, future = pending.pop(0)
            yield chunk, future.result()
    for chunk, future in pending:
        yield chunk, future.result()


_CONTEXTS: dict[tuple, StoreContext] = {}  # a worker's, by store and its files' sizes


def graphs_of_lines(store: str, kind: str, stores: bool, chunk: list[tuple[int, str]]
                    ) -> list[tuple]:
    """The graph rows (StoreWriter.add's arguments) of the measured records among (index, line)
    pairs of a store's record file: what a worker process runs."""
    from calo.graphs import of_record

    path = Path(store)
    key = (store, *((path / f).stat().st_size if (path / f).exists() else 0
                    for f in ("database_workload.json", "record_meta.jsonl", "workloads.json")))
    if key not in _CONTEXTS:
        if stores:  # TVM's per-store features need a TuneContext
            from calo.devices import preload_tensor_intrinsics

            preload_tensor_intrinsics()
        _CONTEXTS.clear()
        _CONTEXTS[key] = store_context(path)
    rows = []
    for rec in records_of_lines(_CONTEXTS[key], chunk):
        if rec.latency is None:
            continue
        g = of_record(kind, rec.record, stores)
        spread = rec.spread
        # numpy, not torch: a tensor crossing a process pool goes through shared memory, one
        # file per tensor, slower than the extraction itself
        rows.append((g.x, g.edge_index, g.edge_type, g.stores,
                     None if g.device is None else tuple(g.device), math.log(rec.latency),
                     math.nan if spread is None else spread, rec.workload_name, rec.index))
    return rows
