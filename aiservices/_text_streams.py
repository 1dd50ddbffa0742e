"""The stream objects a streaming method returns: the answer's text, or the turn's events.

The turn is committed only when the stream runs to its end; closing it early, or an error
midway, records nothing. The drivers that fill them are in ``_runner``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from ._events import StreamEvent

if TYPE_CHECKING:
    from typing import Self

    from ._result import Result

__all__ = ["AsyncEventStream", "AsyncTextStream", "EventStream", "ResultBox", "TextStream"]

_T = TypeVar("_T")


class ResultBox:
    """Where a stream's driver leaves the call's result.

    The driver holds the box, not the stream: a stream dropped unfinished is then freed at
    once, which closes its driver and releases the conversation, rather than waiting in a
    reference cycle for the garbage collector.
    """

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: Result[str] | None = None


class _Stream(Iterator[_T], Generic[_T]):
    """What a sync stream is: iterate it, close it (or leave a ``with`` block), read ``result``."""

    __slots__ = ("_box", "_source", "_stop")

    def __init__(
        self,
        source: Generator[_T, None, None],
        box: ResultBox | None = None,
        *,
        stop: Callable[[], None] | None = None,
    ) -> None:
        self._source = source
        self._box = ResultBox() if box is None else box
        # Marks the stream closed for the thread reading it, which it can't be closed under.
        self._stop = stop

    @property
    def result(self) -> Result[str] | None:
        """The call's ``Result[str]`` once the stream has ended; ``None`` before."""
        return self._box.result

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> _T:
        return next(self._source)

    def close(self) -> None:
        """Stop the stream early; nothing of the turn is recorded.

        Closed while another thread reads it, it ends there at its next event, which that
        thread does not get (a turn that was being written just then is recorded).
        """
        stop = self._stop
        if stop is not None and getattr(self._source, "gi_running", False):
            stop()
            return
        try:
            self._source.close()
        except ValueError:  # its reader's thread resumed it meanwhile
            if stop is None:
                raise
            stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncStream(AsyncIterator[_T], Generic[_T]):
    """What an async stream is: ``async for`` it, ``aclose`` it (or leave an ``async with``
    block), read ``result``."""

    __slots__ = ("_box", "_on_drop", "_source", "_stop")

    def __init__(
        self,
        source: AsyncGenerator[_T, None],
        box: ResultBox | None = None,
        on_drop: Callable[[], None] | None = None,
        stop: Callable[[], None] | None = None,
    ) -> None:
        self._source = source
        self._box = ResultBox() if box is None else box
        self._on_drop = on_drop
        # Marks the stream closed for the task reading it, which it can't be closed under.
        self._stop = stop

    def __del__(self) -> None:
        # Dropped unread (a `break` out of `async for`), the stream is closed later, by
        # its event loop: told now, the call can let its reader's next call wait for that.
        if self._on_drop is not None:
            self._on_drop()

    @property
    def result(self) -> Result[str] | None:
        """The call's ``Result[str]`` once the stream has ended; ``None`` before."""
        return self._box.result

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> _T:
        return await self._source.__anext__()

    async def aclose(self) -> None:
        """Stop the stream early; nothing of the turn is recorded.

        Closed while another task reads it (a stop button), it ends there at its next
        event, which that task does not get (a turn that was being written just then is
        recorded).
        """
        if self._stop is not None and getattr(self._source, "ag_running", False):
            self._stop()
            return
        await self._source.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TextStream(_Stream[str]):
    """The text of an answer as it arrives; iterate it, then read ``result``.

    ``result`` is ``None`` until the stream has ended; then it is a ``Result[str]`` with
    the whole text, the token usage summed over the call's model rounds and the tool
    executions. Declare ``-> TextStream`` instead of ``-> Iterator[str]`` to have it typed.
    """

    __slots__ = ()


class AsyncTextStream(_AsyncStream[str]):
    """The async form of ``TextStream``: ``async for`` it, then read ``result``."""

    __slots__ = ()


class EventStream(_Stream[StreamEvent]):
    """A turn's events as they happen (``TextDelta``, ``ToolCallStarted``,
    ``ToolCallFinished``, and last ``TurnCompleted``); iterate it.

    The conversation is free again once ``TurnCompleted`` is out. Declare ``-> EventStream``
    instead of ``-> Iterator[StreamEvent]`` to have ``close()`` and ``with`` typed.
    """

    __slots__ = ()


class AsyncEventStream(_AsyncStream[StreamEvent]):
    """The async form of ``EventStream``: ``async for`` it."""

    __slots__ = ()
