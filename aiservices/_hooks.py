"""Listener hooks gathered once per service, and calling them safely."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = ["Hooks", "emit", "logger"]

logger: Final = logging.getLogger("aiservices")

_HOOKS: Final = (
    "on_call_start",
    "on_request",
    "on_response",
    "on_tool_start",
    "on_tool_end",
    "on_call_end",
    "on_error",
)


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
        without any known hook, an ``async def`` hook (hooks are called, never awaited)."""
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
            problems += [
                f"listeners[{i}]: {name} is async; hooks are plain functions, called "
                "without being awaited (hand slow work to a queue)"
                for name in _HOOKS
                # Looked up on the class: a test double of a listener (unittest.mock's
                # autospec) answers every question about its instance's methods with yes.
                if inspect.iscoroutinefunction(getattr(type(listener), name, None))
            ]
        return problems


def emit(hooks: tuple[Callable[..., None], ...], *args: Any) -> None:
    """Call each hook; a failing hook is logged, never raised."""
    for hook in hooks:
        try:
            hook(*args)
        except Exception:
            logger.exception("listener %r failed", hook)
