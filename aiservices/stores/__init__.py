"""Where memories keep their messages: the store protocols and the stores.

Every store, and what stores share, is imported on first use: importing this package loads
only the protocols, no database module, and needs no optional driver installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._base import (
    AsyncChatMemoryStore,
    ChatMemoryStore,
    ConcurrentChangeError,
    IncrementalChatMemoryStore,
    store_key,
)

if TYPE_CHECKING:
    from ._common import ChatHistoryStore, CorruptMessageError, HistoryEntry, StoreSchemaError
    from .in_memory import InMemoryChatMemoryStore
    from .postgres import PostgresChatMemoryStore
    from .redis import RedisChatMemoryStore
    from .sqlite import SqliteChatMemoryStore

__all__ = [
    "AsyncChatMemoryStore",
    "ChatHistoryStore",
    "ChatMemoryStore",
    "ConcurrentChangeError",
    "CorruptMessageError",
    "HistoryEntry",
    "InMemoryChatMemoryStore",
    "IncrementalChatMemoryStore",
    "PostgresChatMemoryStore",
    "RedisChatMemoryStore",
    "SqliteChatMemoryStore",
    "StoreSchemaError",
    "store_key",
]

_LAZY = {
    "ChatHistoryStore": "._common",
    "CorruptMessageError": "._common",
    "HistoryEntry": "._common",
    "StoreSchemaError": "._common",
    "InMemoryChatMemoryStore": ".in_memory",
    "SqliteChatMemoryStore": ".sqlite",
    "RedisChatMemoryStore": ".redis",
    "PostgresChatMemoryStore": ".postgres",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
