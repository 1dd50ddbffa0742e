"""An MCP server on the SDK's low-level server, whose ``count`` tool answers with structured
content its own output schema refuses (the client refuses that result); ``whoami`` tells
the process id, to tell a reconnection. ``python schema_breaker.py`` serves over stdio;
with the argument ``bad-input``, it also lists ``typo``, whose input schema is not a valid
JSON schema."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

TOOLS = [
    types.Tool(
        name="count",
        description="Counts, and answers with a count that is not an integer.",
        input_schema={"type": "object", "properties": {}},
        output_schema={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    ),
    types.Tool(
        name="whoami",
        description="The process id of the server.",
        input_schema={"type": "object", "properties": {}},
    ),
]


if sys.argv[1:] == ["bad-input"]:
    TOOLS.append(
        types.Tool(
            name="typo",
            description="Its input schema names a type that does not exist.",
            input_schema={"type": "object", "properties": {"n": {"type": "integr"}}},
        )
    )


async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(context: Any, params: Any) -> types.CallToolResult:
    if params.name == "count":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="n is x")],
            structured_content={"n": "x"},
        )
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(os.getpid()))])


server = Server("schema-breaker", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    asyncio.run(main())
