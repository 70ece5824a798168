"""
A small MCP server for the tests, run over stdio by ``MCPToolset`` (``python tests/workers/mcp_server.py``).
"""

import time

from mcp.server import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """Repeat a text in capitals."""
    return text.upper()


@server.tool()
def slow(seconds: float) -> str:
    """Wait, then answer."""
    time.sleep(seconds)
    return "slept"


if __name__ == "__main__":
    server.run("stdio")
