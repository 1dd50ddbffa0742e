"""``@system_message`` and ``@user_message``: prompt templates declared on an interface."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final, TypeVar

__all__ = ["system_message", "user_message"]

_T = TypeVar("_T", bound=Callable[..., Any] | type)

SYSTEM_ATTRIBUTE: Final = "__aiservices_system_message__"
USER_ATTRIBUTE: Final = "__aiservices_user_message__"


def _join(template: str | list[str] | tuple[str, ...], decorator: str) -> str:
    if isinstance(template, str):
        return template
    if isinstance(template, (list, tuple)) and all(isinstance(t, str) for t in template):
        return "\n".join(template)
    raise TypeError(f"@{decorator} takes a template string (or a list of lines), not {template!r}")


def system_message(template: str | list[str] | tuple[str, ...]) -> Callable[[_T], _T]:
    """Give a method (or, on the interface class, every method) a system message template.

    A list of strings is joined with newlines. ``{{name}}`` placeholders are filled from
    the method's parameters; they are checked when the service is built.
    """
    text = _join(template, "system_message")

    def decorate(target: _T) -> _T:
        check_decorated(target, "@system_message")
        _refuse_twice(target, SYSTEM_ATTRIBUTE, "system_message")
        setattr(target, SYSTEM_ATTRIBUTE, text)
        return target

    return decorate


def user_message(template: str | list[str] | tuple[str, ...]) -> Callable[[_T], _T]:
    """Give a method the template of the user message it sends.

    Without it, the user message is the method's one parameter that no template uses.
    """
    text = _join(template, "user_message")

    def decorate(target: _T) -> _T:
        check_decorated(target, "@user_message", on_class=False)
        _refuse_twice(target, USER_ATTRIBUTE, "user_message")
        setattr(target, USER_ATTRIBUTE, text)
        return target

    return decorate


def check_decorated(target: object, decorator: str, *, on_class: bool = True) -> None:
    """Raise ``TypeError`` unless ``target`` is what an interface decorator goes on: a
    method (plain, static or class, or a property) or, with ``on_class``, the interface."""
    if inspect.isfunction(target) or isinstance(target, staticmethod | classmethod | property):
        return
    if on_class and isinstance(target, type):
        return
    where = "an interface method or on the interface class" if on_class else "a method"
    raise TypeError(
        f"{decorator} goes on {where}, not on {target!r:.60}; with the class decorator "
        "form, write it below @ai_service(...), where it decorates the interface"
    )


def _refuse_twice(target: object, attribute: str, decorator: str) -> None:
    # Stacked, the outer one would replace the inner without a word.
    if attribute in getattr(target, "__dict__", {}):
        name = getattr(target, "__qualname__", repr(target))
        raise TypeError(
            f"@{decorator} is given twice to {name}; give one template (a list of strings "
            "is joined with newlines)"
        )
