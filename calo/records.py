"""Tuning-record stores: TVM JSON databases plus a small index naming their workloads.

A store is a directory holding Meta-Schedule's ``database_workload.json`` and
``database_tuning_record.json`` (so any TVM tool can read it) and ``workloads.json``, which maps
each workload's structural hash to the name it has in params.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from calo.config import CaloError

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
NAMES_FILE = "workloads.json"
# Meta-Schedule's marker for a failed measurement; such records are kept but never used as labels.
FAILED_SECS = 1e10


@dataclass
class Record:
    index: int                 # position in the record file: measurement order
    workload_key: str
    workload_name: str
    record: ms.database.TuningRecord
    latency: float | None      # mean measured seconds; None for a failed measurement


def open_store(path: Path) -> ms.database.JSONDatabase:
    path.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(work_dir=str(path))


def load_names(path: Path) -> dict[str, str]:
    names_file = path / NAMES_FILE
    return json.loads(names_file.read_text()) if names_file.is_file() else {}


def save_name(path: Path, key: str, name: str) -> None:
    names = load_names(path)
    if names.get(key) != name:
        names[key] = name
        tmp = path / (NAMES_FILE + ".tmp")
        tmp.write_text(json.dumps(names, indent=1, sort_keys=True))
        tmp.replace(path / NAMES_FILE)


def latency_of(record: ms.database.TuningRecord) -> float | None:
    secs = record.run_secs
    if secs is None or len(secs) == 0:
        return None
    values = [float(s) for s in secs]
    if any(v >= FAILED_SECS * 0.1 or v <= 0 for v in values):
        return None
    return sum(values) / len(values)


def iter_records(path: Path) -> Iterator[Record]:
    """Records in the order they were measured (the file's line order)."""
    wfile, rfile = path / WORKLOAD_FILE, path / RECORD_FILE
    if not wfile.is_file() or not rfile.is_file():
        raise CaloError(f"no tuning records in {path} (expected {WORKLOAD_FILE} and {RECORD_FILE})")
    workloads = []
    for line in wfile.read_text().splitlines():
        if line.strip():
            workloads.append(ms.database.Workload.from_json(json.loads(line)))
    from calo.workloads import workload_key

    keys = [workload_key(w.mod) for w in workloads]
    names = load_names(path)
    for index, line in enumerate(x for x in rfile.read_text().splitlines() if x.strip()):
        widx, body = json.loads(line)
        record = ms.database.TuningRecord.from_json(body, workloads[widx])
        key = keys[widx]
        yield Record(index, key, names.get(key, key), record, latency_of(record))


def count_by_workload(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    if (path / RECORD_FILE).is_file():
        for rec in iter_records(path):
            counts[rec.workload_key] = counts.get(rec.workload_key, 0) + 1
    return counts
