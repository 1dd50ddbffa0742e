"""An MCP server for the tests, on the SDK's own MCPServer (FastMCP in SDKs before 2.0).

``python weather.py stdio`` serves over stdin/stdout (``stdio PATH``: once the file PATH
exists); ``python weather.py http PORT`` over streamable HTTP on 127.0.0.1:PORT at /mcp.
``crash`` exits the process mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import ImageContent, ResourceLink, TextContent

server = MCPServer("weather")


@server.tool()
def forecast(city: str, days: int = 1) -> str:
    """The forecast for a city."""
    return f"{city}: sunny for {days} day(s)"


@server.tool()
def broken(city: str) -> str:
    """A tool that always fails."""
    raise ValueError(f"no station in {city}")


@server.tool()
def crash() -> str:
    """Ends the server process in the middle of the call."""
    os._exit(3)


@server.tool()
def refuse() -> str:
    """Answers the call with a protocol error."""
    raise MCPError(code=-32602, message="not allowed")


@server.tool()
async def slow(seconds: float = 1) -> str:
    """Takes a while, then tells the server's process id."""
    await asyncio.sleep(seconds)
    return str(os.getpid())


@server.tool()
def whoami() -> str:
    """The process id of the server, to tell a reconnection."""
    return str(os.getpid())


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool 'added' and tells the client its tool list changed."""

    def added() -> str:
        """Added while the server runs."""
        return "here"

    with contextlib.suppress(Exception):  # (added by an earlier call)
        server.remove_tool("added")
    server.add_tool(added, name="added")
    await ctx.notify_tools_changed()
    return "grown"


@server.tool()
def radar() -> list[TextContent | ImageContent | ResourceLink]:
    """Content that is not all text: a heading, an image and a link."""
    return [
        TextContent(type="text", text="The radar:"),
        ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
        ResourceLink(type="resource_link", uri="file:///maps/rain.png", name="rain.png"),
    ]


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        if len(sys.argv) > 2:
            waited = Path(sys.argv[2])
            deadline = time.monotonic() + 60
            while not waited.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
