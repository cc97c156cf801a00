"""A stdio MCP server on the Python SDK 2.x low-level `Server`, whose tools/list is what
`mcp-idem tools` reads (crates/mcp-idem/tests/integration/tools_command.rs): tools with
annotations, identifier-looking arguments and names that are not bare TOML keys, listed two per
page (nextCursor).

    python3 py_tools_server.py

No tool does anything: a call answers with an error.
"""

import anyio

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

PAGE = 2


def schema(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required}


STRING = {"type": "string"}
INTEGER = {"type": "integer"}

TOOLS = [
    types.Tool(
        name="get_order",
        description="Read an order.",
        input_schema=schema({"order_id": STRING}, ["order_id"]),
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="charge_payment",
        description="Charge an order.",
        input_schema=schema(
            {"order_id": STRING, "amount": INTEGER, "currency": STRING},
            ["order_id", "amount", "currency"],
        ),
        annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=True),
    ),
    types.Tool(
        name="send_invoice",
        description="Send an invoice to a customer.",
        input_schema=schema(
            {"customerId": STRING, "invoice_number": INTEGER, "note": STRING},
            ["customerId", "invoice_number"],
        ),
        annotations=types.ToolAnnotations(destructive_hint=False),
    ),
    types.Tool(
        name="create_refund",
        description="Refund a charge; the key makes a retry safe.",
        input_schema=schema(
            {"charge_id": STRING, "amount": INTEGER, "idempotency_key": STRING},
            ["charge_id", "amount"],
        ),
    ),
    types.Tool(
        name="set_status",
        description="Set an order's status.",
        input_schema=schema({"order_id": STRING, "status": STRING}, ["order_id", "status"]),
        annotations=types.ToolAnnotations(idempotent_hint=True),
    ),
    types.Tool(
        name="billing.log_event",
        description="Append an event to the billing log.",
        input_schema=schema({"message": STRING, "reference": STRING}, ["message"]),
    ),
]


async def list_tools(ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    start = int(params.cursor) if params is not None and params.cursor else 0
    end = start + PAGE
    next_cursor = str(end) if end < len(TOOLS) else None
    return types.ListToolsResult(tools=TOOLS[start:end], next_cursor=next_cursor)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text="this fixture only lists its tools")],
        is_error=True,
    )


async def main() -> None:
    server = Server("interop-py-tools-server", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
