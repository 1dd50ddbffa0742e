"""Listener hooks gathered once per service, and calling them safely."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from types import FunctionType, MethodType
from typing import Any, Final

__all__ = ["Hooks", "emit", "logger"]

logger: Final = logging.getLogger("aiservices")

# Each hook with the arguments it is called with.
_ARGUMENTS: Final = {
    "on_call_start": ("call",),
    "on_request": ("call", "request"),
    "on_response": ("call", "request", "response"),
    "on_tool_start": ("call", "request"),
    "on_tool_end": ("call", "execution"),
    "on_call_end": ("call", "result"),
    "on_error": ("call", "error"),
}
_HOOKS: Final = tuple(_ARGUMENTS)


class Hooks:
    """The listeners' bound hooks, gathered once per service, per event."""

    __slots__ = _HOOKS
    on_call_start: tuple[Callable[..., None], ...]
    on_request: tuple[Callable[..., None], ...]
    on_response: tuple[Callable[..., None], ...]
    on_tool_start: tuple[Callable[..., None], ...]
    on_tool_end: tuple[Callable[..., None], ...]
    on_call_end: tuple[Callable[..., None], ...]
    on_error: tuple[Callable[..., None], ...]

    def __init__(self, listeners: Sequence[object]) -> None:
        for name in _HOOKS:
            found = tuple(
                hook for listener in listeners if callable(hook := getattr(listener, name, None))
            )
            setattr(self, name, found)

    @staticmethod
    def check(listeners: Sequence[object]) -> list[str]:
        """Problems with the given listeners: a class instead of an instance, an object
        without any known hook, an ``async def`` hook (hooks are called, never awaited), a
        hook that can't take the arguments it is called with."""
        import inspect

        problems: list[str] = []
        for i, listener in enumerate(listeners):
            if isinstance(listener, type):
                problems.append(
                    f"listeners[{i}]: {listener.__name__} is a class; pass an instance "
                    f"({listener.__name__}())"
                )
            elif not any(callable(getattr(listener, name, None)) for name in _HOOKS):
                problems.append(
                    f"listeners[{i}]: {listener!r} has none of the hooks {', '.join(_HOOKS)}"
                )
            for name, arguments in _ARGUMENTS.items():
                hook = getattr(listener, name, None)
                if not callable(hook) or isinstance(listener, type):
                    continue
                # Looked up on the class, or set on the instance itself: a test double of a
                # listener (unittest.mock's autospec) answers every question about its
                # instance's methods with yes.
                own = getattr(listener, "__dict__", {}).get(name)
                if type(own) is MethodType:  # another object's method (a sink's)
                    own = own.__func__
                if inspect.iscoroutinefunction(getattr(type(listener), name, None)) or (
                    # (a function's own type and code: a mock of a method claims both)
                    type(own) is FunctionType and own.__code__.co_flags & inspect.CO_COROUTINE
                ):
                    problems.append(
                        f"listeners[{i}]: {name} is async; hooks are plain functions, called "
                        "without being awaited (hand slow work to a queue)"
                    )
                    continue
                try:
                    inspect.signature(hook).bind(*arguments)
                except TypeError:
                    problems.append(
                        f"listeners[{i}]: {name}{inspect.signature(hook)} can't take the "
                        f"arguments it is called with: {name}({', '.join(arguments)})"
                    )
                except ValueError:
                    pass  # no signature to read (a builtin): called as it is
        return problems


def emit(hooks: tuple[Callable[..., None], ...], *args: Any) -> None:
    """Call each hook; a failing hook is logged, never raised."""
    for hook in hooks:
        try:
            hook(*args)
        except Exception:
            logger.exception("listener %r failed", hook)
