"""Chat memory: what a conversation's model is shown, kept in a store.

``MessageWindowChatMemory`` and ``TokenWindowChatMemory`` keep the newest messages that fit
a window of messages or tokens; a token window counts with a ``TokenCountEstimator``.
``SummarizingChatMemory`` keeps the newest turns and has a model summarise the older ones.
``sent_on_turn`` rebuilds what the model was sent on a turn from a store's history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._base import ChatMemory, ChatMemoryProvider

if TYPE_CHECKING:
    from ._history import sent_on_turn
    from ._window_memory import WindowChatMemoryProvider
    from .summarizing import SummarizingChatMemory
    from .token_window import TokenWindowChatMemory
    from .tokens import EncodingUnavailableError, OpenAiTokenCountEstimator, TokenCountEstimator
    from .window import MessageWindowChatMemory

# Imported at first use: a service without memory needs none of them, most memories never
# count tokens, summarise or read history, and import time counts for every program that
# imports aiservices.
_LAZY = {
    "MessageWindowChatMemory": ".window",
    "WindowChatMemoryProvider": "._window_memory",
    "EncodingUnavailableError": ".tokens",
    "OpenAiTokenCountEstimator": ".tokens",
    "TokenCountEstimator": ".tokens",
    "TokenWindowChatMemory": ".token_window",
    "SummarizingChatMemory": ".summarizing",
    "sent_on_turn": "._history",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "ChatMemory",
    "ChatMemoryProvider",
    "EncodingUnavailableError",
    "MessageWindowChatMemory",
    "OpenAiTokenCountEstimator",
    "SummarizingChatMemory",
    "TokenCountEstimator",
    "TokenWindowChatMemory",
    "WindowChatMemoryProvider",
    "sent_on_turn",
]
