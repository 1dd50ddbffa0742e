"""A FIFO lock that threads and asyncio tasks (of any loop) can hold in turn.

Calls on one memory id are serialised whether they come from threads or tasks, so one
lock must serve both: a thread waits on an event, a task on a future that the releasing
side resolves on the task's own loop. Ownership passes straight to the next waiter.
"""

from __future__ import annotations

import threading
from collections import deque
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__ = ["Entered", "LoopBlocked", "Reentered", "TurnLock", "enter", "leave"]


class Reentered(RuntimeError):
    """A call waited for a lock that the call it runs inside holds: it would wait forever."""


class LoopBlocked(RuntimeError):
    """A blocking wait on an event loop's thread for a lock that a task of that loop holds
    or waits for: the task could never go on. Raised before the lock is waited for."""


# The locks held by the turns whose code (a tool, a guardrail, a retriever) runs in this
# context: worker threads and tasks started from it inherit them, so a call back into one
# of those conversations is refused instead of waiting for itself. Each entry is cleared
# when that code returns, so that a task it left running waits as any other caller does.
_entered: ContextVar[tuple[Entered, ...]] = ContextVar("aiservices_entered", default=())


class Entered:
    """One `enter`: the lock, while the code run inside its holder has not returned."""

    __slots__ = ("lock",)

    def __init__(self, lock: TurnLock) -> None:
        self.lock: TurnLock | None = lock
        _entered.set((*_entered.get(), self))


def enter(lock: TurnLock) -> Entered:
    """Note that the code run in this context from now on runs inside ``lock``'s holder."""
    return Entered(lock)


def leave(entered: Entered | None) -> None:
    """Undo `enter` (``None``: nothing was entered), here and in the contexts copied from
    this one meanwhile."""
    if entered is None:
        return
    entered.lock = None  # spent in every context that holds it
    # Only this entry goes: marks may be left out of order (two streams read in turn), and
    # resetting to the value before this one would drop the marks set since.
    current = _entered.get()
    if current and current[-1] is entered:
        _entered.set(current[:-1])
    elif entered in current:
        _entered.set(tuple(e for e in current if e is not entered))


def _inside(lock: TurnLock) -> bool:
    return any(e.lock is lock for e in _entered.get())


class TurnLock:
    """Held for a whole turn; ``acquire`` blocks a thread, ``aacquire`` suspends a task."""

    # Explicit acquire/release of the mutex rather than `with`: this runs twice per call,
    # and the context-manager protocol costs more than the work it guards.
    __slots__ = ("_held", "_loop", "_mutex", "_waiters")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        # The event loop of the task holding the lock; None when a thread holds it.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Made by the first waiter: most conversations never see two calls at once, and an
        # empty deque costs 600 bytes, more than the rest of the lock.
        self._waiters: (
            deque[threading.Event | tuple[asyncio.Future[None], asyncio.AbstractEventLoop]] | None
        ) = None

    @property
    def locked(self) -> bool:
        return self._held

    def acquire(self) -> None:
        mutex = self._mutex
        mutex.acquire()
        if not self._held:
            self._held = True
            self._loop = None
            mutex.release()
            return
        try:
            if _inside(self):
                raise Reentered(_REENTERED)
            if self._blocks_a_task_here():
                raise LoopBlocked(
                    "a blocking call waits for a conversation that a task of the event loop "
                    "running in this thread holds or waits for: that task could never go on. "
                    "From async code, await the async method (and leave a memory_scope with "
                    "`async with`), or run the blocking call in a worker thread "
                    "(asyncio.to_thread)"
                )
            event = threading.Event()
            self._queue().append(event)
        finally:
            mutex.release()
        try:
            event.wait()
        except BaseException:
            # Interrupted while waiting (KeyboardInterrupt): leave the queue, or pass on a
            # lock handed over meanwhile, so that it never goes to a waiter that is gone.
            if not self._withdraw(event):
                self.release()
            raise

    def _blocks_a_task_here(self) -> bool:
        """Whether a task of the event loop running in this thread holds the lock or is
        queued for it: waiting here would stop the loop it needs. Called with the mutex held."""
        loops = [w[1] for w in self._waiters or () if type(w) is tuple]
        if self._loop is not None:
            loops.append(self._loop)
        return bool(loops) and any(map(_runs_here, loops))

    def try_acquire(self) -> bool:
        """Take the lock if it is free and nobody waits for it; never blocks."""
        mutex = self._mutex
        mutex.acquire()
        try:
            if self._held:
                return False
            self._held = True
            self._loop = None
            return True
        finally:
            mutex.release()

    async def aacquire(self) -> None:
        import asyncio

        with self._mutex:
            if not self._held:
                self._held = True
                self._loop = asyncio.get_running_loop()
                return
            if _inside(self):
                raise Reentered(_REENTERED)
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            entry = (future, loop)
            self._queue().append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if not self._withdraw(entry) and future.done() and not future.cancelled():
                # The lock was handed over just as the task was cancelled: pass it on.
                self.release()
            raise

    def pass_to_thread(self) -> None:
        """Note that the task holding the lock hands it to a thread, which will release it."""
        with self._mutex:
            self._loop = None

    def release(self) -> None:
        mutex = self._mutex
        mutex.acquire()
        if not self._waiters:
            self._held = False
            mutex.release()
            return
        try:
            self._hand_on()
        finally:
            mutex.release()

    def _withdraw(
        self, waiter: threading.Event | tuple[asyncio.Future[None], asyncio.AbstractEventLoop]
    ) -> bool:
        """Take a waiter that gives up out of the queue; ``False`` if the lock was handed to
        it already."""
        with self._mutex:
            try:
                self._queue().remove(waiter)
            except ValueError:
                return False
        return True

    def _queue(
        self,
    ) -> deque[threading.Event | tuple[asyncio.Future[None], asyncio.AbstractEventLoop]]:
        # Called with the mutex held.
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = deque()
        return waiters

    def _hand_on(self) -> None:
        # Called with the mutex held and waiters queued.
        waiters = self._queue()
        while waiters:
            waiter = waiters.popleft()
            if isinstance(waiter, threading.Event):
                self._loop = None
                waiter.set()
                return
            future, loop = waiter
            if future.done() or loop.is_closed():
                continue
            self._loop = loop
            loop.call_soon_threadsafe(self._hand_over, future)
            return
        self._held = False

    def _hand_over(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            # Cancelled between release and this callback: the lock goes to the next one.
            self.release()
        else:
            future.set_result(None)


_REENTERED = (
    "a call waits for a lock that the call it runs inside holds: it would wait for itself forever"
)


def _runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is the event loop running in this thread."""
    import asyncio

    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
