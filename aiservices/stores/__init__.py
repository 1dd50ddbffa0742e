"""Where memories keep their messages: the store protocols and the stores.

Every store, and what stores share, is imported on first use: importing this package loads
only the protocols, no database module, and needs no optional driver installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._base import AsyncChatMemoryStore, ChatMemoryStore, IncrementalChatMemoryStore, store_key

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The lazy names too, for dir() and completion, before their first use.
    return sorted(set(globals()) | set(_LAZY))
