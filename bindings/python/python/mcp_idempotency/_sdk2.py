"""The adapter for the official SDK `mcp` 2.x: `MCPServer` and the low-level `Server`, through the
SDK's own middleware list (`Server.middleware`), which sees every request and its answer over
stdio and Streamable HTTP alike. jlowin's `fastmcp` 4.x runs on such a low-level server too
(`_fastmcp`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, RequestParams
from pydantic import ValidationError

from ._core import Carrier, Outcome, wire_result


def lowlevel_of(server: Any) -> Any | None:
    """The low-level `Server` of an `MCPServer` or a low-level `Server` of `mcp` 2.x, else None."""
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import MCPServer

    if isinstance(server, MCPServer):
        return server._lowlevel_server
    if isinstance(server, Server):
        return server
    return None


def wired(lowlevel: Any) -> bool:
    """Whether an earlier `idempotent()` wired `lowlevel` (its middleware list holds ours)."""
    return any(isinstance(middleware, IdempotencyMiddleware) for middleware in getattr(lowlevel, "middleware", ()))


def install(lowlevel: Any, carrier: Carrier, *, outermost: bool = False) -> None:
    """Adds the middleware to `lowlevel`'s list: last (the SDK's own servers), or first
    (`outermost`: a framework whose middleware rebuilds results, so it sees their final shape).
    `lowlevel` is not `wired` yet: the caller refuses a second wiring before it opens the gateway."""
    middleware = IdempotencyMiddleware(carrier)
    if outermost:
        lowlevel.middleware.insert(0, middleware)
    else:
        lowlevel.middleware.append(middleware)


class IdempotencyMiddleware:
    """The SDK middleware that hands each request and its answer to the gateway."""

    def __init__(self, carrier: Carrier):
        self.carrier = carrier

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        if ctx.request_id is None:
            # A notification: the SDK handles cancellations itself (see `absorb_cancel`), and no
            # call of a per-request connection can be in flight for anything else to concern.
            return await call_next(ctx)

        async def run(params: Any) -> Outcome:
            forwarded = ctx if params is ctx.params else dataclasses.replace(ctx, params=params, meta=_meta_of(params))
            return await _outcome(call_next, forwarded)

        async def list_tools(params: Any) -> Outcome:
            # The server's own `tools/list`, through the middleware after this one.
            listing = dataclasses.replace(ctx, method="tools/list", params=params, meta=_meta_of(params))
            return await _outcome(call_next, listing)

        result, error = await self.carrier.carry(ctx, ctx.request_id, ctx.method, ctx.params, run, list_tools)
        if error is not None:
            raise MCPError(code=error.get("code", INTERNAL_ERROR), message=error.get("message", ""), data=error.get("data"))
        return result


async def _outcome(call_next: Callable[[Any], Any], ctx: Any) -> Outcome:
    """The handler's wire result, or the error the client is sent (the same for the replay)."""
    try:
        result = await call_next(ctx)
    except MCPError as error:
        return None, _error_body(error)
    except ValidationError:
        return None, _error_body(MCPError(code=INVALID_PARAMS, message="Invalid request parameters", data=""))
    except Exception as error:  # noqa: BLE001 - recorded and sent as the internal error it is
        return None, _error_body(MCPError(code=INTERNAL_ERROR, message=str(error)))
    return wire_result(result), None


def _error_body(error: MCPError) -> dict[str, Any]:
    return error.error.model_dump(by_alias=True, mode="json", exclude_none=True)


def _meta_of(params: Any) -> Any:
    if not isinstance(params, dict) or "_meta" not in params:
        return None
    try:
        return RequestParams.model_validate(params, by_name=False).meta
    except ValidationError:
        return None
