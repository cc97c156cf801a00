"""The payments server (see common.py) on `mcp` 2.x's low-level `Server`, with `idempotent()`."""

import json

import anyio
from common import Ledger, failed_after, parse, serve_http, wire_again
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from mcp_idempotency import idempotency_key, idempotent

args, options = parse()
ledger = Ledger(args.ledger)
CHARGE = {"type": "object", "properties": {"amount": {"type": "number"}, "currency": {"type": "string"},
          "order_id": {"type": "string"}, "delay_ms": {"type": "integer"}, "fail_after_charge": {"type": "boolean"}},
          "required": ["amount", "currency"]}


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[
        types.Tool(name="charge_payment", input_schema=CHARGE),
        types.Tool(name="get_balance", input_schema={"type": "object"}),
    ])


def answer(value: dict) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(value))], structured_content=value)


async def call_tool(ctx, params):
    arguments = params.arguments or {}
    if params.name == "get_balance":
        return answer(ledger.balance())
    charge = await ledger.charge(arguments["amount"], arguments["currency"], arguments.get("order_id"),
                                 arguments.get("delay_ms", 0), idempotency_key(ctx))
    if arguments.get("fail_after_charge"):
        raise MCPError(code=types.INTERNAL_ERROR, message=failed_after(charge), data={"chargeId": charge["chargeId"]})
    return answer(charge)


server = idempotent(Server("payments", on_list_tools=list_tools, on_call_tool=call_tool), **options)
if args.wire_twice:
    wire_again(lambda: idempotent(server, **options))


async def main() -> None:
    if args.http:
        await serve_http(server.streamable_http_app(stateless_http=True, json_response=True))
        return
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
