"""Import an existing Meta-Schedule JSON database into a device's record store.

Every line is validated on its own: a bad line is named and skipped, the rest are kept.
Records already in the store (same workload and same trace) are skipped, so importing the same
database twice adds nothing. A store holds one device's records: those measured on another target
than the store's (its existing records', or the first imported one's) are skipped and named.
"""

from __future__ import annotations

import json
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from calo import config as cfg
from calo import locks, paths, records
from calo.devices import make_target
from calo.errors import CaloError, reason
from calo.log import Progress, get_logger
from calo.workloads import workload_key


def _lines(path: Path) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(path.read_text().splitlines(), start=1)
            if line.strip()]


def _read_workloads(path: Path, bad: list[str]) -> dict[int, ms.database.Workload]:
    """Workloads by their index in the file (the index records refer to)."""
    workloads = {}
    for index, (lineno, line) in enumerate(_lines(path)):
        try:
            workloads[index] = ms.database.Workload.from_json(json.loads(line))
        except Exception as err:  # JSON or TVM parse errors; the line is named and skipped
            bad.append(f"{path.name} line {lineno}: not a workload ({reason(err)})")
    return workloads


def import_records(settings: cfg.Settings, device_name: str, source: Path) -> dict:
    """Holds the device's lock throughout (calo.locks): one writer of its records at a time."""
    with locks.device_lock(device_name, "calo import"):
        return _import_records(settings, device_name, source)


def _import_records(settings: cfg.Settings, device_name: str, source: Path) -> dict:
    device = settings.device(device_name)
    wfile, rfile = source / records.WORKLOAD_FILE, source / records.RECORD_FILE
    if not wfile.is_file() or not rfile.is_file():
        raise CaloError(f"{source} is not a TVM JSON database "
                        f"(expected {records.WORKLOAD_FILE} and {records.RECORD_FILE})")
    kind = make_target(device).kind.name
    bad: list[str] = []
    workloads = _read_workloads(wfile, bad)
    keys = {i: workload_key(w.mod) for i, w in workloads.items()}

    store = paths.records_dir(device_name)
    db = records.open_store(store)  # first: it sets a torn last line aside
    seen = set()
    if (store / records.RECORD_FILE).is_file():
        seen = {records.candidate_id(r.workload_key, r.record.trace)
                for r in records.iter_records(store)}
    # One device's store holds one target's records (records.check_target): the store's,
    # or on an empty store the first record's.
    targets = records.store_targets(store)
    committed: dict[str, ms.database.Workload] = {}
    lines = _lines(rfile)
    progress = Progress(f"import {device_name}", len(lines), "records")
    summary = {"device": device_name, "source": str(source), "imported": 0, "duplicates": 0,
               "failed_measurements": 0}
    for lineno, line in lines:
        progress.advance()
        where = f"{rfile.name} line {lineno}"
        try:
            widx, body = json.loads(line)
            if widx not in workloads:
                bad.append(f"{where}: refers to workload {widx}, which is missing or bad")
                continue
            rec = ms.database.TuningRecord.from_json(body, workloads[widx])
        except Exception as err:  # malformed JSON, wrong shape, or a trace TVM cannot parse
            bad.append(f"{where}: not a tuning record ({reason(err)})")
            continue
        if rec.target is not None and rec.target.kind.name != kind:
            bad.append(f"{where}: measured on a '{rec.target.kind.name}' target, "
                       f"device '{device_name}' is '{kind}'")
            continue
        target = records.target_key(rec.target) if rec.target is not None else None
        if target is not None and targets and target not in targets:
            bad.append(f"{where}: measured on {records.describe_target(target)}, and "
                       f"'{device_name}' holds records of {records.describe_targets(targets)}")
            continue
        targets = targets or ({target} if target is not None else set())
        key = records.candidate_id(keys[widx], rec.trace)
        if key in seen:
            summary["duplicates"] += 1
            continue
        seen.add(key)
        if keys[widx] not in committed:
            committed[keys[widx]] = db.commit_workload(workloads[widx].mod)
        db.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, committed[keys[widx]], rec.run_secs, rec.target, rec.args_info))
        ok = records.latency_of(rec) is not None
        records.append_meta(store, keys[widx], rec.trace, records.IMPORTED,
                            "ok" if ok else "failed")
        summary["imported"] += 1
        summary["failed_measurements"] += not ok
    summary["bad_lines"] = bad
    log = get_logger()
    for message in bad:
        log.warning(f"import {device_name}: skipped {message}")
    log.info(f"import {device_name}: {summary['imported']} imported, {summary['duplicates']} "
             f"duplicates, {len(bad)} bad lines")
    return summary
