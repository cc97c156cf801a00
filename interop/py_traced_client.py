"""A client built on the Python SDK `mcp` 2.x that sends one keyed `tools/call` with a W3C trace
context in `_meta` (`traceparent`, `tracestate`, `baggage`: MCP 2026-07-28, SEP-414) to each
Streamable HTTP endpoint it is given, in turn: the call, then its retry with the same key through
another instance. Prints the results as one JSON document on stdout; the Rust test
(crates/mcp-idem/tests/integration/otel_traces.rs) makes the assertions.

    python3 py_traced_client.py TRACEPARENT URL [URL...]

The SDK's typed `CallToolRequestParams` has no `idempotencyKey`, so a subclass adds it (aliased to
the wire name); `_meta` is the SDK's own `meta` field.
"""

import json
import sys
from typing import Any

import anyio
from pydantic import Field

from mcp import Client
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult


class KeyedCallToolRequestParams(CallToolRequestParams):
    idempotency_key: str | None = Field(default=None, alias="idempotencyKey")


class KeyedCallToolRequest(CallToolRequest):
    params: KeyedCallToolRequestParams


async def main() -> None:
    if len(sys.argv) < 3:
        print("usage: py_traced_client.py TRACEPARENT URL [URL...]", file=sys.stderr)
        sys.exit(2)
    traceparent, urls = sys.argv[1], sys.argv[2:]
    meta = {"traceparent": traceparent, "tracestate": "vendor=opaque", "baggage": "tenant=acme"}
    results = []
    for url in urls:
        async with Client(url, mode="auto") as client:
            request = KeyedCallToolRequest(
                params=KeyedCallToolRequestParams(
                    name="charge_payment",
                    arguments={"amount": 42, "currency": "usd"},
                    idempotency_key="traced-order-1",
                    _meta=meta,
                )
            )
            result = await client.session.send_request(request, CallToolResult)
            results.append(result.model_dump(by_alias=True, mode="json", exclude_none=True))
    print(json.dumps({"sdk": "python", "results": results}))


anyio.run(main)
