"""One async client or pool per event loop, as none can outlive the loop it was made in."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import asyncio

__all__ = ["PerLoop", "close_in_loop"]

T = TypeVar("T")


class PerLoop(Generic[T]):
    """One ``T`` per event loop, made on first use in that loop.

    With ``aclose``, each ``T`` still held when its loop is shut down by asyncio.run() (or
    anything else that calls ``loop.shutdown_asyncgens()``) is closed in that loop then.
    """

    __slots__ = ("_aclose", "_closers", "_items", "_lock")

    def __init__(self, aclose: Callable[[T], Awaitable[None]] | None = None) -> None:
        self._items: dict[asyncio.AbstractEventLoop, T] = {}
        self._aclose = aclose
        self._closers: dict[asyncio.AbstractEventLoop, _Closer[T]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, factory: Callable[[], T]) -> T:
        """The running loop's ``T``, made with ``factory`` if it has none yet."""
        import asyncio

        loop = asyncio.get_running_loop()
        item = self._items.get(loop)
        if item is None:
            with self._lock:
                items = self._items
                # Users do call asyncio.run() more than once; the objects of loops that have
                # closed were closed with them (with aclose) or cannot be any more.
                for old in [old for old in items if old.is_closed()]:
                    del items[old]
                    self._disarm(old)
                item = items.get(loop)
                if item is None:
                    item = items[loop] = factory()
                    if self._aclose is not None:
                        self._closers[loop] = _Closer(item, self._aclose)
        return item

    def current(self) -> T | None:
        """The running loop's ``T``, or ``None`` if none was made in it."""
        import asyncio

        return self._items.get(asyncio.get_running_loop())

    def pop(self) -> T | None:
        """Take the running loop's ``T`` out, if it has one."""
        import asyncio

        loop = asyncio.get_running_loop()
        with self._lock:
            self._disarm(loop)
            return self._items.pop(loop, None)

    def pop_all(self) -> list[tuple[asyncio.AbstractEventLoop, T]]:
        """Take every ``T`` out, each with its loop."""
        with self._lock:
            items = list(self._items.items())
            self._items.clear()
            for loop in list(self._closers):
                self._disarm(loop)
        return items

    def _disarm(self, loop: asyncio.AbstractEventLoop) -> None:
        closer = self._closers.pop(loop, None)
        if closer is not None:
            closer.disarm()


class _Closer(Generic[T]):
    """Closes ``item`` in the running loop when that loop shuts down its async generators.

    An async generator, suspended in the loop it was first iterated in, is what a loop
    closes at its end (asyncio.run() awaits ``aclose()`` on each before closing the loop):
    the one hook there is into a loop's end.
    """

    __slots__ = ("_armed", "_generator")

    def __init__(self, item: T, aclose: Callable[[T], Awaitable[None]]) -> None:
        self._armed = [True]  # shared with the generator, which must not refer to self
        self._generator = _close_at_end(item, aclose, self._armed)
        # Run to its first yield now: asend() registers it with the running loop, and the
        # body awaits nothing before the yield, so no loop is needed to get there.
        _run_to_end(self._generator.asend(None))

    def disarm(self) -> None:
        """Finish without closing the item (it was taken out, or its loop is gone)."""
        self._armed[0] = False
        # Finished now, so the garbage collector never hands it to a loop to close: that
        # loop may be closed by then.
        with contextlib.suppress(RuntimeError):  # it is closing the item in its loop now
            _run_to_end(self._generator.aclose())

    def __del__(self) -> None:
        # Dropped with its PerLoop: the item, if not closed, is left to its own finalizer.
        self.disarm()


async def _close_at_end(
    item: T, aclose: Callable[[T], Awaitable[None]], armed: list[bool]
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        if armed[0]:
            armed[0] = False
            await aclose(item)


def _run_to_end(step: Awaitable[object]) -> None:
    # Drives an async generator's step that does not await: it ends at once.
    try:
        step.__await__().send(None)
    except StopIteration:
        return
    raise RuntimeError("an async generator step awaited where it could not")


def close_in_loop(loop: asyncio.AbstractEventLoop, aclose: Callable[[], Awaitable[None]]) -> None:
    """Await ``aclose()`` in ``loop``: at once if it is idle, soon if running, never if closed."""
    import asyncio

    if loop.is_closed():
        return
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(_await(aclose), loop)
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop.run_until_complete(aclose())
        return
    # This thread runs another loop, and a thread runs one loop at a time.
    worker = threading.Thread(target=loop.run_until_complete, args=(_await(aclose),))
    worker.start()
    worker.join()


async def _await(aclose: Callable[[], Awaitable[None]]) -> None:
    await aclose()
