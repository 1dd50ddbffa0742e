"""Running a caller's blocking function in a worker thread from async code."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["Stopped", "in_thread", "is_async"]


def is_async(function: object) -> bool:
    """Whether calling ``function`` makes a coroutine: an ``async def``, or an object whose
    ``__call__`` is one."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - an object's async __call__
    )


async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``asyncio.to_thread``, except that a cancelled caller waits for the thread to end,
    and a ``StopIteration`` comes back as `Stopped`.

    A thread cannot be stopped: were the caller told it was cancelled at once, the
    conversation's lock would be released while the function still acts, and the next
    turn would run beside it.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    future = loop.run_in_executor(
        None, functools.partial(context.run, _carry_stop, fn, args, kwargs)
    )
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((future,))
        if not future.cancelled():
            future.exception()  # retrieved: the call is cancelled, its result unused
        raise


class Stopped(Exception):
    """A ``StopIteration`` a function raised in a worker thread, carried to the awaiting side."""

    def __init__(self, stop: StopIteration) -> None:
        super().__init__(str(stop))
        self.stop = stop


def _carry_stop(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # asyncio can't set a StopIteration as a future's outcome: the future would never be
    # done, and the call would wait for it forever (a failed `next(...)` in a tool, say).
    try:
        return fn(*args, **kwargs)
    except StopIteration as stop:
        raise Stopped(stop) from stop
