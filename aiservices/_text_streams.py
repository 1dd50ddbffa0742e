"""The stream objects a streaming method returns: the answer's text as it arrives.

The turn is committed only when the stream runs to its end; closing it early, or an error
midway, records nothing. The drivers that fill them are in ``_runner``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._result import Result

__all__ = ["AsyncTextStream", "TextStream"]


class TextStream(Iterator[str]):
    """The text of an answer as it arrives; iterate it, then read ``result``.

    ``result`` is ``None`` until the stream has ended; then it is a ``Result[str]`` with
    the whole text, the token usage summed over the call's model rounds and the tool
    executions. Declare ``-> TextStream`` instead of ``-> Iterator[str]`` to have it typed.
    """

    __slots__ = ("_chunks", "result")

    def __init__(self, chunks: Generator[str, None, None]) -> None:
        self._chunks = chunks
        self.result: Result[str] | None = None

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

    __slots__ = ("_chunks", "result")

    def __init__(self, chunks: AsyncGenerator[str, None]) -> None:
        self._chunks = chunks
        self.result: Result[str] | None = None

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
