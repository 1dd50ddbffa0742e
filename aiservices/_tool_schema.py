"""A tool's signature, read once: its arguments' JSON schema and their validator.

The schema and the validator come from the same pydantic type (a ``TypedDict`` with one key
per parameter), so what the model is shown is exactly what is accepted.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, NotRequired, Required, get_args, get_origin

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema, core_schema, to_json, to_jsonable_python
from typing_extensions import TypedDict

from ._typeddicts import UnreadableTypedDict, with_twins
from .errors import InterfaceError
from .markers import Context, MemoryId, is_marker, metadata_of

__all__ = [
    "SchemaGenerator",
    "ToolSignature",
    "clean_json_schema",
    "describe_validation_error",
    "read_signature",
]

_EMPTY: Final = inspect.Parameter.empty
_VARIADIC: Final = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_ARGUMENTS_CONFIG: Final = ConfigDict(extra="forbid")
# typing's TypedDict is not enough for pydantic before Python 3.12; built from a dict of
# fields, it is out of a type checker's sight anyway.
_typed_dict: Any = TypedDict


@dataclass(frozen=True, slots=True)
class ToolSignature:
    """A tool's parameters as the model sees them, and how its arguments become a call.

    ``validate_json`` turns the model's JSON arguments into keyword arguments (pydantic's
    ``ValidationError`` when they do not fit). ``positional`` lists positional-only
    parameters with their defaults; ``memory_id`` and ``context`` are the parameters that
    receive the memory id and the call's context, hidden from ``schema``.
    """

    schema: Mapping[str, Any]
    validate_json: Callable[[str | bytes], dict[str, Any]]
    memory_id: str | None
    positional: tuple[tuple[str, Any], ...]
    returns_nothing: bool
    context: str | None = None

    def bind(
        self, arguments: str, memory_id: object, context: object = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Validate the model's arguments; positional and keyword arguments for the call."""
        # Providers send "" for a call without arguments.
        kwargs = self.validate_json(arguments or "{}")
        if self.memory_id is not None:
            kwargs[self.memory_id] = memory_id
        if self.context is not None:
            kwargs[self.context] = context
        if not self.positional:
            return (), kwargs
        pop = kwargs.pop
        return tuple(pop(name, default) for name, default in self.positional), kwargs


class SchemaGenerator(GenerateJsonSchema):
    """The JSON schema a model is shown, for tool arguments and answers alike."""

    # A default that has no JSON form is simply left out of the schema, without a warning.
    ignored_warning_kinds = {"skipped-choice", "non-serializable-default"}  # noqa: RUF012

    def enum_schema(self, schema: core_schema.EnumSchema) -> JsonSchemaValue:
        # The values of an enum that are not text (auto(), an IntEnum, tuples) say nothing
        # of what they mean: the description says which member each one is. (Noted here,
        # written by `generate`: pydantic sets an enum's description from its docstring
        # after this returns.)
        result = super().enum_schema(schema)
        members = schema["members"]
        if not all(isinstance(m.value, str) for m in members):
            result[_MEANINGS] = ", ".join(
                f"{to_json(to_jsonable_python(m.value)).decode()} = {m.name}" for m in members
            )
        return result

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        result = super().generate(schema, mode)
        _describe_meanings(result)
        return result


_MEANINGS: Final = "x-member-values"


def _describe_meanings(root: dict[str, Any]) -> None:
    """Write the noted meanings of enum values into descriptions: the enum's own, and
    that of each field (or parameter) that refers to it with a description of its own,
    which would hide the enum's."""
    by_ref = {
        f"#/$defs/{name}": found[_MEANINGS]
        for name, found in (root.get("$defs") or {}).items()
        if isinstance(found, dict) and _MEANINGS in found
    }
    if by_ref:
        _describe_referrers(root, by_ref)
    _describe_own(root)


def _describe_referrers(node: Any, by_ref: dict[str, str]) -> None:
    if isinstance(node, dict):
        meanings = by_ref.get(node.get("$ref"))  # type: ignore[arg-type]
        description = node.get("description")
        if meanings is not None and isinstance(description, str):
            node["description"] = f"{description} ({meanings})"
        for value in node.values():
            _describe_referrers(value, by_ref)
    elif isinstance(node, list):
        for value in node:
            _describe_referrers(value, by_ref)


def _describe_own(node: Any) -> None:
    if isinstance(node, dict):
        meanings = node.pop(_MEANINGS, None)
        if meanings is not None:
            description = node.get("description")
            node["description"] = f"{description} ({meanings})" if description else meanings
        for value in node.values():
            _describe_own(value)
    elif isinstance(node, list):
        for value in node:
            _describe_own(value)


def _schema_name(name: str, metadata: tuple[Any, ...]) -> str:
    """The property a parameter is shown as: its alias, when a ``Field`` gives one."""
    for item in reversed(metadata):
        if isinstance(item, FieldInfo):
            alias = item.validation_alias if isinstance(item.validation_alias, str) else item.alias
            if alias is not None:
                return alias
    return name


def read_signature(fn: Callable[..., Any], *, skip_first: bool, where: str) -> ToolSignature:
    """Analyse ``fn``'s parameters; every problem found is raised in one ``InterfaceError``.

    ``skip_first`` drops the first parameter (``self`` or ``cls`` of a method called bound);
    ``where`` names the tool in problems, ``Calculator.add`` giving ``Calculator.add(b): ...``.
    """
    try:
        try:
            signature = inspect.signature(fn, eval_str=True)
        except NameError:
            signature = _parameters_evaluated(fn)
    except (NameError, SyntaxError, TypeError, ValueError) as exc:
        raise InterfaceError(
            f"{where}: its signature cannot be read ({exc}); define the types it names at "
            "module level, before the tool is used"
        ) from None
    parameters = list(signature.parameters.values())
    if skip_first and parameters and parameters[0].kind not in _VARIADIC:
        parameters = parameters[1:]
    # A partial's keywords are fixed: the model is neither shown them nor may it send them.
    fixed = fn.keywords if isinstance(fn, functools.partial) else {}

    problems: list[str] = []
    fields: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    positional: list[tuple[str, Any]] = []
    memory_id: str | None = None
    context: str | None = None
    twins: dict[type, type] = {}
    sent_names: dict[str, str] = {}  # the property each parameter is sent as -> its name
    for param in parameters:
        if param.name in fixed:
            continue
        pwhere = f"{where}({param.name})"
        if param.kind in _VARIADIC:
            stars = "*" if param.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            problems.append(
                f"{pwhere}: a tool cannot take {stars}{param.name}: the model calls tools with "
                "named arguments; declare each argument as its own parameter"
            )
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append((param.name, param.default))
        if param.annotation is _EMPTY and param.name in ("self", "cls") and param is parameters[0]:
            problems.append(
                f"{pwhere}: this is a method taken from its class, not bound to an object; "
                "pass an instance (tools=[Orders()] gives its @tool methods) or a bound "
                "method (tools=[orders.find])"
            )
            continue
        if param.annotation is _EMPTY:
            problems.append(
                f"{pwhere}: the parameter has no type; annotate it (`{param.name}: str`, say) "
                "so that the model is told what to send (`typing.Any` accepts anything)"
            )
            continue
        annotation = param.annotation
        metadata: tuple[Any, ...] = (
            get_args(annotation)[1:] if get_origin(annotation) is Annotated else ()
        )
        markers = metadata_of(annotation)
        is_context = any(is_marker(m, Context) for m in markers)
        if is_context and any(is_marker(m, MemoryId) for m in markers):
            problems.append(
                f"{pwhere}: a Context parameter cannot also be a MemoryId; mark it with one "
                "(a tool that needs both takes two parameters)"
            )
            continue
        if any(is_marker(m, MemoryId) for m in markers):
            if memory_id is not None:
                problems.append(
                    f"{pwhere}: a second MemoryId parameter (the first is {memory_id}); "
                    "mark only one"
                )
            memory_id = param.name
            continue
        if is_context:
            if context is not None:
                problems.append(
                    f"{pwhere}: a second Context parameter (the first is {context}); mark only one"
                )
            context = param.name
            continue
        try:
            # Only what the model is shown: a Context or MemoryId is never validated.
            annotation = with_twins(annotation, twins)
        except UnreadableTypedDict as exc:
            problems.append(f"{pwhere}: {exc}")
            continue
        default = param.default
        sent_as = _schema_name(
            param.name, (*metadata, default) if isinstance(default, FieldInfo) else metadata
        )
        if sent_as in sent_names:
            problems.append(
                f"{pwhere}: the model would send it as {sent_as!r}, as it sends "
                f"{sent_names[sent_as]}; give each parameter a name or alias of its own"
            )
            continue
        sent_names[sent_as] = param.name
        if isinstance(default, FieldInfo):
            # `x: int = Field(3, description=...)`: pydantic reads the field, the default too.
            fields[param.name] = _field(Annotated[annotation, default], default.is_required())
            continue
        if default is not _EMPTY and _has_field_default(metadata):
            problems.append(
                f"{pwhere}: two defaults, one in Field(default=...) and one after `=`; the "
                "model would be shown one and the tool given the other: keep one"
            )
            continue
        if default is None and not _admits_none(annotation):
            # `limit: int = None`, the old spelling of an optional parameter: the model is
            # shown the default, so it must be allowed to send it.
            annotation = _optional(annotation)
        required = default is _EMPTY and not _has_field_default(metadata)
        fields[param.name] = _field(annotation, required)
        if default is not _EMPTY:
            defaults[_schema_name(param.name, metadata)] = default
    if problems:
        raise InterfaceError(problems)

    arguments = _typed_dict(f"{_name_of(fn)}_arguments", fields)
    arguments.__module__ = getattr(fn, "__module__", None) or __name__
    arguments.__pydantic_config__ = _ARGUMENTS_CONFIG
    try:
        adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(arguments)
        raw = adapter.json_schema(schema_generator=SchemaGenerator)
    except Exception as exc:
        raise InterfaceError(_locate(fields, where, exc)) from None
    schema = clean_json_schema(raw)
    properties = schema["properties"]
    for name, default in defaults.items():
        shown = properties.get(name)
        if shown is None:
            continue  # shown under an alias this does not follow (AliasChoices, AliasPath)
        with contextlib.suppress(ValueError):  # no JSON form: the model is not told
            value = to_jsonable_python(default)
            if has_json_form(value):
                shown["default"] = value
    returns = signature.return_annotation
    return ToolSignature(
        schema=schema,
        validate_json=adapter.validator.validate_json,
        memory_id=memory_id,
        positional=tuple(positional),
        returns_nothing=returns is _EMPTY or returns is None or returns is type(None),
        context=context,
    )


def _parameters_evaluated(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with its parameters' types evaluated, its return type only if it
    can be: a type imported under ``TYPE_CHECKING`` for the return alone is common, and only
    whether the tool returns nothing is read from it. A parameter's type that can't be
    evaluated raises ``NameError``."""
    signature = inspect.signature(fn)
    target: Any = fn.func if isinstance(fn, functools.partial) else fn
    target = getattr(target, "__func__", target)
    if not inspect.isfunction(target):
        target = getattr(type(target), "__call__", target)  # noqa: B004 - a callable object
    namespace = getattr(inspect.unwrap(target), "__globals__", {})

    def evaluated(annotation: Any) -> Any:
        return eval(annotation, namespace) if isinstance(annotation, str) else annotation

    parameters = [
        p.replace(annotation=evaluated(p.annotation)) for p in signature.parameters.values()
    ]
    returns = signature.return_annotation
    try:
        returns = evaluated(returns)
    except Exception:
        returns = Any
    return signature.replace(parameters=parameters, return_annotation=returns)


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _field(annotation: Any, required: bool) -> Any:
    return Required[annotation] if required else NotRequired[annotation]


def _admits_none(annotation: Any) -> bool:
    try:
        TypeAdapter(annotation).validate_python(None)
    except Exception:
        return False
    return True


def _optional(annotation: Any) -> Any:
    """``annotation`` that also takes ``None``, its ``Annotated`` metadata kept."""
    if get_origin(annotation) is Annotated:
        base, *metadata = get_args(annotation)
        return Annotated[(base | None, *metadata)]
    return annotation | None


def _has_field_default(metadata: tuple[Any, ...]) -> bool:
    return any(isinstance(m, FieldInfo) and not m.is_required() for m in metadata)


def _locate(fields: dict[str, Any], where: str, exc: Exception) -> list[str]:
    """Find which parameters pydantic cannot handle: one problem each."""
    problems = []
    for name, annotation in fields.items():
        shown = get_args(annotation)[0]
        try:
            TypeAdapter(shown).json_schema(schema_generator=SchemaGenerator)
        except Exception as param_exc:
            problems.append(
                f"{where}({name}): the model cannot be shown or send a {_type_name(shown)} "
                f"({_first_line(param_exc)}); use str, numbers, bool, enums, Literal, lists, "
                "dicts, pydantic models or dataclasses"
            )
    return problems or [f"{where}: its parameters have no JSON schema ({_first_line(exc)})"]


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return getattr(annotation, "__qualname__", None) or repr(annotation)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# Keywords whose value maps names to schemas, holds one schema, or a list of schemas; any
# other value ("default", "enum", "const", "examples") is data and left alone.
_NAMED_SCHEMAS: Final = frozenset({"properties", "patternProperties", "dependentSchemas"})
_ONE_SCHEMA: Final = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_SCHEMA_LISTS: Final = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
_DEFS_PREFIX: Final = "#/$defs/"
# Data that only informs the model: left out when JSON can't carry it.
_EXAMPLE_DATA: Final = frozenset({"default", "examples"})


def has_json_form(value: object) -> bool:
    """Whether ``value`` (made JSON-able by pydantic) is valid JSON: no infinite or NaN
    float anywhere in it, which strict encoders (the SDKs' HTTP clients) refuse."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(has_json_form, value.values()))
    if isinstance(value, list | tuple):
        return all(map(has_json_form, value))
    return True


def clean_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Pydantic's schema in the form providers take: no titles, ``$ref`` inlined.

    A reference is replaced by the definition it points to, so the result has no ``$ref``
    unless a type is recursive: those definitions stay in a root ``$defs`` (local
    ``#/$defs/...`` references, which OpenAI and Anthropic accept). A discriminated union
    becomes a plain ``anyOf`` of its variants. The root of an object schema always has
    ``properties`` and ``required``.
    """
    definitions: dict[str, Any] = dict(schema.get("$defs", {}))
    recursive = _recursive_definitions(definitions)
    body = {k: v for k, v in schema.items() if k != "$defs"}
    cleaned: dict[str, Any] = _clean(body, definitions, recursive)
    if cleaned.get("type") == "object":
        ordered: dict[str, Any] = {"type": "object"}
        ordered["properties"] = cleaned.pop("properties", {})
        ordered["required"] = cleaned.pop("required", [])
        ordered.update(cleaned)
        cleaned = ordered
    kept = {name: _clean(definitions[name], definitions, recursive) for name in sorted(recursive)}
    if kept:
        cleaned["$defs"] = kept
    return cleaned


def _clean(node: Any, definitions: dict[str, Any], recursive: frozenset[str]) -> Any:
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
        name = ref[len(_DEFS_PREFIX) :]
        if name not in recursive and name in definitions:
            # Keywords next to the reference ("description", "default") override the
            # definition's own.
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            node = {**definitions[name], **siblings}
    # pydantic's discriminated unions: "discriminator" is OpenAPI, not JSON Schema, and its
    # mapping points into "$defs"; the variants are disjoint, so "anyOf" (which OpenAI's
    # strict mode takes, unlike "oneOf") means the same.
    discriminated = "discriminator" in node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (discriminated and key == "discriminator"):
            continue
        if discriminated and key == "oneOf":
            key = "anyOf"  # noqa: PLW2901
        if key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {n: _clean(s, definitions, recursive) for n, s in value.items()}
        elif key in _ONE_SCHEMA:
            out[key] = _clean(value, definitions, recursive)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_clean(s, definitions, recursive) for s in value]
        elif key in _EXAMPLE_DATA and not has_json_form(value):
            continue  # (an infinite or NaN default: JSON has no form for it)
        else:
            out[key] = value
    if discriminated and isinstance(out.get("anyOf"), list):
        # The tag picks the variant: pydantic wants it even where it has a default, so the
        # model is told to send it.
        tag = node["discriminator"].get("propertyName")
        out["anyOf"] = [_requiring(variant, tag) for variant in out["anyOf"]]
    return out


def _requiring(variant: Any, name: object) -> Any:
    if not isinstance(variant, dict) or name not in variant.get("properties", {}):
        return variant
    required = list(variant.get("required", []))
    return variant if name in required else {**variant, "required": [*required, name]}


def _recursive_definitions(definitions: Mapping[str, Any]) -> frozenset[str]:
    """The definitions that reach themselves through references."""
    edges = {name: _references(schema) for name, schema in definitions.items()}
    recursive = set()
    for start, targets in edges.items():
        stack = list(targets)
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name == start:
                recursive.add(start)
                break
            if name in seen or name not in edges:
                continue
            seen.add(name)
            stack.extend(edges[name])
    return frozenset(recursive)


def _references(node: Any) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
                found.add(ref[len(_DEFS_PREFIX) :])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


_SHOWN_ERRORS: Final = 5


def describe_validation_error(exc: ValidationError) -> str:
    """Pydantic's errors in one short line: ``b: Input should be a valid integer; ...``."""
    errors = exc.errors(include_url=False, include_context=False)
    parts = []
    for error in errors[:_SHOWN_ERRORS]:
        loc = ".".join(str(p) for p in error["loc"])
        message = error["msg"]
        if not loc and error["type"] == "dict_type":
            message = "the arguments must be a JSON object"
        elif error["type"] not in ("missing", "json_invalid", "extra_forbidden"):
            message = f"{message} (got {_short(error.get('input'))})"
        parts.append(f"{loc}: {message}" if loc else message)
    if len(errors) > _SHOWN_ERRORS:
        parts.append(f"and {len(errors) - _SHOWN_ERRORS} more")
    return "; ".join(parts)


_SHORT: Final = 60


def _short(value: Any) -> str:
    shown = to_json(value, fallback=repr).decode()
    return shown if len(shown) <= _SHORT else shown[: _SHORT - 3] + "..."
