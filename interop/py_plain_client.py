"""An UNMODIFIED Python SDK (`mcp` 2.x) client that sends no idempotency key: it launches a stdio
server (e.g. `mcp-idem bridge URL`), pinned to protocol 2026-07-28, and makes N sequential
`charge_payment` calls with the SDK's plain `client.call_tool(...)`. It prints what it saw as one
JSON document on stdout; the Rust tests (crates/mcp-idem/tests/integration/bridge_sdk_clients.rs)
make the assertions.

    python3 py_plain_client.py charges N AMOUNT_BASE stdio -- COMMAND [ARGS...]

Call i (0-based) charges AMOUNT_BASE + i US cents. Per call the report holds the result's
`structuredContent` (and `isError`) or the JSON-RPC error `{code, message, data}`. The SDK's
parsed capabilities drop `tools.idempotency`, so the script also sends `server/discover` itself
(as py_client.py does) and reports the raw result.
"""

import json
import sys
from typing import Any

import anyio

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

PROTOCOL = "2026-07-28"
# Generous: the stdio server (the bridge) does its own re-issuing within this time.
READ_TIMEOUT_SECONDS = 120.0


def usage() -> None:
    print("usage: py_plain_client.py charges N AMOUNT_BASE stdio -- COMMAND [ARGS...]", file=sys.stderr)
    sys.exit(2)


async def charge(client: Client, amount: int) -> dict[str, Any]:
    try:
        result = await client.call_tool("charge_payment", {"amount": amount, "currency": "usd"})
    except MCPError as error:
        return {"error": {"code": error.code, "message": error.message, "data": error.data}}
    return {"structuredContent": result.structured_content, "isError": result.is_error}


async def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 6 or argv[0] != "charges" or argv[3] != "stdio" or argv[4] != "--":
        usage()
    try:
        calls, base = int(argv[1]), int(argv[2])
    except ValueError:
        usage()
    target = StdioServerParameters(command=argv[5], args=argv[6:])
    async with Client(target, mode=PROTOCOL, read_timeout_seconds=READ_TIMEOUT_SECONDS) as client:
        discover = await client.session.send_discover(PROTOCOL)
        results = [await charge(client, base + i) for i in range(calls)]
        version = client.protocol_version
    report = {"sdk": "python", "protocolVersion": version, "discover": discover, "calls": results}
    print(json.dumps(report))


anyio.run(main)
