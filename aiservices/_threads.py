"""Running a caller's blocking function in a worker thread from async code."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

__all__ = [
    "Stopped",
    "carried_to_its_end",
    "in_thread",
    "is_async",
    "is_async_generator",
    "is_carried_to_its_end",
    "waited_out",
]

# Set in the task that performs a service's commit (see `carried_to_its_end`).
_carried: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "aiservices_carried_to_its_end", default=False
)


def is_async(function: object) -> bool:
    """Whether calling ``function`` makes a coroutine or an async generator: an ``async
    def`` (with ``yield`` or not), or an object whose ``__call__`` is one."""
    return _made_by(function, _makes_async)


def is_async_generator(function: object) -> bool:
    """Whether calling ``function`` makes an async generator (``async def`` with ``yield``)."""
    return _made_by(function, inspect.isasyncgenfunction)


def _made_by(function: object, test: Callable[[object], bool]) -> bool:
    # The function itself, or an object's own __call__ (an instance with an async __call__).
    return test(function) or test(getattr(function, "__call__", None))  # noqa: B004


def _makes_async(function: object) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


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
        if await waited_out(future):
            return future.result()
        raise


async def carried_to_its_end(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` in this task, marked as carrying its I/O to its end: cancelled while
    a thread performs that I/O, it waits for the thread and hands back what it gave instead
    of raising.

    For a service's commit, run as a task of its own so that its caller learns whether the
    turn was written: a cancellation of that task comes from whoever cancels every task (a
    loop shutting down, which then waits for them), and a thread's write goes on regardless.
    """
    _carried.set(True)  # (in this task's own copy of the context)
    return await work


def is_carried_to_its_end() -> bool:
    """Whether the running task was started by `carried_to_its_end`."""
    return _carried.get()


async def waited_out(future: asyncio.Future[Any]) -> bool:
    """Called when the wait for ``future``, the end of a thread's work, was cancelled: wait
    for that end anyway; whether to hand back its outcome rather than raise the
    cancellation (in a task `carried_to_its_end`, whose cancellation is then taken back)."""
    import asyncio

    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((future,))
    task = asyncio.current_task()
    if not _carried.get() or task is None or future.cancelled():
        if not future.cancelled():
            future.exception()  # retrieved: the call is cancelled, its result unused
        return False
    while task.cancelling():
        task.uncancel()
    return True


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
