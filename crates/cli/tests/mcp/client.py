"""An MCP client made with the official Python SDK, driving `promptforge mcp serve`.

Usage: client.py SCENARIO URL_OR_DASH [COMMAND ARGS...]
With URL_OR_DASH `-`, the server is COMMAND ARGS over stdio; otherwise the streamable HTTP
endpoint at that URL, with `Authorization: Bearer $MCP_TOKEN` when MCP_TOKEN is set.
Prints one JSON object per line for the Rust test to read.
"""
import json
import os
import sys

import anyio
import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def say(**fields):
    print(json.dumps(fields), flush=True)


async def scenario(name, session, changed):
    await session.initialize()
    if name == "call":
        tools = await session.list_tools()
        say(tools=sorted(t.name for t in tools.tools))
        r = await session.call_tool("greet", {"who": "Ada", "times": 2})
        say(text=r.content[0].text, is_error=bool(r.is_error))
        r = await session.call_tool("facts", {})
        say(text=r.content[0].text, structured=r.structured_content)
        r = await session.call_tool("broken", {})
        say(text=r.content[0].text, is_error=bool(r.is_error))
        p = await session.get_prompt("greet", {"who": "Bob", "times": "3"})
        say(prompt=p.messages[0].content.text)
        seen = []

        async def on_progress(progress, total, message):
            seen.append(message)

        r = await session.call_tool("ask", {}, progress_callback=on_progress)
        say(text=r.content[0].text, progress=seen)
    elif name == "cancel":
        # Give up on the call CANCEL_AFTER seconds after its run is seen going (its first
        # progress message), however long a loaded machine takes to start it.
        seen = []
        going = anyio.Event()

        async def on_progress(progress, total, message):
            seen.append(message)
            going.set()

        scope = anyio.CancelScope()

        async def spin():
            with scope:
                await session.call_tool("spin", {}, progress_callback=on_progress)

        async with anyio.create_task_group() as group:
            group.start_soon(spin)
            with anyio.fail_after(30):
                await going.wait()
            await anyio.sleep(float(os.environ.get("CANCEL_AFTER", "2")))
            scope.cancel()
        say(cancelled=scope.cancelled_caught, progress=seen)
        r = await session.call_tool("shout", {"args": "still here"})
        say(text=r.content[0].text)
    elif name == "watch":
        tools = await session.list_tools()
        resources = await session.list_resources()
        read = await session.read_resource("promptforge://prompts/shout")
        await session.subscribe_resource("promptforge://prompts/shout")
        templates = await session.list_resource_templates()
        say(
            tools=sorted(t.name for t in tools.tools),
            resources=[(r.uri, r.mime_type) for r in resources.resources],
            read=read.contents[0].text,
            templates=[t.uri_template for t in templates.resource_templates],
        )
        with anyio.fail_after(20):
            await changed.wait()
            await updated.wait()
        tools = await session.list_tools()
        read = await session.read_resource("promptforge://prompts/shout")
        say(changed=True, tools=sorted(t.name for t in tools.tools), updated=UPDATED,
            read=read.contents[0].text)
    elif name == "output":
        r = await session.call_tool("test_embedded_resource", {})
        say(content=[c.model_dump(mode="json", exclude_none=True, by_alias=True) for c in r.content])
        p = await session.get_prompt("test_prompt_with_embedded_resource", {"resourceUri": "x://y"})
        say(messages=[m.content.model_dump(mode="json", exclude_none=True, by_alias=True) for m in p.messages])
    elif name == "elicit":
        # ELICIT (set for this scenario) is what the user answers, or `decline`.
        r = await session.call_tool("interview", {})
        say(text=r.content[0].text, is_error=bool(r.is_error))
        r = await session.call_tool("maybe_ask", {})
        say(text=r.content[0].text)
        say(asked=ASKED)
    elif name == "modern":
        raise SystemExit("the modern scenario runs through mcp.Client (see main)")
    elif name == "task":
        # The tasks extension (SEP-2663), spoken through the session's JSON-RPC dispatcher:
        # the SDK has no client for it, and checks a tools/call result against the
        # 2025-11-25 shape, which a task handle is not.
        async def request(method, params):
            return await session._dispatcher.send_raw_request(method, params, None)

        async def poll(task_id, until):
            with anyio.fail_after(20):
                while True:
                    got = await request("tasks/get", {"taskId": task_id})
                    task = got.get("task", got)
                    if task["status"] in until:
                        return task
                    await anyio.sleep(0.05)

        created = await request("tools/call", {"name": "interview", "arguments": {}})
        say(result_type=created.get("resultType"), status=created["status"],
            has_id=bool(created.get("taskId")), poll=created.get("pollIntervalMs"))
        task_id = created["taskId"]
        asking = await poll(task_id, ["input_required"])
        keys = sorted(asking["inputRequests"].keys())
        say(status=asking["status"], keys=keys,
            message=asking["inputRequests"][keys[0]]["params"]["message"])
        await request("tasks/update", {"taskId": task_id, "inputResponses": {
            keys[0]: {"action": "accept", "content": {"answer": "in a task"}}}})
        done = await poll(task_id, ["completed", "failed", "cancelled"])
        say(status=done["status"], text=done["result"]["content"][0]["text"])
        quick = await request("tools/call", {"name": "shout", "arguments": {"args": "quick"}})
        say(result_type=quick.get("resultType"), text=quick["content"][0]["text"])
        spinning = await request("tools/call", {"name": "spin", "arguments": {}})
        await anyio.sleep(0.5)
        await request("tasks/cancel", {"taskId": spinning["taskId"]})
        stopped = await poll(spinning["taskId"], ["completed", "failed", "cancelled"])
        say(status=stopped["status"])
    elif name == "no-elicit":
        with anyio.fail_after(10):
            r = await session.call_tool("maybe_ask", {})
        say(text=r.content[0].text)
        r = await session.call_tool("interview", {})
        say(text=r.content[0].text, is_error=bool(r.is_error))
    else:
        raise SystemExit(f"unknown scenario {name}")


ASKED = []


async def on_elicit(context, params):
    """The user behind the client: answers ELICIT, or declines."""
    ASKED.append(params.message)
    answer = os.environ["ELICIT"]
    if answer == "decline":
        return types.ElicitResult(action="decline")
    return types.ElicitResult(action="accept", content={"answer": answer})


def session_options():
    options = {"elicitation_callback": on_elicit} if os.environ.get("ELICIT") else {}
    if os.environ.get("TASKS"):
        options["extensions"] = {"io.modelcontextprotocol/tasks": {}}
    return options


UPDATED = []
updated = None


async def modern(target, command):
    """MCP 2026-07-28 (no initialize): asks come back as input_required results."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ)) \
        if target == "-" else target
    async with Client(server, mode="2026-07-28", elicitation_callback=on_elicit) as client:
        say(protocol=client.protocol_version)
        # The SDK drives the rounds: the user's answer reaches the run that asked.
        r = await client.call_tool("interview", {})
        say(text=r.content[0].text, asked=ASKED)
        # By hand: the question, then the answer with the sealed state.
        session = client.session
        first = await session.call_tool("interview", {}, allow_input_required=True)
        keys = sorted((first.input_requests or {}).keys())
        say(result_type=first.result_type, keys=keys,
            message=first.input_requests[keys[0]].params.message)
        answers = {k: types.ElicitResult(action="accept", content={"answer": "by hand"}) for k in keys}
        state = first.request_state
        tampered = state[:-1] + ("A" if state[-1] != "A" else "B")
        for label, bad_state, args in [("tampered", tampered, {}), ("other args", state, {"args": "x"})]:
            try:
                await session.call_tool("interview", args, input_responses=answers,
                                        request_state=bad_state, allow_input_required=True)
                say(refused=label, error=None)
            except MCPError as e:
                say(refused=label, error=str(e))
        done = await session.call_tool("interview", {}, input_responses=answers,
                                       request_state=state, allow_input_required=True)
        say(text=done.content[0].text)
        try:
            await session.call_tool("interview", {}, input_responses=answers,
                                    request_state=state, allow_input_required=True)
            say(refused="replayed", error=None)
        except MCPError as e:
            say(refused="replayed", error=str(e))


async def expire(target):
    """A 2026-07-28 client that asks and never answers in time."""
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    async with Client(target, mode="2026-07-28", elicitation_callback=on_elicit) as client:
        first = await client.session.call_tool("interview", {}, allow_input_required=True)
        answers = {k: types.ElicitResult(action="accept", content={"answer": "late"})
                   for k in (first.input_requests or {})}
        await anyio.sleep(float(os.environ.get("WAIT", "2.5")))
        try:
            await client.session.call_tool("interview", {}, input_responses=answers,
                                           request_state=first.request_state,
                                           allow_input_required=True)
            say(refused=False, error=None)
        except MCPError as e:
            say(refused=True, error=str(e))


async def main():
    global updated
    name, target, *command = sys.argv[1:]
    if name == "modern":
        await modern(target, command)
        return
    if name == "expire":
        await expire(target)
        return
    changed = anyio.Event()
    updated = anyio.Event()

    async def on_message(message):
        root = getattr(message, "root", message)
        if isinstance(root, types.ResourceUpdatedNotification):
            UPDATED.append(str(root.params.uri))
            updated.set()
        if isinstance(message, types.ServerNotification) and isinstance(
            message, types.ToolListChangedNotification
        ):
            changed.set()
        root = getattr(message, "root", None)
        if isinstance(root, types.ToolListChangedNotification) or isinstance(
            message, types.ToolListChangedNotification
        ):
            changed.set()

    if target == "-":
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
        async with stdio_client(params) as (read, write):
            async with ClientSession(
                read, write, message_handler=on_message, **session_options()
            ) as session:
                await scenario(name, session, changed)
    else:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        headers = {}
        if os.environ.get("MCP_TOKEN"):
            headers["Authorization"] = "Bearer " + os.environ["MCP_TOKEN"]
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(target, http_client=http) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(
                    read, write, message_handler=on_message, **session_options()
                ) as session:
                    await scenario(name, session, changed)


anyio.run(main)
