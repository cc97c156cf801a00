"""A low-level `mcp.server.lowlevel.Server` with one tool, `charge`, whose answer holds a fresh
charge id, and SEP-3182 through `idempotent` (store: argv[1]); serves stdio."""

import sys
import uuid

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from mcp_idempotency import idempotent


async def list_tools(ctx, params):
    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    return types.ListToolsResult(tools=[types.Tool(name="charge", input_schema=schema)])


async def call_tool(ctx, params):
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"ch_{uuid.uuid4().hex}")])


server = idempotent(Server("lowlevel-payments", on_list_tools=list_tools, on_call_tool=call_tool), store=sys.argv[1])


async def main():
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


anyio.run(main)
