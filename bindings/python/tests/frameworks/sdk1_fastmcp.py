"""The payments server (see common.py) on `mcp` 1.x's `mcp.server.fastmcp.FastMCP`, with
`idempotent()`."""

import asyncio
from typing import Any

from common import Ledger, failed_after, parse, serve_http, wire_again
from mcp.server.fastmcp import Context, FastMCP

from mcp_idempotency import idempotency_key, idempotent

args, options = parse()
ledger = Ledger(args.ledger)
server = FastMCP("payments", stateless_http=True, json_response=True)


@server.tool()
async def charge_payment(amount: int | float, currency: str, ctx: Context, order_id: str | None = None,
                         delay_ms: int = 0, fail_after_charge: bool = False) -> dict[str, Any]:
    """Charge a payment: appends one line to the ledger and returns its chargeId."""
    charge = await ledger.charge(amount, currency, order_id, delay_ms, idempotency_key(ctx))
    if fail_after_charge:
        raise RuntimeError(failed_after(charge))
    return charge


@server.tool()
def get_balance() -> dict[str, Any]:
    """Number of charges in the ledger and the sum per currency."""
    return ledger.balance()


idempotent(server, **options)
if args.wire_twice:
    wire_again(lambda: idempotent(server, **options))

if __name__ == "__main__":
    if args.http:
        asyncio.run(serve_http(server.streamable_http_app()))
    else:
        server.run()
