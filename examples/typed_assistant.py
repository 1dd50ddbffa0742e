"""Typed answers: an enum, a pydantic model and a list, parsed from the model's replies.

Runs offline on a scripted model by default; set OPENAI_API_KEY (or ANTHROPIC_API_KEY) to
run it on a real provider: ``python examples/typed_assistant.py``.
"""

from __future__ import annotations

import os
from datetime import date
from enum import Enum
from typing import Protocol

from pydantic import BaseModel, Field

from aiservices import ChatModel, Result, ai_service, system_message, user_message
from aiservices.testing import ScriptedChatModel


class Priority(Enum):
    LOW = "low"
    NORMAL = "normal"
    URGENT = "urgent"


class Ticket(BaseModel):
    customer: str = Field(description="the customer's first name")
    product: str
    bought_on: date | None = Field(description="purchase date, if the e-mail gives one")
    problems: list[str] = Field(description="each problem the customer reports, briefly")


@system_message("You triage the support inbox of a small appliance shop.")
class Triage(Protocol):
    @user_message("How urgent is this e-mail? {{email}}")
    def priority(self, email: str) -> Priority: ...

    @user_message("Extract the support ticket from this e-mail: {{email}}")
    def ticket(self, email: str) -> Result[Ticket]: ...

    @user_message("Suggest up to three replies to this ticket, shortest first: {{ticket}}")
    def replies(self, ticket: Ticket) -> list[str]: ...


EMAIL = (
    "Hello, this is Dana. The Kettle K2 I bought on 3 March 2025 stopped switching on, and "
    "the lid no longer closes. I need it for my café tomorrow morning!"
)


def pick_model() -> ChatModel | str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-haiku-4-5"
    # What a model answers, more or less tidily: the parser reads a bare enum name, JSON in
    # a fenced block, and a list wrapped in {"value": ...}.
    return ScriptedChatModel(
        "URGENT",
        "```json\n"
        '{"customer": "Dana", "product": "Kettle K2", "bought_on": "2025-03-03",\n'
        ' "problems": ["does not switch on", "lid does not close"]}\n'
        "```",
        '{"value": ["We are sorry, Dana: a replacement K2 ships today.",'
        ' "Could you send us a photo of the lid?",'
        ' "Please bring the kettle to our shop for a free repair."]}',
    )


def main() -> tuple[Priority, Ticket, list[str]]:
    triage = ai_service(Triage, model=pick_model())

    priority = triage.priority(EMAIL)
    print(f"priority: {priority.name}")

    result = triage.ticket(EMAIL)
    ticket = result.content
    print(f"ticket:   {ticket.customer}, {ticket.product}, bought {ticket.bought_on}")
    for problem in ticket.problems:
        print(f"          - {problem}")
    if result.token_usage is not None:
        print(f"          ({result.token_usage.total_tokens} tokens)")

    replies = triage.replies(ticket)  # the model is sent the ticket as JSON
    print("replies:")
    for reply in replies:
        print(f"  * {reply}")
    return priority, ticket, replies


if __name__ == "__main__":
    main()
