"""Logging that lands in the Prefect UI inside a flow run and on stderr outside one."""

from __future__ import annotations

import logging
import time


def get_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError

        try:
            return get_run_logger()
        except MissingContextError:
            pass
    except ImportError:
        pass
    logger = logging.getLogger("calo")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # prefect puts a handler on the root logger too
    return logger


class Progress:
    """Periodic progress lines: done/total, rate and ETA, at most one per `every` seconds."""

    def __init__(self, what: str, total: int, unit: str = "items", every: float = 5.0):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.done = 0
        self.start = self.last = time.monotonic()
        self.log = get_logger()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            self.log.info(self.line(note))

    def line(self, note: str = "") -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        tail = f" ({note})" if note else ""
        return (f"{self.what}: {self.done}/{self.total} {self.unit}, {rate:.2f} {self.unit}/s, "
                f"ETA {eta:.0f}s{tail}")
