"""The one loop behind every service call: memory -> render -> model -> tools -> parse -> commit.

The turn itself is a generator that yields the I/O it needs (read the memory, call the
model, run tools, commit) and never does any; ``run_sync`` and ``run_async`` perform that
I/O the blocking or the awaiting way. One loop, two drivers, no rule written twice.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from pydantic_core import to_json

from ._hooks import Hooks, emit, logger
from ._locks import TurnLock
from ._result import Result
from ._templates import render_value
from ._toolbox import Toolbox
from .errors import OutputParseError, ToolLimitError
from .memory import ChatMemory
from .memory._base import ChatMemoryProvider
from .messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
    _trusted,
    new_message_id,
)
from .models import (
    ChatModel,
    ChatRequest,
    ChatRequestParameters,
    ChatResponse,
    ResponseFormat,
    TokenUsage,
)
from .observability import CallInfo

if TYPE_CHECKING:
    from ._plan import MethodPlan
    from .tools import ToolExecution

__all__ = ["Conversation", "ServiceState", "run_async", "run_plain", "run_sync"]

DEFAULT_MEMORY_ID: Final = "default"

# Operations a turn yields to its driver.
_READ: Final = 0
_MODEL: Final = 1
_TOOLS: Final = 2
_COMMIT: Final = 3

_now = datetime.now


class Conversation:
    """A cached memory with the lock that serialises its turns.

    ``retired`` is set, with the lock held, when the cache drops the conversation: a caller
    that looked it up just before then finds the flag once it holds the lock, and looks
    the memory id up again instead of running beside the conversation's successor.
    """

    __slots__ = ("add_turn", "lock", "memory", "retired")

    def __init__(self, memory: ChatMemory) -> None:
        self.memory = memory
        self.lock = TurnLock()
        self.retired = False
        # A memory of ours takes a plain turn (a user message and an answer without tool
        # requests, both with new ids) without checking what the runner vouches for.
        self.add_turn: Callable[[UserMessage, AiMessage], None] | None = getattr(
            memory, "_add_turn", None
        )


@dataclass(slots=True)
class ServiceState:
    """What every call of one service shares."""

    model: ChatModel | None
    model_spec: str | None
    memory_provider: ChatMemoryProvider | None
    toolbox: Toolbox
    tool_provider: Callable[[Hashable, UserMessage], Iterable[object]] | None
    tool_error_handler: Callable[..., str] | None
    system_message_provider: Callable[[Hashable], str | None] | None
    max_tool_invocations: int
    max_output_retries: int
    parameters: ChatRequestParameters
    cache_size: int
    conversations: OrderedDict[Hashable, Conversation]
    table_lock: threading.Lock
    single: Conversation | None = None
    hooks: Hooks | None = None

    # -- the model -------------------------------------------------------------------

    def chat_model(self) -> ChatModel:
        model = self.model
        if model is None:
            from .models._registry import resolve_model

            with self.table_lock:
                if self.model is None:
                    assert self.model_spec is not None
                    self.model = resolve_model(self.model_spec)
                model = self.model
        return model

    # -- conversations ---------------------------------------------------------------

    def conversation(self, memory_id: Hashable, *, create: bool = True) -> Conversation | None:
        """The cached conversation for ``memory_id``, made by the provider on a miss.

        Hold it with :func:`hold` or :func:`ahold`, which look again if it was retired.
        """
        table = self.conversations
        lock = self.table_lock
        # acquire/release rather than `with`: this runs on every call.
        lock.acquire()
        try:
            entry = table.get(memory_id)
            if entry is not None:
                table.move_to_end(memory_id)
                return entry
        finally:
            lock.release()
        if not create or self.memory_provider is None:
            return None
        memory = self.memory_provider(memory_id)
        with self.table_lock:
            entry = table.get(memory_id)
            if entry is None:
                entry = table[memory_id] = Conversation(memory)
                self._trim()
            else:
                table.move_to_end(memory_id)
            return entry

    def _trim(self) -> None:
        table = self.conversations
        excess = len(table) - self.cache_size
        if excess <= 0:
            return
        # Least recently used first; a conversation in use (its lock held or awaited) stays,
        # and so does the newest, which its caller is about to take.
        for key, entry in list(table.items())[:-1]:
            if _retire(table, key, entry):
                excess -= 1
                if not excess:
                    return

    def evict(self, memory_id: Hashable) -> None:
        with self.table_lock:
            entry = self.conversations.get(memory_id)
            if entry is not None:
                _retire(self.conversations, memory_id, entry)

    def toolbox_for(self, memory_id: Hashable, user: UserMessage) -> Toolbox:
        provider = self.tool_provider
        if provider is None:
            return self.toolbox
        extra = list(provider(memory_id, user))
        if not extra:
            return self.toolbox
        dynamic = Toolbox.from_objects(extra, error_handler=self.tool_error_handler)
        return self.toolbox.merge(dynamic) if self.toolbox else dynamic


def _retire(table: OrderedDict[Hashable, Conversation], key: Hashable, entry: Conversation) -> bool:
    if not entry.lock.try_acquire():
        return False
    entry.retired = True
    del table[key]
    entry.lock.release()
    return True


def hold(state: ServiceState, call: _Call) -> Conversation:
    """Take the call's conversation lock, following the conversation if it was retired."""
    conversation = call.conversation
    assert conversation is not None
    while True:
        lock = conversation.lock
        lock.acquire()
        if not conversation.retired:
            return conversation
        lock.release()
        conversation = call.conversation = state.conversation(call.memory_id)
        assert conversation is not None


async def ahold(state: ServiceState, call: _Call) -> Conversation:
    """:func:`hold` for a task: waits without blocking the event loop."""
    conversation = call.conversation
    assert conversation is not None
    while True:
        lock = conversation.lock
        await lock.aacquire()
        if not conversation.retired:
            return conversation
        lock.release()
        conversation = call.conversation = state.conversation(call.memory_id)
        assert conversation is not None


@dataclass(slots=True)
class _Call:
    """One call's bound inputs, before any I/O."""

    plan: MethodPlan
    memory_id: Hashable | None
    conversation: Conversation | None
    system_text: str | None
    user_text: str
    user_name: str | None
    info: CallInfo | None = None


# What run_plain hands over to the general loop: the turn id, the messages so far, those to
# record, and the first request with its answer.
_FirstRound: TypeAlias = tuple[str, list[ChatMessage], list[ChatMessage], ChatRequest, ChatResponse]


def _stamp(cls: type[Any], values: dict[str, Any], turn_id: str) -> Any:
    values["message_id"] = new_message_id()
    values["turn_id"] = turn_id
    values["created_at"] = _now(UTC)
    return _trusted(cls, values)


def _recorded(message: ChatMessage, turn_id: str) -> Any:
    return _trusted(
        type(message),
        {
            **message.__dict__,
            "message_id": new_message_id(),
            "turn_id": turn_id,
            "created_at": _now(UTC),
        },
    )


def bind(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> _Call:
    """Resolve the conversation and render the prompts: all a call does before its turn."""
    memory_id: Hashable | None = None
    conversation: Conversation | None = None
    index = plan.memory_id_index
    if index is not None:
        memory_id = args[index]
        if memory_id is None:
            if not plan.memory_id_optional:
                raise ValueError(
                    f"{plan.qualname}({plan.parameters[index]}): the memory id is None; pass "
                    "an id, or declare the parameter optional (`str | None`) to start a new "
                    "conversation"
                )
            memory_id = str(uuid.uuid4())
        try:
            conversation = state.conversation(memory_id)
        except TypeError:
            if isinstance(memory_id, Hashable):
                raise
            raise TypeError(
                f"{plan.qualname}({plan.parameters[index]}): the memory id {memory_id!r} is "
                f"unhashable ({type(memory_id).__name__}); pass a str, int or UUID"
            ) from None
    elif state.single is not None:
        conversation = state.single
        memory_id = conversation.memory.id
    elif state.memory_provider is not None:
        memory_id = DEFAULT_MEMORY_ID
        conversation = state.conversation(memory_id)

    system_template, user_template = plan.system_template, plan.user_template
    values = (
        {name: args[i] for name, i in plan.variables}
        if system_template is not None or user_template is not None
        else {}
    )
    system: str | None = None
    if system_template is not None:
        system = system_template.render(values)
    elif state.system_message_provider is not None:
        system = state.system_message_provider(memory_id)
    if user_template is not None:
        text = user_template.render(values)
    else:
        assert plan.user_message_index is not None
        value = args[plan.user_message_index]
        text = value if type(value) is str else render_value(value)
    name = args[plan.user_name_index] if plan.user_name_index is not None else None
    return _Call(plan, memory_id, conversation, system, text, name)


def _request_base(
    history: list[ChatMessage], system_text: str | None, turn_id: str
) -> tuple[list[ChatMessage], SystemMessage | None]:
    """The window the model sees before this turn, and the system message to record if any.

    The model always sees the system message first, wherever the memory keeps it; a new or
    changed one replaces the old one.
    """
    try:
        position = list(map(type, history)).index(SystemMessage)  # a C-speed scan
    except ValueError:
        position = -1
    if system_text is None or (position >= 0 and history[position].text == system_text):
        if position <= 0:
            return list(history), None
        return [history[position], *history[:position], *history[position + 1 :]], None
    system = _stamp(SystemMessage, {"type": "system", "text": system_text}, turn_id)
    if position < 0:
        return [system, *history], system
    return [system, *history[:position], *history[position + 1 :]], system


def _feedback(error: ValueError, response_format: ResponseFormat | None) -> UserMessage:
    # Models without native structured output learn the expected shape from this message.
    if response_format is None:
        return UserMessage(str(error))
    return UserMessage(f"{error}\nThe JSON schema: {to_json(response_format.schema).decode()}")


def _turn(
    state: ServiceState, call: _Call, first: _FirstRound | None = None
) -> Generator[tuple[int, Any], Any, Any]:
    """One turn; yields (operation, argument) pairs to its driver and returns the answer.

    ``first`` is a first model round that :func:`run_plain` already made for a service
    without listeners: the turn goes on from its answer.
    """
    plan = call.plan
    output = plan.output
    hooks = state.hooks
    info: CallInfo | None = None
    pending: ChatResponse | None = None
    if first is None:
        turn_id = new_message_id()
        if hooks is not None:
            info = call.info = CallInfo(
                plan.qualname, call.memory_id, turn_id, getattr(state.model, "model_name", None)
            )
            emit(hooks.on_call_start, info)
        history: list[ChatMessage] = (yield _READ, None) if call.conversation is not None else []
        messages, recorded, user = _open_turn(call, history, turn_id)
    else:
        turn_id, messages, recorded, first_request, pending = first
        user = recorded[-1]  # type: ignore[assignment]

    toolbox = state.toolbox_for(call.memory_id, user) if state.tool_provider else state.toolbox
    specifications = toolbox.specifications
    response_format = output.response_format
    parameters = state.parameters
    usage: TokenUsage | None = None
    executions: list[ToolExecution] = []
    tool_rounds = 0
    retries = 0
    scratch: list[ChatMessage] = []
    while True:
        response: ChatResponse
        if pending is not None:
            request, response, pending = first_request, pending, None
        else:
            request = ChatRequest(
                # a snapshot: the turn goes on appending to `messages` after the request
                messages + scratch if scratch else messages.copy(),
                specifications,
                response_format,
                parameters,
            )
            if info is not None:
                emit(hooks.on_request, info, request)  # type: ignore[union-attr]
            response = yield _MODEL, request
            if info is not None:
                emit(hooks.on_response, info, request, response)  # type: ignore[union-attr]
        if response.token_usage is not None:
            usage = response.token_usage if usage is None else usage + response.token_usage
        ai = _recorded(response.ai_message, turn_id)
        requests: list[ToolExecutionRequest] = ai.tool_execution_requests
        if requests:
            if tool_rounds >= state.max_tool_invocations:
                raise ToolLimitError(
                    f"{plan.qualname}: the model asked for tools again after "
                    f"{tool_rounds} tool round(s); max_tool_invocations="
                    f"{state.max_tool_invocations}. Raise the limit or check the tools' answers",
                    limit=state.max_tool_invocations,
                )
            tool_rounds += 1
            scratch = []
            messages.append(ai)
            recorded.append(ai)
            if info is not None:
                for tool_request in requests:
                    emit(hooks.on_tool_start, info, tool_request)  # type: ignore[union-attr]
            results: list[ToolExecution] = yield _TOOLS, (toolbox, requests, call.memory_id)
            if info is not None:
                for execution in results:
                    emit(hooks.on_tool_end, info, execution)  # type: ignore[union-attr]
            for execution in results:
                result = _stamp(
                    ToolExecutionResultMessage,
                    {
                        "type": "tool_result",
                        "id": execution.request.id,
                        "tool_name": execution.request.name,
                        "text": execution.result,
                    },
                    turn_id,
                )
                messages.append(result)
                recorded.append(result)
            executions.extend(results)
            if results and all(e.return_direct for e in results):
                value = _direct_value(plan, results)
                yield _COMMIT, (recorded, request, response)
                return _finish(state, call, value, usage, response, executions, None, tool_rounds)
            continue
        if output.returns_ai_message:
            value = ai
        else:
            try:
                value = output.parse(ai.text)
            except ValueError as error:
                if retries >= state.max_output_retries:
                    raise OutputParseError(
                        f"{plan.qualname}: the answer could not be parsed as "
                        f"{_type_name(output.annotation)} after {retries + 1} attempt(s): {error}",
                        raw_text=ai.text,
                        attempts=retries + 1,
                    ) from error
                retries += 1
                scratch = [ai, _feedback(error, response_format)]
                continue
        recorded.append(ai)
        yield _COMMIT, (recorded, request, response)
        return _finish(state, call, value, usage, response, executions, ai, tool_rounds)


def _open_turn(
    call: _Call, history: list[ChatMessage], turn_id: str
) -> tuple[list[ChatMessage], list[ChatMessage], UserMessage]:
    """What the model is sent first (the window, then the user message), what the turn
    records so far, and the user message."""
    if call.system_text is None and SystemMessage not in map(type, history):
        user = _user_message(call, turn_id)  # the usual case, without a scan in Python
        return [*history, user], [user], user
    # A new system message is stamped before the user message, as it is recorded.
    messages, system = _request_base(history, call.system_text, turn_id)
    user = _user_message(call, turn_id)
    messages.append(user)
    return messages, [user] if system is None else [system, user], user


def _user_message(call: _Call, turn_id: str) -> UserMessage:
    return _trusted(
        UserMessage,
        {
            "type": "user",
            "text": call.user_text,
            "name": call.user_name,
            "message_id": new_message_id(),
            "turn_id": turn_id,
            "created_at": _now(UTC),
        },
    )


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def _direct_value(plan: MethodPlan, results: list[ToolExecution]) -> Any:
    if plan.output.returns_ai_message:
        return AiMessage("\n".join(r.result for r in results))
    if len(results) == 1 and plan.output.response_format is not None:
        return plan.output.parse(results[0].result)
    return plan.output.parse("\n".join(r.result for r in results))


def _finish(  # noqa: PLR0917 - private, called from two places in the turn
    state: ServiceState,
    call: _Call,
    value: Any,
    usage: TokenUsage | None,
    response: ChatResponse,
    executions: list[ToolExecution],
    ai: AiMessage | None,
    tool_rounds: int,
) -> Any:
    plan = call.plan
    info = call.info
    result: Result[Any] | None = None
    if plan.wraps_result or info is not None:
        result = Result(value, usage, response.finish_reason, tuple(executions), call.memory_id, ai)
        if info is not None and state.hooks is not None:
            emit(state.hooks.on_call_end, info, result)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s memory_id=%r tool_rounds=%d tool_executions=%d token_usage=%s finish=%s",
            plan.qualname,
            call.memory_id,
            tool_rounds,
            len(executions),
            usage,
            response.finish_reason,
        )
    return result if plan.wraps_result else value


def failed(state: ServiceState, call: _Call, error: BaseException) -> None:
    """Report a call that raised to the listeners and the debug log."""
    if call.info is not None and state.hooks is not None:
        emit(state.hooks.on_error, call.info, error)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s memory_id=%r failed: %s",
            call.plan.qualname,
            call.memory_id,
            type(error).__name__,
        )


# -- drivers -------------------------------------------------------------------------


def run_sync(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """Run a call on the calling thread."""
    call = bind(state, plan, args)
    if call.conversation is None:
        return _drive(state, call, None)
    conversation = hold(state, call)
    try:
        return _drive(state, call, conversation.memory)
    finally:
        conversation.lock.release()


def _drive(state: ServiceState, call: _Call, memory: ChatMemory | None) -> Any:
    try:
        return _go_on(_turn(state, call), state.model or state.chat_model(), memory)
    except BaseException as error:
        # Cancellation and interrupts too: listeners must see every call end.
        failed(state, call, error)
        raise


def _go_on(
    turn: Generator[tuple[int, Any], Any, Any], model: ChatModel, memory: ChatMemory | None
) -> Any:
    """Drive ``turn`` to its end on the calling thread; return its answer."""
    send = turn.send
    value: Any = None
    try:
        while True:
            op, argument = send(value)
            value = model.chat(argument) if op == _MODEL else do_io(op, argument, memory)
    except StopIteration as stop:
        return stop.value


def run_plain(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """:func:`run_sync` for a service without listeners or tools, the usual turn written out.

    The turn is the general one's first round; an answer that asks for tools or does not
    parse hands the turn over to the general loop, which goes on from there.
    """
    call = bind(state, plan, args)
    conversation = call.conversation
    memory: ChatMemory | None = None
    if conversation is not None:
        conversation = hold(state, call)
        memory = conversation.memory
    try:
        output = plan.output
        turn_id = new_message_id()
        history: list[ChatMessage] = memory.messages() if memory is not None else []
        messages, recorded, user = _open_turn(call, history, turn_id)
        model = state.model or state.chat_model()
        request = ChatRequest(
            messages, state.toolbox.specifications, output.response_format, state.parameters
        )
        response = model.chat(request)
        answer = response.ai_message
        if not answer.tool_execution_requests:
            try:
                value = None if output.returns_ai_message else output.parse(answer.text)
            except ValueError:
                pass  # the general loop asks again, with the error
            else:
                ai = _recorded(answer, turn_id)
                recorded.append(ai)
                if memory is not None:
                    add_turn = conversation.add_turn  # type: ignore[union-attr]
                    if add_turn is not None and len(recorded) == 2:
                        add_turn(user, ai)
                    else:
                        memory.add(*recorded)
                    _observe(memory, request, response)
                if output.returns_ai_message:
                    value = ai
                return _finish(state, call, value, response.token_usage, response, [], ai, 0)
        first = (turn_id, messages.copy(), recorded, request, response)
        return _go_on(_turn(state, call, first), model, memory)
    except BaseException as error:
        failed(state, call, error)
        raise
    finally:
        if conversation is not None:
            conversation.lock.release()


def do_io(op: int, argument: Any, memory: ChatMemory | None) -> Any:
    """Perform a turn's memory or tool operation, the blocking way."""
    if op == _READ:
        assert memory is not None
        return memory.messages()
    if op == _TOOLS:
        toolbox, requests, memory_id = argument
        return toolbox.execute_all(requests, memory_id)
    if memory is not None:
        _commit(memory, argument)
    return None


async def ado_io(op: int, argument: Any, memory: ChatMemory | None) -> Any:
    """Perform a turn's memory or tool operation without blocking the event loop."""
    if op == _READ:
        assert memory is not None
        return await _amemory(memory, "amessages", memory.messages)
    if op == _TOOLS:
        toolbox, requests, memory_id = argument
        return await toolbox.aexecute_all(requests, memory_id)
    if memory is not None:
        await _acommit(memory, argument)
    return None


def _commit(memory: ChatMemory, argument: tuple[list[ChatMessage], ChatRequest, Any]) -> None:
    messages, request, response = argument
    memory.add(*messages)
    _observe(memory, request, response)


def _observe(memory: ChatMemory, request: ChatRequest, response: ChatResponse) -> None:
    # A memory that counts tokens may calibrate its estimate with what the provider counted
    # for the last request of the turn.
    if response.token_usage is not None:
        observe = getattr(memory, "observe_usage", None)
        if observe is not None:
            observe(request.messages, response.token_usage)


async def run_async(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Any:
    """Run a call on the running event loop; blocking I/O goes to worker threads."""
    call = bind(state, plan, args)
    if call.conversation is None:
        return await _adrive(state, call, None)
    conversation = await ahold(state, call)
    try:
        return await _adrive(state, call, conversation.memory)
    finally:
        conversation.lock.release()


async def _adrive(state: ServiceState, call: _Call, memory: ChatMemory | None) -> Any:
    import asyncio

    model = state.model or state.chat_model()
    achat = getattr(model, "achat", None)
    turn = _turn(state, call)
    send = turn.send
    value: Any = None
    try:
        while True:
            op, argument = send(value)
            if op == _MODEL:
                if achat is not None:
                    value = await achat(argument)
                else:
                    value = await asyncio.to_thread(model.chat, argument)
            else:
                value = await ado_io(op, argument, memory)
    except StopIteration as stop:
        return stop.value
    except BaseException as error:
        # Cancellation and interrupts too: listeners must see every call end.
        failed(state, call, error)
        raise


async def _acommit(
    memory: ChatMemory, argument: tuple[list[ChatMessage], ChatRequest, Any]
) -> None:
    messages, request, response = argument
    await _amemory(memory, "aadd", memory.add, *messages)
    _observe(memory, request, response)


async def _amemory(memory: ChatMemory, name: str, blocking: Callable[..., Any], *args: Any) -> Any:
    import asyncio

    native = getattr(memory, name, None)
    if native is not None:
        return await native(*args)
    return await asyncio.to_thread(blocking, *args)
