"""Chat memory: what a conversation's model is shown, kept in a store.

``MessageWindowChatMemory`` and ``TokenWindowChatMemory`` keep the newest messages that fit
a window of messages or tokens; a token window counts with a ``TokenCountEstimator``.
"""

from __future__ import annotations

from ._base import ChatMemory, ChatMemoryProvider
from ._window import WindowChatMemoryProvider
from .token_window import TokenWindowChatMemory
from .tokens import EncodingUnavailableError, OpenAiTokenCountEstimator, TokenCountEstimator
from .window import MessageWindowChatMemory

__all__ = [
    "ChatMemory",
    "ChatMemoryProvider",
    "EncodingUnavailableError",
    "MessageWindowChatMemory",
    "OpenAiTokenCountEstimator",
    "TokenCountEstimator",
    "TokenWindowChatMemory",
    "WindowChatMemoryProvider",
]
