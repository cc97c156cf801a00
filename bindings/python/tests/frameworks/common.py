"""What the framework payments servers share (no framework imported here): the demo server's
ledger and tools' bodies, the command line, and Streamable HTTP on a free loopback port.

Each server (`sdk2_lowlevel.py`, `sdk1_fastmcp.py`, `sdk1_lowlevel.py`, `jlowin_fastmcp.py`; the
`MCPServer` one is `../payments_server.py`) registers `charge_payment` and `get_balance` in its
framework's own API and takes:

    python3 SERVER --ledger FILE [--store S] [--lease D] [--option NAME=VALUE ...]
                   [--tools JSON] [--meta-key NAME ...]    idempotent()'s options
    python3 SERVER --ledger FILE ... --wire-twice   then idempotent() a second time on the same
                                               server, which must raise; stderr says whether it did
    python3 SERVER --ledger FILE ... --http    stateless Streamable HTTP (JSON answers) on
                                               127.0.0.1, a free port; the first stderr line is
                                               "listening on http://127.0.0.1:PORT/mcp"

- charge_payment {amount, currency, order_id?, delay_ms?, fail_after_charge?}: sleeps delay_ms,
  appends one JSON line {chargeId, amount, currency, orderId, pid, unixMs, key} to the ledger,
  answers {chargeId, amount, currency}; with fail_after_charge it charges, then fails.
- get_balance: the number of charges in the ledger and the sum per currency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import uuid
from typing import Any


class Ledger:
    def __init__(self, path: str):
        self.path = path
        self.descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def charge(self, amount: Any, currency: str, order_id: str | None, delay_ms: int, key: str | None) -> dict:
        """Sleeps `delay_ms`, appends one charge (one write on an O_APPEND descriptor)."""
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        charge_id = "ch_" + uuid.uuid4().hex
        line = {"chargeId": charge_id, "amount": amount, "currency": currency, "orderId": order_id,
                "pid": os.getpid(), "unixMs": int(time.time() * 1000), "key": key}
        os.write(self.descriptor, (json.dumps(line) + "\n").encode())
        return {"chargeId": charge_id, "amount": amount, "currency": currency}

    def balance(self) -> dict:
        sums: dict[str, float] = {}
        charges = 0
        with open(self.path, encoding="utf-8") as file:
            for line in file:
                if line.endswith("\n"):
                    charge = json.loads(line)
                    charges += 1
                    sums[charge["currency"]] = sums.get(charge["currency"], 0) + charge["amount"]
        return {"charges": charges, "sums": sums}


def failed_after(charge: dict) -> str:
    return f"charge {charge['chargeId']} was recorded, then the call failed (fail_after_charge)"


def parse() -> tuple[argparse.Namespace, dict[str, Any]]:
    """The command line, and `idempotent()`'s keyword arguments from it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--store")
    parser.add_argument("--namespace")
    parser.add_argument("--lease")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--tools", type=json.loads)
    parser.add_argument("--meta-key", action="append")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--wire-twice", action="store_true")
    args = parser.parse_args()
    options: dict[str, Any] = dict(option.split("=", 1) for option in args.option)
    if args.lease:
        options["lease"] = args.lease
    options.update(store=args.store, namespace=args.namespace, tools=args.tools, meta_key=args.meta_key)
    return args, options


def wire_again(wire: Any) -> None:
    """`--wire-twice`: `wire()` calls `idempotent()` on the wired server again; says on stderr
    whether it raised (as it must) or was accepted."""
    try:
        wire()
    except TypeError as refused:
        print(f"the second idempotent() raised TypeError: {refused}", file=sys.stderr, flush=True)
    else:
        print("the second idempotent() was accepted", file=sys.stderr, flush=True)


async def serve_http(app: Any) -> None:
    """Serves the ASGI `app` (its MCP endpoint at /mcp) on 127.0.0.1, a free port."""
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    # Listen before saying so: a client connecting between the line and uvicorn's start-up would
    # otherwise be refused.
    listener.listen(512)
    port = listener.getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
    await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[listener])
