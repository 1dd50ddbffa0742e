"""The stream objects a streaming method returns: the answer's text as it arrives.

The turn is committed only when the stream runs to its end; closing it early, or an error
midway, records nothing. The drivers that fill them are in ``_runner``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._result import Result

__all__ = ["AsyncTextStream", "ResultBox", "TextStream"]


class ResultBox:
    """Where a stream's driver leaves the call's result.

    The driver holds the box, not the stream: a stream dropped unfinished is then freed at
    once, which closes its driver and releases the conversation, rather than waiting in a
    reference cycle for the garbage collector.
    """

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: Result[str] | None = None


class TextStream(Iterator[str]):
    """The text of an answer as it arrives; iterate it, then read ``result``.

    ``result`` is ``None`` until the stream has ended; then it is a ``Result[str]`` with
    the whole text, the token usage summed over the call's model rounds and the tool
    executions. Declare ``-> TextStream`` instead of ``-> Iterator[str]`` to have it typed.
    """

    __slots__ = ("_box", "_chunks")

    def __init__(self, chunks: Generator[str, None, None], box: ResultBox | None = None) -> None:
        self._chunks = chunks
        self._box = ResultBox() if box is None else box

    @property
    def result(self) -> Result[str] | None:
        """The call's ``Result[str]`` once the stream has ended; ``None`` before."""
        return self._box.result

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._chunks)

    def close(self) -> None:
        """Stop the stream early; nothing of the turn is recorded."""
        self._chunks.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTextStream(AsyncIterator[str]):
    """The async form of ``TextStream``: ``async for`` it, then read ``result``."""

    __slots__ = ("_box", "_chunks")

    def __init__(self, chunks: AsyncGenerator[str, None], box: ResultBox | None = None) -> None:
        self._chunks = chunks
        self._box = ResultBox() if box is None else box

    @property
    def result(self) -> Result[str] | None:
        """The call's ``Result[str]`` once the stream has ended; ``None`` before."""
        return self._box.result

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        """Stop the stream early; nothing of the turn is recorded."""
        await self._chunks.aclose()

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
