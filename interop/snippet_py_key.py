"""Sending the SEP-3182 idempotency key yourself from the Python SDK (`mcp` 2.x) client. Tested by
crates/mcp-idem/tests/integration/bridge_sdk_clients.rs:   python3 snippet_py_key.py COMMAND [ARGS...]
"""

import json
import sys
import uuid

import anyio
from pydantic import Field

from mcp import Client, StdioServerParameters
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult


# The SDK's CallToolRequestParams has no idempotencyKey field: add it.
class KeyedParams(CallToolRequestParams):
    idempotency_key: str = Field(alias="idempotencyKey")


class KeyedCallToolRequest(CallToolRequest):
    params: KeyedParams


async def main() -> None:
    server = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:])
    async with Client(server) as client:
        # One key per logical operation, reused on every retry of it.
        request = KeyedCallToolRequest(
            params=KeyedParams(
                name="charge_payment",
                arguments={"amount": 4200, "currency": "usd"},
                idempotency_key=str(uuid.uuid4()),
            )
        )
        first = await client.session.send_request(request, CallToolResult)
        retry = await client.session.send_request(request, CallToolResult)  # replayed: no second charge
        print(json.dumps([r.model_dump(by_alias=True, mode="json", exclude_none=True) for r in (first, retry)]))


anyio.run(main)
