"""A client built on the Python SDK `mcp` 2.x that runs the `dedup` scenario of ts-client.mjs and
prints what it saw as one JSON document on stdout (same shape as ts-client.mjs). The Rust tests
(crates/mcp-idem/tests/integration/interop_*.rs, key_sources.rs) make the assertions.

    python3 py_client.py (dedup|dedup-meta) stdio -- COMMAND [ARGS...]
    python3 py_client.py (dedup|dedup-meta) http URL

`dedup`: the SDK's typed `CallToolRequestParams` has no `idempotencyKey`, so a subclass adds it
(aliased to the wire name) and the request goes out through `session.send_request`.
`dedup-meta`: the same scenario with the key where the SDK's public API lets a client put it, in
`_meta` (`session.call_tool(..., meta={"idempotencyKey": KEY})`), no subclass. Either way the
report's `steps.concurrentOrder` lists the two concurrent calls in the order their answers came.
The SDK's parsed capabilities drop `tools.idempotency`, so the scenario also sends
`server/discover` itself and reports the raw result.
"""

import json
import sys
from typing import Any

import anyio
from pydantic import Field

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult

PROTOCOL = "2026-07-28"


class KeyedCallToolRequestParams(CallToolRequestParams):
    idempotency_key: str | None = Field(default=None, alias="idempotencyKey")


class KeyedCallToolRequest(CallToolRequest):
    params: KeyedCallToolRequestParams


SCENARIOS = ("dedup", "dedup-meta")
# Where `call` puts the key: the SEP's `params.idempotencyKey`, or `params._meta.idempotencyKey`.
CARRIER = "params"


def usage() -> None:
    print("usage: py_client.py (dedup|dedup-meta) (stdio -- COMMAND [ARGS...] | http URL)", file=sys.stderr)
    sys.exit(2)


async def call(client: Client, name: str, arguments: dict[str, Any], key: str) -> dict[str, Any]:
    try:
        if CARRIER == "meta":
            result = await client.session.call_tool(name, arguments, meta={"idempotencyKey": key})
        else:
            request = KeyedCallToolRequest(
                params=KeyedCallToolRequestParams(name=name, arguments=arguments, idempotency_key=key)
            )
            result = await client.session.send_request(request, CallToolResult)
        return {"result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}
    except MCPError as error:
        return {"error": {"code": error.code, "message": error.message, "data": error.data}}


async def dedup(client: Client) -> dict[str, Any]:
    charge = {"amount": 4200, "currency": "usd"}
    steps: dict[str, Any] = {}
    steps["first"] = await call(client, "charge_payment", charge, "interop-key-1")
    steps["retry"] = await call(client, "charge_payment", charge, "interop-key-1")
    steps["conflict"] = await call(client, "charge_payment", {"amount": 9900, "currency": "usd"}, "interop-key-1")
    slow = {"amount": 100, "currency": "eur", "delay_ms": 3000}

    steps["concurrentOrder"] = []

    async def concurrent(name: str) -> None:
        steps[name] = await call(client, "charge_payment", slow, "interop-key-2")
        steps["concurrentOrder"].append(name)

    async with anyio.create_task_group() as group:
        group.start_soon(concurrent, "concurrentA")
        group.start_soon(concurrent, "concurrentB")
    steps["concurrentRetry"] = await call(client, "charge_payment", slow, "interop-key-2")
    return steps


async def main() -> None:
    global CARRIER
    argv = sys.argv[1:]
    if len(argv) < 3 or argv[0] not in SCENARIOS:
        usage()
    if argv[0] == "dedup-meta":
        CARRIER = "meta"
    kind, rest = argv[1], argv[2:]
    if kind == "stdio" and rest[0] == "--" and len(rest) > 1:
        target: Any = StdioServerParameters(command=rest[1], args=rest[2:])
    elif kind == "http" and len(rest) == 1:
        target = rest[0]
    else:
        usage()
    # "auto" sends server/discover and adopts its parsed result; the raw one is fetched again below.
    async with Client(target, mode="auto") as client:
        if client.protocol_version != PROTOCOL:
            raise SystemExit(f"negotiated {client.protocol_version}, expected {PROTOCOL}")
        parsed = client.server_capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
        discover = await client.session.send_discover(PROTOCOL)
        steps = await dedup(client)
    report = {"sdk": "python", "discover": discover, "parsedCapabilities": parsed, "steps": steps, "sent": []}
    print(json.dumps(report))


anyio.run(main)
