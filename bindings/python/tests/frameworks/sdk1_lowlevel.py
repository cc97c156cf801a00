"""The payments server (see common.py) on `mcp` 1.x's low-level `Server`, with `idempotent()`
applied before the handlers are registered (they are carried all the same)."""

import json

import anyio
from common import Ledger, failed_after, parse, serve_http, wire_again
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import McpError

from mcp_idempotency import idempotency_key, idempotent

args, options = parse()
ledger = Ledger(args.ledger)
server = idempotent(Server("payments"), **options)
if args.wire_twice:
    wire_again(lambda: idempotent(server, **options))
CHARGE = {"type": "object", "properties": {"amount": {"type": "number"}, "currency": {"type": "string"},
          "order_id": {"type": "string"}, "delay_ms": {"type": "integer"}, "fail_after_charge": {"type": "boolean"}},
          "required": ["amount", "currency"]}


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [types.Tool(name="charge_payment", inputSchema=CHARGE),
            types.Tool(name="get_balance", inputSchema={"type": "object"})]


@server.call_tool()
async def call_tool(name: str, arguments: dict) -> dict:
    if name == "get_balance":
        return ledger.balance()
    key = idempotency_key(server.request_context)
    charge = await ledger.charge(arguments["amount"], arguments["currency"], arguments.get("order_id"),
                                 arguments.get("delay_ms", 0), key)
    if arguments.get("fail_after_charge"):
        # The low-level server turns a tool's exception into an `isError` result; an McpError
        # is a JSON-RPC error.
        raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=failed_after(charge),
                                       data={"chargeId": charge["chargeId"]}))
    return charge


def http_app():
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    class Endpoint:
        async def __call__(self, scope, receive, send):
            await manager.handle_request(scope, receive, send)

    return Starlette(routes=[Route("/mcp", endpoint=Endpoint())], lifespan=lambda _app: manager.run())


async def main() -> None:
    if args.http:
        await serve_http(http_app())
        return
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
