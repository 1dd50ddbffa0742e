"""One turn of a service call, written once: memory -> render -> model -> tools -> parse -> commit.

`bind` turns a call's arguments into a `Call`. `turn` is the whole turn
as a generator that does no I/O: it yields each operation it needs (``READ`` the memory,
ask the ``MODEL``, run ``TOOLS``, ``COMMIT`` the turn) to a driver in ``_runner`` and is
sent the outcome. Every rule lives here: opening the turn, where the system message goes,
stamping, tool rounds and their limit, direct-return tools, parse-and-retry, what is
recorded and in which order, and the call's result. A driver only performs the I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import uuid
from collections.abc import Callable, Generator, Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from pydantic_core import to_json

from ._conversations import Conversation, Conversations, key_of
from ._hooks import Hooks, emit, logger
from ._result import Result
from ._templates import render_value
from ._toolbox import Toolbox
from .errors import (
    GuardrailError,
    IncompleteResponseError,
    OutputParseError,
    Reprompt,
    ToolLimitError,
)
from .memory._base import DEFAULT_MEMORY_ID
from .messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
    new_message_id,
    unchecked_message,
)
from .models import ChatModel, ChatRequest, ChatRequestParameters, ChatResponse, ResponseFormat
from .observability import CallInfo, ConversationStats
from .scopes import MemoryScope, current_scope

if TYPE_CHECKING:
    from ._locks import Entered
    from ._plan import MethodPlan
    from .models import TokenUsage
    from .tools import ToolExecution

__all__ = [
    "CALL",
    "COMMIT",
    "END",
    "FETCH",
    "MODEL",
    "READ",
    "TOOLS",
    "Call",
    "ServiceState",
    "Turn",
    "bind",
    "failed",
    "turn",
]

# The operations a turn yields, each with its argument; the driver sends back the outcome.
READ: Final = 0  # None -> the memory's messages
MODEL: Final = 1  # ChatRequest -> ChatResponse
TOOLS: Final = 2  # (Toolbox, requests, memory id, context) -> list[ToolExecution]
COMMIT: Final = 3  # (messages to record, last request, last response) -> None
CALL: Final = 4  # (function, args) -> what it returns, awaited in async calls
# As CALL, for a function that may wait on I/O (a retriever, a seed, the tool provider's
# toolbox): in async calls, a plain one runs in a worker thread.
FETCH: Final = 5
# (conversations, key, "forget" or "evict") -> None: end the held conversation as a scope
# that ended meanwhile did.
END: Final = 6
# The text of direct-return tools, which no model round streamed -> None: a stream hands it
# to its reader before the turn is recorded, so that a reader who stops there records nothing.
SAY: Final = 7

Turn: TypeAlias = Generator[tuple[int, Any], Any, Any]

_now = datetime.now

# Finish reasons after which an unparsable answer is not sent back to be corrected.
_NOT_ASKED_AGAIN: Final = {
    "length": "it was cut at the output token limit (finish_reason='length'); raise "
    "max_output_tokens in the service's parameters, or ask for less",
    "content_filter": "the model refused, or its answer was filtered "
    "(finish_reason='content_filter')",
}


@dataclass(slots=True)
class ServiceState:
    """What every call of one service shares."""

    model: ChatModel | None
    model_spec: str | None
    conversations: Conversations
    single: Conversation | None
    toolbox: Toolbox
    tool_provider: Callable[[Hashable, UserMessage], Iterable[object]] | None
    tool_error_handler: Callable[..., str] | None
    system_message_provider: Callable[[Hashable], str | None] | None
    max_tool_invocations: int
    max_output_retries: int
    parameters: ChatRequestParameters
    hooks: Hooks | None = None
    name: str = ""
    # Whether the providers declare a `context` keyword, to be given the call's context.
    system_provider_takes_context: bool = False
    tool_provider_takes_context: bool = False
    retriever: Callable[..., Any] | None = None
    seed_memory: Callable[[Hashable], Sequence[ChatMessage]] | None = None
    request_transformer: Callable[[ChatRequest, Hashable], ChatRequest] | None = None
    model_lock: threading.Lock = field(default_factory=threading.Lock)
    # The cache key of the service's own memory's id (chat_memory=): that id's conversation
    # is that memory for every method, so that one id is one conversation.
    single_key: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.single is not None:
            self.single_key = key_of(self.single.memory.id)

    def chat_model(self) -> ChatModel:
        """The model, resolved from its ``"provider:name"`` spec at first use."""
        model = self.model
        if model is None:
            from .models._registry import resolve_model

            with self.model_lock:
                if self.model is None:
                    assert self.model_spec is not None
                    self.model = resolve_model(self.model_spec)
                model = self.model
        return model

    # -- the conversations, as ChatMemoryAccess and scopes reach them ------------------

    def conversation_of(self, memory_id: Hashable) -> tuple[Conversation, str | None]:
        """The conversation kept for ``memory_id`` (made on a miss) and its cache key."""
        conversations = self.conversations
        key = key_of(memory_id)
        if key == self.single_key or not conversations.has_provider:
            return self._single(memory_id, key), None
        return conversations.get(memory_id, key), key

    async def aconversation_of(self, memory_id: Hashable) -> tuple[Conversation, str | None]:
        """`conversation_of` without blocking the event loop on a provider."""
        conversations = self.conversations
        key = key_of(memory_id)
        if key == self.single_key or not conversations.has_provider:
            return self._single(memory_id, key), None
        return await conversations.aget(memory_id, key), key

    def _single(self, memory_id: Hashable, key: str) -> Conversation:
        single = self.single
        if single is None or key != self.single_key:
            raise LookupError(
                f"this service has no chat_memory_provider, so no memory for {memory_id!r}"
            )
        return single

    def stats(self) -> ConversationStats:
        """The service's conversation counts so far."""
        extra = () if self.single is None else (self.single,)
        return ConversationStats(*self.conversations.counts(*extra))

    def evict(self, memory_id: Hashable) -> None:
        """Drop the cached memory of ``memory_id``; the stored conversation stays."""
        if self.conversations.has_provider:
            self.conversations.evict(key_of(memory_id))

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation of ``memory_id``: memory, stored messages, history."""
        conversation, key = self.conversation_of(memory_id)
        self.conversations.forget(conversation, memory_id, key)

    async def aforget(self, memory_id: Hashable) -> None:
        """`forget` without blocking the event loop."""
        conversation, key = await self.aconversation_of(memory_id)
        await self.conversations.aforget(conversation, memory_id, key)

    def toolbox_for(self, memory_id: Hashable, user: UserMessage, context: object) -> Toolbox:
        """The service's tools, with those the tool provider adds for this call."""
        provider = self.tool_provider
        if provider is None:
            return self.toolbox
        if self.tool_provider_takes_context:
            given = provider(memory_id, user, context=context)  # type: ignore[call-arg]
        else:
            given = provider(memory_id, user)
        if given is None:  # no tools for this call
            return self.toolbox
        if not isinstance(given, Iterable) or isinstance(given, str | bytes | Mapping):
            raise TypeError(
                f"tool_provider returned {type(given).__name__} for the memory id "
                f"{memory_id!r}; it must return the call's extra tools (a list, empty or None "
                "for none)"
            )
        extra = list(given)
        if not extra:
            return self.toolbox
        dynamic = Toolbox.from_objects(extra, error_handler=self.tool_error_handler)
        return self.toolbox.merge(dynamic) if self.toolbox else dynamic


@dataclass(slots=True)
class Call:
    """One call's bound inputs, before any I/O.

    ``key`` is the memory id's cache key, ``None`` for a stateless call or a service's own
    memory; ``conversation`` is the cached one (``None`` before a driver makes it: a
    provider may block, and only the driver knows how to wait).
    """

    plan: MethodPlan
    memory_id: Hashable | None
    key: str | None
    conversation: Conversation | None
    system_text: str | None
    user_text: str
    user_name: str | None
    context: object = None
    scope: MemoryScope | None = None  # the scope whose conversation the call uses
    # The event loop an async stream in a scope runs on, once it started (its scope's exit
    # closes it there).
    loop: object = None
    info: CallInfo | None = None
    # Set for a stream closed while another task or thread was reading it (by its scope's
    # exit, or by close()/aclose()): a generator can't be closed while it runs, so it stops
    # at its next event instead.
    closed_elsewhere: bool = False
    # The mark an async stream's reader holds between two events (see `_locks.enter`).
    mark: Entered | None = None


def bind(state: ServiceState, plan: MethodPlan, args: tuple[Any, ...]) -> Call:
    """Find the conversation and render the prompts: all a call does before its turn."""
    memory_id: Hashable | None = None
    key: str | None = None
    conversation: Conversation | None = None
    scope: MemoryScope | None = None
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
            # The new id is the parameter's value from here on: templates show it too.
            args = (*args[:index], memory_id, *args[index + 1 :])
        try:
            key = key_of(memory_id)
        except TypeError as error:
            if _hashable(memory_id):  # an id with no text of its own: the error says so
                raise TypeError(f"{plan.qualname}({plan.parameters[index]}): {error}") from None
            raise TypeError(
                f"{plan.qualname}({plan.parameters[index]}): the memory id {memory_id!r} is "
                f"unhashable ({type(memory_id).__name__}); pass a str, int or UUID"
            ) from None
        conversation = state.conversations.cached(key)
        if conversation is None and key == state.single_key:
            conversation = state.single
    elif state.single is not None:
        conversation = state.single
        memory_id = conversation.memory.id
    elif state.conversations.has_provider:
        scope = current_scope()
        if scope is None:
            memory_id = key = DEFAULT_MEMORY_ID
        else:
            memory_id = scope.memory_id
            key = key_of(memory_id)
            scope.used_by(state)
        conversation = state.conversations.cached(key)

    system_template, user_template = plan.system_template, plan.user_template
    values = (
        {name: args[i] for name, i in plan.variables}
        if system_template is not None or user_template is not None
        else {}
    )
    context = args[plan.context_index] if plan.context_index is not None else None
    system: str | None = None
    if system_template is not None:
        system = system_template.render(values) or None  # (empty: none for this method)
    elif state.system_message_provider is not None:
        if state.system_provider_takes_context:
            system = state.system_message_provider(memory_id, context=context)  # type: ignore[call-arg]
        else:
            system = state.system_message_provider(memory_id)
        if system is not None and not isinstance(system, str):
            raise TypeError(
                f"system_message_provider {_name(state.system_message_provider)} returned "
                f"{type(system).__name__} for memory id {memory_id!r}; it returns the system "
                "message's text (a str), or None for none"
            )
        system = system or None  # empty, as a template that renders empty: none
    if user_template is not None:
        text = user_template.render(values)
    else:
        assert plan.user_message_index is not None
        value = args[plan.user_message_index]
        text = value if type(value) is str else render_value(value)
    at = plan.user_name_index
    name = args[at] if at is not None else None
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"{plan.qualname}({plan.parameters[at or 0]}): a UserName must be a "
            f"str (or None), not {type(name).__name__}; pass str({name!r:.40}) for a numeric id"
        )
    return Call(plan, memory_id, key, conversation, system, text, name, context, scope)


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_WHOLE: Final = frozenset({"sync", "async"})  # the call kinds that answer all at once


def turn(state: ServiceState, call: Call) -> Turn:
    """The call's turn: yields ``(operation, argument)`` pairs and returns the answer.

    The operations' outcomes come back by ``send``, their exceptions by ``throw``. Input
    guardrails and the retriever run first; a turn with a conversation then reads the
    memory, and commits last, once, what it records: the system message when new or
    changed, the user message, each model round's ``AiMessage`` with its tool results, and
    the final answer. Every recorded message
    carries a new message id, the turn's id and the time it was made (the opening messages
    share one). A stateless turn stamps only the answer it returns as a message.
    """
    plan = call.plan
    output = plan.output
    hooks = state.hooks
    keep = call.conversation is not None
    # A stateless call stamps only the answer it hands to its caller (AiMessage, Result).
    if keep or output.returns_ai_message or plan.wraps_result:
        turn_id: str | None = new_message_id()
    else:
        turn_id = None
    # What the messages other than answers are stamped with: nothing when nothing is kept.
    kept_id = turn_id if keep else None
    opened_at = _now(UTC) if keep else None
    info: CallInfo | None = None
    if hooks is not None:
        info = call.info = CallInfo(
            plan.qualname,
            call.memory_id,
            turn_id or new_message_id(),
            getattr(state.model, "model_name", None),
            streamed=plan.kind not in _WHOLE,
        )
        emit(hooks.on_call_start, info)
    user_text = call.user_text
    for guardrail in plan.input_guardrails:
        try:
            replaced = yield CALL, (guardrail, (user_text,))
        except Reprompt as reprompt:
            raise TypeError(
                f"input guardrail {_name(guardrail)} raised Reprompt({reprompt.reason!r}): "
                "there is no answer yet to ask again for; an input guardrail refuses with "
                "GuardrailError, and Reprompt belongs in output guardrails"
            ) from reprompt
        if replaced is not None:
            user_text = _checked_text(replaced, guardrail)
    sources: tuple[str, ...] = ()
    if state.retriever is not None:
        found = yield FETCH, (state.retriever, (user_text, call.memory_id))
        sources = _checked_sources(found, state.retriever)
    history: list[ChatMessage] = (yield READ, None) if keep else []
    recorded: list[ChatMessage] = []
    if keep and not history and state.seed_memory is not None:
        # A new conversation starts with the seed, committed with this turn's messages.
        seed = yield FETCH, (state.seed_memory, (call.memory_id,))
        history = _seeded(seed, state.seed_memory, kept_id, opened_at)
        recorded = history.copy()  # recorded first; the window the model sees starts with it

    # The model sees the system message first, wherever the memory keeps it; a new or
    # changed one replaces the old one and is recorded before the user message.
    system_text = call.system_text
    window = history
    if system_text is not None or SystemMessage in map(type, history):
        kinds = list(map(type, history))
        position = kinds.index(SystemMessage) if SystemMessage in kinds else -1
        if position < 0:
            current, rest = None, history
        else:
            current, rest = history[position], [*history[:position], *history[position + 1 :]]
        if current is not None and (system_text is None or current.text == system_text):
            window = [current, *rest]
        else:
            system = unchecked_message(
                SystemMessage,
                {
                    "type": "system",
                    "text": system_text,
                    "message_id": kept_id and new_message_id(),
                    "turn_id": kept_id,
                    "created_at": opened_at,
                },
            )
            recorded.append(system)
            window = [system, *rest]
    user: UserMessage = unchecked_message(
        UserMessage,
        {
            "type": "user",
            "text": user_text,
            "name": call.user_name,
            "message_id": kept_id and new_message_id(),
            "turn_id": kept_id,
            "created_at": opened_at,
        },
    )
    recorded.append(user)
    # The model sees what was retrieved with the user message; the memory keeps what the
    # user said.
    # The turn as the model sees it: a list is never changed once sent. What the model is
    # told between rounds (a rejected answer and its reprompt, a parse error) stays in it,
    # so that a later round still knows every correction it was given.
    sent = [*window, _augmented(user, sources) if sources else user]

    toolbox = state.toolbox
    if state.tool_provider:
        # What a provider hands out may connect first (an MCP server's toolset lists its tools).
        toolbox = yield FETCH, (state.toolbox_for, (call.memory_id, user, call.context))
    specifications = toolbox.specifications
    response_format = output.response_format
    parameters = state.parameters
    usage: TokenUsage | None = None
    executions: list[ToolExecution] = []
    tool_rounds = 0
    retries = 0
    reprompts = 0
    transform = state.request_transformer
    while True:
        if transform is None:
            request = ChatRequest(sent, specifications, response_format, parameters)
        else:
            # Its own list: a transformer that changes it in place must not change the turn
            # the next requests are made from.
            request = _transformed(
                transform,
                ChatRequest(list(sent), specifications, response_format, parameters),
                call.memory_id,
            )
        if info is not None:
            emit(hooks.on_request, info, request)  # type: ignore[union-attr]
        response: ChatResponse = yield MODEL, request
        if info is not None:
            emit(hooks.on_response, info, request, response)  # type: ignore[union-attr]
        if response.token_usage is not None:
            usage = response.token_usage if usage is None else usage + response.token_usage
        answer = response.ai_message
        requests: list[ToolExecutionRequest] = answer.tool_execution_requests
        if requests:
            if response.finish_reason == "length":
                # Its arguments may be cut short; asking again under the same cap would cut
                # them again, round after paid round.
                raise IncompleteResponseError(
                    f"{plan.qualname}: the model's tool call was cut at the output token "
                    "limit (finish_reason='length'), so its arguments may be incomplete; "
                    "raise max_output_tokens in the service's parameters (or, when the "
                    "conversation fills the model's context, keep a smaller window)"
                )
            if tool_rounds >= state.max_tool_invocations:
                raise ToolLimitError(
                    f"{plan.qualname}: the model asked for tools again after "
                    f"{tool_rounds} tool round(s); max_tool_invocations="
                    f"{state.max_tool_invocations}. Raise the limit or check the tools' answers",
                    limit=state.max_tool_invocations,
                )
            tool_rounds += 1
            answer = _with_distinct_ids(answer, sent)
            requests = answer.tool_execution_requests
            ai = _stamped(answer, kept_id)
            # Listeners are told of each tool as it starts and as it ends, where it runs.
            observer = (
                None
                if info is None
                else (
                    functools.partial(emit, hooks.on_tool_start, info),  # type: ignore[union-attr]
                    functools.partial(emit, hooks.on_tool_end, info),  # type: ignore[union-attr]
                )
            )
            results: list[ToolExecution] = yield (
                TOOLS,
                (toolbox, requests, call.memory_id, call.context, observer),
            )
            round_messages: list[ChatMessage] = [ai]
            ran_at = _now(UTC) if keep else None
            for execution in results:
                round_messages.append(
                    unchecked_message(
                        ToolExecutionResultMessage,
                        {
                            "type": "tool_result",
                            "id": execution.request.id,
                            "tool_name": execution.request.name,
                            "text": execution.result,
                            "is_error": True if execution.error is not None else None,
                            "message_id": kept_id and new_message_id(),
                            "turn_id": kept_id,
                            "created_at": ran_at,
                        },
                    )
                )
            sent = sent + round_messages
            recorded += round_messages
            if parameters.tool_choice not in (None, "auto", "none"):
                # A choice that forces a tool holds for the first answer; asked again after
                # the tools ran, the model must be free to answer.
                parameters = dataclasses.replace(parameters, tool_choice="auto")
            executions += results
            if results and all(e.return_direct for e in results):
                value = _direct_value(plan, results)
                if value is not _NOT_ONE:
                    final: AiMessage | None = None
                    if type(value) is str and value:
                        yield SAY, value
                    break
            continue
        replacer: Callable[..., Any] | None = None  # the guardrail whose answer this is
        if plan.output_guardrails:
            try:
                checked = answer
                for guardrail in plan.output_guardrails:
                    replaced = yield CALL, (guardrail, (checked,))
                    if replaced is not None:
                        replacement = _checked_answer(replaced, guardrail)
                        # One that hands the answer on (a guardrail that only audits) or
                        # writes back what it was given replaces nothing.
                        if replacement.text != checked.text:
                            replacer = guardrail
                        checked = replacement
                if replacer is not None and checked.text == answer.text:
                    replacer = None  # changed, then changed back: the model's own words
            except Reprompt as reprompt:
                if reprompts >= state.max_output_retries:
                    raise GuardrailError(
                        reprompt.reason,
                        message=f"{plan.qualname}: the answer was still refused after "
                        f"{reprompts} reprompt(s): {reprompt.reason}",
                    ) from reprompt
                reprompts += 1
                # Asked again with the reason; neither the answer nor the reason is recorded.
                sent = [*sent, answer, UserMessage(reprompt.reason)]
                continue
            answer = checked
        if output.returns_ai_message:
            value = ai = _stamped(answer, turn_id)
        else:
            try:
                value = output.parse(answer.text)
            except ValueError as error:
                cut = response.finish_reason
                attempts = retries + reprompts + 1
                if replacer is not None:
                    # No model wrote this: asking one again cannot help.
                    why = (
                        f"the answer output guardrail {_name(replacer)} put in place could "
                        f"not be parsed as {output.type_name}: {error}"
                    )
                elif cut in _NOT_ASKED_AGAIN:
                    # Asking again cannot help: the same cap cuts the answer again, and a
                    # refusal is no answer to correct.
                    why = (
                        f"the answer could not be parsed as {output.type_name}: "
                        f"{_NOT_ASKED_AGAIN[cut]}"
                    )
                elif retries >= state.max_output_retries:
                    why = (
                        f"the answer could not be parsed as {output.type_name} after "
                        f"{attempts} attempt(s): {error}"
                    )
                else:
                    retries += 1
                    # Asked again with the error; neither the answer nor the error is recorded.
                    sent = [*sent, answer, _feedback(error, response_format)]
                    continue
                raise OutputParseError(
                    f"{plan.qualname}: {why}", raw_text=answer.text, attempts=attempts
                ) from error
            ai = _stamped(answer, turn_id)
        recorded.append(ai)
        final = ai
        break
    if keep:
        yield COMMIT, (recorded, request, response)
        scope = call.scope
        if scope is not None and scope.left and scope.on_exit != "keep":
            # The scope's block ended while this turn ran (or before it began, in a task
            # started inside): its exit found nothing of this turn to end, so the turn ends
            # its conversation as the exit did.
            yield END, (state.conversations, call.key, scope.on_exit)
    return _finish(state, call, value, usage, response, executions, final, tool_rounds, sources)


def _with_distinct_ids(answer: AiMessage, sent: list[ChatMessage]) -> AiMessage:
    """``answer`` with each tool request's id other than those of its other requests and of
    the requests already in the conversation.

    Some compatible servers give parallel calls one id, or number the calls afresh in each
    answer; providers refuse a conversation in which two calls share an id, and a result
    could not tell which call it answers.
    """
    requests = answer.tool_execution_requests
    used: set[str] = set()
    for m in sent:
        if isinstance(m, AiMessage) and m.tool_execution_requests:
            used.update([r.id for r in m.tool_execution_requests])
    if len(requests) == 1 and requests[0].id not in used:
        return answer
    distinct: list[ToolExecutionRequest] = []
    renamed = False
    for request in requests:
        kept = request
        if request.id in used:
            kept = request.model_copy(update={"id": f"{request.id}_{uuid.uuid4().hex[:8]}"})
            renamed = True
        used.add(kept.id)
        distinct.append(kept)
    return answer.model_copy(update={"tool_execution_requests": distinct}) if renamed else answer


def _stamped(answer: AiMessage, turn_id: str | None) -> AiMessage:
    """The model's answer as the turn records it, made now; the model's own object when the
    turn stamps nothing."""
    if turn_id is None:
        return answer
    return unchecked_message(
        AiMessage,
        {
            **answer.__dict__,
            "message_id": new_message_id(),
            "turn_id": turn_id,
            "created_at": _now(UTC),
        },
    )


def _augmented(user: UserMessage, sources: tuple[str, ...]) -> UserMessage:
    """The user message as the model is sent it, with what the retriever found."""
    text = f"{user.text}\n\nAnswer using the following information:\n" + "\n\n".join(sources)
    return unchecked_message(UserMessage, {**user.__dict__, "text": text})


def _seeded(
    seed: object, seed_memory: object, turn_id: str | None, at: datetime | None
) -> list[ChatMessage]:
    """The seed's messages, stamped as this turn's."""
    if isinstance(seed, (str, bytes, ChatMessage)) or not isinstance(seed, Iterable):
        raise TypeError(
            f"seed_memory {_name(seed_memory)} returned {type(seed).__name__}; it returns "
            "a sequence of chat messages ([SystemMessage(...)], say)"
        )
    messages: list[ChatMessage] = []
    for message in seed:
        if not isinstance(
            message, (SystemMessage, UserMessage, AiMessage, ToolExecutionResultMessage)
        ):
            raise TypeError(
                f"seed_memory {_name(seed_memory)} returned a {type(message).__name__} among "
                "its messages; each must be a chat message (UserMessage(...), AiMessage(...))"
            )
        messages.append(
            message.with_metadata(message_id=new_message_id(), turn_id=turn_id, created_at=at)
        )
    return messages


def _checked_text(value: object, guardrail: object) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f"input guardrail {_name(guardrail)} returned {type(value).__name__}; it returns "
            "None to let the user message pass or a str to replace its text"
        )
    return value


def _checked_answer(value: object, guardrail: object) -> AiMessage:
    if isinstance(value, str):
        return AiMessage(value)
    if not isinstance(value, AiMessage):
        raise TypeError(
            f"output guardrail {_name(guardrail)} returned {type(value).__name__}; it returns "
            "None to let the answer pass, or an AiMessage or a str to replace it"
        )
    if value.tool_execution_requests:
        # Recorded, it would be a tool call without results, which providers refuse on
        # every later request of the conversation.
        raise TypeError(
            f"output guardrail {_name(guardrail)} returned an AiMessage that asks for tools; "
            "a guardrail replaces an answer with an answer (an AiMessage with text, or a str)"
        )
    return value


def _checked_sources(found: object, retriever: object) -> tuple[str, ...]:
    if isinstance(found, (str, Mapping, AbstractSet)) or not isinstance(found, Iterable):
        # A mapping would give its keys and a set no order: neither is the texts, in order.
        raise TypeError(
            f"retriever {_name(retriever)} returned {type(found).__name__}; it returns a "
            "sequence of texts, most relevant first (list[str])"
        )
    sources = tuple(found)
    for text in sources:
        if not isinstance(text, str):
            raise TypeError(
                f"retriever {_name(retriever)} returned a {type(text).__name__} among its "
                "texts; each must be a str"
            )
    return sources


def _transformed(
    transform: Callable[[ChatRequest, Hashable], ChatRequest],
    request: ChatRequest,
    memory_id: Hashable,
) -> ChatRequest:
    changed = transform(request, memory_id)
    if not isinstance(changed, ChatRequest):
        raise TypeError(
            f"request_transformer {_name(transform)} returned {type(changed).__name__}; it "
            "returns a ChatRequest (dataclasses.replace(request, ...) makes one)"
        )
    return changed


def _name(function: object) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _feedback(error: ValueError, response_format: ResponseFormat | None) -> UserMessage:
    # Models without native structured output learn the expected shape from this message.
    if response_format is None:
        return UserMessage(str(error))
    return UserMessage(f"{error}\nThe JSON schema: {to_json(response_format.schema).decode()}")


# Several direct-return results that are not one value of a typed method's type: they go
# to the model, as the results of other tools do.
_NOT_ONE: Final = object()


def _direct_value(plan: MethodPlan, results: list[ToolExecution]) -> Any:
    output = plan.output
    text = results[0].result if len(results) == 1 else "\n".join(r.result for r in results)
    if output.returns_ai_message:
        return AiMessage(text)
    tried = [text]
    if not output.takes_text:
        # The results as the items of one array (each as the JSON it is, else as text):
        # -> list[Order] takes them all, or the one; -> Order is never given one of two.
        items = [_json_or_text(r.result) for r in results]
        tried = [text] if len(results) == 1 else []
        tried += [to_json(items).decode(), to_json([r.result for r in results]).decode()]
    errors: list[ValueError] = []
    for candidate in tried:
        try:
            return output.parse(candidate)
        except ValueError as failed:
            errors.append(failed)
    if len(results) > 1:
        return _NOT_ONE
    # No model wrote this: asking one again cannot help, so the caller is told at once.
    names = ", ".join(dict.fromkeys(r.request.name for r in results))
    raise OutputParseError(
        f"{plan.qualname}: the result of the direct-return tool(s) {names} could not be "
        f"parsed as {output.type_name}: {errors[0]}",
        raw_text=text,
    ) from errors[0]


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _finish(  # noqa: PLR0917 - private, called from the turn's two ends
    state: ServiceState,
    call: Call,
    value: Any,
    usage: TokenUsage | None,
    response: ChatResponse,
    executions: list[ToolExecution],
    ai: AiMessage | None,
    tool_rounds: int,
    sources: tuple[str, ...],
) -> Any:
    plan = call.plan
    info = call.info
    result: Result[Any] | None = None
    if plan.wraps_result or info is not None:
        result = Result(
            value,
            usage,
            response.finish_reason,
            tuple(executions),
            call.memory_id,
            ai,
            sources,
        )
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


def failed(state: ServiceState, call: Call, error: BaseException) -> None:
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
