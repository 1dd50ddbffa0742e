"""A small tool-calling agent: a calculator and an order lookup.

Runs offline on a scripted model by default; set OPENAI_API_KEY (or ANTHROPIC_API_KEY) to
run it on a real provider: ``python examples/tool_agent.py``.
"""

from __future__ import annotations

import os
from typing import Annotated, Protocol

from pydantic import Field

from aiservices import (
    ChatModel,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    ai_service,
    system_message,
    tool,
)
from aiservices.testing import ScriptedChatModel, tool_call

ORDERS = {"A-100": "shipped on Monday", "B-200": "waiting for stock"}


@tool
def calculate(
    a: Annotated[float, Field(description="left operand")],
    op: Annotated[str, Field(description="one of + - * /")],
    b: Annotated[float, Field(description="right operand")],
) -> float:
    """Do one arithmetic operation."""
    operations = {"+": a + b, "-": a - b, "*": a * b}
    if op == "/":
        return a / b
    return operations[op]


class OrderDesk:
    """Tools that need state live on an object: its @tool methods are bound to it."""

    def __init__(self, orders: dict[str, str]) -> None:
        self.orders = orders

    @tool
    def order_status(self, order_id: str) -> str:
        """The status of an order, by its id (like A-100)."""
        return self.orders.get(order_id, f"no order {order_id}")


@system_message("You are a shop assistant. Use the tools; answer in one sentence.")
class ShopAgent(Protocol):
    def ask(self, customer: Annotated[str, MemoryId], question: str) -> Result[str]: ...


def pick_model() -> ChatModel | str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-haiku-4-5"
    return ScriptedChatModel(
        tool_call("order_status", order_id="A-100"),
        tool_call("calculate", a=19.99, op="*", b=3),
        "Order A-100 shipped on Monday, and three of them cost 59.97.",
    )


def main() -> Result[str]:
    agent = ai_service(
        ShopAgent,
        model=pick_model(),
        tools=[calculate, OrderDesk(ORDERS)],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=30),
    )
    result = agent.ask("carol", "Where is order A-100, and what do three $19.99 mugs cost?")
    for execution in result.tool_executions:
        print(f"tool {execution.request.name}({execution.request.arguments}) -> {execution.result}")
    print(result.content)
    return result


if __name__ == "__main__":
    main()
