"""The drivers: a service call's turn (``_turn.turn``) run the blocking way, the awaiting
way, or as a stream of text, sync or async.

A driver binds the call, holds the conversation's turn lock, performs the I/O the turn
yields (read the memory, ask the model, run tools, commit) and releases the lock. It holds
no rule of the turn: those are all in ``_turn``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

from ._text_streams import AsyncTextStream, TextStream
from ._turn import COMMIT, MODEL, READ, Call, ServiceState, bind, failed, turn, unstreamed_text
from .models import ChatModel, ChatRequest, ChatResponse

if TYPE_CHECKING:
    from ._conversations import Conversation
    from ._plan import MethodPlan

__all__ = ["run_async", "run_sync", "stream_async", "stream_sync"]


# -- blocking -------------------------------------------------------------------------


def run_sync(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """Run a call on the calling thread."""
    call = bind(state, plan, args)
    conversation = _hold(state, call)
    try:
        chat = (state.model or state.chat_model()).chat
        send = turn(state, call).send
        value: Any = None
        try:
            while True:
                op, argument = send(value)
                value = chat(argument) if op == MODEL else _perform(op, argument, conversation)
        except StopIteration as stop:
            return stop.value
    except BaseException as error:
        # Cancellation and interrupts too: listeners must see every call end.
        failed(state, call, error)
        raise
    finally:
        if conversation is not None:
            conversation.lock.release()


def stream_sync(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> TextStream:
    """Start a streaming call: bind now, run when the first chunk is asked for."""
    call = bind(state, plan, args)
    stream = TextStream.__new__(TextStream)
    TextStream.__init__(stream, _chunks(state, call, stream))
    return stream


def _chunks(state: ServiceState, call: Call, sink: TextStream) -> Generator[str, None, None]:
    # The conversation is held from the first chunk asked for until the stream ends.
    conversation = _hold(state, call)
    try:
        model = state.model or state.chat_model()
        send = turn(state, call).send
        value: Any = None
        try:
            while True:
                op, argument = send(value)
                if op == MODEL:
                    value = yield from _streamed(model, argument)
                else:
                    value = _perform(op, argument, conversation)
        except StopIteration as stop:
            sink.result = stop.value
            direct = unstreamed_text(stop.value)
            if direct:
                yield direct
    except BaseException as error:
        # An early close (GeneratorExit) or a cancellation ends the call too.
        failed(state, call, error)
        raise
    finally:
        if conversation is not None:
            conversation.lock.release()


def _hold(state: ServiceState, call: Call) -> Conversation | None:
    conversation = call.conversation
    if conversation is None:
        return None
    conversation = state.conversations.hold(conversation, call.memory_id, call.key)
    call.conversation = conversation
    return conversation


def _perform(op: int, argument: Any, conversation: Conversation | None) -> Any:
    """Perform a turn's memory or tool operation, the blocking way."""
    if op == READ:
        return conversation.memory.messages()  # type: ignore[union-attr]
    if op == COMMIT:
        messages, request, response = argument
        conversation.memory.add(*messages)  # type: ignore[union-attr]
        _observe(conversation, request, response)  # type: ignore[arg-type]
        return None
    toolbox, requests, memory_id = argument
    return toolbox.execute_all(requests, memory_id)


def _streamed(model: ChatModel, request: ChatRequest) -> Generator[str, None, ChatResponse]:
    """Forward the answer's text deltas; return the final response."""
    stream = getattr(model, "stream", None)
    if stream is None:
        response = model.chat(request)
        if response.ai_message.text:
            yield response.ai_message.text
        return response
    final: ChatResponse | None = None
    for piece in stream(request):
        if isinstance(piece, ChatResponse):
            final = piece
        elif piece:
            yield piece
    return _final(model, final)


# -- awaiting -------------------------------------------------------------------------


async def run_async(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """Run a call on the running event loop; blocking I/O goes to worker threads."""
    call = bind(state, plan, args)
    conversation = await _ahold(state, call)
    try:
        model = state.model or state.chat_model()
        send = turn(state, call).send
        value: Any = None
        try:
            while True:
                op, argument = send(value)
                if op == MODEL:
                    value = await _achat(model, argument)
                else:
                    value = await _aperform(op, argument, conversation)
        except StopIteration as stop:
            return stop.value
    except BaseException as error:
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
    state: ServiceState, call: Call, sink: AsyncTextStream
) -> AsyncGenerator[str, None]:
    conversation = await _ahold(state, call)
    try:
        model = state.model or state.chat_model()
        astream = getattr(model, "astream", None)
        send = turn(state, call).send
        value: Any = None
        try:
            while True:
                op, argument = send(value)
                if op != MODEL:
                    value = await _aperform(op, argument, conversation)
                elif astream is None:
                    value = await _achat(model, argument)
                    if value.ai_message.text:
                        yield value.ai_message.text
                else:
                    value = None
                    async for piece in astream(argument):
                        if isinstance(piece, ChatResponse):
                            value = piece
                        elif piece:
                            yield piece
                    value = _final(model, value)
        except StopIteration as stop:
            sink.result = stop.value
            direct = unstreamed_text(stop.value)
            if direct:
                yield direct
    except BaseException as error:
        failed(state, call, error)
        raise
    finally:
        if conversation is not None:
            conversation.lock.release()


async def _ahold(state: ServiceState, call: Call) -> Conversation | None:
    conversation = call.conversation
    if conversation is None:
        return None
    conversation = await state.conversations.ahold(conversation, call.memory_id, call.key)
    call.conversation = conversation
    return conversation


async def _aperform(op: int, argument: Any, conversation: Conversation | None) -> Any:
    """Perform a turn's memory or tool operation without blocking the event loop.

    A memory whose store does no I/O (``is_blocking = False``) is used directly.
    """
    if op == READ:
        memory: Any = conversation.memory  # type: ignore[union-attr]
        if not conversation.blocking:  # type: ignore[union-attr]
            return memory.messages()
        return await _amemory(memory, "amessages", memory.messages)
    if op == COMMIT:
        messages, request, response = argument
        memory = conversation.memory  # type: ignore[union-attr]
        if conversation.blocking:  # type: ignore[union-attr]
            await _settled(_amemory(memory, "aadd", memory.add, *messages))
        else:
            memory.add(*messages)
        _observe(conversation, request, response)  # type: ignore[arg-type]
        return None
    toolbox, requests, memory_id = argument
    return await toolbox.aexecute_all(requests, memory_id)


async def _achat(model: ChatModel, request: ChatRequest) -> ChatResponse:
    achat = getattr(model, "achat", None)
    if achat is not None:
        return await achat(request)  # type: ignore[no-any-return]
    import asyncio

    return await asyncio.to_thread(model.chat, request)


def _amemory(
    memory: Any, name: str, blocking: Callable[..., Any], *args: Any
) -> Coroutine[Any, Any, Any]:
    native = getattr(memory, name, None)
    if native is not None:
        return native(*args)  # type: ignore[no-any-return]
    import asyncio

    return asyncio.to_thread(blocking, *args)


async def _settled(write: Coroutine[Any, Any, Any]) -> Any:
    """Await a commit to its end, even when the caller is cancelled meanwhile.

    A cancelled caller must not be told the call failed while the write goes on and lands
    (in a worker thread, or a request already sent to a server): the write runs as a task
    of its own, the conversation's lock stays held until it has finished, and the caller
    gets its outcome: the answer when the turn was written, the store's error when not.
    """
    import asyncio

    task = asyncio.ensure_future(write)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise  # the write itself was cancelled (its loop is closing): nothing landed


# -- shared by the drivers --------------------------------------------------------------


def _observe(conversation: Conversation, request: ChatRequest, response: ChatResponse) -> None:
    # A memory that counts tokens may calibrate its estimate with what the provider counted
    # for the last request of the turn.
    if response.token_usage is not None and conversation.observe is not None:
        conversation.observe(request.messages, response.token_usage)


def _final(model: ChatModel, response: ChatResponse | None) -> ChatResponse:
    if response is None:
        raise RuntimeError(
            f"{type(model).__name__}.stream() ended without its final ChatResponse; a stream "
            "yields text deltas (str) and then one ChatResponse"
        )
    return response
