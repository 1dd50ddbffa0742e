"""Chat memory: what a conversation's model is shown, kept in a store.

``MessageWindowChatMemory`` and ``TokenWindowChatMemory`` keep the newest messages that fit
a window of messages or tokens; a token window counts with a ``TokenCountEstimator``.
``SummarizingChatMemory`` keeps the newest turns and has a model summarise the older ones.
``sent_on_turn`` rebuilds what the model was sent on a turn from a store's history.
"""

from __future__ import annotations

from ._base import ChatMemory, ChatMemoryProvider
from ._history import sent_on_turn
from ._window import WindowChatMemoryProvider
from .summarizing import SummarizingChatMemory
from .token_window import TokenWindowChatMemory
from .tokens import EncodingUnavailableError, OpenAiTokenCountEstimator, TokenCountEstimator
from .window import MessageWindowChatMemory

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
