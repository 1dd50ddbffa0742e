"""One thread that runs a store's blocking calls for async callers, in the order they came.

``asyncio.to_thread`` pays for a thread wake-up and an event-loop wake-up on every call. A
store whose calls are short and serialised anyway (SQLite's writes share one lock) does
better with a thread of its own: while it is busy, calls queue without waking anyone, and
the results that come in before an event loop has taken the last ones reach it in one
callback.

Cancellation never tears a call in half: a call still queued when its caller is cancelled
does not run at all; a call already running is waited for, and the caller then sees its
``CancelledError``. So a caller that was told "cancelled" knows whether the call ran only
in one case, a running call, and then the call has ended by the time it is told.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final, TypeVar

from .._threads import waited_out

__all__ = ["IoThread"]

T = TypeVar("T")

# A call's states; moved under the thread's condition.
_QUEUED: Final = 0
_RUNNING: Final = 1
_DONE: Final = 2
_SKIPPED: Final = 3

# Seconds the thread waits for a call before it ends; the next call starts another.
_IDLE: Final = 5.0
# Results held back at most, and at most how long (seconds), while more calls wait.
_BATCH: Final = 16
_HOLD: Final = 0.001


class _Call:
    __slots__ = ("args", "error", "function", "future", "loop", "state", "value", "waiter")

    def __init__(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
    ) -> None:
        self.function = function
        self.args = args
        self.value: Any = None
        self.error: BaseException | None = None
        self.loop = loop
        self.future = future
        self.state = _QUEUED
        # Made when a caller is cancelled while the call runs: resolved when it has ended.
        self.waiter: asyncio.Future[None] | None = None


class IoThread:
    """A daemon thread, started at first use (again in a forked child), that runs calls."""

    # A forked child starts afresh (see _after_fork_in_child): its parent's thread does not
    # exist there, and the calls queued in the parent are the parent's.
    #
    # Results are held back while more calls wait, and handed to their loops together: when
    # the queue runs dry, when _BATCH of them are held, or once the oldest has waited _HOLD
    # seconds (checked before each call, and by the shared _Flusher while a call runs, so
    # that a call that waits on a lock never holds back results that are ready).

    __slots__ = (
        "__weakref__",
        "_calls",
        "_closed",
        "_condition",
        "_held",
        "_held_since",
        "_name",
        "_ready",
        "_thread",
        "_watched",
    )

    def __init__(self, name: str) -> None:
        self._name = name
        self._condition = threading.Condition(threading.Lock())
        self._calls: deque[_Call] = deque()
        self._held: list[_Call] = []  # ended, not yet handed to their loops
        self._held_since = 0.0  # time.monotonic() when the oldest of them ended
        self._watched = False  # whether the flusher looks at this thread's held results
        # Per event loop, the results handed to it that its drain callback has not taken.
        self._ready: dict[asyncio.AbstractEventLoop, list[_Call]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        _every.add(self)

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the thread; its result, or its exception, raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        call = _Call(function, args, loop, future)
        condition = self._condition
        with condition:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if self._thread is None:
                thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                thread.start()  # if it can't start, nothing is queued and the next call retries
                self._thread = thread
            self._calls.append(call)
            if len(self._calls) == 1:
                condition.notify()
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled() and await self._settle(call):
                return call.value  # type: ignore[no-any-return]
            raise

    async def _settle(self, call: _Call) -> bool:
        """The caller was cancelled: a queued call is skipped, a running one waited for.
        Whether to hand back the outcome of a call that ran (see `waited_out`); its error
        is raised here."""
        with self._condition:
            if call.state == _QUEUED:
                call.state = _SKIPPED
                return False
            waiter = call.waiter = call.loop.create_future()
            if call.state == _DONE:
                waiter.set_result(None)
        if not await waited_out(waiter):
            return False
        if call.error is not None:
            raise _error(call)
        return True

    def close(self) -> None:
        """Let the calls queued so far run, then end the thread; later calls are refused.

        Blocks until then: from async code, run it in a worker thread.
        """
        with self._condition:
            self._closed = True
            thread = self._thread
            self._condition.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _after_fork(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._calls = deque()
        self._held = []
        self._watched = False
        self._ready = {}
        self._thread = None

    def _work(self) -> None:
        condition, calls, held = self._condition, self._calls, self._held
        try:
            while True:
                with condition:
                    due = held and (
                        not calls
                        or len(held) >= _BATCH
                        or time.monotonic() - self._held_since >= _HOLD
                    )
                    loops = self._hand_over() if due else []
                self._wake(loops)
                with condition:
                    # Nothing is held here when the queue is empty: it was handed over above.
                    while not calls:
                        if self._closed or not condition.wait(_IDLE):
                            if calls:
                                continue
                            # Under the lock: a call queued from now on starts a new thread.
                            self._thread = None
                            return
                    call = calls.popleft()
                    if call.state == _SKIPPED:
                        continue
                    call.state = _RUNNING
                    watch = bool(held) and not self._watched
                    if watch:
                        self._watched = True
                if watch:
                    try:
                        _FLUSHER.watch(self)
                    except BaseException:  # no flusher (no thread could start): hand over now
                        with condition:
                            self._watched = False
                            loops = self._hand_over()
                        self._wake(loops)
                try:
                    call.value = call.function(*call.args)
                except BaseException as error:  # handed to the caller, whatever it is
                    call.error = error
                call.args = ()  # what it was given need not live as long as the caller
                with condition:
                    call.state = _DONE
                    if not held:
                        self._held_since = time.monotonic()
                    held.append(call)
        finally:
            # Ended by an error of its own (out of memory, say): the next call starts another.
            with condition:
                if self._thread is threading.current_thread():
                    self._thread = None
                loops = self._hand_over()
            self._wake(loops)

    def _hand_over(self) -> list[asyncio.AbstractEventLoop]:
        """Move the held results to their loops; return the loops to wake. Lock held."""
        ready = self._ready
        woken: list[asyncio.AbstractEventLoop] = []
        for call in self._held:
            loop = call.loop
            waiting = ready.get(loop)
            if waiting is None:
                ready[loop] = [call]
                woken.append(loop)
            else:
                waiting.append(call)  # the loop's drain, already scheduled, takes it too
        self._held.clear()
        return woken

    def _wake(self, loops: list[asyncio.AbstractEventLoop]) -> None:
        for loop in loops:
            try:
                loop.call_soon_threadsafe(self._drain, loop)
            except RuntimeError:  # the loop is closed: nobody waits for its calls any more
                with self._condition:
                    self._ready.pop(loop, None)

    def _flush_stale(self, now: float) -> bool:
        """Hand over held results that have waited `_HOLD`; whether any are still held."""
        with self._condition:
            loops = self._hand_over() if self._held and now - self._held_since >= _HOLD else []
            self._watched = bool(self._held)
            still = self._watched
        self._wake(loops)
        return still

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        # On the loop's thread: resolve every call whose result came in since the last drain.
        with self._condition:
            ready = self._ready.pop(loop, ())
        for call in ready:
            _resolve(call)


class _Flusher:
    """One thread for every IoThread: hands over results held back while a call runs long."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._watched: set[IoThread] = set()
        self._thread: threading.Thread | None = None

    def watch(self, io: IoThread) -> None:
        with self._condition:
            self._watched.add(io)
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, name="aiservices-io-flusher", daemon=True
                )
                thread.start()  # if it can't start, the next watch tries again
                self._thread = thread
            elif len(self._watched) == 1:
                self._condition.notify()

    def _run(self) -> None:
        condition = self._condition
        while True:
            with condition:
                while not self._watched:
                    condition.wait()
                watched = list(self._watched)
            time.sleep(_HOLD)
            now = time.monotonic()
            done = [io for io in watched if not io._flush_stale(now)]
            with condition:
                for io in done:
                    if not io._watched:  # else its worker watched it again meanwhile
                        self._watched.discard(io)


_FLUSHER = _Flusher()
_every: weakref.WeakSet[IoThread] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    _FLUSHER._reset()
    for io in list(_every):
        io._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _error(call: _Call) -> BaseException:
    """What the call raised, as its caller is given it."""
    error = call.error
    assert error is not None
    if isinstance(error, StopIteration):
        # A future can't hold StopIteration (it would end the awaiting coroutine's frame
        # instead): raised as a generator would raise it, per PEP 479.
        name = getattr(call.function, "__qualname__", repr(call.function))
        return RuntimeError(f"{name} raised StopIteration")
    return error


def _resolve(call: _Call) -> None:
    future = call.future
    if not future.done():
        if call.error is None:
            future.set_result(call.value)
        else:
            future.set_exception(_error(call))
    waiter = call.waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
