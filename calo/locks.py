"""One writer per device: an advisory file lock per device name, held while a run writes the
device's records (harvest, import) or its model (pretrain, finetune, calibrate, promote).

Two runs of one device (a scheduled deployment and a manual run, two workers) would otherwise
measure the same missing candidates twice or race for the device's files. The second run waits,
with a line now and then naming who holds the lock, or (`calo --no-wait ...`) stops with one
line. The lock is the kernel's (flock): a run that dies releases it, nothing stale is left.
Re-entrant within a process, so a stage called from another stage of one device does not wait
for itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from calo import paths
from calo.errors import CaloError
from calo.log import get_logger

WAIT_NOTE_EVERY_S = 60.0
_policy = {"wait": True}
_held: dict[str, int] = {}  # device -> depth of nested holds in this process


def set_waiting(wait: bool) -> None:
    """Whether a run finding its device busy waits (default) or stops at once."""
    _policy["wait"] = wait


def holder(device: str) -> str:
    """Who holds a device's lock, as its holder wrote it (empty if nobody says)."""
    path = paths.lock_path(device)
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return ""
    if not info:
        return ""
    since = time.strftime("%H:%M:%S", time.localtime(info.get("since", 0)))
    return f"`{info.get('what', '?')}` (pid {info.get('pid', '?')}, since {since})"


def _acquire(fd: int, device: str, what: str, wait: bool) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        busy = f"device '{device}' is busy: {holder(device) or 'another run'} writes its data"
    if not wait:
        raise CaloError(f"{busy}; run `{what}` again when it ends (or without --no-wait to "
                        "wait for it)")
    log, start, last = get_logger(), time.monotonic(), -WAIT_NOTE_EVERY_S
    while True:
        if time.monotonic() - last >= WAIT_NOTE_EVERY_S:
            last = time.monotonic()
            log.info(f"{busy}; `{what}` waits for it ({last - start:.0f}s so far)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.5)


@contextmanager
def device_lock(device: str, what: str, wait: bool | None = None) -> Iterator[None]:
    """Hold the device's lock for the block; `what` names the run for whoever waits."""
    if device in _held:
        _held[device] += 1
        try:
            yield
        finally:
            _held[device] -= 1
        return
    path: Path = paths.lock_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, device, what, _policy["wait"] if wait is None else wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": what,
                                  "since": time.time()}).encode(), 0)
        _held[device] = 1
        try:
            yield
        finally:
            del _held[device]
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextmanager
def lock_if_free(device: str, what: str) -> Iterator[bool]:
    """Hold the device's lock for the block if nobody does; yields whether it is held (readers
    use it to repair what only an idle store may have repaired)."""
    with ExitStack() as stack:
        try:
            stack.enter_context(device_lock(device, what, wait=False))
            held = True
        except CaloError:
            held = False
        yield held
