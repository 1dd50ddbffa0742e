"""An MCP server on the SDK's low-level API, for what MCPServer never lists: a bare object
schema, a parameter named ``self``, an error told only in structured content, and names
the providers refuse.

``python odd.py stdio [clash]``: ``clash`` adds two tools whose names differ only by
characters a provider refuses.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

_EMPTY: dict[str, Any] = {"type": "object", "properties": {}}

TOOLS = [
    # What some SDKs list for a tool without parameters.
    types.Tool(name="regions", description="The regions served.", input_schema={"type": "object"}),
    types.Tool(
        name="echo",
        description="Its arguments, as JSON.",
        input_schema={
            "type": "object",
            "properties": {"self": {"type": "string"}, "other": {"type": "string"}},
            "required": ["self"],
        },
    ),
    types.Tool(
        name="quota", description="Fails, saying why in structured content.", input_schema=_EMPTY
    ),
]
if sys.argv[2:3] == ["clash"]:
    TOOLS += [
        types.Tool(name="get.weather", description="", input_schema=_EMPTY),
        types.Tool(name="get_weather", description="", input_schema=_EMPTY),
    ]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    def text(value: str) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])

    if params.name == "regions":
        return text("eu, us")
    if params.name == "echo":
        return text(json.dumps(params.arguments, sort_keys=True))
    if params.name == "quota":
        return types.CallToolResult(
            content=[],
            structured_content={"error": "quota exceeded", "retry_after": 30},
            is_error=True,
        )
    return text(f"called {params.name}")


server = Server("odd", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    import asyncio

    asyncio.run(main())
