"""What a service counts of its conversations: readable from the service and as
OpenTelemetry metrics."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiservices import (
    ChatMemoryAccess,
    MemoryId,
    MessageWindowChatMemory,
    ai_service,
    memory_scope,
)
from aiservices.observability import ConversationStats
from aiservices.otel import observe_conversations
from aiservices.testing import ScriptedChatModel


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    def scoped(self, text: str) -> str: ...


def _bot(cache_size: int = 100) -> Bot:
    return ai_service(
        Bot,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4),
        chat_memory_cache_size=cache_size,
    )


def test_the_service_counts_conversations_turns_evictions_and_forgets() -> None:
    bot = _bot(cache_size=2)
    assert bot.conversation_stats() == ConversationStats(0, 0, 0, 0)
    for turn in range(3):
        bot.chat("alice", f"turn {turn}")  # 6 messages into a window of 4: 2 evicted
    bot.chat("bob", "hi")
    assert bot.conversation_stats() == ConversationStats(2, 4, 2, 0)
    bot.chat("carol", "hi")  # a third conversation: alice's memory leaves the cache
    stats = bot.conversation_stats()
    assert stats.cached_conversations == 2
    assert stats.turns_committed == 5  # counted still, from the retired conversation
    assert stats.messages_evicted == 2
    bot.forget("bob")
    with memory_scope():
        bot.scoped("in a scope")
    assert bot.conversation_stats() == ConversationStats(1, 6, 2, 2)


def test_a_failed_turn_is_not_counted() -> None:
    bot = ai_service(
        Bot,
        model=ScriptedChatModel(RuntimeError("down")),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4),
    )
    with pytest.raises(RuntimeError):
        bot.chat("alice", "hi")
    assert bot.conversation_stats().turns_committed == 0


def _points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, Any] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                (point,) = metric.data.data_points
                found[metric.name] = (point.value, dict(point.attributes or {}))
    return found


def test_the_counts_are_opentelemetry_metrics_read_at_collection() -> None:
    reader = InMemoryMetricReader()
    bot = _bot()
    observe_conversations(bot, meter_provider=MeterProvider(metric_readers=[reader]))
    for turn in range(3):
        bot.chat("alice", f"turn {turn}")
    bot.forget("alice")
    points = _points(reader)
    agent = {"gen_ai.agent.name": "Bot"}
    assert points == {
        "aiservices.conversations.cached": (0, agent),
        "aiservices.turns.committed": (3, agent),
        "aiservices.messages.evicted": (2, agent),
        "aiservices.conversations.forgotten": (1, agent),
    }


def test_several_services_report_on_one_meter_provider() -> None:
    class Triage(ChatMemoryAccess, Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    support = _bot()
    triage = ai_service(
        Triage,
        model=ScriptedChatModel(default="ok"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4),
    )
    observe_conversations(support, meter_provider=meters)
    observe_conversations(triage, meter_provider=meters)
    observe_conversations(triage, meter_provider=meters)  # again: still reported once
    support.chat("alice", "hi")
    for turn in range(2):
        triage.chat("bob", f"turn {turn}")
    data = reader.get_metrics_data()
    assert data is not None
    turns = {
        dict(point.attributes or {})["gen_ai.agent.name"]: point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "aiservices.turns.committed"
        for point in metric.data.data_points
    }
    assert turns == {"Bot": 1, "Triage": 2}


def test_a_memory_the_provider_hands_back_again_counts_its_evictions_once() -> None:
    # A provider that keeps its own memories gives the cache the same object again after
    # an eviction: what it evicted before was already counted when it was dropped.
    memories: dict[Any, MessageWindowChatMemory] = {}

    def provider(memory_id: Any) -> MessageWindowChatMemory:
        return memories.setdefault(memory_id, MessageWindowChatMemory(2, id=memory_id))

    bot = ai_service(Bot, model=ScriptedChatModel(default="ok"), chat_memory_provider=provider)
    for turn in range(3):
        bot.chat("alice", f"turn {turn}")
    bot.evict_chat_memory("alice")
    bot.chat("alice", "again")
    assert memories["alice"].evicted_messages == 6
    assert bot.conversation_stats().messages_evicted == 6


def test_a_service_with_one_memory_counts_it_as_held() -> None:
    class Single(ChatMemoryAccess, Protocol):
        def chat(self, text: str) -> str: ...

    bot = ai_service(
        Single, model=ScriptedChatModel(default="ok"), chat_memory=MessageWindowChatMemory(4)
    )
    bot.chat("hi")
    stats = bot.conversation_stats()
    assert stats.cached_conversations == 1
    assert stats.turns_committed == 1


def test_a_counter_keeps_what_a_service_that_is_gone_counted() -> None:
    # Two services of one interface report one series; a counter never goes down (a
    # backend takes a drop for a reset), while the cached conversations leave with it.
    import gc

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    first, second = _bot(), _bot()
    observe_conversations(first, meter_provider=meters)
    observe_conversations(second, meter_provider=meters)
    for turn in range(3):
        first.chat("alice", f"turn {turn}")
    second.chat("bob", "hi")
    assert _points(reader)["aiservices.turns.committed"][0] == 4
    assert _points(reader)["aiservices.conversations.cached"][0] == 2
    del second
    gc.collect()
    points = _points(reader)
    assert points["aiservices.turns.committed"][0] == 4
    assert points["aiservices.conversations.cached"][0] == 1


_BEFORE_AND_AFTER_SETUP = """
from typing import Annotated, Protocol
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from aiservices import ChatMemoryAccess, MemoryId, MessageWindowChatMemory, ai_service
from aiservices.otel import observe_conversations
from aiservices.testing import ScriptedChatModel

class Shop(ChatMemoryAccess, Protocol):
    def ask(self, customer: Annotated[str, MemoryId], question: str) -> str: ...

class Support(ChatMemoryAccess, Protocol):
    def ask(self, customer: Annotated[str, MemoryId], question: str) -> str: ...

def make(interface):
    return ai_service(interface, model=ScriptedChatModel(default="ok"),
                      chat_memory_provider=MessageWindowChatMemory.provider(10))

shop, support = make(Shop), make(Support)
observe_conversations(shop)  # at import time, before the SDK is set up
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
observe_conversations(support)
shop.ask("a", "hi")
support.ask("b", "hi")
support.ask("b", "again")
turns = {
    dict(point.attributes)["gen_ai.agent.name"]: point.value
    for resource in reader.get_metrics_data().resource_metrics
    for scope in resource.scope_metrics
    for metric in scope.metrics if metric.name == "aiservices.turns.committed"
    for point in metric.data.data_points
}
print(sorted(turns.items()))
"""


def test_services_observed_before_and_after_the_sdk_is_set_up_are_all_reported() -> None:
    # (In a process of its own: the global meter provider can be set once.)
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _BEFORE_AND_AFTER_SETUP],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('Shop', 1), ('Support', 2)]"
