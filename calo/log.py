"""Log lines on stderr: one per event, with counts and rates for long work, never arrays.

Under a pipeline flow (calo.flows.pipeline sets CALO_PLAIN_LOGS) a stage logs bare messages:
the flow forwards them to Prefect, which adds the time and level itself.
"""

from __future__ import annotations

import logging
import os
import time


def get_logger() -> logging.Logger:
    logger = logging.getLogger("calo")
    if not logger.handlers:
        handler = logging.StreamHandler()
        plain = os.environ.get("CALO_PLAIN_LOGS")
        handler.setFormatter(logging.Formatter("%(message)s") if plain else
                             logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                               "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # prefect puts a handler on the root logger too
    return logger


class Progress:
    """Periodic progress lines: done/total, rate and ETA (from the first items on), at most one
    per `every` seconds."""

    def __init__(self, what: str, total: int, unit: str = "items", every: float = 15.0):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.done = 0
        self.start = self.last = time.monotonic()
        self.first: tuple[float, int] | None = None  # when the first items came, and how many
        self.log = get_logger()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.first is None:
            self.first = (now, self.done)
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            self.log.info(self.line(note))

    def line(self, note: str = "") -> str:
        tail = f" ({note})" if note else ""
        if self.done >= self.total:
            elapsed = max(time.monotonic() - self.start, 1e-9)
            # Work that took under a second (found cached, say) has no rate worth printing.
            pace = f", {self.done / elapsed:.2f} {self.unit}/s" if elapsed >= 1.0 else ""
            return (f"{self.what}: {self.done}/{self.total} {self.unit} in {elapsed:.1f} s"
                    f"{pace}{tail}")
        if self.first is None or self.done <= self.first[1]:
            # The first items' time holds the start-up (spawning workers, loading a model),
            # paid once: a pace from them would stretch the ETA of all the rest.
            return f"{self.what}: {self.done}/{self.total} {self.unit}{tail}"
        rate = (self.done - self.first[1]) / max(time.monotonic() - self.first[0], 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        return (f"{self.what}: {self.done}/{self.total} {self.unit}, {rate:.2f} {self.unit}/s, "
                f"ETA {eta:.0f}s{tail}")
