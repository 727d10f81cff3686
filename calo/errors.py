"""The one error type users see, and the one-line reason of any other error."""

from __future__ import annotations


class CaloError(Exception):
    """A problem with the user's input or state, reported as one line without a traceback."""


def reason(err: BaseException | str) -> str:
    """The last line of an error message (TVM puts its C++ backtrace first)."""
    lines = str(err).strip().splitlines()
    return lines[-1][:200] if lines else type(err).__name__
