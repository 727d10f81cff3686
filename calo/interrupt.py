"""Ctrl-C during long measuring work: the first stops it at the next batch boundary, with every
result so far stored; a second stops it at once.

A terminal's Ctrl-C reaches the build and run worker processes too, so the batch in flight can
come back with failures that say nothing about its candidates: `StopRequest.requested` tells the
caller to store none of them (they are measured again on the next run).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from calo.log import get_logger

_requested = False


class StopRequest:
    """Set by the first Ctrl-C inside `stop_on_interrupt`."""

    def __init__(self) -> None:
        self.requested = False


def requested() -> bool:
    """Whether a Ctrl-C asked this process to stop (an error raised after it is its echo)."""
    return _requested


@contextmanager
def stop_on_interrupt(what: str) -> Iterator[StopRequest]:
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # only the main thread can take signals (a flow's worker thread cannot)
        return

    def on_sigint(signum, frame) -> None:
        global _requested
        _requested = True
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
        get_logger().warning(f"{what}: stopping after this batch, every result so far is "
                             "stored (Ctrl-C again to stop at once)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
