"""Listeners: see every call, model request, tool run and error of a service.

```python
class Timing:
    def on_request(self, call, request):
        call.attributes["t"] = time.perf_counter()

    def on_response(self, call, request, response):
        print(time.perf_counter() - call.attributes["t"])

bot = ai_service(Assistant, model=..., listeners=[Timing()])
```

A listener defines any of the ``on_*`` methods of :class:`ServiceListener`; the others are
skipped at no cost. Listeners run on the calling thread (or event loop), in the order given,
and must be quick. An exception in a listener is logged on the ``aiservices`` logger and
does not break the call (as in LangChain4j's ``ChatModelListener``).

The ``aiservices`` logger records each call at DEBUG: method, memory id, turn id, model
rounds, tool executions and token usage; never message contents.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from .messages import ToolExecutionRequest
from .models import ChatRequest, ChatResponse

if TYPE_CHECKING:
    from .tools import ToolExecution

__all__ = ["CallInfo", "ServiceListener"]

logger: Final = logging.getLogger("aiservices")


@dataclass(slots=True)
class CallInfo:
    """One service call, as listeners see it; ``attributes`` is theirs to keep state in."""

    method: str
    memory_id: Hashable | None
    turn_id: str
    model_name: str | None
    attributes: dict[str, Any] = field(default_factory=dict)


class ServiceListener(Protocol):
    """The hooks a listener may define; every one is optional."""

    def on_call_start(self, call: CallInfo) -> None: ...

    def on_request(self, call: CallInfo, request: ChatRequest) -> None: ...

    def on_response(self, call: CallInfo, request: ChatRequest, response: ChatResponse) -> None: ...

    def on_tool_start(self, call: CallInfo, request: ToolExecutionRequest) -> None: ...

    def on_tool_end(self, call: CallInfo, execution: ToolExecution) -> None: ...

    def on_call_end(self, call: CallInfo, result: Any) -> None:
        """The call succeeded; ``result`` is a ``Result`` whatever the method returns."""
        ...

    def on_error(self, call: CallInfo, error: BaseException) -> None: ...


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
        """Problems with the given listeners (objects without any known hook)."""
        return [
            f"listeners[{i}]: {listener!r} has none of the hooks {', '.join(_HOOKS)}"
            for i, listener in enumerate(listeners)
            if not any(callable(getattr(listener, name, None)) for name in _HOOKS)
        ]


def emit(hooks: tuple[Callable[..., None], ...], *args: Any) -> None:
    """Call each hook; a failing hook is logged, never raised."""
    for hook in hooks:
        try:
            hook(*args)
        except Exception:
            logger.exception("listener %r failed", hook)
