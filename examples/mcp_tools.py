"""An agent using the tools of an MCP server, with the signed-in user passed as context.

``python examples/mcp_tools.py`` starts this same file as an MCP server over stdio
(``python examples/mcp_tools.py serve``, on the MCP SDK's ``MCPServer``), offers its tools
to a service next to a tool of our own that reads the caller from its ``Context``, and asks
once. Runs offline on a scripted model; with OPENAI_API_KEY set, on OpenAI. Needs
``pip install "aiservices[mcp]"``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Annotated, Protocol

from aiservices import AiMessage, ChatModel, Context, Result, ToolExecutionRequest, ai_service, tool
from aiservices.mcp import McpToolset
from aiservices.testing import ScriptedChatModel


def serve() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("weather")

    @server.tool()
    def forecast(city: str, days: int = 1) -> str:
        """The weather forecast for a city."""
        return f"{city}: sunny, 21°C, for the next {days} day(s)"

    server.run("stdio")


@dataclass(frozen=True)
class User:
    name: str
    home: str


@tool
def home_city(user: Annotated[User | None, Context]) -> str:
    """The signed-in user's home city."""
    return "unknown" if user is None else user.home


class Assistant(Protocol):
    def ask(self, question: str, user: Annotated[User, Context]) -> Result[str]: ...


def pick_model() -> ChatModel | str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    # Offline: the model first asks for the user's city, then for its forecast.
    return ScriptedChatModel(
        AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "home_city", "{}")]),
        AiMessage(
            tool_execution_requests=[
                ToolExecutionRequest("c2", "forecast", '{"city": "Lisbon", "days": 2}')
            ]
        ),
        "(offline model) Sunny in Lisbon for the next two days, 21°C.",
    )


def main() -> None:
    with McpToolset.stdio(sys.executable, [__file__, "serve"]) as weather:
        bot = ai_service(Assistant, model=pick_model(), tools=[weather, home_city])
        result = bot.ask("What will the weather be like at home?", user=User("Ada", "Lisbon"))
    for execution in result.tool_executions:
        print(f"tool {execution.request.name}({execution.request.arguments}) -> {execution.result}")
    print(result.content)


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["serve"] else main()
