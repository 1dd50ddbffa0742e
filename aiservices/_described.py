"""An exception as a caller reads it: ``Type: message``, with exception groups opened."""

from __future__ import annotations

__all__ = ["described"]


def described(error: BaseException) -> str:
    """``Type: message`` (``Type`` alone without a message) for what ``error`` holds.

    A group of one error (in groups of one: task groups nest them) is the error it holds;
    a group of several lists them, so that what went wrong is never hidden behind
    "unhandled errors in a TaskGroup".
    """
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(map(described, error.exceptions))
    detail = str(error)
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__
