"""Streaming calls: the answer's text as it arrives, the turn recorded when the stream ends.

A streaming call runs the same turn as any other call (``_runner._turn``); only the driver
differs: it forwards the model's text deltas to the consumer. The conversation's lock is
held from the first chunk asked for until the stream ends or is closed. The turn is
committed only when the stream runs to its end; closing it early, or an error midway,
records nothing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any

from ._plan import MethodPlan
from ._result import Result
from ._runner import (
    _MODEL,
    ServiceState,
    _Call,
    _turn,
    ado_io,
    ahold,
    bind,
    do_io,
    failed,
    hold,
)
from .models import ChatResponse

__all__ = ["AsyncTextStream", "TextStream", "stream_async", "stream_sync"]


def _missing_final(model: object) -> RuntimeError:
    return RuntimeError(
        f"{type(model).__name__}.stream() ended without its final ChatResponse; a stream "
        "yields text deltas (str) and then one ChatResponse"
    )


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


def _direct_text(result: Result[Any]) -> str | None:
    """The text of a call answered by a direct-return tool (no model round streamed it)."""
    if result.ai_message is not None or not result.tool_executions:
        return None
    return "\n".join(e.result for e in result.tool_executions)


def stream_sync(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> TextStream:
    """Start a streaming call: bind now, run when the first chunk is asked for."""
    call = bind(state, plan, args)
    stream = TextStream.__new__(TextStream)
    TextStream.__init__(stream, _chunks(state, call, stream))
    return stream


def _chunks(state: ServiceState, call: _Call, sink: TextStream) -> Generator[str, None, None]:
    conversation = hold(state, call) if call.conversation is not None else None
    try:
        model = state.model or state.chat_model()
        stream = getattr(model, "stream", None)
        memory = conversation.memory if conversation is not None else None
        turn = _turn(state, call)
        value: Any = None
        try:
            while True:
                op, argument = turn.send(value)
                if op == _MODEL:
                    if stream is None:
                        value = model.chat(argument)
                        if value.ai_message.text:
                            yield value.ai_message.text
                        continue
                    value = None
                    for piece in stream(argument):
                        if isinstance(piece, ChatResponse):
                            value = piece
                        elif piece:
                            yield piece
                    if value is None:
                        raise _missing_final(model)
                else:
                    value = do_io(op, argument, memory)
        except StopIteration as stop:
            sink.result = stop.value
            direct = _direct_text(stop.value)
            if direct:
                yield direct
        except BaseException as error:
            # An early close (GeneratorExit) or a cancellation ends the call too.
            failed(state, call, error)
            raise
    finally:
        if conversation is not None:
            conversation.lock.release()


def stream_async(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> AsyncTextStream:
    """Start an async streaming call: bind now, run when the first chunk is awaited."""
    call = bind(state, plan, args)
    stream = AsyncTextStream.__new__(AsyncTextStream)
    AsyncTextStream.__init__(stream, _achunks(state, call, stream))
    return stream


async def _achunks(
    state: ServiceState, call: _Call, sink: AsyncTextStream
) -> AsyncGenerator[str, None]:
    import asyncio

    conversation = await ahold(state, call) if call.conversation is not None else None
    try:
        model = state.model or state.chat_model()
        astream = getattr(model, "astream", None)
        achat = getattr(model, "achat", None)
        memory = conversation.memory if conversation is not None else None
        turn = _turn(state, call)
        value: Any = None
        try:
            while True:
                op, argument = turn.send(value)
                if op == _MODEL:
                    if astream is None:
                        if achat is not None:
                            value = await achat(argument)
                        else:
                            value = await asyncio.to_thread(model.chat, argument)
                        if value.ai_message.text:
                            yield value.ai_message.text
                        continue
                    value = None
                    async for piece in astream(argument):
                        if isinstance(piece, ChatResponse):
                            value = piece
                        elif piece:
                            yield piece
                    if value is None:
                        raise _missing_final(model)
                else:
                    value = await ado_io(op, argument, memory)
        except StopIteration as stop:
            sink.result = stop.value
            direct = _direct_text(stop.value)
            if direct:
                yield direct
        except BaseException as error:
            # An early close (GeneratorExit) or a cancellation ends the call too.
            failed(state, call, error)
            raise
    finally:
        if conversation is not None:
            conversation.lock.release()
