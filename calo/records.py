"""Tuning-record stores: TVM JSON databases plus a small index naming their workloads.

A store is a directory holding Meta-Schedule's ``database_workload.json`` and
``database_tuning_record.json`` (so any TVM tool can read it), ``workloads.json``, which maps
each workload's structural hash to the name it has in params.yaml, and ``record_meta.jsonl``:
one line per harvested candidate with where it came from (random sample, evolved by the search,
imported) and how its measurement went (ok, build error, run error, timeout). The side file keeps
the TVM files readable by TVM; records it does not mention are treated as random samples.

All three files are append-only, one JSON value per line. A crash mid-append leaves a torn last
line (no newline): readers skip it, and a writer opening the store moves it aside to
``<file>.torn`` beside it first, so the next append never glues a record onto broken bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from calo.errors import CaloError, reason
from calo.log import get_logger

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
NAMES_FILE = "workloads.json"
META_FILE = "record_meta.jsonl"
RANDOM, EVOLVED, IMPORTED = "random", "evolved", "imported"
UNKNOWN = "unknown"  # a record no side-file line describes: a plain TVM database's
APPEND_ONLY = (WORKLOAD_FILE, RECORD_FILE, META_FILE)
TORN_SUFFIX = ".torn"
TARGET_OPTIONS = ("mcpu", "arch", "num-cores")  # what describe_target names of a target
# Meta-Schedule's marker for a failed measurement; such records are kept but never used as labels.
FAILED_SECS = 1e10


@dataclass
class Record:
    index: int                 # position in the record file: measurement order
    workload_key: str
    workload_name: str         # params.yaml's name, or one made from the workload's content
    record: ms.database.TuningRecord
    latency: float | None      # mean measured seconds; None for a failed measurement
    source: str = UNKNOWN      # random, evolved, imported, or unknown
    status: str = "ok"         # ok, build_error, run_error, timeout (or failed, if unrecorded)

    @property
    def spread(self) -> float | None:
        return spread_of(self.record)


def open_store(path: Path) -> ms.database.JSONDatabase:
    """The store as TVM's database, for writing: call it holding the device's lock
    (calo.locks), since it first moves torn last lines aside."""
    path.mkdir(parents=True, exist_ok=True)
    recover_torn_tails(path)
    return ms.database.JSONDatabase(work_dir=str(path))


def _torn_tail(file: Path) -> int:
    """Bytes after the last newline of a file: a line whose append never finished."""
    with open(file, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        pos, chunk = end, 1 << 16
        while pos > 0:
            start = max(pos - chunk, 0)
            f.seek(start)
            newline = f.read(pos - start).rfind(b"\n")
            if newline >= 0:
                return end - (start + newline + 1)
            pos = start
        return end


def recover_torn_tails(path: Path) -> list[Path]:
    """Move the torn last line of each append-only file of a store to `<file>.torn` (appended,
    so earlier recoveries stay); every complete line stays. Returns the files repaired."""
    return [path / name for name in APPEND_ONLY if recover_torn_tail(path / name)]


def recover_torn_tail(file: Path) -> bool:
    """recover_torn_tails for one append-only file; whether it had a torn last line."""
    if not file.is_file() or not (size := _torn_tail(file)):
        return False
    with open(file, "rb+") as f:
        f.seek(-size, os.SEEK_END)
        tail = f.read()
        with open(file.with_name(file.name + TORN_SUFFIX), "ab") as aside:
            aside.write(tail + b"\n")
            aside.flush()
            os.fsync(aside.fileno())
        f.truncate(f.seek(-size, os.SEEK_END))
        f.flush()
        os.fsync(f.fileno())
    get_logger().warning(f"{file}: a torn last line ({size} bytes, an append that never "
                         f"finished) was moved to {file.name + TORN_SUFFIX}; complete lines kept")
    return True


def stream_lines(file: Path) -> Iterator[str]:
    """The newline-terminated, non-blank lines of an append-only file, read a line at a time (a
    torn tail is left out): a store of any size in constant memory."""
    with open(file) as f:
        for line in f:
            if not line.endswith("\n"):
                return  # a torn tail
            if line.strip():
                yield line[:-1]


def complete_lines(file: Path) -> list[str]:
    """stream_lines, all at once."""
    return list(stream_lines(file))


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


def spread_of(record: ms.database.TuningRecord) -> float | None:
    """How far a record's repeated runs disagree: (slowest - fastest) / mean, or None with
    fewer than two runs or a failed one. On a shared machine this is the label's noise."""
    secs = [float(s) for s in record.run_secs or []]
    if len(secs) < 2 or latency_of(record) is None:
        return None
    return (max(secs) - min(secs)) / (sum(secs) / len(secs))


def candidate_id(workload_key: str, trace: object) -> str:
    """A candidate's identity within a store: its workload and its printed trace.

    The printed trace (schedule program and sampling decisions) is canonical whichever way a
    record was serialized, so it also finds duplicates across databases.
    """
    return hashlib.sha1(f"{workload_key}\n{trace}".encode()).hexdigest()[:20]


def append_meta(path: Path, workload_key: str, trace: object, source: str, status: str,
                error: str | None = None, spread: float | None = None) -> None:
    """Written after the record itself, so every line here describes a stored record."""
    line = {"workload": workload_key, "id": candidate_id(workload_key, trace),
            "source": source, "status": status}
    if spread is not None:
        line["spread"] = round(spread, 4)
    if error:
        line["error"] = reason(error)
    with open(path / META_FILE, "a") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_meta(path: Path) -> dict[str, dict]:
    meta_file = path / META_FILE
    if not meta_file.is_file():
        return {}
    return {m["id"]: m for m in map(json.loads, complete_lines(meta_file)) if m}


def candidate_ids(path: Path, workload_key: str) -> set[str]:
    """Ids of the stored candidates of a workload (records without a side-file line included)."""
    ids = {m["id"] for m in load_meta(path).values() if m["workload"] == workload_key}
    if len(ids) < count_by_workload(path).get(workload_key, 0):
        ids |= {candidate_id(r.workload_key, r.record.trace)
                for r in iter_records(path, workload_key)}
    return ids


def _workloads(path: Path) -> list[ms.database.Workload]:
    return [ms.database.Workload.from_json(json.loads(line))
            for line in complete_lines(path / WORKLOAD_FILE)]


def _workload_keys(path: Path) -> list[str]:
    from calo.workloads import workload_key

    return [workload_key(w.mod) for w in _workloads(path)]


def _workload_names(path: Path, workloads: list, keys: list[str]) -> list[str]:
    """A readable name per workload of a store: the one params.yaml gave it when harvested
    here, else one made from its content (`C 512x768x768`); duplicates get a short hash."""
    from calo.workloads import describe

    given = load_names(path)
    names = [given.get(k) or describe(w.mod) for k, w in zip(keys, workloads)]
    for i, (key, name) in enumerate(zip(keys, names)):
        if key not in given and sum(n == name for n, k in zip(names, keys) if k != key):
            names[i] = f"{name} #{key[-4:]}"
    return names


@dataclass(frozen=True)
class StoreContext:
    """What reading a store's record lines needs besides the lines: its workloads, their keys
    and names, and the side file."""

    workloads: list
    keys: list[str]
    names: list[str]
    meta: dict[str, dict]


def store_context(path: Path) -> StoreContext:
    wfile, rfile = path / WORKLOAD_FILE, path / RECORD_FILE
    if not wfile.is_file() or not rfile.is_file():
        raise CaloError(f"no tuning records in {path} (expected {WORKLOAD_FILE} and {RECORD_FILE})")
    from calo.workloads import workload_key

    workloads = _workloads(path)
    keys = [workload_key(w.mod) for w in workloads]
    return StoreContext(workloads, keys, _workload_names(path, workloads, keys), load_meta(path))


def iter_records(path: Path, only: str | None = None) -> Iterator[Record]:
    """Records in the order they were measured (the file's line order); with `only`, a
    workload key, only that workload's (other lines are skipped unparsed)."""
    context = store_context(path)
    yield from records_of_lines(context, enumerate(complete_lines(path / RECORD_FILE)), only)


def records_of_lines(context: StoreContext, numbered: Iterable[tuple[int, str]],
                     only: str | None = None) -> Iterator[Record]:
    """The records of (index, line) pairs of a store's record file."""
    keys = context.keys
    for index, line in numbered:
        if only is not None and keys[_workload_index(line)] != only:
            continue
        widx, body = json.loads(line)
        record = ms.database.TuningRecord.from_json(body, context.workloads[widx])
        key, latency = keys[widx], latency_of(record)
        m = context.meta.get(candidate_id(key, record.trace), {})
        yield Record(index, key, context.names[widx], record, latency,
                     m.get("source", UNKNOWN), m.get("status", "ok" if latency else "failed"))


def target_key(target) -> str:
    """A target (TVM's Target, or the dict a record file holds) as one comparable string."""
    spec = target if isinstance(target, dict) else json.loads(str(target))
    return json.dumps(spec, sort_keys=True)


def record_targets(path: Path) -> list[str | None]:
    """The target (target_key) each of a store's records was measured on, by index; read from
    the record file's JSON without building TVM's records."""
    if not (path / RECORD_FILE).is_file():
        return []
    specs = (json.loads(line)[1][2] for line in complete_lines(path / RECORD_FILE))
    return [None if spec is None else target_key(spec) for spec in specs]


def store_targets(path: Path) -> set[str]:
    """The targets a store's records were measured on (target_key)."""
    return {key for key in record_targets(path) if key is not None}


def describe_target(key: str) -> str:
    """A target_key as a short label: its kind and the options that tell devices apart."""
    spec = json.loads(key)
    return " ".join([spec.get("kind", "?"), *(f"-{k}={spec[k]}" for k in TARGET_OPTIONS
                                               if k in spec)])


def describe_targets(keys: Iterable[str]) -> str:
    """Target keys as one line of describe_target's labels, in a stable order."""
    return ", ".join(sorted(map(describe_target, keys)))


def check_target(path: Path, target, what: str) -> None:
    """Refuse to add records of `target` to a store holding another target's. A store's
    candidates of a workload are ranked against each other, which means nothing across two
    CPUs; a harvest resumed on another machine (`mcpu: host`) would mix them silently."""
    held, key = store_targets(path), target_key(target)
    if held and key not in held:
        raise CaloError(
            f"{what}: {path} holds records measured on "
            f"{describe_targets(held)}, but this run measures on "
            f"{describe_target(key)} (`mcpu: host` is the CPU of the machine it runs on). A "
            "store holds one device's records: give this machine a device of its own in "
            f"params.yaml, or move {path} aside")


def count_by_workload(path: Path) -> dict[str, int]:
    """Records per workload key, reading only each line's workload index (no trace parsing)."""
    if not (path / RECORD_FILE).is_file() or not (path / WORKLOAD_FILE).is_file():
        return {}
    keys, counts = _workload_keys(path), {}
    for line in complete_lines(path / RECORD_FILE):
        key = keys[_workload_index(line)]
        counts[key] = counts.get(key, 0) + 1
    return counts


def count_by_source(path: Path, source: str) -> dict[str, int]:
    """Harvested records per workload key that came from `source`, from the side file alone."""
    counts: dict[str, int] = {}
    for m in load_meta(path).values():
        if m["source"] == source:
            counts[m["workload"]] = counts.get(m["workload"], 0) + 1
    return counts


def subset_store(source: Path, dest: Path, keep: Callable[[str], bool]) -> int:
    """Copy the records of the workloads whose names `keep` accepts into a new store.

    Workload lines are copied whole, so record lines keep their workload indices; the record
    and side-file lines of other workloads are left out. Returns the number of records copied.
    """
    if (dest / RECORD_FILE).exists():
        raise CaloError(f"{dest} already holds records; subset into a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    keys, names = _workload_keys(source), load_names(source)
    kept = {k for k in keys if keep(names.get(k, k))}
    shutil.copy(source / WORKLOAD_FILE, dest / WORKLOAD_FILE)
    if (source / NAMES_FILE).is_file():
        shutil.copy(source / NAMES_FILE, dest / NAMES_FILE)
    lines = [line for line in complete_lines(source / RECORD_FILE)
             if keys[_workload_index(line)] in kept]
    (dest / RECORD_FILE).write_text("".join(line + "\n" for line in lines))
    if (source / META_FILE).is_file():
        meta = [line for line in complete_lines(source / META_FILE)
                if json.loads(line)["workload"] in kept]
        (dest / META_FILE).write_text("".join(line + "\n" for line in meta))
    return len(lines)


def _workload_index(line: str) -> int:
    """The workload index that starts a record line, `[index, {...}]`, without parsing the rest."""
    return int(line[1:line.index(",")])
