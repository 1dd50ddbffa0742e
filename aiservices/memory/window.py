"""``MessageWindowChatMemory``: keeps the newest messages, counted one by one."""

from __future__ import annotations

from collections.abc import Hashable

from ..stores._base import ChatMemoryStore
from ._window import Limit, check_limit
from ._window_memory import WindowChatMemory, WindowChatMemoryProvider

__all__ = ["MessageWindowChatMemory"]


class MessageWindowChatMemory(WindowChatMemory):
    """Keeps the newest ``max_messages`` messages of a conversation.

    ``max_messages`` may be a callable taking the memory id, read at every add and read.
    The system message counts toward the limit and is never evicted; the memory holds one,
    and a different one replaces it where it is added (the end), or first with
    ``always_keep_system_message_first``. Evicting an ``AiMessage`` with tool requests also
    evicts its tool results. With ``evict_whole_turns`` the oldest turn (a ``UserMessage``
    and everything up to the next one) goes whole. ``store`` defaults to a new
    ``InMemoryChatMemoryStore``.
    """

    _limit_name = "max_messages"

    def __init__(
        self,
        max_messages: Limit = 10,
        *,
        id: Hashable = "default",  # noqa: A002
        store: ChatMemoryStore | None = None,
        always_keep_system_message_first: bool = False,
        evict_whole_turns: bool = False,
    ) -> None:
        super().__init__(
            max_messages,
            id=id,
            store=store,
            always_keep_system_message_first=always_keep_system_message_first,
            evict_whole_turns=evict_whole_turns,
        )

    @classmethod
    def provider(
        cls,
        max_messages: Limit = 10,
        *,
        store: ChatMemoryStore | None = None,
        always_keep_system_message_first: bool = False,
        evict_whole_turns: bool = False,
    ) -> WindowChatMemoryProvider[MessageWindowChatMemory]:
        """A ``ChatMemoryProvider`` giving each memory id its own memory on one store.

        ``store`` defaults to one new ``InMemoryChatMemoryStore`` shared by every id.
        """
        if not callable(max_messages):
            check_limit(max_messages, cls._limit_name)

        def make(memory_id: Hashable, shared: ChatMemoryStore) -> MessageWindowChatMemory:
            return cls(
                max_messages,
                id=memory_id,
                store=shared,
                always_keep_system_message_first=always_keep_system_message_first,
                evict_whole_turns=evict_whole_turns,
            )

        return WindowChatMemoryProvider.create(cls, make, store, f"max_messages={max_messages!r}")
