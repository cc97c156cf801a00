"""The payments server of the binding's tests: `mcp-idem demo-server`'s tools and ledger on the
Python SDK's `MCPServer`, with SEP-3182 in process through `mcp_idempotency.idempotent`.

    python3 payments_server.py --ledger FILE [--store S] [--namespace N] [--lease D] [--option NAME=VALUE ...]
                               [--tools JSON] [--meta-key NAME ...]   key policies (idempotent's
                                                          `tools=` and `meta_key=`)
    python3 payments_server.py --ledger FILE ... --http    stateless Streamable HTTP on 127.0.0.1, a
                                                          free port; the first stderr line is
                                                          "listening on http://127.0.0.1:PORT/mcp"
    python3 payments_server.py --ledger FILE ... --http --sessions   the same with sessions
                                                          (Mcp-Session-Id) and SSE answers
    python3 payments_server.py --ledger FILE --plain       the same server without the binding
    python3 payments_server.py --ledger FILE ... --wire-twice   then idempotent() a second time on
                                                          the same server, which must raise;
                                                          stderr says whether it did

Tools (as the demo server's):
- charge_payment {amount, currency, order_id?, delay_ms?, fail_after_charge?}: sleeps delay_ms,
  appends one JSON line {chargeId, amount, currency, orderId, pid, unixMs, key} to the ledger (one
  write on an O_APPEND descriptor, so servers may share it), answers {chargeId, amount, currency};
  with fail_after_charge it charges, then fails with a JSON-RPC internal error naming the charge.
- confirm_charge {order_id, amount, currency}: asks the client to confirm (MCP elicitation,
  `elicitation/create`), then charges as charge_payment does; declined, it charges nothing.
- get_balance (readOnlyHint): the number of charges in the ledger and the sum per currency.
- noop, work_1ms: no ledger write; answer at once, or after 1 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, ToolAnnotations
from pydantic import BaseModel

from mcp_idempotency import idempotency_key, idempotent

# The HTTP side is the interop server's (interop/py_server.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "interop"))
from py_server import serve_http  # noqa: E402


def build(ledger: str) -> MCPServer:
    server = MCPServer("payments")
    descriptor = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(charge: dict[str, Any]) -> None:
        os.write(descriptor, (json.dumps(charge) + "\n").encode())

    def charge(amount: int | float, currency: str, order_id: str | None, ctx: Context) -> str:
        charge_id = "ch_" + uuid.uuid4().hex
        append(
            {
                "chargeId": charge_id,
                "amount": amount,
                "currency": currency,
                "orderId": order_id,
                "pid": os.getpid(),
                "unixMs": int(time.time() * 1000),
                "key": idempotency_key(ctx),
            }
        )
        return charge_id

    @server.tool()
    async def charge_payment(
        amount: int | float,
        currency: str,
        ctx: Context,
        order_id: str | None = None,
        delay_ms: int = 0,
        fail_after_charge: bool = False,
    ) -> dict[str, Any]:
        """Charge a payment: appends one line to the ledger and returns its chargeId."""
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        charge_id = charge(amount, currency, order_id, ctx)
        if fail_after_charge:
            raise MCPError(
                code=INTERNAL_ERROR,
                message=f"charge {charge_id} was recorded, then the call failed (fail_after_charge)",
                data={"chargeId": charge_id},
            )
        return {"chargeId": charge_id, "amount": amount, "currency": currency}

    class Confirmation(BaseModel):
        confirm: bool

    @server.tool()
    async def confirm_charge(order_id: str, amount: int | float, currency: str, ctx: Context) -> dict[str, Any]:
        """Ask the client to confirm the charge (elicitation), then charge it."""
        answer = await ctx.elicit(f"Charge {amount} {currency} for {order_id}?", Confirmation)
        if answer.action != "accept" or not answer.data.confirm:
            raise MCPError(code=INTERNAL_ERROR, message=f"the charge for {order_id} was not confirmed")
        return {"chargeId": charge(amount, currency, order_id, ctx), "amount": amount, "currency": currency}

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def get_balance() -> dict[str, Any]:
        """Number of charges in the ledger and the sum per currency."""
        sums: dict[str, float] = {}
        charges = 0
        with open(ledger, encoding="utf-8") as file:
            for line in file:
                if not line.endswith("\n"):
                    continue
                charge = json.loads(line)
                charges += 1
                sums[charge["currency"]] = sums.get(charge["currency"], 0) + charge["amount"]
        return {"charges": charges, "sums": sums}

    @server.tool()
    def noop() -> str:
        """Do nothing and answer at once (no ledger write)."""
        return "ok"

    @server.tool()
    async def work_1ms() -> str:
        """Wait on a 1 ms timer, then answer (no ledger write)."""
        await asyncio.sleep(0.001)
        return "ok"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--store")
    parser.add_argument("--namespace")
    parser.add_argument("--lease")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--tools", type=json.loads, help="key policies, as JSON: idempotent(tools=...)")
    parser.add_argument("--meta-key", action="append", help="idempotent(meta_key=[...])")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--sessions", action="store_true", help="with --http: sessions and SSE answers")
    parser.add_argument("--plain", action="store_true", help="without the binding (the bench's baseline)")
    parser.add_argument("--wire-twice", action="store_true", help="then idempotent() again, which must raise")
    args = parser.parse_args()
    server = build(args.ledger)
    if not args.plain:
        options = dict(option.split("=", 1) for option in args.option)
        if args.lease:
            options["lease"] = args.lease
        options.update(store=args.store, namespace=args.namespace, tools=args.tools, meta_key=args.meta_key)
        idempotent(server, **options)
        if args.wire_twice:
            try:
                idempotent(server, **options)
            except TypeError as refused:
                print(f"the second idempotent() raised TypeError: {refused}", file=sys.stderr, flush=True)
            else:
                print("the second idempotent() was accepted", file=sys.stderr, flush=True)
    if args.http:
        asyncio.run(serve_http(server, sessions=args.sessions))
    else:
        server.run()


if __name__ == "__main__":
    main()
