"""``typing.TypedDict`` classes made readable by pydantic on Python 3.11.

Pydantic reads only ``typing_extensions.TypedDict`` before Python 3.12: an equivalent one
is made from the class's annotations and required keys, for return types and tool
parameters alike.
"""

from __future__ import annotations

import operator
import sys
import typing
from collections.abc import Callable
from typing import Annotated, Any, Final, Union, get_args, get_origin

import typing_extensions

__all__ = ["NEEDS_TWINS", "UnreadableTypedDict", "is_typing_typeddict", "twin", "with_twins"]

NEEDS_TWINS: Final = sys.version_info < (3, 12)

# The functional form, typed loosely: its result is a class made at run time.
_new_typeddict: Final[Any] = typing_extensions.TypedDict


class UnreadableTypedDict(TypeError):
    """A ``typing.TypedDict`` no twin can be made of; the message says why."""


def is_typing_typeddict(tp: object) -> bool:
    """Whether ``tp`` is a ``typing.TypedDict`` that pydantic cannot read here."""
    return (
        NEEDS_TWINS
        and isinstance(tp, type)
        and typing_extensions.is_typeddict(tp)
        and type(tp).__module__ == "typing"
    )


def twin(tp: type, done: dict[type, type], field_type: Callable[[Any], Any]) -> type:
    """A ``typing_extensions.TypedDict`` equal to ``tp``; ``field_type`` prepares each
    field's type, and ``done`` maps the classes twinned so far (which also ends the walk of
    a recursive TypedDict)."""
    found = done.get(tp)
    if found is not None:
        return found
    name = tp.__qualname__
    if getattr(tp, "__parameters__", ()):
        raise UnreadableTypedDict(
            f"{name} is a generic typing.TypedDict, which pydantic reads only on Python "
            "3.12+; declare it with typing_extensions.TypedDict"
        )
    try:
        hints = typing.get_type_hints(tp, include_extras=True)
    except Exception as exc:
        raise UnreadableTypedDict(f"the annotations of {name} cannot be resolved ({exc})") from None
    # Created empty and registered first, so a field that refers back to this TypedDict
    # finds it; pydantic reads the fields and required keys from these attributes.
    made = _new_typeddict(tp.__name__, {}, total=getattr(tp, "__total__", True))
    done[tp] = made
    required = set(tp.__required_keys__)  # type: ignore[attr-defined]
    fields = {}
    for key, hint in hints.items():
        # Python 3.11 misses Required / NotRequired written as strings (postponed
        # annotations) when it sorts the keys; the resolved hints show them.
        origin = get_origin(hint)
        if origin is typing.Required:
            required.add(key)
        elif origin is typing.NotRequired:
            required.discard(key)
        fields[key] = field_type(_strip_required(hint))
    made.__annotations__ = fields
    made.__required_keys__ = frozenset(required)
    made.__optional_keys__ = frozenset(fields.keys() - required)
    made.__mutable_keys__ = frozenset(fields)
    made.__readonly_keys__ = frozenset()
    made.__module__ = tp.__module__
    made.__qualname__ = tp.__qualname__
    made.__doc__ = tp.__doc__
    config = getattr(tp, "__pydantic_config__", None)
    if config is not None:
        made.__pydantic_config__ = config
    return typing.cast(type, made)


def with_twins(tp: Any, done: dict[type, type] | None = None) -> Any:
    """``tp`` with every ``typing.TypedDict`` in it, however deep, replaced by its twin."""
    if not NEEDS_TWINS:
        return tp
    done = {} if done is None else done
    if is_typing_typeddict(tp):
        return twin(tp, done, lambda hint: with_twins(hint, done))
    if isinstance(tp, typing_extensions.TypeAliasType):
        value = with_twins(tp.__value__, done)
        return tp if value is tp.__value__ else value
    if hasattr(tp, "__supertype__"):  # typing.NewType: its values are the supertype's
        value = with_twins(tp.__supertype__, done)
        return tp if value is tp.__supertype__ else value
    args = get_args(tp)
    if not args:
        return tp
    origin = get_origin(tp)
    if is_typing_typeddict(origin):
        twin(origin, done, lambda hint: with_twins(hint, done))  # says why it can't be
    if origin is Annotated:
        inner = with_twins(tp.__origin__, done)
        return tp if inner is tp.__origin__ else Annotated[(inner, *tp.__metadata__)]
    if origin is typing.Literal:
        return tp
    new = tuple(a if isinstance(a, list | type(...)) else with_twins(a, done) for a in args)
    if all(map(operator.is_, new, args)):
        return tp
    if origin is Union or isinstance(tp, type(int | str)):
        return Union[new]  # noqa: UP007
    return origin[new] if origin is not None else tp


def _strip_required(tp: Any) -> Any:
    while get_origin(tp) in (typing.Required, typing.NotRequired):
        tp = get_args(tp)[0]
    return tp
