"""The drivers: a service call's turn (``_turn.turn``) run the blocking way, the awaiting
way, or as a stream of events or text, sync or async.

A driver binds the call, holds the conversation's turn lock, performs the operations the
turn yields (read the memory, ask the model, run tools, call a guardrail or a retriever,
commit), hands back each outcome (``send``) or exception (``throw``), and releases the lock.
It holds no rule of the turn: those are all in ``_turn``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ._conversations import aerase, erase, settled
from ._events import StreamEvent, TextDelta, ToolCallFinished, ToolCallStarted, TurnCompleted
from ._hooks import logger
from ._locks import Entered, LoopBlocked, enter, leave
from ._text_streams import AsyncEventStream, AsyncTextStream, EventStream, ResultBox, TextStream
from ._threads import Stopped, in_thread, is_async
from ._turn import (
    CALL,
    COMMIT,
    END,
    FETCH,
    MODEL,
    READ,
    SAY,
    TOOLS,
    Call,
    ServiceState,
    bind,
    failed,
    turn,
)
from .models import ChatModel, ChatRequest, ChatResponse

if TYPE_CHECKING:
    from ._conversations import Conversation
    from ._plan import MethodPlan

__all__ = [
    "events_async",
    "events_sync",
    "run_async",
    "run_sync",
    "stream_async",
    "stream_sync",
]


# -- blocking -------------------------------------------------------------------------


def run_sync(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """Run a call on the calling thread."""
    call = bind(state, plan, args)
    conversation = _hold(state, call)
    try:
        chat = (state.model or state.chat_model()).chat
        running = turn(state, call)
        send, throw = running.send, running.throw
        value: Any = None
        error: Exception | None = None
        try:
            while True:
                op, argument = send(value) if error is None else throw(error)
                error = None
                try:
                    value = chat(argument) if op == MODEL else _perform(op, argument, conversation)
                except Exception as raised:  # the turn decides what an error means
                    error = raised
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
    box = ResultBox()
    events = _opened(call, _marked(call, _events(state, call, box)))
    return TextStream(_texts(events), box, stop=partial(_stop, call))


def events_sync(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> EventStream:
    """Start a call that streams its events: bind now, run when the first is asked for."""
    call = bind(state, plan, args)
    box = ResultBox()
    events = _opened(call, _marked(call, _events(state, call, box)))
    return EventStream(events, box, stop=partial(_stop, call))


def _texts(events: Generator[StreamEvent, None, None]) -> Generator[str, None, None]:
    try:
        for event in events:
            if type(event) is TextDelta:
                yield event.text
    finally:
        events.close()


def _marked(
    call: Call, events: Generator[StreamEvent, None, None]
) -> Generator[StreamEvent, None, None]:
    """``events``, with the reader's code between two of them marked as inside the turn
    while the stream holds its conversation: a call back into it from there is refused
    instead of waiting for a stream that only that caller can move on."""
    try:
        for event in events:
            if call.closed_elsewhere:
                # Closed while read elsewhere (by its scope, or another task or thread): it ends
                # at its next event, unrecorded.
                return
            entered = None if type(event) is TurnCompleted else _entered(call.conversation)
            try:
                yield event
            finally:
                leave(entered)
            if call.closed_elsewhere:
                return
    finally:
        events.close()


def _events(state: ServiceState, call: Call, box: ResultBox) -> Generator[StreamEvent, None, None]:
    # The conversation is held from the first event asked for until the turn is recorded.
    conversation = _hold(state, call)
    completed = False
    try:
        model = state.model or state.chat_model()
        running = turn(state, call)
        send, throw = running.send, running.throw
        value: Any = None
        error: Exception | None = None
        try:
            while True:
                op, argument = send(value) if error is None else throw(error)
                error = None
                try:
                    if op == MODEL:
                        value = yield from _streamed(model, argument)
                    elif op == TOOLS:
                        # One after another, as execute_all runs them: each tool's events
                        # frame its own run.
                        toolbox, requests, memory_id, context, observer = argument
                        value = []
                        for request in requests:
                            yield ToolCallStarted(request)
                            # (Entered and left between two yields: the reader's context
                            # is this generator's only while it asks for the next event.)
                            entered = _entered(conversation)
                            try:
                                execution = toolbox.execute(request, memory_id, context, observer)
                            finally:
                                leave(entered)
                            value.append(execution)
                            yield ToolCallFinished(execution)
                    elif op == SAY:
                        yield TextDelta(argument)
                        value = None
                    else:
                        value = _perform(op, argument, conversation)
                except Exception as raised:
                    error = raised
        except StopIteration as stop:
            completed = True  # recorded and reported: closing from here on is no failure
            box.result = stop.value
            # Free before the last events: a consumer that calls on the conversation when
            # it sees TurnCompleted must not wait for the stream to be asked once more.
            if conversation is not None:
                conversation.lock.release()
                conversation = None
            yield TurnCompleted(stop.value)
    except BaseException as error:
        # An early close (GeneratorExit) or a cancellation ends the call too.
        if not completed:
            failed(state, call, error)
        raise
    finally:
        if conversation is not None:
            conversation.lock.release()


_Stream = TypeVar("_Stream", Generator[StreamEvent, None, None], AsyncGenerator[StreamEvent, None])


def _opened(call: Call, stream: _Stream) -> _Stream:
    """``stream``, noted by the scope whose conversation it uses (closed when it ends)."""
    if call.scope is not None:
        call.scope.opened(stream, call)
    return stream


def _hold(state: ServiceState, call: Call) -> Conversation | None:
    conversation = call.conversation
    if conversation is None and call.key is None:
        return None  # stateless
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
        conversation.turns += 1  # type: ignore[union-attr]
        _observe(conversation, request, response)  # type: ignore[arg-type]
        return None
    if op == SAY:
        return None  # only a stream has a reader to hand it to
    if op == END:
        conversations, key, how = argument
        if how == "forget":
            erase(conversation.memory)  # type: ignore[union-attr]
        conversations.drop_held(conversation, key, forgotten=how == "forget")
        return None
    # What is left runs the caller's code (tools, guardrails, retrievers) inside the turn.
    entered = _entered(conversation)
    try:
        if op in (CALL, FETCH):
            function, call_args = argument
            value = _called(function, call_args, fetch=op == FETCH)
            if inspect.isawaitable(value) or _is_async_iterator(value):
                if inspect.iscoroutine(value):
                    value.close()
                what = "an awaitable" if inspect.isawaitable(value) else "an async iterator"
                raise TypeError(
                    f"{getattr(function, '__qualname__', function)!r} returned {what} in a "
                    "sync call; give async guardrails and retrievers to async methods"
                )
            return value
        toolbox, requests, memory_id, context, observer = argument
        return toolbox.execute_all(requests, memory_id, context, observer)
    finally:
        leave(entered)


def _streamed(model: ChatModel, request: ChatRequest) -> Generator[TextDelta, None, ChatResponse]:
    """Forward the answer's text deltas; return the final response."""
    stream = getattr(model, "stream", None)
    if stream is None:
        response = model.chat(request)
        if response.ai_message.text:
            yield TextDelta(response.ai_message.text)
        return response
    final: ChatResponse | None = None
    for piece in stream(request):
        if isinstance(piece, ChatResponse):
            final = piece
        elif piece:
            yield TextDelta(piece)
    return _final(model, final, "stream")


# -- awaiting -------------------------------------------------------------------------


async def run_async(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """Run a call on the running event loop; blocking I/O goes to worker threads."""
    call = bind(state, plan, args)
    conversation = await _ahold(state, call)
    try:
        model = state.model or state.chat_model()
        running = turn(state, call)
        send, throw = running.send, running.throw
        value: Any = None
        error: Exception | None = None
        try:
            while True:
                op, argument = send(value) if error is None else throw(error)
                error = None
                try:
                    if op == MODEL:
                        value = await _achat(model, argument)
                    else:
                        value = await _aperform(op, argument, conversation)
                except Exception as raised:  # the turn decides what an error means
                    error = raised
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
    box = ResultBox()
    events = _opened(call, _amarked(call, _aevents(state, call, box)))
    return AsyncTextStream(_atexts(events), box, partial(_dropped, call), partial(_stop, call))


def events_async(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> AsyncEventStream:
    """Start an async call that streams its events: bind now, run when the first is awaited."""
    call = bind(state, plan, args)
    box = ResultBox()
    events = _opened(call, _amarked(call, _aevents(state, call, box)))
    return AsyncEventStream(events, box, partial(_dropped, call), partial(_stop, call))


def _stop(call: Call) -> None:
    """Closed while another task or thread reads it, the stream ends at its next event."""
    call.closed_elsewhere = True


def _dropped(call: Call) -> None:
    """The stream was dropped unfinished: its reader no longer runs inside its turn (a call
    it makes now waits for the turn, which the event loop closes, instead of being refused)."""
    leave(call.mark)


async def _atexts(events: AsyncGenerator[StreamEvent, None]) -> AsyncGenerator[str, None]:
    try:
        async for event in events:
            if type(event) is TextDelta:
                yield event.text
    finally:
        await events.aclose()


async def _amarked(
    call: Call, events: AsyncGenerator[StreamEvent, None]
) -> AsyncGenerator[StreamEvent, None]:
    """`_marked` for async streams."""
    try:
        async for event in events:
            if call.closed_elsewhere:
                # Closed while read elsewhere (by its scope, or another task or thread): it ends
                # at its next event, unrecorded.
                return
            entered = None if type(event) is TurnCompleted else _entered(call.conversation)
            call.mark = entered
            try:
                yield event
            finally:
                call.mark = None
                leave(entered)
            if call.closed_elsewhere:
                return
    finally:
        await events.aclose()


async def _aevents(
    state: ServiceState, call: Call, box: ResultBox
) -> AsyncGenerator[StreamEvent, None]:
    if call.scope is not None:
        import asyncio

        call.loop = asyncio.get_running_loop()
    conversation = await _ahold(state, call)
    completed = False
    try:
        model = state.model or state.chat_model()
        astream = getattr(model, "astream", None)
        running = turn(state, call)
        send, throw = running.send, running.throw
        value: Any = None
        error: Exception | None = None
        try:
            while True:
                op, argument = send(value) if error is None else throw(error)
                error = None
                try:
                    if op == SAY:
                        yield TextDelta(argument)
                        value = None
                    elif op not in (MODEL, TOOLS):
                        value = await _aperform(op, argument, conversation)
                    elif op == TOOLS:
                        for request in argument[1]:
                            yield ToolCallStarted(request)
                        value = await _aperform(op, argument, conversation)
                        for execution in value:
                            yield ToolCallFinished(execution)
                    elif astream is None:
                        value = await _achat(model, argument)
                        if value.ai_message.text:
                            yield TextDelta(value.ai_message.text)
                    else:
                        value = None
                        pieces = astream(argument)
                        try:
                            async for piece in pieces:
                                if isinstance(piece, ChatResponse):
                                    value = piece
                                elif piece:
                                    yield TextDelta(piece)
                        finally:
                            # Closed now, not when the loop finalises it: a provider's
                            # stream holds its HTTP response open until then.
                            aclose = getattr(pieces, "aclose", None)
                            if aclose is not None:
                                await aclose()
                        value = _final(model, value, "astream")
                except Exception as raised:
                    error = raised
        except StopIteration as stop:
            completed = True
            box.result = stop.value
            if conversation is not None:
                conversation.lock.release()
                conversation = None
            yield TurnCompleted(stop.value)
    except BaseException as error:
        if not completed:
            failed(state, call, error)
        raise
    finally:
        if conversation is not None:
            conversation.lock.release()


async def _ahold(state: ServiceState, call: Call) -> Conversation | None:
    conversation = call.conversation
    if conversation is None and call.key is None:
        return None  # stateless
    conversation = await state.conversations.ahold(conversation, call.memory_id, call.key)
    call.conversation = conversation
    return conversation


async def _aperform(op: int, argument: Any, conversation: Conversation | None) -> Any:
    """Perform a turn's memory or tool operation without blocking the event loop.

    A memory whose store does no I/O (``is_blocking = False``) is used directly, unless a
    task of this loop has it or waits for it (its async method then waits in turn).
    """
    if op == READ:
        memory: Any = conversation.memory  # type: ignore[union-attr]
        if not conversation.blocking:  # type: ignore[union-attr]
            try:
                return memory.messages()
            except LoopBlocked:
                pass  # a task of this loop has the memory, or is queued for it: await it
        return await _amemory(memory, "amessages", memory.messages)
    if op == COMMIT:
        messages, request, response = argument
        memory = conversation.memory  # type: ignore[union-attr]
        if conversation.blocking:  # type: ignore[union-attr]
            await settled(_amemory(memory, "aadd", memory.add, *messages))
        else:
            try:
                memory.add(*messages)
            except LoopBlocked:  # (raised before the add began, as for a read)
                await settled(_amemory(memory, "aadd", memory.add, *messages))
        conversation.turns += 1  # type: ignore[union-attr]
        _observe(conversation, request, response)  # type: ignore[arg-type]
        return None
    if op == SAY:
        return None
    if op == END:
        conversations, key, how = argument
        if how == "forget":
            await aerase(conversation)  # type: ignore[arg-type]
        conversations.drop_held(conversation, key, forgotten=how == "forget")
        return None
    entered = _entered(conversation)
    try:
        if op == CALL:
            function, call_args = argument
            value = _called(function, call_args, fetch=False)
            return (await value) if inspect.isawaitable(value) else value
        if op == FETCH:
            function, call_args = argument
            if is_async(function):
                value = function(*call_args)
            else:
                try:
                    value = await in_thread(_called, function, call_args, fetch=True)
                except Stopped as stopped:
                    raise RuntimeError(
                        f"{getattr(function, '__qualname__', function)!r} raised StopIteration"
                    ) from stopped.stop
            if inspect.isawaitable(value):
                return await value
            if _is_async_iterator(value):
                # (An async generator: read on the event loop, where its awaits run.)
                return [item async for item in value]
            return value
        toolbox, requests, memory_id, context, observer = argument
        return await toolbox.aexecute_all(requests, memory_id, context, observer)
    finally:
        leave(entered)


def _is_async_iterator(value: object) -> bool:
    return hasattr(type(value), "__anext__")


def _called(function: Callable[..., Any], args: tuple[Any, ...], *, fetch: bool) -> Any:
    """``function(*args)``: a guardrail's, a retriever's or a seed's. What a fetch gives as
    an iterator (a generator) is read here, where its body then runs: in the worker thread
    of an async call, not on its event loop."""
    try:
        value = function(*args)
        return list(value) if fetch and isinstance(value, Iterator) else value
    except StopIteration as stop:
        # Raised into the turn's generator, it would become "generator raised StopIteration".
        raise RuntimeError(
            f"{getattr(function, '__qualname__', function)!r} raised StopIteration"
        ) from stop


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
    return in_thread(blocking, *args)


# -- shared by the drivers --------------------------------------------------------------


def _entered(conversation: Conversation | None) -> Entered | None:
    """Mark the caller's code run from here (a tool, a guardrail) as inside the turn holding
    ``conversation``, so that a call back into it is refused instead of waiting forever."""
    return None if conversation is None else enter(conversation.lock)


def _observe(conversation: Conversation, request: ChatRequest, response: ChatResponse) -> None:
    # A memory that counts tokens may calibrate its estimate with what the provider counted
    # for the last request of the turn.
    if response.token_usage is not None and conversation.observe is not None:
        try:
            conversation.observe(request.messages, response.token_usage, request=request)
        except Exception:
            # The turn is recorded: a call that raised now would say it was not.
            logger.warning(
                "%s.observe_usage raised after the turn was recorded; the call goes on",
                type(conversation.memory).__name__,
                exc_info=True,
            )


def _final(model: ChatModel, response: ChatResponse | None, method: str) -> ChatResponse:
    if response is None:
        raise RuntimeError(
            f"{type(model).__name__}.{method}() ended without its final ChatResponse; a stream "
            "yields text deltas (str) and then one ChatResponse"
        )
    return response
