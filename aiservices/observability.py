"""Listeners: see every call, model request, tool run and error of a service.

```python
class Timing:
    def on_request(self, call, request):
        call.attributes["t"] = time.perf_counter()

    def on_response(self, call, request, response):
        print(time.perf_counter() - call.attributes["t"])

bot = ai_service(Assistant, model=..., listeners=[Timing()])
```

A listener defines any of the ``on_*`` methods of ``ServiceListener``; the others are
skipped at no cost. Listeners run on the calling thread (or event loop), in the order given,
and must be quick. An exception in a listener is logged on the ``aiservices`` logger and
does not break the call (as in LangChain4j's ``ChatModelListener``).

The ``aiservices`` logger records each call at DEBUG: method, memory id, turn id, model
rounds, tool executions and token usage; never message contents.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .messages import ToolExecutionRequest
from .models import ChatRequest, ChatResponse

if TYPE_CHECKING:
    from .tools import ToolExecution

__all__ = ["CallInfo", "ConversationStats", "ServiceListener"]


@dataclass(slots=True)
class CallInfo:
    """One service call, as listeners see it; ``attributes`` is theirs to keep state in.

    ``streamed`` is true for a call whose caller reads the answer as it comes (a text or
    event stream): its reader may stop it early, and then it ends with ``GeneratorExit`` or,
    its task cancelled (a web client gone), ``CancelledError``.
    """

    method: str
    memory_id: Hashable | None
    turn_id: str
    model_name: str | None
    attributes: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class ConversationStats:
    """A service's conversations so far: ``bot.conversation_stats()``.

    ``cached_conversations`` is how many memories the service holds now; the others count
    from when it was built: turns committed, messages that window memories evicted from
    their store's window, and conversations forgotten (``forget``, a scope's exit).
    """

    cached_conversations: int
    turns_committed: int
    messages_evicted: int
    conversations_forgotten: int


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
