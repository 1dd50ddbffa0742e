"""Where memories keep their messages: the store protocols and the stores.

``SqliteChatMemoryStore`` is imported on first use, like the stores backed by an optional
driver, so importing this package loads no database module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._base import AsyncChatMemoryStore, ChatMemoryStore, IncrementalChatMemoryStore, store_key
from ._common import ChatHistoryStore, CorruptMessageError, HistoryEntry, StoreSchemaError
from .in_memory import InMemoryChatMemoryStore

if TYPE_CHECKING:
    from .sqlite import SqliteChatMemoryStore

__all__ = [
    "AsyncChatMemoryStore",
    "ChatHistoryStore",
    "ChatMemoryStore",
    "CorruptMessageError",
    "HistoryEntry",
    "InMemoryChatMemoryStore",
    "IncrementalChatMemoryStore",
    "SqliteChatMemoryStore",
    "StoreSchemaError",
    "store_key",
]

_LAZY = {"SqliteChatMemoryStore": ".sqlite"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
