"""One async client or pool per event loop, as none can outlive the loop it was made in."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import asyncio

__all__ = ["PerLoop", "close_in_loop"]

T = TypeVar("T")


class PerLoop(Generic[T]):
    """One ``T`` per event loop, made on first use in that loop."""

    __slots__ = ("_items", "_lock")

    def __init__(self) -> None:
        self._items: dict[asyncio.AbstractEventLoop, T] = {}
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
                # closed cannot be closed any more, only forgotten.
                for old in [old for old in items if old.is_closed()]:
                    del items[old]
                item = items.get(loop)
                if item is None:
                    item = items[loop] = factory()
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
            return self._items.pop(loop, None)

    def pop_all(self) -> list[tuple[asyncio.AbstractEventLoop, T]]:
        """Take every ``T`` out, each with its loop."""
        with self._lock:
            items = list(self._items.items())
            self._items.clear()
        return items


def close_in_loop(loop: asyncio.AbstractEventLoop, aclose: Callable[[], Awaitable[None]]) -> None:
    """Await ``aclose()`` in ``loop``: at once if it is idle, soon if running, never if closed."""
    import asyncio

    if loop.is_closed():
        return
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(_await(aclose), loop)
    else:
        loop.run_until_complete(aclose())


async def _await(aclose: Callable[[], Awaitable[None]]) -> None:
    await aclose()
