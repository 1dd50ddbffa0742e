"""Building a service object from an analysed interface; loaded by the first ``ai_service``."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._conversations import Conversation, Conversations
from ._hooks import Hooks
from ._plan import plan_interface
from ._runner import events_async, events_sync, run_async, run_sync, stream_async, stream_sync
from ._threads import is_async, is_async_generator
from ._toolbox import Toolbox
from ._turn import ServiceState
from .errors import InterfaceError
from .guardrails import not_a_list
from .memory import ChatMemory
from .memory._base import ChatMemoryProvider
from .messages import ChatMessage, UserMessage
from .models import ChatModel, ChatRequest, ChatRequestParameters
from .models._registry import PROVIDERS, parse_model_spec
from .observability import ConversationStats

if TYPE_CHECKING:
    from ._plan import MethodPlan

__all__ = ["build"]

T = TypeVar("T")


class _ServiceBase:
    """Behaviour shared by every generated service class."""

    __slots__ = ()
    _state: ServiceState

    def get_chat_memory(self, memory_id: Hashable) -> ChatMemory:
        return self._state.conversation_of(memory_id)[0].memory

    async def aget_chat_memory(self, memory_id: Hashable) -> ChatMemory:
        return (await self._state.aconversation_of(memory_id))[0].memory

    def evict_chat_memory(self, memory_id: Hashable) -> None:
        self._state.evict(memory_id)

    async def aevict_chat_memory(self, memory_id: Hashable) -> None:
        self._state.evict(memory_id)  # never waits: a conversation in use stays

    def forget(self, memory_id: Hashable) -> None:
        self._state.forget(memory_id)

    async def aforget(self, memory_id: Hashable) -> None:
        await self._state.aforget(memory_id)

    def conversation_stats(self) -> ConversationStats:
        return self._state.stats()

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} service>"


def _method(plan: MethodPlan) -> Callable[..., Any]:
    """A method with the interface's own signature that hands its arguments to a driver."""
    names = plan.parameters
    params = list(plan.signature.parameters.values())[1:]
    defaults: dict[str, Any] = {}
    pieces: list[str] = []
    seen_keyword_only = False
    for index, param in enumerate(params):
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not seen_keyword_only:
            pieces.append("*")
            seen_keyword_only = True
        piece = param.name
        if param.default is not inspect.Parameter.empty:
            defaults[f"_d{index}"] = param.default
            piece += f"=_d{index}"
        pieces.append(piece)
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and (
            index + 1 == len(params)
            or params[index + 1].kind is not inspect.Parameter.POSITIONAL_ONLY
        ):
            pieces.append("/")
    arguments = "".join(f"{n}, " for n in names)
    driver = {
        "sync": run_sync,
        "async": run_async,
        "stream": stream_sync,
        "astream": stream_async,
        "events": events_sync,
        "aevents": events_async,
    }[plan.kind]
    # The body's own names must not be those of a parameter, which would hide them.
    runner, planned = _unused("_run", names), _unused("_plan", names)
    prefix = "async " if plan.is_coroutine else ""
    call = "await " if plan.kind == "async" else ""
    source = (
        f"{prefix}def {plan.name}(self, {', '.join(pieces)}):\n"
        f"    return {call}{runner}(self._state, {planned}, ({arguments}))\n"
    )
    namespace: dict[str, Any] = {runner: driver, planned: plan, **defaults}
    exec(compile(source, f"<aiservices {plan.qualname}>", "exec"), namespace)
    function: Callable[..., Any] = namespace[plan.name]
    function.__doc__ = plan.doc
    function.__qualname__ = plan.qualname
    function.__signature__ = plan.signature  # type: ignore[attr-defined]
    return function


def _unused(name: str, taken: Sequence[str]) -> str:
    while name in taken:
        name = f"_{name}"
    return name


def _with_guardrails(
    plans: dict[str, MethodPlan],
    input_guardrails: tuple[Callable[..., Any], ...],
    output_guardrails: tuple[Callable[..., Any], ...],
    awaited: dict[str, Callable[..., Any] | None],
) -> dict[str, MethodPlan]:
    """Each plan with the service's guardrails before its own; one ``InterfaceError`` for
    an async guardrail or an async callable of ``awaited`` (by option name) on a sync
    method, output guardrails on a stream, or a method's guardrail that can't take what it
    is called with."""
    problems: list[str] = []
    merged: dict[str, MethodPlan] = {}
    checked: set[int] = set()  # a class's guardrails are every method's: reported once
    generators: set[int] = set()
    for name, plan in plans.items():
        inputs = input_guardrails + plan.input_guardrails
        outputs = output_guardrails + plan.output_guardrails
        where = f"{plan.qualname}()"
        for kind, argument, own in (
            ("input", "text", plan.input_guardrails),
            ("output", "message", plan.output_guardrails),
        ):
            for guardrail in own:
                if id(guardrail) in checked or not callable(guardrail):
                    continue
                checked.add(id(guardrail))
                problem = _call_problem(guardrail, "guardrail", (argument,))
                if problem is not None:
                    problems.append(f"{where}: the {kind} guardrail {problem}")
        for kind, given in (("input", inputs), ("output", outputs)):
            for guardrail in given:
                if id(guardrail) not in generators and is_async_generator(guardrail):
                    generators.add(id(guardrail))
                    problems.append(
                        f"{where}: the {kind} guardrail {_name(guardrail)} is an async "
                        "generator: a guardrail returns its verdict; write it as `async def` "
                        "without `yield`"
                    )
        if plan.kind not in ("async", "aevents", "astream"):
            for kind, given in (("input", inputs), ("output", outputs)):
                problems += [
                    f"{where}: the {kind} guardrail {_name(g)} is async and the method is "
                    "not: give async guardrails to async methods only"
                    for g in given
                    if is_async(g) and id(g) not in generators
                ]
            problems += [
                f"{where}: the {option} {_name(function)} is async and the method is not: "
                f"make the method async or the {option} sync"
                for option, function in awaited.items()
                if function is not None and is_async(function)
            ]
        if outputs and plan.kind in ("stream", "astream", "events", "aevents"):
            problems.append(
                f"{where}: a streaming method shows the answer as it arrives, before output "
                "guardrails could check it; give the output guardrails to the other methods "
                "with @guardrails(output=[...])"
            )
        merged[name] = dataclasses.replace(plan, input_guardrails=inputs, output_guardrails=outputs)
    if problems:
        raise InterfaceError(problems)
    return merged


def _takes_context(function: object) -> bool:
    """Whether ``function`` declares a ``context`` keyword (or takes any keyword)."""
    if function is None:
        return False
    try:
        parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "context" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        or p.kind is inspect.Parameter.VAR_KEYWORD
        for p in parameters
    )


def _name(function: object) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _callable_name(function: object) -> str:
    """``function``'s name as its signature follows it: a partial's function, a callable
    object's ``__call__``."""
    if isinstance(function, functools.partial):
        return f"partial({_callable_name(function.func)}, ...)"
    if inspect.isroutine(function) or isinstance(function, type):
        return _name(function)
    return f"{type(function).__qualname__}.__call__"


def _call_problem(
    function: object, call: str, arguments: tuple[str, ...], *, context: bool = False
) -> str | None:
    """Why ``function`` can't be called as ``call(*arguments)`` (with ``context=`` too when
    it takes one), or ``None`` when it can or its signature can't be read."""
    keywords = {"context": None} if context else {}
    errors: list[str] = []
    shown = ""
    # A wrapper made with functools.wraps shows its wrapped function's signature, which may
    # not be how it is called: it is refused only when neither signature can take the call.
    for follow_wrapped in (True, False):
        try:
            signature = inspect.signature(function, follow_wrapped=follow_wrapped)  # type: ignore[arg-type]
        except Exception:  # a builtin or a C callable, say: nothing to check it against
            return None
        try:
            signature.bind(*arguments, **keywords)
        except TypeError as exc:
            errors.append(str(exc))
        else:
            return None
        if not shown:
            # The parameters' names and kinds are what matter here, not their types.
            shown = str(
                signature.replace(
                    parameters=[
                        p.replace(annotation=inspect.Parameter.empty)
                        for p in signature.parameters.values()
                    ],
                    return_annotation=inspect.Signature.empty,
                )
            )
    takes = ", ".join((*arguments, *(("context=...",) if context else ())))
    return (
        f"{_callable_name(function)}{shown} can't be called as {call}({takes}): {errors[0]}; "
        f"it must accept ({takes}), and any other parameter needs a default"
    )


def _listed(option: str, given: Iterable[Any], problems: list[str]) -> tuple[Any, ...]:
    """``given`` as a tuple; a lone callable, object or string where a list belongs is a
    problem, with nothing taken from it."""
    if not_a_list(given):
        name = getattr(given, "__name__", None) or "..."
        problems.append(f"{option}= takes a list, not {given!r:.60}; write {option}=[{name}]")
        return ()
    return tuple(given)


def _check_model(model: object) -> tuple[ChatModel | None, str | None]:
    if isinstance(model, str):
        try:
            provider, _ = parse_model_spec(model)
        except ValueError as exc:
            raise InterfaceError(f"model={model!r}: {exc}") from None
        sdk = PROVIDERS[provider].sdk
        if importlib.util.find_spec(sdk) is None:
            raise InterfaceError(
                f'model={model!r} needs the {sdk} SDK: pip install "aiservices[{provider}]"'
            )
        return None, model
    if isinstance(model, type):
        raise InterfaceError(
            f"model={model.__name__} is a class; pass a model made from it, such as "
            f"{model.__name__}(...)"
        )
    if not callable(getattr(model, "chat", None)):
        raise InterfaceError(
            f"model={model!r} is not a ChatModel: it needs a chat(request) method "
            "(or pass 'openai:MODEL' / 'anthropic:MODEL')"
        )
    return model, None  # type: ignore[return-value]


def build(
    interface: Callable[..., T],
    *,
    model: ChatModel | str,
    chat_memory: ChatMemory | None,
    chat_memory_provider: ChatMemoryProvider | None,
    tools: Iterable[object],
    tool_provider: Callable[[Hashable, UserMessage], Iterable[object]] | None,
    tool_error_handler: Callable[..., str] | None,
    system_message_provider: Callable[[Hashable], str | None] | None,
    max_tool_invocations: int,
    max_output_retries: int,
    parameters: ChatRequestParameters | None,
    chat_memory_cache_size: int,
    listeners: Sequence[object],
    input_guardrails: Sequence[Callable[..., Any]],
    output_guardrails: Sequence[Callable[..., Any]],
    request_transformer: Callable[[ChatRequest, Hashable], ChatRequest] | None,
    retriever: Callable[..., Any] | None,
    seed_memory: Callable[[Hashable], Sequence[ChatMessage]] | None,
    localns: dict[str, Any] | None,
) -> T:
    chat_model, model_spec = _check_model(model)
    problems: list[str] = []
    for name, count in (
        ("max_tool_invocations", max_tool_invocations),
        ("max_output_retries", max_output_retries),
    ):
        if type(count) is not int:  # (a bool is not a count either)
            problems.append(
                f"{name}={count!r}: must be a whole number (an int), 0 or more; 0 allows none"
            )
        elif count < 0:
            problems.append(f"{name}={count}: must be 0 or more")
    if (
        not isinstance(chat_memory_cache_size, int)
        or isinstance(chat_memory_cache_size, bool)
        or chat_memory_cache_size < 1
    ):
        problems.append(
            f"chat_memory_cache_size={chat_memory_cache_size!r}: must be an int, 1 or more"
        )
    if chat_memory_provider is not None and not callable(chat_memory_provider):
        problems.append(
            "chat_memory_provider must be a callable memory_id -> ChatMemory, such as "
            "MessageWindowChatMemory.provider(max_messages=20)"
        )
    elif isinstance(chat_memory_provider, type) and hasattr(chat_memory_provider, "provider"):
        # Called with a memory id, the class would take it for its limit.
        name = chat_memory_provider.__name__
        problems.append(
            f"chat_memory_provider={name} is the memory class; pass a provider that makes one "
            f"per memory id, such as {name}.provider(...)"
        )
    if isinstance(chat_memory, type):
        problems.append(
            f"chat_memory={chat_memory.__name__} is a class; pass a memory made from it, such "
            f"as {chat_memory.__name__}(...)"
        )
    elif chat_memory is not None and not callable(getattr(chat_memory, "messages", None)):
        problems.append(f"chat_memory={chat_memory!r} is not a ChatMemory")
    if parameters is not None and not isinstance(parameters, ChatRequestParameters):
        shown = (
            f"the class {parameters.__name__}"
            if isinstance(parameters, type)
            else f"a {type(parameters).__name__}"
        )
        problems.append(
            f"parameters is {shown}; pass ChatRequestParameters(...), such as "
            "parameters=ChatRequestParameters(temperature=0.2)"
        )
        parameters = None
    if tool_provider is not None and not callable(tool_provider):
        problems.append("tool_provider must be a callable (memory_id, user_message) -> tools")
    if system_message_provider is not None and not callable(system_message_provider):
        problems.append(
            f"system_message_provider={system_message_provider!r:.60} is not callable: it is a "
            "callable memory_id -> str | None (for a fixed text, use @system_message on the "
            "interface or its methods)"
        )
    listeners = list(_listed("listeners", listeners, problems))
    problems.extend(Hooks.check(listeners))
    input_guardrails = _listed("input_guardrails", input_guardrails, problems)
    output_guardrails = _listed("output_guardrails", output_guardrails, problems)
    tools = _listed("tools", tools, problems)
    for name, given in (
        ("input_guardrails", input_guardrails),
        ("output_guardrails", output_guardrails),
    ):
        problems += [
            f"{name}[{i}]: {g!r} is not callable" for i, g in enumerate(given) if not callable(g)
        ]
    if request_transformer is not None and not callable(request_transformer):
        problems.append(
            "request_transformer must be a callable (request, memory_id) -> ChatRequest"
        )
    if seed_memory is not None and not callable(seed_memory):
        problems.append("seed_memory must be a callable memory_id -> Sequence[ChatMessage]")
    if retriever is not None and not callable(retriever):
        problems.append("retriever must be a callable (query, memory_id) -> Sequence[str]")
    # Called where nothing awaits them, whatever the method: an async one could never work.
    problems += [
        f"{option}={_name(function)} is async: it must be a plain function (it is called "
        "before or between the turn's awaits)"
        for option, function in (
            ("chat_memory_provider", chat_memory_provider),
            ("system_message_provider", system_message_provider),
            ("tool_provider", tool_provider),
            ("request_transformer", request_transformer),
            ("tool_error_handler", tool_error_handler),
        )
        if function is not None and is_async(function)
    ]
    # Each as the turn calls it: a mistake in its parameters shows now, not at a first call.
    # (The memory class given as the provider is reported above, with its fix.)
    memory_class = isinstance(chat_memory_provider, type) and hasattr(
        chat_memory_provider, "provider"
    )
    calls: list[tuple[str, object, str, tuple[str, ...], bool]] = [
        (option, function, option, arguments, _takes_context(function) if context else False)
        # The last: whether it is given context= when it declares it.
        for option, function, arguments, context in (
            (
                "chat_memory_provider",
                None if memory_class else chat_memory_provider,
                ("memory_id",),
                False,
            ),
            ("system_message_provider", system_message_provider, ("memory_id",), True),
            ("tool_provider", tool_provider, ("memory_id", "user_message"), True),
            ("tool_error_handler", tool_error_handler, ("error", "request"), False),
            ("request_transformer", request_transformer, ("request", "memory_id"), False),
            ("retriever", retriever, ("query", "memory_id"), False),
            ("seed_memory", seed_memory, ("memory_id",), False),
        )
    ]
    calls += [
        (f"{kind}_guardrails[{i}]", guardrail, "guardrail", (argument,), False)
        for kind, argument, given in (
            ("input", "text", input_guardrails),
            ("output", "message", output_guardrails),
        )
        for i, guardrail in enumerate(given)
    ]
    for option, function, call, arguments, context in calls:
        if callable(function):
            problem = _call_problem(function, call, arguments, context=context)
            if problem is not None:
                problems.append(f"{option}={problem}")
    if problems:
        raise InterfaceError(problems)
    plans = plan_interface(
        interface, has_memory_provider=chat_memory_provider is not None, localns=localns
    )
    plans = _with_guardrails(
        plans,
        input_guardrails,
        output_guardrails,
        {"retriever": retriever, "seed_memory": seed_memory},
    )
    toolbox = Toolbox.from_objects(list(tools), error_handler=tool_error_handler)
    choice = parameters.tool_choice if parameters is not None else None
    if (
        choice not in (None, "auto", "required", "none")
        and tool_provider is None
        and choice not in toolbox.names
    ):
        known = ", ".join(repr(n) for n in toolbox.names) or "none"
        raise InterfaceError(
            f"parameters: tool_choice={choice!r} names no tool of the service (its tools: "
            f"{known}); name one of them, or 'auto', 'required' or 'none'"
        )
    state = ServiceState(
        model=chat_model,
        model_spec=model_spec,
        conversations=Conversations(chat_memory_provider, chat_memory_cache_size),
        single=Conversation(chat_memory) if chat_memory is not None else None,
        toolbox=toolbox,
        tool_provider=tool_provider,
        tool_error_handler=tool_error_handler,
        system_message_provider=system_message_provider,
        max_tool_invocations=max_tool_invocations,
        max_output_retries=max_output_retries,
        parameters=parameters or ChatRequestParameters(),
        hooks=Hooks(listeners) if listeners else None,
        name=getattr(interface, "__name__", ""),
        system_provider_takes_context=_takes_context(system_message_provider),
        tool_provider_takes_context=_takes_context(tool_provider),
        retriever=retriever,
        seed_memory=seed_memory,
        request_transformer=request_transformer,
    )
    assert isinstance(interface, type)
    namespace: dict[str, Any] = {name: _method(plan) for name, plan in plans.items()}
    namespace["__slots__"] = ("_state",)
    namespace["__module__"] = interface.__module__
    namespace["__doc__"] = interface.__doc__
    cls = type(f"{interface.__name__}Service", (_ServiceBase, interface), namespace)
    instance: Any = object.__new__(cls)
    instance._state = state
    return instance  # type: ignore[no-any-return]
