"""Return annotation -> response format and parser: the one registry for typed answers.

``plan_output`` reads a method's return type once, when the service is built, and
returns an ``OutputPlan``: the JSON schema the model is asked to follow and a parser
for its answer. Parsing tries the answer as it is first (one pydantic ``validate_json``
call) and looks for JSON inside fences, prose or a ``{"value": ...}`` object only when
that fails, so a well-formed answer costs what pydantic costs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Any, Final, Literal, TypeAlias, Union, get_args, get_origin
from uuid import UUID

import typing_extensions
from pydantic import BaseModel, BeforeValidator, RootModel, TypeAdapter, ValidationError
from pydantic.errors import PydanticUndefinedAnnotation, PydanticUserError
from pydantic_core import PydanticCustomError

from ._result import Result
from ._tool_schema import SchemaGenerator
from ._typeddicts import UnreadableTypedDict, is_typing_typeddict, twin
from .errors import OutputParseError
from .messages import AiMessage, ChatMessage
from .models import ResponseFormat
from .models._strict import is_strict_schema

__all__ = ["OutputPlan", "UnsupportedOutputType", "plan_output", "unhashable_part"]

_SUPPORTED: Final = (
    "str, AiMessage, bool, int, float, Decimal, date, datetime, time, timedelta, UUID, "
    "Enum subclasses, "
    "Literal[...], pydantic models, dataclasses, TypedDict, list[T], set[T], frozenset[T], "
    "tuple[T, ...], tuple[A, B], dict[str, T], and unions of these such as T | None"
)

_RETRY_HINT: Final = OutputParseError.retry_instruction


class UnsupportedOutputType(TypeError):
    """A return type the parser cannot produce; the message names it and what is supported."""


def _text(text: str | None) -> str:
    return "" if text is None else text


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How one return type is asked for and read back.

    ``response_format`` is ``None`` for ``str`` and ``AiMessage`` (the answer is free text).
    """

    annotation: Any
    response_format: ResponseFormat | None
    returns_ai_message: bool = False
    _parser: Callable[[str | None], Any] = field(default=_text, repr=False, compare=False)
    takes_text: bool = True
    """Whether any text is a value of the type (``str``, ``str | None``, ``Verdict | str``)."""

    @property
    def type_name(self) -> str:
        """The type as a reader would write it: ``list[Verdict]``, ``int | None``."""
        return _type_name(self.annotation)

    def parse(self, text: str | None) -> Any:
        """The typed value of an answer's text.

        Raises ``ValueError`` whose message says what failed and asks for JSON matching
        the schema, fit to send back to the model as is.
        """
        return self._parser(text)


def plan_output(annotation: Any) -> OutputPlan:
    """Analyse a return type once: its response format and its parser.

    Raises ``UnsupportedOutputType`` naming the type, what is wrong with it and the
    supported types.
    """
    try:
        shape = _shape(annotation)
        hash(shape)
    except TypeError:
        return _plan(annotation)
    return _plan_cached(shape, annotation)


@lru_cache(maxsize=256)
def _plan_cached(shape: object, annotation: Any) -> OutputPlan:
    # Services built from the same Protocol, or methods sharing a return type, share one
    # plan: a TypeAdapter and its schema cost milliseconds to build.
    return _plan(annotation)


def _shape(tp: Any) -> object:
    """``tp`` as a key that tells apart what its ``==`` does not: ``Cat | Dog`` equals
    ``Dog | Cat``, and ``Literal["b", "a"]`` equals ``Literal["a", "b"]``, but pydantic
    tries a union's members in order, and the order shows in the schema."""
    args = get_args(tp)
    if args:
        return (get_origin(tp), tuple(map(_shape, args)))
    return tp if isinstance(tp, type) else (type(tp), tp)


_TEXT_PLAN: Final = OutputPlan(str, None)
_AI_MESSAGE_PLAN: Final = OutputPlan(AiMessage, None, returns_ai_message=True)


def _plan(annotation: Any) -> OutputPlan:
    if annotation is str:
        return _TEXT_PLAN
    if annotation is AiMessage:
        return _AI_MESSAGE_PLAN
    shown = _type_name(annotation)
    try:
        prepared = _prepare(annotation, {}, lenient=True)
    except _Unsupported as exc:
        raise UnsupportedOutputType(
            f"{shown} is not a supported return type: {exc}. Supported: {_SUPPORTED}"
        ) from None
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(prepared)
        schema = adapter.json_schema(schema_generator=SchemaGenerator)
    except (PydanticUserError, PydanticUndefinedAnnotation) as exc:
        reason = str(exc).split("\n", 1)[0]
        raise UnsupportedOutputType(
            f"{shown} is not a supported return type: pydantic cannot validate it or "
            f"describe it as JSON schema ({reason})"
        ) from None
    schema = _inline_root_ref(schema)
    check = _empty_object_check(prepared)
    wrapper: TypeAdapter[Any] | None = None
    if schema.get("type") != "object":
        # OpenAI's structured output needs an object at the root, so a list, a number or a
        # union travels as {"value": ...}.
        schema = _wrap(schema)
        wrapper = TypeAdapter(_new_typeddict("Value", {"value": prepared}))
    strict = _tighten(schema)
    admits_none = _admits_none(adapter)
    takes_text = _admits_text(adapter)
    parser = _JsonParser(
        adapter,
        wrapper,
        _is_scalar(annotation),
        admits_none,
        shown,
        exact_decimals=_decimals_only(annotation),
        check=check,
    ).parser()
    return OutputPlan(
        annotation,
        ResponseFormat(_schema_name(annotation), schema, strict),
        _parser=parser,
        takes_text=takes_text,
    )


# --- what is supported -------------------------------------------------------------------


class _Unsupported(Exception):
    pass


# The functional form, typed loosely: its result is a class made at run time.
_new_typeddict: Final[Any] = typing_extensions.TypedDict

_SCALARS: Final = (bool, int, float, Decimal, date, datetime, time, timedelta, UUID, str)
_SEQUENCES: Final = (list, set, frozenset)
_UNION_ORIGINS: Final = (Union, types.UnionType)
_NONE_TYPE: Final = type(None)


def _prepare(tp: Any, typeddicts: dict[type, type], *, lenient: bool) -> Any:
    """Check that ``tp`` is supported; return it as pydantic should validate it.

    With ``lenient``, enums and literals get a before-validator accepting names and any
    case. ``typing.TypedDict`` classes are re-created with ``typing_extensions`` on
    Python < 3.12, where pydantic accepts only the latter; ``typeddicts`` maps the ones
    done so far, which also ends the walk of a recursive TypedDict.
    """
    if tp in _SCALARS:
        return tp
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        inner = _prepare(tp.__origin__, typeddicts, lenient=lenient)
        return tp if inner is tp.__origin__ else Annotated[(inner, *tp.__metadata__)]
    if origin in _UNION_ORIGINS:
        members = [m if m is _NONE_TYPE else _prepare(m, typeddicts, lenient=lenient) for m in args]
        if all(m is _NONE_TYPE for m in members):
            raise _Unsupported("a union of None alone carries no answer")
        return tp if members == list(args) else Union[tuple(members)]  # noqa: UP007
    if origin is Literal:
        return _prepare_literal(tp, args, lenient=lenient)
    if origin in _SEQUENCES:
        if not args:
            raise _Unsupported(_why_not(tp))
        if origin is not list:
            _check_hashable(tp, args[0])
        item = _prepare(args[0], typeddicts, lenient=lenient)
        return tp if item is args[0] else origin[item]
    if origin is tuple:
        return _prepare_tuple(tp, args, typeddicts, lenient=lenient)
    if origin is dict:
        if not args:
            raise _Unsupported(_why_not(tp))
        key, value = args
        if _strip_annotated(key) is not str:
            raise _Unsupported(
                f"the keys of {_type_name(tp)} must be str, because JSON object keys are "
                "strings; declare dict[str, T]"
            )
        prepared = _prepare(value, typeddicts, lenient=lenient)
        return tp if prepared is value else dict[key, prepared]  # type: ignore[valid-type]
    if isinstance(tp, typing_extensions.TypeAliasType):
        return _prepare(tp.__value__, typeddicts, lenient=lenient)
    if hasattr(tp, "__supertype__"):  # typing.NewType: its values are the supertype's
        prepared = _prepare(tp.__supertype__, typeddicts, lenient=lenient)
        return tp if prepared is tp.__supertype__ else prepared
    if isinstance(tp, type):
        return _prepare_class(tp, typeddicts, lenient=lenient)
    if origin is Result or tp is Result:
        raise _Unsupported(
            "Result[T] wraps the whole return type, never a part of it: declare "
            "Result[T | None] rather than Result[T] | None"
        )
    if isinstance(origin, type) and (
        dataclasses.is_dataclass(origin) or typing_extensions.is_typeddict(origin)
    ):
        # A generic dataclass or TypedDict with its parameters given: Box[int].
        _prepare_class(origin, typeddicts, lenient=lenient)
        return tp
    raise _Unsupported(_why_not(tp))


def _check_hashable(tp: Any, item: Any) -> None:
    """Raise `_Unsupported` unless the items of the set ``tp`` can be hashed."""
    found = unhashable_part(item)
    if found is None:
        return
    shown = _type_name(item)
    if found is not item:
        why = f", as it holds a {_type_name(found)}"
    else:
        kind = _unaliased(found)
        can_freeze = isinstance(kind, type) and (
            issubclass(kind, BaseModel) or dataclasses.is_dataclass(kind)
        )
        why = (
            " (make it frozen: model_config = ConfigDict(frozen=True), or @dataclass(frozen=True))"
            if can_freeze
            else ""
        )
    raise _Unsupported(
        f"the items of a {get_origin(tp).__name__} must be hashable, and {shown} is not{why}; "
        f"declare list[{shown}]"
    )


def unhashable_part(tp: Any, seen: set[int] | None = None) -> Any:
    """The type in ``tp`` whose values can't be hashed (``tp`` itself, or one it holds: a
    frozen model's field, a tuple's item), or ``None``."""
    seen = set() if seen is None else seen
    kind = _unaliased(tp)
    if id(kind) in seen:
        return None  # (a recursive type: its other parts are checked)
    seen.add(id(kind))
    origin = get_origin(kind)
    if origin in _UNION_ORIGINS or origin is tuple or origin is frozenset:
        for member in get_args(kind):
            found = None if member is Ellipsis else unhashable_part(member, seen)
            if found is not None:
                return found
        return None
    cls = origin or kind
    if origin is Literal or not isinstance(cls, type):
        return None
    if typing_extensions.is_typeddict(cls) or getattr(cls, "__hash__", None) is None:
        return tp
    fields: list[Any] = []
    if issubclass(cls, BaseModel):
        fields = [f.annotation for f in cls.model_fields.values()]
    elif dataclasses.is_dataclass(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            return None
        fields = [hints.get(f.name) for f in dataclasses.fields(cls) if f.hash is not False]
    for field_type in fields:
        found = None if field_type is None else unhashable_part(field_type, seen)
        if found is not None:
            return found
    return None


def _prepare_class(tp: type, typeddicts: dict[type, type], *, lenient: bool) -> Any:
    if issubclass(tp, enum.Enum):
        if not list(tp):
            raise _Unsupported(f"the Enum {tp.__name__} has no members: no answer could be one")
        return Annotated[tp, BeforeValidator(_enum_choices(tp))] if lenient else tp
    if issubclass(tp, ChatMessage):
        # Only `-> AiMessage` itself is the model's message; inside another type it would
        # be asked for as JSON of the message's own fields.
        raise _Unsupported(
            f"{tp.__name__} is returned alone (`-> AiMessage`, or `-> Result[str]` for the "
            "answer with its message), not inside another type"
        )
    if issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp):
        return tp
    if typing_extensions.is_typeddict(tp):
        if is_typing_typeddict(tp):
            try:
                return twin(tp, typeddicts, lambda hint: _prepare(hint, typeddicts, lenient=False))
            except UnreadableTypedDict as exc:
                raise _Unsupported(str(exc)) from None
        return tp
    raise _Unsupported(_why_not(tp))


def _prepare_literal(tp: Any, values: tuple[Any, ...], *, lenient: bool) -> Any:
    for value in values:
        if value is not None and not isinstance(value, str | int | enum.Enum):
            raise _Unsupported(
                f"the Literal value {value!r} is not a str, int, bool, None or enum member"
            )
    if all(value is None for value in values):
        raise _Unsupported("Literal[None] carries no answer; return None from your own code")
    if lenient and any(isinstance(v, str | int | enum.Enum) for v in values):
        return Annotated[tp, BeforeValidator(_literal_choices(values))]
    return tp


def _prepare_tuple(
    tp: Any, args: tuple[Any, ...], typeddicts: dict[type, type], *, lenient: bool
) -> Any:
    if not args:
        raise _Unsupported(_why_not(tp))
    if len(args) == 2 and args[1] is Ellipsis:
        item = _prepare(args[0], typeddicts, lenient=lenient)
        return tp if item is args[0] else tuple[item, ...]  # type: ignore[valid-type]
    items = [_prepare(a, typeddicts, lenient=lenient) for a in args]
    return tp if items == list(args) else tuple[tuple(items)]  # type: ignore[misc]


def _why_not(tp: Any) -> str:
    if tp is None or tp is _NONE_TYPE:
        return "a method must return something; declare str to get the answer's text"
    if tp is Any or tp is object:
        return (
            f"{_type_name(tp)} says nothing about the answer's shape; declare a concrete "
            "type such as str or a pydantic model"
        )
    if isinstance(tp, str | typing.ForwardRef):
        name = tp if isinstance(tp, str) else tp.__forward_arg__
        return (
            f"{name!r} is an unresolved forward reference; define {name} before the "
            "service is built"
        )
    origin = get_origin(tp) or tp
    if origin in _SEQUENCES and not get_args(tp):
        name = origin.__name__
        return f"a bare {name} has no item type; declare one, e.g. {name}[str]"
    if origin is dict and not get_args(tp):
        return "a bare dict has no key and value types; declare them, e.g. dict[str, int]"
    if tp == tuple[()]:
        return "an empty tuple carries no answer"
    if origin is tuple:
        return "a bare tuple has no item types; declare tuple[T, ...] or tuple[A, B]"
    if getattr(origin, "__module__", None) == "collections.abc" and issubclass(origin, Iterable):
        wanted = "dict[str, T]" if issubclass(origin, Mapping) else "list[T]"
        return f"{origin.__name__} is an abstract collection; declare {wanted}"
    if isinstance(tp, type):
        return (
            f"{tp.__qualname__} is a plain class; make it a pydantic model, a dataclass or "
            "a TypedDict"
        )
    return f"{_type_name(tp)} cannot be read from a JSON answer"


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = tp.__origin__
    return tp


def _unaliased(tp: Any) -> Any:
    """``tp`` with its NewType and ``type X = ...`` aliases resolved, and ``Annotated``
    stripped: the type its values are."""
    while True:
        tp = _strip_annotated(tp)
        if isinstance(tp, typing_extensions.TypeAliasType):
            tp = tp.__value__
        elif hasattr(tp, "__supertype__"):
            tp = tp.__supertype__
        else:
            return tp


def _is_scalar(tp: Any) -> bool:
    """Whether the answer may be a bare token (``2024-05-01``, ``POSITIVE``)."""
    tp = _unaliased(tp)
    origin = get_origin(tp)
    if origin in _UNION_ORIGINS:
        return all(m is _NONE_TYPE or _is_scalar(m) for m in get_args(tp))
    if origin is Literal:
        return True
    return tp in _SCALARS or (isinstance(tp, type) and issubclass(tp, enum.Enum))


_EmptyObjectCheck: TypeAlias = Callable[[Any], frozenset[str] | None]


def _empty_object_check(tp: Any) -> _EmptyObjectCheck | None:
    """A check finding, in an answer's JSON, an object given for an object type none of
    whose fields is required (a model, dataclass or TypedDict) that holds none of its
    fields; it returns those fields. ``None`` when ``tp`` holds no such type where the
    answer's own objects stand (alone, beside None, or as the items of a collection).

    Any JSON object validates as such a type (unknown keys are ignored, missing fields take
    their defaults): ``{"person": {...}}`` would be read as the defaults.
    """
    tp = _unaliased(tp)
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in _UNION_ORIGINS:
        # Beside other members, an object may well be another member's value.
        members = [m for m in args if m is not _NONE_TYPE]
        return _empty_object_check(members[0]) if len(members) == 1 else None
    if origin in _SEQUENCES or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        inner = _empty_object_check(args[0])
        if inner is None:
            return None

        def items(data: Any) -> frozenset[str] | None:
            for item in data if type(data) is list else ():
                found = inner(item)
                if found is not None:
                    return found
            return None

        return items
    if origin is dict and len(args) == 2:
        value_check = _empty_object_check(args[1])
        if value_check is None:
            return None

        def values(data: Any) -> frozenset[str] | None:
            for value in data.values() if type(data) is dict else ():
                found = value_check(value)
                if found is not None:
                    return found
            return None

        return values
    kind = origin or tp
    keys = _keys_if_all_optional(kind) if isinstance(kind, type) else None
    if keys is None:
        return None

    def holds_none(data: Any) -> frozenset[str] | None:
        return keys if type(data) is dict and data and keys.isdisjoint(data) else None

    return holds_none


def _keys_if_all_optional(kind: type) -> frozenset[str] | None:
    """The keys an object of ``kind`` may hold, when it is a model, dataclass or TypedDict
    none of whose fields is required; else ``None``. The keys are the fields' names and
    their aliases (as the model is asked for them); a type that may read other keys (a root
    model, a model validator that runs before its fields) is left unchecked."""
    keys: set[str] = set()
    config = getattr(kind, "model_config", None) or getattr(kind, "__pydantic_config__", None)
    if (config or {}).get("extra") == "allow":
        return None  # any key is data
    if issubclass(kind, BaseModel):
        if issubclass(kind, RootModel):
            return None  # any key is data
        validators = kind.__pydantic_decorators__.model_validators.values()
        if any(v.info.mode in ("before", "wrap") for v in validators):
            return None  # it may read the answer's keys its own way
        fields: dict[str, Any] = kind.model_fields
        if any(f.is_required() for f in fields.values()):
            return None
    elif dataclasses.is_dataclass(kind):
        missing = dataclasses.MISSING
        for entry in dataclasses.fields(kind):
            if entry.default is missing and entry.default_factory is missing:
                return None
        fields = {entry.name: None for entry in dataclasses.fields(kind)}
    elif typing_extensions.is_typeddict(kind):
        typed: Any = kind
        if typed.__required_keys__:
            return None
        fields = dict.fromkeys(typed.__optional_keys__)
    else:
        return None
    for name, info in fields.items():
        keys.add(name)
        for alias in (getattr(info, "alias", None), getattr(info, "validation_alias", None)):
            if isinstance(alias, str):
                keys.add(alias)
            elif alias is not None:
                return None  # AliasChoices, AliasPath: not worth reading
    if not issubclass(kind, BaseModel):
        # A dataclass's or TypedDict's aliases (Annotated[int, Field(alias=...)]) show only
        # in its schema, as the model is asked for them.
        try:
            schema = TypeAdapter(kind).json_schema(schema_generator=SchemaGenerator)
        except (PydanticUserError, PydanticUndefinedAnnotation):
            return None
        keys.update(schema.get("properties", ()))
    return frozenset(keys) if keys else None


# --- lenient enums and literals ----------------------------------------------------------

_MISSING: Final = object()
_AMBIGUOUS: Final = object()


def _choices_lookup(
    pairs: Iterable[tuple[Any, Iterable[str], Iterable[str]]],
) -> Callable[[Any], Any]:
    """A before-validator mapping strings to choices.

    ``pairs`` gives each choice with its exact keys (tried first) and the keys matched in
    any case; a case-insensitive key shared by two choices matches neither.
    """
    exact: dict[str, Any] = {}
    folded: dict[str, Any] = {}
    for choice, exact_keys, loose_keys in pairs:
        for key in exact_keys:
            exact.setdefault(key, choice)
        for loose in loose_keys:
            key = loose.casefold()
            seen = folded.get(key, _MISSING)
            folded[key] = choice if seen is _MISSING or seen is choice else _AMBIGUOUS

    def lenient(value: Any) -> Any:
        if isinstance(value, str):
            hit = exact.get(value, _MISSING)
            if hit is _MISSING:
                hit = folded.get(value.strip().casefold(), _MISSING)
            if hit is not _MISSING and hit is not _AMBIGUOUS:
                return hit
        return value

    return lenient


def _enum_choices(cls: type[enum.Enum]) -> Callable[[Any], Any]:
    members = list(cls.__members__.items())
    # A member's value wins over another member's name when both spell the input exactly.
    values = [(m, [m.value] if isinstance(m.value, str) else [], ()) for _, m in members]
    names = [(m, [name], [name, str(m.value)]) for name, m in members]
    by_text = _choices_lookup([*values, *names])
    # JSON has no tuples: a member whose value is one is sent as an array.
    by_array = {m.value: m for _, m in members if type(m.value) is tuple}
    if not by_array:
        return by_text

    def lenient(value: Any) -> Any:
        if type(value) is list:
            try:
                return by_array.get(tuple(value), value)
            except TypeError:  # an item that cannot be hashed matches no member
                return value
        return by_text(value)

    return lenient


def _literal_choices(values: tuple[Any, ...]) -> Callable[[Any], Any]:
    def keys(value: Any) -> tuple[Any, list[str], list[str]]:
        if isinstance(value, enum.Enum):
            return value, [value.name], [value.name, str(value.value)]
        return value, [value] if isinstance(value, str) else [], [str(value)]

    return _choices_lookup(keys(v) for v in values if v is not None)


# --- schema ------------------------------------------------------------------------------


def _inline_root_ref(schema: dict[str, Any]) -> dict[str, Any]:
    """Turn ``{"$ref": "#/$defs/M", "$defs": ...}`` into M's own schema at the root."""
    ref = schema.get("$ref")
    defs = schema.get("$defs")
    if not isinstance(ref, str) or not isinstance(defs, dict) or len(schema) != 2:
        return schema
    name = ref.rsplit("/", 1)[-1]
    root: dict[str, Any] = defs[name]
    rest = {k: v for k, v in defs.items() if k != name}
    if ref in set(_refs(root)) | set(_refs(rest)):
        # Recursive: the definition stays for its references, and the root gets a copy
        # so that tightening one does not see the other's changes half done.
        rest[name] = root
        root = copy.deepcopy(root)
    if rest:
        root["$defs"] = rest
    return root


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _wrap(schema: dict[str, Any]) -> dict[str, Any]:
    defs = schema.pop("$defs", None)
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {"value": schema},
        "required": ["value"],
        "additionalProperties": False,
    }
    if defs:
        wrapped["$defs"] = defs
    return wrapped


def _tighten(schema: dict[str, Any]) -> bool:
    """Make ``schema`` as close to strict mode as is safe, in place; whether it fits.

    Safe because the answer is validated with the declared type anyway: objects that
    declare their properties get ``additionalProperties: false`` (extra keys would be
    ignored), ``uniqueItems`` goes (a set drops duplicates), and an optional property whose
    default is ``None`` becomes a required nullable one (a ``null`` gives the same value).
    """
    check = _StrictCheck(schema.get("$defs", {}))
    for name, definition in list(check.defs.items()):
        check.defs[name] = check.visit(definition, (name,))
    body = {k: v for k, v in schema.items() if k != "$defs"}
    schema.update(check.visit(body, ()))
    _drop_unused_defs(schema)
    return is_strict_schema(schema)


def _drop_unused_defs(schema: dict[str, Any]) -> None:
    # Inlining can leave a definition nobody refers to; it would only cost the model tokens.
    defs = schema.get("$defs")
    if not defs:
        return
    used: set[str] = set()
    pending = list(_refs({k: v for k, v in schema.items() if k != "$defs"}))
    while pending:
        name = pending.pop().rsplit("/", 1)[-1]
        if name not in used and name in defs:
            used.add(name)
            pending.extend(_refs(defs[name]))
    if len(used) == len(defs):
        return
    if used:
        schema["$defs"] = {k: v for k, v in defs.items() if k in used}
    else:
        del schema["$defs"]


class _StrictCheck:
    """Brings a schema as close to strict mode as is safe; ``is_strict_schema`` judges."""

    __slots__ = ("defs",)

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs

    def visit(self, node: Any, inlined: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if ref is not None and len(node) > 1:
            return self._inline(node, ref, inlined)
        node.pop("uniqueItems", None)
        if node.get("type") == "object" or "properties" in node:
            self._object(node, inlined)
        items = node.get("items")
        if items is not None:
            node["items"] = self.visit(items, inlined)
        any_of = node.get("anyOf")
        if isinstance(any_of, list):
            node["anyOf"] = [self.visit(member, inlined) for member in any_of]
        return node

    def _object(self, node: dict[str, Any], inlined: tuple[str, ...]) -> None:
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if not isinstance(properties, dict):
            # dict[str, T]: the keys are not known in advance, which strict mode cannot say.
            if isinstance(extra, dict):
                node["additionalProperties"] = self.visit(extra, inlined)
            return
        required = set(node.get("required", ()))
        for name, prop in properties.items():
            if (
                name not in required
                and isinstance(prop, dict)
                and "default" in prop
                and prop["default"] is None
                and _admits_null(prop)
            ):
                del prop["default"]
                required.add(name)
        node["required"] = [name for name in properties if name in required]
        if extra is None:
            node["additionalProperties"] = False
        for name, prop in properties.items():
            properties[name] = self.visit(prop, inlined)

    def _inline(self, node: dict[str, Any], ref: str, inlined: tuple[str, ...]) -> Any:
        # Strict mode takes no keywords beside a $ref, so a field's description next to the
        # reference to its type means copying the referenced schema in (once per path: a
        # recursive type keeps its bare reference further down, and so is not strict).
        name = ref.rsplit("/", 1)[-1]
        target = self.defs.get(name)
        if name in inlined or not isinstance(target, dict):
            return node
        merged = copy.deepcopy(target)
        merged.update((k, v) for k, v in node.items() if k != "$ref")
        return self.visit(merged, (*inlined, name))


def _admits_null(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    members = schema.get("anyOf")
    return isinstance(members, list) and any(
        isinstance(m, dict) and _admits_null(m) for m in members
    )


def _json_reader(
    adapter: TypeAdapter[Any],
    exact: bool,
    check: _EmptyObjectCheck | None = None,
    *,
    wrapped: bool = False,
) -> Callable[[str], Any]:
    """The adapter's JSON validation; with ``exact`` (a type of `_decimals_only`), numbers
    are read as written (pydantic reads a JSON number as a float: ``1.10`` would be
    ``Decimal("1.1")``, and a 19-digit amount would lose its last digits). With ``check``
    (`_empty_object_check`), an object it finds is refused; with ``wrapped``, it looks in
    the answer's ``"value"``."""
    validate_json = adapter.validator.validate_json
    if not exact and check is None:
        return validate_json
    validate_python = adapter.validator.validate_python
    numbers = Decimal if exact else float

    def read(text: str) -> Any:
        try:
            data = json.loads(text, parse_float=numbers)
        except (TypeError, ValueError, RecursionError):
            return validate_json(text)  # not JSON: pydantic says why, as it would have
        if check is not None:
            value = data.get("value") if wrapped and type(data) is dict else data
            _refuse_empty_objects(check, value)
        return validate_python(data) if exact else validate_json(text)

    return read


def _refuse_empty_objects(check: _EmptyObjectCheck | None, data: Any) -> None:
    """Raise ``ValidationError`` for an object ``check`` finds in ``data``."""
    fields = check(data) if check is not None else None
    if fields is None:
        return
    raise ValidationError.from_exception_data(
        "answer",
        [
            {
                "type": PydanticCustomError(
                    "no_known_field",
                    "the object has none of the fields {fields}",
                    {"fields": ", ".join(sorted(fields))},
                ),
                "loc": (),
                "input": data,
            }
        ],
    )


def _decimals_only(tp: Any) -> bool:
    """Whether ``tp`` holds Decimals and nothing else of its own (None aside): ``Decimal``,
    ``Decimal | None``, ``list[Decimal]``, ``dict[str, Decimal]``...

    Only such a type is read with Python's JSON parser and validated in Python mode: that
    mode reads other types differently (a strict model refuses a date as text, a union
    with ``str`` takes text first), so a model keeps pydantic's JSON mode, floats and all.
    """
    tp = _unaliased(tp)
    if tp is Decimal:
        return True
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in _UNION_ORIGINS:
        members = [m for m in args if m is not _NONE_TYPE]
        return bool(members) and all(_decimals_only(m) for m in members)
    if origin in _SEQUENCES or origin is tuple:
        items = [a for a in args if a is not Ellipsis]
        return bool(items) and all(_decimals_only(a) for a in items)
    if origin is dict and len(args) == 2:
        return _decimals_only(args[1])
    return False


_PROSE: Final = "An answer in words, not JSON: {see} [1]."


def _admits_text(adapter: TypeAdapter[Any]) -> bool:
    try:
        return bool(adapter.validate_python(_PROSE) == _PROSE)
    except ValidationError:
        return False


def _admits_none(adapter: TypeAdapter[Any]) -> bool:
    try:
        adapter.validate_python(None)
    except ValidationError:
        return False
    return True


# --- names -------------------------------------------------------------------------------

_NAME_JUNK: Final = re.compile(r"[^a-zA-Z0-9_-]+")


def _schema_name(tp: Any) -> str:
    """A response format name from the type: ``Verdict``, ``list_int``, ``int_or_None``."""
    name = _NAME_JUNK.sub("_", _name_parts(tp)).strip("_")
    return name[:64].rstrip("_") or "Output"


def _name_parts(tp: Any) -> str:
    tp = _strip_annotated(tp)
    if tp is None or tp is _NONE_TYPE:
        return "None"
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in _UNION_ORIGINS:
        return "_or_".join(_name_parts(a) for a in args)
    if origin is Literal:
        return "Literal_" + "_".join(str(getattr(v, "name", v)) for v in args)
    if origin is not None:
        parts = [_name_parts(a) for a in args if a is not Ellipsis]
        return "_".join([getattr(origin, "__name__", "generic"), *parts])
    return str(getattr(tp, "__name__", tp))


def _type_name(tp: Any) -> str:
    """The type as a reader would write it: ``list[Verdict]``, ``int | None``."""
    if tp is None or tp is _NONE_TYPE:
        return "None"
    if tp is Ellipsis:
        return "..."
    origin = get_origin(tp)
    if origin is Annotated:
        return _type_name(tp.__origin__)
    args = get_args(tp)
    if origin in _UNION_ORIGINS:
        return " | ".join(_type_name(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(v) for v in args)}]"
    if origin is not None and args:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', repr(origin))}[{inner}]"
    if isinstance(tp, type):
        return tp.__name__
    return repr(tp).removeprefix("typing.")


# --- parsing -----------------------------------------------------------------------------

_FENCE: Final = re.compile(r"```(?:[ \t]*[\w+.-]*[ \t]*\r?\n)?(.*?)(?:```|\Z)", re.DOTALL)
_OPENING: Final = re.compile(r"[\[{]")
_DECODER: Final = json.JSONDecoder()
_MAX_EMBEDDED_TRIES: Final = 32
_TOKEN_JUNK: Final = " \t\r\n`'\"*"
_MAX_ERRORS_SHOWN: Final = 3
_MAX_INPUT_SHOWN: Final = 80


class _JsonParser:
    """Reads an answer into a typed value; tried in order, cheapest first."""

    __slots__ = (
        "_admits_none",
        "_admits_text",
        "_check",
        "_numbers",
        "_scalar",
        "_shown",
        "_validate",
        "_validate_json",
        "_wrapped",
    )

    def __init__(
        self,
        adapter: TypeAdapter[Any],
        wrapper: TypeAdapter[Any] | None,
        scalar: bool,
        admits_none: bool,
        shown: str,
        *,
        exact_decimals: bool,
        check: _EmptyObjectCheck | None = None,
    ) -> None:
        # The validators themselves, not the adapters: skips a layer of Python per call.
        self._validate_json = _json_reader(adapter, exact_decimals, check)
        self._validate = adapter.validator.validate_python
        self._wrapped = (
            _json_reader(wrapper, exact_decimals, check, wrapped=True)
            if wrapper is not None
            else None
        )
        self._check = check
        self._numbers: Callable[[str], Any] = Decimal if exact_decimals else float
        self._scalar = scalar
        self._admits_none = admits_none
        self._admits_text = _admits_text(adapter)
        self._shown = shown

    def parser(self) -> Callable[[str | None], Any]:
        """The parse function: the fast path, falling back on the lenient one."""
        # A closure over locals, not a method: half the Python overhead per call.
        # None goes to pydantic too: its ValidationError leads to the empty-answer handling
        # without a check on the fast path.
        validate_json = typing.cast(Callable[[str | None], Any], self._validate_json)
        lenient = self._lenient
        wrapped = self._wrapped
        if wrapped is None:

            def parse(text: str | None) -> Any:
                try:
                    return validate_json(text)
                except ValidationError as error:
                    return lenient(text or "", error)

            return parse

        def parse_wrapped(text: str | None) -> Any:
            try:
                if text is not None and text[:1] == "{":
                    return wrapped(text)["value"]
                return validate_json(text)
            except ValidationError as error:
                return lenient(text or "", error)

        return parse_wrapped

    def _lenient(self, text: str, first: ValidationError) -> Any:
        stripped = text.strip()
        if not stripped:
            if self._admits_none:
                return None
            raise ValueError(f"The answer was empty; expected {self._shown}. {_RETRY_HINT}")
        if self._admits_text:
            # Any text is a value of the type (a union with str): a fenced block may hold
            # its other members' JSON, but text found inside prose is never the answer: the
            # answer is the text as written.
            blocks = [m.group(1).strip() for m in _FENCE.finditer(text)] if "```" in text else []
            if stripped[:1] in ("{", "["):
                blocks.append(stripped)  # the whole answer is JSON of another member
            for block in blocks:
                found, value = self._try_json(block, [])
                if found and not isinstance(value, str):
                    return value
            with contextlib.suppress(ValidationError):
                return self._validate(text)
        errors: list[ValidationError] = [first]
        tried: set[str] = set()
        for candidate in _json_candidates(text, stripped):
            if candidate in tried:
                continue
            tried.add(candidate)
            found, value = self._try_json(candidate, errors)
            if found:
                return value
        if self._scalar:
            for token in _tokens(text, stripped):
                try:
                    return self._validate(token)
                except ValidationError as error:
                    errors.append(error)
        raise ValueError(self._message(errors))

    def _try_json(self, candidate: str, errors: list[ValidationError]) -> tuple[bool, Any]:
        is_object = candidate[:1] == "{"
        if self._wrapped is not None and is_object:
            try:
                return True, self._wrapped(candidate)["value"]
            except ValidationError as error:
                errors.append(error)
        try:
            return True, self._validate_json(candidate)
        except ValidationError as error:
            errors.append(error)
        if is_object:
            # A model that wraps its answer in a one-key object, {"value": ...} or
            # {"answer": ...}, is unwrapped; an object type only from {"value": ...}.
            try:
                data = json.loads(candidate, parse_float=self._numbers)
            except (ValueError, RecursionError):
                return False, None
            if isinstance(data, dict) and len(data) == 1:
                ((key, inner),) = data.items()
                if self._wrapped is not None or key == "value":
                    try:
                        _refuse_empty_objects(self._check, inner)
                        return True, self._validate(inner)
                    except ValidationError as error:
                        errors.append(error)
        return False, None

    def _message(self, errors: list[ValidationError]) -> str:
        best = next((e for e in errors if _is_informative(e)), None)
        if best is None:
            detail = errors[0].errors(include_url=False)[0]["msg"]
            return f"The answer is not JSON for {self._shown} ({detail}). {_RETRY_HINT}"
        return f"The answer is not a valid {self._shown}:\n{_describe(best)}\n{_RETRY_HINT}"


def _json_candidates(text: str, stripped: str) -> Iterator[str]:
    if "```" in text:
        for match in _FENCE.finditer(text):
            yield match.group(1).strip()
    yield stripped
    yield from _embedded_json(text)


def _embedded_json(text: str) -> Iterator[str]:
    """The JSON objects and arrays in prose, as written, first to last."""
    match = _OPENING.search(text)
    for _ in range(_MAX_EMBEDDED_TRIES):
        if match is None:
            return
        start = match.start()
        try:
            _, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            match = _OPENING.search(text, start + 1)
            continue
        yield text[start:end]
        match = _OPENING.search(text, end)


def _tokens(text: str, stripped: str) -> Iterator[str]:
    yield stripped
    token = stripped
    while True:
        # Markup and a final period, in any order: **Yes**. or "No". or `42`.
        shorter = token.strip(_TOKEN_JUNK).rstrip(".")
        if shorter == token:
            break
        token = shorter
    if token != stripped:
        yield token
    if "```" in text:
        for match in _FENCE.finditer(text):
            yield match.group(1).strip(_TOKEN_JUNK)


def _is_informative(error: ValidationError) -> bool:
    # Invalid JSON says less than a schema mismatch, and a wrapper's missing "value" only
    # says the answer was not wrapped.
    details = error.errors(include_url=False)
    return not all(
        d["type"] == "json_invalid" or (d["type"] == "missing" and d["loc"] == ("value",))
        for d in details
    )


def _describe(error: ValidationError) -> str:
    details = error.errors(include_url=False)
    lines = []
    for detail in details[:_MAX_ERRORS_SHOWN]:
        where = ".".join(str(part) for part in detail["loc"])
        shown = repr(detail["input"])
        if len(shown) > _MAX_INPUT_SHOWN:
            shown = shown[: _MAX_INPUT_SHOWN - 3] + "..."
        message = f"{detail['msg']} (got {shown})"
        lines.append(f"- {where}: {message}" if where else f"- {message}")
    if len(details) > _MAX_ERRORS_SHOWN:
        lines.append(f"- and {len(details) - _MAX_ERRORS_SHOWN} more errors")
    return "\n".join(lines)
