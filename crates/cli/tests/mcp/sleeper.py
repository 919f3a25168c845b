"""A FastMCP server whose one tool waits, and writes down whether its call was cancelled:
the client Plugin's cancellation test reads the file (the path is the first argument)."""
import asyncio
import sys

from fastmcp import FastMCP

MARK = sys.argv[1]
mcp = FastMCP("sleeper")


@mcp.tool()
async def wait(seconds: float) -> str:
    """Wait this many seconds."""
    with open(MARK, "a") as f:
        f.write("started\n")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        with open(MARK, "a") as f:
            f.write("cancelled\n")
        raise
    return "waited"


if __name__ == "__main__":
    mcp.run(show_banner=False)
