"""A FastMCP server with two tools, for the client Plugin's tests (run over stdio)."""
from fastmcp import FastMCP

mcp = FastMCP("adder")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool(name="reverseText")
def reverse_text(text: str) -> str:
    """Reverse a piece of text."""
    return text[::-1]


if __name__ == "__main__":
    mcp.run(show_banner=False)
