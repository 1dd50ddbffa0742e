"""Scopes: a conversation tied to a block of code (a web request, a session, a job).

```python
with memory_scope() as scope:          # a new conversation id, forgotten at the end
    bot.chat("Hi, I am Ada")           # a method without a MemoryId parameter
    bot.chat("What is my name?")       # the same conversation: scope.memory_id
```

Inside the block, a call of a method without a ``MemoryId`` parameter, on a service with a
``chat_memory_provider``, uses the conversation ``scope.memory_id`` instead of
``"default"``. The scope travels with ``contextvars``: asyncio tasks created inside see it,
a thread started inside does not. Leaving the block, normally or by an exception, applies
``on_exit`` to the conversation of every service that made a call inside it: ``"forget"``
erases it (memory, stored messages, history), ``"evict"`` drops only the cached memory,
``"keep"`` leaves it. Forgetting first closes the streams started inside and not read to
their end (they record nothing): read a stream inside the block, or keep the conversation.
In async code, leave with ``async with``: a plain ``with`` can't wait for an async stream
still running on its loop, and then raises ``RuntimeError`` without forgetting anything.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections.abc import AsyncGenerator, Coroutine, Generator, Hashable
from contextvars import ContextVar
from typing import Final, Literal, Protocol, TypeAlias

__all__ = ["MemoryScope", "OnExit", "current_memory_scope", "memory_scope"]

OnExit: TypeAlias = Literal["forget", "evict", "keep"]
_ON_EXIT: Final = ("forget", "evict", "keep")


class _Service(Protocol):
    # What a scope asks of a service whose conversation it ends (a ServiceState).
    def forget(self, memory_id: Hashable) -> None: ...

    async def aforget(self, memory_id: Hashable) -> None: ...

    def evict(self, memory_id: Hashable) -> None: ...


_Stream: TypeAlias = Generator[object, None, None] | AsyncGenerator[object, None]


class _StreamCall(Protocol):
    # What a scope reads of a stream's call: the event loop an async stream started on
    # (None before it starts); and what it sets: that it closed the stream, so that one
    # being read elsewhere just then, which it cannot close, stops at its next event.
    loop: object
    closed_elsewhere: bool


_current: ContextVar[MemoryScope | None] = ContextVar("aiservices_memory_scope", default=None)


class MemoryScope:
    """An active (or ready) scope: ``memory_id`` is its conversation's id in every service."""

    __slots__ = (
        "_active",
        "_lock",
        "_outer",
        "_services",
        "_streams",
        "left",
        "memory_id",
        "on_exit",
    )

    def __init__(self, memory_id: Hashable, on_exit: OnExit) -> None:
        self.memory_id = memory_id
        self.on_exit = on_exit
        # The services that made a call inside the block, by identity, in order.
        self._services: dict[int, _Service] = {}
        self._lock = threading.Lock()
        self._active = False
        # The scope that was current when this one was entered: current again when this
        # one is left, unless it has ended meanwhile (left out of order).
        self._outer: MemoryScope | None = None
        # Streams started inside the block, closed when it ends forgetting: an unfinished
        # one holds its conversation, which forgetting would otherwise wait for forever.
        self._streams: weakref.WeakKeyDictionary[_Stream, _StreamCall] | None = None
        # Set when the block ends: a call still running then (or made later, by a task
        # started inside) ends its own conversation as the exit did, after its commit.
        self.left = False

    def __repr__(self) -> str:
        return f"MemoryScope({self.memory_id!r}, on_exit={self.on_exit!r})"

    def used_by(self, service: _Service) -> None:
        """Note that ``service`` made a call in this scope (its conversation ends with it)."""
        services = self._services
        if id(service) not in services:
            with self._lock:
                services.setdefault(id(service), service)

    def opened(self, stream: _Stream, call: _StreamCall) -> None:
        """Note a stream started in this scope: a forgetting exit closes it, unfinished."""
        with self._lock:
            if self._streams is None:
                self._streams = weakref.WeakKeyDictionary()
            self._streams[stream] = call

    def _open_streams(self) -> list[tuple[_Stream, _StreamCall]]:
        # Only a forgetting exit waits for the conversation (evicting never waits), and a
        # kept conversation's stream may still be read after the block.
        with self._lock:
            streams = list((self._streams or {}).items())
            self._streams = None
        return streams if self.on_exit == "forget" else []

    def _enter(self) -> MemoryScope:
        if self._active:
            raise RuntimeError(f"{self!r} is already active; make a new memory_scope(...)")
        self._active = True
        self._outer = _current.get()
        _current.set(self)
        self.left = False
        return self

    def _leave(self, *, ending: bool = True) -> list[_Service]:
        self._active = False
        with self._lock:
            self.left = ending
            services = list(self._services.values())
            self._services.clear()
        # Only a scope that is current makes way, for the nearest outer one still active:
        # two generators that each hold a scope, advanced in turn, leave them out of order.
        # Left in another context than it was entered in (an async generator finalised by
        # the event loop, say), this one is not current there: nothing changes.
        if _current.get() is self:
            outer = self._outer
            # (A scope object entered again after such exits may lead back to itself.)
            passed = {id(self)}
            while outer is not None and not outer._active:
                if id(outer) in passed:
                    outer = None
                    break
                passed.add(id(outer))
                outer = outer._outer
            _current.set(outer)
        return services if self.on_exit != "keep" else []

    def __enter__(self) -> MemoryScope:
        return self._enter()

    def __exit__(self, *exc_info: object) -> None:
        errors: list[Exception] = []
        stuck = False
        try:
            for stream, call in self._open_streams():
                call.closed_elsewhere = True
                try:
                    if isinstance(stream, Generator):
                        # Running in another thread (ValueError): it stops at its next event,
                        # and the exit waits for that.
                        with contextlib.suppress(ValueError):
                            stream.close()
                    elif not _close_async(stream, call.loop):
                        stuck = True
                        call.closed_elsewhere = False  # nothing is forgotten: it goes on
                except Exception as error:  # a stream whose close failed has still ended
                    errors.append(error)
        finally:
            # Whatever closing the streams did, the block is left.
            services = self._leave(ending=not stuck)
        if stuck:
            raise RuntimeError(
                f"{self!r} ended with a plain `with` while an async stream started in it was "
                "unfinished; forgetting its conversation would wait for that stream on an "
                "event loop that this exit blocks (or that no longer runs), so nothing was "
                "forgotten. Use `async with "
                "memory_scope(...)`, or read the stream to its end or `await stream.aclose()` "
                "inside the block"
            )
        for service in services:
            try:
                if self.on_exit == "forget":
                    service.forget(self.memory_id)
                else:
                    service.evict(self.memory_id)
            except Exception as error:  # every service's conversation ends, then we say
                errors.append(error)
        _raise(errors)

    async def __aenter__(self) -> MemoryScope:
        return self._enter()

    async def __aexit__(self, *exc_info: object) -> None:
        errors: list[Exception] = []
        cancelled: BaseException | None = None
        try:
            for stream, call in self._open_streams():
                call.closed_elsewhere = True
                try:
                    if isinstance(stream, AsyncGenerator):
                        # To its end even when cancelled meanwhile: half closed, a stream
                        # would hold its conversation, which the forget below waits for.
                        await _to_the_end(_aclosed(stream))
                    else:
                        with contextlib.suppress(ValueError):
                            stream.close()
                except _Cancelled as stopped:
                    cancelled = stopped.error
                    if stopped.failed is not None:
                        errors.append(stopped.failed)
                except Exception as error:  # a stream whose close failed has still ended
                    errors.append(error)
        finally:
            services = self._leave()
        for service in services:
            try:
                if self.on_exit == "forget":
                    await _to_the_end(service.aforget(self.memory_id))
                else:
                    service.evict(self.memory_id)
            except _Cancelled as stopped:
                cancelled = stopped.error
                if stopped.failed is not None:
                    errors.append(stopped.failed)
            except Exception as error:
                errors.append(error)
        if cancelled is not None:
            if errors:  # shown with the cancellation, which must go on
                cancelled.__context__ = ExceptionGroup(
                    "ending the scope's conversations failed", errors
                )
            raise cancelled
        _raise(errors)


def _running_loop() -> object:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _aclosed(stream: AsyncGenerator[object, None]) -> None:
    # Running elsewhere (ValueError, RuntimeError): it stops at its next event (its call is
    # marked closed), and the exit waits for that.
    with contextlib.suppress(ValueError, RuntimeError):
        await stream.aclose()


def _close_async(stream: AsyncGenerator[object, None], loop: object) -> bool:
    """Close an async stream from a plain `with`; ``False`` if only an event loop that this
    exit blocks (or one that no longer runs) could finish closing it."""
    import asyncio

    here = _running_loop()
    if loop is None or loop is here:
        # Not started (closing it runs nothing), or on this thread's loop.
        return _close_here(stream)
    assert isinstance(loop, asyncio.AbstractEventLoop)
    if not loop.is_running():
        # Ended already (read to its end with asyncio.run), or stuck for good on a loop that
        # no longer runs: closing here finishes the first and says so of the second.
        return _close_here(stream)
    # On another thread's loop: closed there, while this thread waits.
    asyncio.run_coroutine_threadsafe(_aclosed(stream), loop).result()
    return True


def _close_here(stream: AsyncGenerator[object, None]) -> bool:
    """Close ``stream`` without an event loop's help; ``False`` if closing had to wait (it
    then finishes on the loop once this thread gives it back, releasing the conversation)."""
    closing = stream.aclose()
    try:
        waited = closing.send(None)
    except StopIteration:
        return True
    except (RuntimeError, ValueError):  # running (another task has it), or closing already
        return False
    import asyncio

    # It awaits something only the loop can finish (a provider's HTTP response closing).
    loop = _running_loop()
    if loop is None:
        return False
    assert isinstance(loop, asyncio.AbstractEventLoop)
    finishing = loop.create_task(_finish(closing, waited))
    _FINISHING.add(finishing)
    finishing.add_done_callback(_FINISHING.discard)
    return False


async def _finish(closing: Coroutine[object, None, None], waited: object) -> None:
    """Drive a coroutine that was started by hand to its end, as a task would have."""
    import asyncio

    while True:
        if isinstance(waited, asyncio.Future):
            await asyncio.wait((waited,))
        else:  # a bare yield (asyncio.sleep(0))
            await asyncio.sleep(0)
        try:
            waited = closing.send(None)
        except StopIteration:
            return
        except Exception:  # a close that fails has still ended
            return


# Closings left to the loop, held until they end (a task only weakly held may vanish).
_FINISHING: Final[set[object]] = set()


class _Cancelled(Exception):
    """A forget that ran to its end although its caller was cancelled meanwhile."""

    def __init__(self, error: BaseException, failed: Exception | None) -> None:
        super().__init__()
        self.error = error  # the cancellation
        self.failed = failed  # what the forget raised, if it did


async def _to_the_end(forgetting: Coroutine[object, None, None]) -> None:
    """Await ``forgetting`` to its end even when cancelled meanwhile (a web framework may
    cancel a request's task again while its scope exits), then say it was (`_Cancelled`).

    The block was left: what it said was kept for it must go, whatever stopped it.
    """
    from ._conversations import to_the_end

    task, cancelled = await to_the_end(forgetting)
    failed = task.exception()  # raises CancelledError if the forget itself was cancelled
    if cancelled is not None:
        raise _Cancelled(cancelled, failed if isinstance(failed, Exception) else None)
    if failed is not None:
        raise failed


def _raise(errors: list[Exception]) -> None:
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup("ending the scope's conversations failed", errors)


def memory_scope(
    memory_id: Hashable | None = None, /, *, on_exit: OnExit = "forget"
) -> MemoryScope:
    """A scope for ``with`` or ``async with``: ``memory_id`` or a new uuid4 string.

    ``on_exit``: ``"forget"`` (the default) erases the conversation of every service used
    inside when the block ends, ``"evict"`` drops only their cached memories, ``"keep"``
    leaves them.
    """
    if on_exit not in _ON_EXIT:
        raise ValueError(f"on_exit must be 'forget', 'evict' or 'keep', not {on_exit!r}")
    if memory_id is None:
        memory_id = str(uuid.uuid4())
    else:
        try:
            hash(memory_id)
        except TypeError:
            raise TypeError(
                f"a scope's memory id must be hashable (a str, int, UUID...), got "
                f"{type(memory_id).__name__}"
            ) from None
    return MemoryScope(memory_id, on_exit)


def current_memory_scope() -> MemoryScope | None:
    """The innermost active scope of this context, or ``None``."""
    return _current.get()


current_scope = _current.get  # for the turn: the lookup without a Python call around it
