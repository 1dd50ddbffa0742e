"""Protocol -> frozen plans: everything a call needs, worked out once when a service is built.

Pure analysis, no I/O. Every mistake found is gathered and raised as one ``InterfaceError``
whose lines each start with ``Class.method(param)``.
"""

from __future__ import annotations

import collections.abc
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from ._events import StreamEvent
from ._output import OutputPlan, UnsupportedOutputType, plan_output, unhashable_part
from ._result import Result
from ._templates import BUILTIN_VARIABLES, Template
from ._text_streams import AsyncEventStream, AsyncTextStream, EventStream, TextStream
from .errors import InterfaceError
from .guardrails import GUARDRAILS_ATTRIBUTE
from .markers import Context, MemoryId, UserName, V, is_marker, metadata_of
from .prompts import SYSTEM_ATTRIBUTE, USER_ATTRIBUTE

__all__ = ["CallKind", "MethodPlan", "plan_interface"]

CallKind = Literal["sync", "async", "stream", "astream", "events", "aevents"]

# Members every service object has; an interface may declare them (ChatMemoryAccess).
ACCESS_METHODS: Final = frozenset(
    {
        "get_chat_memory",
        "evict_chat_memory",
        "forget",
        "aget_chat_memory",
        "aevict_chat_memory",
        "aforget",
        "conversation_stats",
    }
)


@dataclass(frozen=True, slots=True)
class MethodPlan:
    """How one interface method turns its arguments into a turn."""

    qualname: str
    name: str
    kind: CallKind
    parameters: tuple[str, ...]
    signature: inspect.Signature
    memory_id_index: int | None
    memory_id_optional: bool
    user_name_index: int | None
    variables: tuple[tuple[str, int], ...]
    system_template: Template | None
    user_template: Template | None
    user_message_index: int | None
    output: OutputPlan
    wraps_result: bool
    is_coroutine: bool
    doc: str | None
    # The method's own guardrails (@guardrails); the builder puts the service's first.
    input_guardrails: tuple[Callable[..., Any], ...] = ()
    output_guardrails: tuple[Callable[..., Any], ...] = ()
    # The parameter that carries the call's context (Annotated[T, Context]), if any.
    context_index: int | None = None


def _problem(where: str, text: str) -> str:
    return f"{where}: {text}"


def _interface_methods(
    interface: type,
) -> tuple[dict[str, Callable[..., Any]], dict[str, Callable[..., Any]], dict[str, str]]:
    """The methods the service implements, those with a body of their own, and why each
    member carrying a prompt or guardrail decorator that the service leaves alone is left."""
    methods: dict[str, Callable[..., Any]] = {}
    written: dict[str, Callable[..., Any]] = {}
    left: dict[str, str] = {}
    for klass in reversed(interface.__mro__):
        if klass is object or klass is typing.Generic:
            continue
        if getattr(klass, "_is_protocol", False) is False and klass is not interface:
            continue
        for name, member in vars(klass).items():
            # `__call__` makes the service callable; other underscore names are Python's
            # machinery or the interface's own helpers.
            if name in ACCESS_METHODS:
                continue
            if name.startswith("_") and name != "__call__":
                if _decorated(member):
                    left[name] = (
                        "its name starts with an underscore, which marks the interface's "
                        "own helpers; rename it"
                    )
                continue
            if isinstance(member, (staticmethod, classmethod, property)):
                if _decorated(member):
                    kind = type(member).__name__
                    left[name] = (
                        f"it is a {kind}, which the service leaves as written; declare it "
                        "as a plain method taking self"
                    )
                continue
            if not inspect.isfunction(member):
                continue
            # A method with a body runs as written (as a Java interface's default method
            # does), on the service: it may call the methods the model answers.
            if _is_stub(inspect.unwrap(member)):
                methods[name] = member
                written.pop(name, None)
            else:
                written[name] = member
                methods.pop(name, None)
    return methods, written, left


def _decorated(member: object) -> bool:
    """Whether a prompt or guardrail decorator marked ``member`` (or the function a
    staticmethod, classmethod or property wraps)."""
    inner = getattr(member, "__func__", None) or getattr(member, "fget", None) or member
    return any(
        hasattr(found, marker)
        for found in (member, inner)
        for marker in (SYSTEM_ATTRIBUTE, USER_ATTRIBUTE, GUARDRAILS_ATTRIBUTE)
    )


def _reserved_names(interface: type) -> set[str]:
    """Members of ``interface`` named like the service's memory access, other than the
    declarations ``ChatMemoryAccess`` makes (which the interface may repeat)."""
    access = next(
        (k for k in interface.__mro__ if k.__name__ == "ChatMemoryAccess"
         and k.__module__ == "aiservices.service"),
        None,
    )  # fmt: skip
    found: set[str] = set()
    for klass in interface.__mro__:
        if klass is access or klass is object:
            continue
        for name in ACCESS_METHODS.intersection(vars(klass)):
            declared = getattr(access, name, None) if access is not None else None
            if declared is None or not _same_parameters(vars(klass)[name], declared):
                found.add(name)
    return found


def _same_parameters(member: object, declared: Callable[..., Any]) -> bool:
    try:
        mine = inspect.signature(member)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return list(mine.parameters) == list(inspect.signature(declared).parameters)


_STUB_STEPS: Final = frozenset(
    {"RESUME", "NOP", "CACHE", "RETURN_GENERATOR", "POP_TOP", "COPY_FREE_VARS", "MAKE_CELL"}
)


def _is_stub(function: Callable[..., Any]) -> bool:
    """Whether ``function``'s body only declares it: ``...``, ``pass``, a docstring, or
    ``raise NotImplementedError``."""
    import dis

    steps = [i for i in dis.get_instructions(function) if i.opname not in _STUB_STEPS]
    names = [(i.opname, i.argval) for i in steps]
    if names in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)]):
        return True
    # `raise NotImplementedError(...)`, whatever builds its arguments: the body's first load
    # is the exception, and its one way out is the raise.
    loads = [i for i in steps if i.opname != "PUSH_NULL"]
    return (
        bool(loads)
        and loads[0].opname in ("LOAD_GLOBAL", "LOAD_NAME")
        and loads[0].argval == "NotImplementedError"
        and steps[-1].opname == "RAISE_VARARGS"
        and not any(i.opname.startswith(("RETURN", "JUMP", "POP_JUMP")) for i in steps)
    )


def _strip_annotated(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    if get_origin(annotation) is Annotated:
        return annotation.__origin__, annotation.__metadata__
    return annotation, ()


def _admits_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return any(_admits_none(a) for a in get_args(annotation))
    if origin is Annotated:
        return _admits_none(annotation.__origin__)
    return False


def _is_text_type(annotation: Any) -> bool:
    """Whether ``annotation`` is text: ``str`` (a subclass, a ``NewType`` of it, a
    ``Literal`` of strings, ``LiteralString``), or a union of those and ``None`` (or it says
    nothing)."""
    base, _ = _strip_annotated(annotation)
    if base in (Any, inspect.Parameter.empty, typing.LiteralString):
        return True
    if isinstance(base, type):
        return issubclass(base, str)
    supertype = getattr(base, "__supertype__", None)  # a NewType
    if supertype is not None:
        return _is_text_type(supertype)
    origin = get_origin(base)
    if origin is Literal:
        return all(isinstance(value, str) for value in get_args(base))
    if origin in (Union, types.UnionType):
        members = [m for m in get_args(base) if m is not type(None)]
        return bool(members) and all(_is_text_type(m) for m in members)
    return False


def _return_kind(annotation: Any, is_async: bool) -> tuple[CallKind, Any, bool] | str:
    """The call kind, the inner type to parse, and whether it is wrapped in ``Result``.

    A string is the problem with a streaming declaration.
    """
    origin = get_origin(annotation) or annotation
    if origin is AsyncEventStream:
        return "aevents", str, True
    if origin in (collections.abc.Iterator, collections.abc.Iterable, TextStream, EventStream):
        if is_async:
            return "an async def method streams with AsyncIterator[str]"
        if origin is EventStream:
            return "events", str, True
        inner = _only_arg(annotation) if origin is not TextStream else str
        if inner == StreamEvent:
            return "events", str, True
        return ("stream", inner, True) if inner is str else _STREAMS_YIELD
    if origin in (collections.abc.AsyncIterator, collections.abc.AsyncIterable, AsyncTextStream):
        inner = _only_arg(annotation) if origin is not AsyncTextStream else str
        if inner == StreamEvent:
            return "aevents", str, True
        return ("astream", inner, True) if inner is str else _STREAMS_YIELD
    if origin is collections.abc.Generator or origin is collections.abc.AsyncGenerator:
        return "what a streaming method returns is an iterator, not a generator"
    if origin is Result:
        inner = _only_arg(annotation)
        if (get_origin(inner) or inner) in _STREAMING:
            return (
                "Result cannot wrap a stream (declare -> TextStream or -> AsyncTextStream, "
                "whose `result` is the call's Result once the stream has ended)"
            )
        return ("async" if is_async else "sync"), inner, True
    return ("async" if is_async else "sync"), annotation, False


_STREAMS_YIELD: Final = "a streaming method yields str or StreamEvent"
_STREAMING: Final = (
    collections.abc.Iterator,
    collections.abc.Iterable,
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.Generator,
    collections.abc.AsyncGenerator,
    TextStream,
    AsyncTextStream,
    EventStream,
    AsyncEventStream,
)


def _only_arg(annotation: Any) -> Any:
    args = get_args(annotation)
    return args[0] if args else str


def plan_method(
    interface: type,
    name: str,
    function: Callable[..., Any],
    *,
    default_system: str | None,
    has_memory_provider: bool,
    problems: list[str],
    localns: dict[str, Any] | None = None,
) -> MethodPlan | None:
    """Analyse one method; problems are appended to ``problems``."""
    qualname = f"{interface.__name__}.{name}"
    where = f"{qualname}()"
    before = len(problems)
    if localns and "<locals>" not in function.__qualname__:
        # Defined at module level: its module's names come first, as they would for Python;
        # the builder's locals only fill in what the module does not define.
        module = getattr(function, "__globals__", {})
        localns = {k: v for k, v in localns.items() if k not in module}
    try:
        hints = typing.get_type_hints(function, localns=localns, include_extras=True)
    except Exception as exc:
        problems.append(_problem(where, f"its annotations cannot be resolved: {exc}"))
        return None
    signature = inspect.signature(function)
    params = list(signature.parameters.values())
    if (
        not params
        or params[0].name not in ("self",)
        or params[0].kind
        not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )
    ):
        problems.append(_problem(where, "an interface method takes `self` first"))
        return None
    params = params[1:]
    names = tuple(p.name for p in params)

    memory_index: int | None = None
    memory_optional = False
    context_index: int | None = None
    contexts: list[str] = []  # the Context parameters' names, which templates can't use
    user_name_index: int | None = None
    variables: list[tuple[str, int]] = []
    seen_aliases: dict[str, str] = {}
    # Parameters that can't be the user message, whatever else is wrong with them.
    not_the_message: set[int] = set()
    for index, param in enumerate(params):
        pwhere = f"{qualname}({param.name})"
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            not_the_message.add(index)
            problems.append(
                _problem(
                    pwhere,
                    "*args and **kwargs cannot become prompt variables; "
                    "declare each parameter by name",
                )
            )
            continue
        annotation = hints.get(param.name, Any)
        bare = _bare_marker(annotation)
        if bare is not None:
            not_the_message.add(index)
            problems.append(
                _problem(
                    pwhere,
                    f"`{param.name}: {bare}` gives the parameter the marker as its type; a "
                    f"marker goes inside Annotated: `{param.name}: Annotated[str, {bare}]`",
                )
            )
            continue
        metadata = metadata_of(annotation)
        is_memory = any(is_marker(m, MemoryId) for m in metadata)
        is_user_name = any(is_marker(m, UserName) for m in metadata)
        if is_memory or is_user_name:
            not_the_message.add(index)
        if any(is_marker(m, Context) for m in metadata):
            contexts.append(param.name)
            if is_memory or is_user_name:
                problems.append(
                    _problem(pwhere, "a Context parameter cannot also be a MemoryId or UserName")
                )
            elif context_index is not None:
                problems.append(
                    _problem(
                        pwhere,
                        f"a second Context parameter (the first is `{names[context_index]}`); "
                        "pass one context object (a dataclass holding both, say)",
                    )
                )
            else:
                context_index = index
            continue  # neither a template variable nor the user message
        aliases = [m.name for m in metadata if isinstance(m, V)]
        if is_memory:
            if memory_index is not None:
                problems.append(
                    _problem(
                        pwhere,
                        f"a second MemoryId parameter (the first is "
                        f"`{names[memory_index]}`); mark only one",
                    )
                )
            else:
                memory_index = index
                memory_optional = _admits_none(annotation)
                if unhashable_part(annotation) is not None:
                    problems.append(
                        _problem(
                            pwhere,
                            f"a MemoryId must be hashable (str, int, UUID...), not {annotation!r}",
                        )
                    )
        if is_user_name:
            if user_name_index is not None:
                problems.append(_problem(pwhere, "a second UserName parameter; mark only one"))
            else:
                user_name_index = index
            if not _is_text_type(annotation):
                problems.append(
                    _problem(
                        pwhere,
                        "a UserName is the user's name as the model is given it: annotate "
                        f"it str (or str | None), not {_strip_annotated(annotation)[0]!r}",
                    )
                )
        if len(aliases) > 1:
            problems.append(_problem(pwhere, "more than one V(...) alias; give one"))
        variable = aliases[0] if aliases else param.name
        if variable in seen_aliases:
            problems.append(
                _problem(
                    pwhere,
                    f"template variable `{variable}` is already the name of "
                    f"`{seen_aliases[variable]}`; choose another V(...) alias",
                )
            )
        seen_aliases[variable] = param.name
        variables.append((variable, index))
    if memory_index is not None and not has_memory_provider:
        problems.append(
            _problem(
                f"{qualname}({names[memory_index]})",
                "a MemoryId parameter needs a chat_memory_provider: pass "
                "chat_memory_provider=MessageWindowChatMemory.provider(...) to ai_service",
            )
        )
    # `{{it}}`: the only parameter, the context aside (it is never a template variable).
    others = [i for i in range(len(params)) if i != context_index]
    if len(others) == 1 and "it" not in seen_aliases:
        variables.append(("it", others[0]))
    known = frozenset(v for v, _ in variables)

    own_system: str | None = getattr(function, SYSTEM_ATTRIBUTE, None)
    # A method's own wins, even an empty one: that method then sends no system message,
    # not even one a system_message_provider would give.
    system_source = default_system if own_system is None else own_system
    user_source = getattr(function, USER_ATTRIBUTE, None)
    before_templates = len(problems)
    system_decorator = (
        "@system_message" if own_system is not None else f"@system_message on {interface.__name__}"
    )
    system_template = _template(
        system_source, system_decorator, where, known, problems, contexts=contexts
    )
    user_template = _template(
        user_source, "@user_message", where, known, problems, contexts=contexts
    )
    # A misspelt placeholder leaves its parameter unused: reported once, as the misspelling.
    templates_ok = len(problems) == before_templates

    used: frozenset[str] = frozenset()
    for template in (system_template, user_template):
        if template is not None:
            used |= template.variables
    used_indexes = {index for variable, index in variables if variable in used}
    # A parameter no template uses, written `{name}` in one (as str.format has it): its
    # braces would reach the model as they are. Reported as that, whatever else it is.
    braced: dict[int, str] = {}
    for variable, index in variables:
        if index in used_indexes or index in braced:
            continue
        hint = _braces_hint(variable, user_source, system_source)
        if hint is not None:
            braced[index] = hint
            problems.append(
                _problem(
                    f"{qualname}({names[index]})",
                    "no template uses this parameter, "
                    + (
                        "so its value would be lost: "
                        if user_source is not None and index not in not_the_message
                        else "but "
                    )
                    + hint,
                )
            )

    user_message_index: int | None = None
    if user_source is not None and templates_ok:
        reported = used_indexes | braced.keys() | not_the_message
        for variable, index in variables:
            if index in reported:
                continue
            reported.add(index)  # reported once, under its first name
            problems.append(
                _problem(
                    f"{qualname}({names[index]})",
                    "no template uses this parameter, so its value would be lost: use "
                    f"{{{{{variable}}}}} in @user_message or @system_message, pass it to tools "
                    "as Annotated[..., Context], or remove it",
                )
            )
    elif user_source is None:
        candidates = [
            index
            for index in range(len(params))
            if index not in used_indexes
            and index not in not_the_message
            and index != context_index
            and index not in braced
        ]
        if len(candidates) == 1:
            user_message_index = candidates[0]
        elif not candidates:
            problems.append(
                _problem(
                    where,
                    'there is no user message: add @user_message("...") or a '
                    "parameter that no template uses (it becomes the user message)",
                )
            )
        else:
            listed = ", ".join(f"`{names[i]}`" for i in candidates)
            problems.append(
                _problem(
                    where,
                    f"the user message is ambiguous: {listed} are all unused by "
                    'templates; add @user_message("...") that uses them',
                )
            )

    is_async = inspect.iscoroutinefunction(function)
    if "return" not in hints:
        problems.append(
            _problem(where, "declare a return type (str, a pydantic model, Result[T], ...)")
        )
        return None
    kind_or_problem = _return_kind(hints["return"], is_async)
    if isinstance(kind_or_problem, str):
        problems.append(
            _problem(
                where,
                f"{kind_or_problem}: declare `def m(...) -> Iterator[str]` (or "
                "Iterator[StreamEvent]) or `async def m(...) -> AsyncIterator[str]` (or "
                f"AsyncIterator[StreamEvent]), not "
                f"{hints['return']!r}",
            )
        )
        return None
    kind, inner, wraps = kind_or_problem
    try:
        output = plan_output(inner)
    except UnsupportedOutputType as exc:
        problems.append(_problem(where, f"return type: {exc}"))
        return None
    own_guardrails = class_guardrails(interface)
    method_input, method_output = getattr(function, GUARDRAILS_ATTRIBUTE, ((), ()))
    own_guardrails = (own_guardrails[0] + method_input, own_guardrails[1] + method_output)
    if len(problems) > before:
        return None
    return MethodPlan(
        qualname=qualname,
        name=name,
        kind=kind,
        parameters=names,
        signature=signature,
        memory_id_index=memory_index,
        memory_id_optional=memory_optional,
        user_name_index=user_name_index,
        variables=tuple(variables),
        system_template=system_template,
        user_template=user_template,
        user_message_index=user_message_index,
        output=output,
        wraps_result=wraps,
        is_coroutine=is_async,
        doc=function.__doc__,
        input_guardrails=own_guardrails[0],
        output_guardrails=own_guardrails[1],
        context_index=context_index,
    )


def _template(
    source: str | None,
    decorator: str,
    where: str,
    known: frozenset[str],
    problems: list[str],
    *,
    contexts: list[str],
) -> Template | None:
    if source is None:
        return None
    try:
        template = Template.parse(source)
    except ValueError as exc:
        problems.append(_problem(where, f"{decorator}: {exc}"))
        return None
    unknown = template.unknown(known)
    for name in [n for n in unknown if n in contexts]:
        unknown.remove(name)
        problems.append(
            _problem(
                where,
                f"{decorator} uses {{{{{name}}}}}, which is the call's context "
                "(Annotated[..., Context]): a template can't use the context, which goes to "
                "tools and providers and never to the model; pass what the prompt needs as a "
                "parameter of its own",
            )
        )
    if unknown:
        listed = ", ".join(f"{{{{{n}}}}}" for n in unknown)
        choices = ", ".join(sorted(known | BUILTIN_VARIABLES))
        problems.append(
            _problem(
                where, f"{decorator} uses {listed}, which is not a parameter; known: {choices}"
            )
        )
    return template


def _braces_hint(variable: str, *sources: str | None) -> str | None:
    """The fix for ``{variable}`` written with one brace each side in a template, if it is."""
    single = f"{{{variable}}}"
    # One brace each side, not the inside of `{{variable}}` (in a template that failed to
    # parse, whose placeholders are not known as used).
    alone = re.compile(rf"(?<!{{){re.escape(single)}(?!}})")
    if any(alone.search(source) for source in sources if source):
        return f"the template has `{single}`: a placeholder takes two braces, `{{{single}}}`"
    return None


def _bare_marker(annotation: object) -> str | None:
    """The name of a marker used as a parameter's type (``user: MemoryId``), if so."""
    union = get_origin(annotation) in (Union, types.UnionType)
    for candidate in (annotation, *(get_args(annotation) if union else ())):
        for marker in (MemoryId, UserName, Context):
            if is_marker(candidate, marker):
                return marker.__name__
        if isinstance(candidate, V) or candidate is V:
            return "V(...)"
    return None


def class_guardrails(interface: type) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The guardrails ``@guardrails`` put on ``interface`` and the interfaces it extends,
    those of the most basic first."""
    inputs: tuple[Any, ...] = ()
    outputs: tuple[Any, ...] = ()
    for klass in reversed(interface.__mro__):
        found = vars(klass).get(GUARDRAILS_ATTRIBUTE)
        if found is not None:
            inputs += found[0]
            outputs += found[1]
    return inputs, outputs


def plan_interface(
    interface: object, *, has_memory_provider: bool, localns: dict[str, Any] | None = None
) -> dict[str, MethodPlan]:
    """Plans for every method of ``interface``, or one ``InterfaceError`` listing every problem.

    ``localns`` resolves annotations naming classes local to the function that built the
    service (string annotations cannot see them otherwise).
    """
    if not isinstance(interface, type):
        raise InterfaceError(
            f"ai_service() takes an interface class (a typing.Protocol), not {interface!r}"
        )
    if not getattr(interface, "_is_protocol", False):
        raise InterfaceError(
            f"{interface.__name__} must be a typing.Protocol: declare "
            f"`class {interface.__name__}(Protocol): ...`"
        )
    default_system = getattr(interface, SYSTEM_ATTRIBUTE, None)
    problems: list[str] = []
    plans: dict[str, MethodPlan] = {}
    methods, written, left = _interface_methods(interface)
    for name, why in left.items():
        problems.append(
            f"{interface.__name__}.{name}: its prompt or guardrail decorators would do "
            f"nothing, as the service does not implement it: {why}"
        )
    for name in sorted(_reserved_names(interface)):
        problems.append(
            f"{interface.__name__}.{name}: the name is the service's own memory access "
            f"(ChatMemoryAccess.{name}), which would replace the method; rename it"
        )
    for name, function in written.items():
        if _decorated(function):
            problems.append(
                f"{interface.__name__}.{name} has a body, so it runs as written and its "
                "prompt or guardrail decorators would do nothing: make its body `...` for "
                "the model to answer it, or remove the decorators"
            )
    if not methods:
        raise InterfaceError(problems or f"{interface.__name__} declares no method to implement")
    for name, function in methods.items():
        plan = plan_method(
            interface,
            name,
            function,
            default_system=default_system,
            has_memory_provider=has_memory_provider,
            problems=problems,
            localns=localns,
        )
        if plan is not None:
            plans[name] = plan
    if problems:
        raise InterfaceError(problems)
    return plans
