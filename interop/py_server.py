"""A small MCP server built on the Python SDK 2.x (`MCPServer`, formerly FastMCP), the upstream of
the gateway in crates/mcp-idem/tests/integration/interop_servers.rs.

    python3 py_server.py --executions FILE           serve stdio
    python3 py_server.py --executions FILE --http    serve Streamable HTTP on 127.0.0.1, a free
                                                     port; the first stderr line is
                                                     "listening on http://127.0.0.1:PORT/mcp"

Tool `charge {amount, currency}` appends one JSON line {tool, executionId, amount, currency, pid}
to FILE per execution and returns {executionId}, so a test counts real executions.
"""

import argparse
import asyncio
import json
import os
import socket
import sys
import uuid
from typing import TypedDict

from mcp.server.mcpserver import MCPServer


class Charged(TypedDict):
    executionId: str


def build(executions: str) -> MCPServer:
    server = MCPServer("interop-py-server")

    @server.tool()
    def charge(amount: float, currency: str) -> Charged:
        """Charge once: appends one execution line."""
        execution_id = str(uuid.uuid4())
        line = {"tool": "charge", "executionId": execution_id, "amount": amount, "currency": currency, "pid": os.getpid()}
        with open(executions, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")
        return {"executionId": execution_id}

    return server


async def serve_http(server: MCPServer, *, sessions: bool = False) -> None:
    """Serves `server` over Streamable HTTP on 127.0.0.1, a free port: stateless with JSON answers,
    or with `sessions` (`Mcp-Session-Id`) and SSE answers. Also the HTTP side of the Python
    binding's payments server (bindings/python/tests)."""
    import uvicorn

    app = server.streamable_http_app(stateless_http=not sessions, json_response=not sessions)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    # Listen before saying so: a client connecting between the line and uvicorn's start-up would
    # otherwise be refused.
    listener.listen(512)
    port = listener.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning")
    print(f"listening on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
    await uvicorn.Server(config).serve(sockets=[listener])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", required=True)
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args()
    server = build(args.executions)
    if args.http:
        asyncio.run(serve_http(server))
    else:
        server.run()


if __name__ == "__main__":
    main()
