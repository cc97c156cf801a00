"""The adapter for the official SDK's maintenance line, `mcp` 1.x: `mcp.server.fastmcp.FastMCP`
and the low-level `mcp.server.lowlevel.Server`. jlowin's `fastmcp` 3.x runs on such a low-level
server too (`_fastmcp`).

1.x has no middleware list. Every request but `initialize` reaches a handler of the low-level
server's `request_handlers` (by request type), called with the parsed request once the request
context is set; its models keep unknown members (`idempotencyKey`), so the handler wrapped here
sees the request as sent. `initialize` is answered by the session from the server's
`create_initialization_options()`, whose capabilities come from `get_capabilities`: the library
adds `tools.idempotency` there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
from mcp import types
from mcp.server.lowlevel.server import Server, request_ctx
from mcp.shared.exceptions import McpError
from pydantic import ValidationError

from ._core import Carrier, Outcome, wire_result


def lowlevel_of(server: Any) -> Any | None:
    """The low-level `Server` of a `FastMCP` or a low-level `Server` of `mcp` 1.x, else None."""
    from mcp.server.fastmcp import FastMCP

    if isinstance(server, FastMCP):
        return server._mcp_server
    if isinstance(server, Server):
        return server
    return None


def wired(lowlevel: Any) -> bool:
    """Whether an earlier `idempotent()` wired `lowlevel` (its handlers are carried already)."""
    return isinstance(getattr(lowlevel, "request_handlers", None), _Handlers)


def install(lowlevel: Any, carrier: Carrier) -> None:
    """Routes every request handler of `lowlevel`, present and registered later, through the
    gateway, and its capabilities through the library. `lowlevel` is not `wired` yet: the caller
    refuses a second wiring before it opens the gateway."""
    if not isinstance(getattr(lowlevel, "request_handlers", None), dict) or not callable(
        getattr(lowlevel, "get_capabilities", None)
    ):
        raise TypeError(f"{type(lowlevel).__name__} has no request_handlers/get_capabilities of mcp 1.x")
    lowlevel.request_handlers = _Handlers(carrier, lowlevel.request_handlers)
    # The SDK's experimental (tasks) handlers, once made, register into the dict they were given.
    experimental = getattr(lowlevel, "_experimental_handlers", None)
    if experimental is not None and isinstance(getattr(experimental, "_request_handlers", None), dict):
        experimental._request_handlers = lowlevel.request_handlers
    capabilities = lowlevel.get_capabilities  # bound: the server's own, or its framework's override

    def get_capabilities(*args: Any, **kwargs: Any) -> types.ServerCapabilities:
        own = capabilities(*args, **kwargs)
        advertised = carrier.advertised(own.model_dump(by_alias=True, mode="json", exclude_none=True))
        return types.ServerCapabilities.model_validate(advertised)

    lowlevel.get_capabilities = get_capabilities


class _Handlers(dict):
    """`request_handlers` whose every handler, set before or after, is carried by the gateway."""

    def __init__(self, carrier: Carrier, handlers: dict):
        super().__init__()
        self.carrier = carrier
        for request_type, handler in handlers.items():
            self[request_type] = handler

    def __setitem__(self, request_type: type, handler: Callable[..., Any]) -> None:
        super().__setitem__(request_type, _carried(self.carrier, handler, self))

    async def list_tools(self, params: Any) -> Outcome:
        """The server's own `tools/list` handler, run for the gateway (not carried)."""
        handler = self.get(types.ListToolsRequest)
        if handler is None:
            return None, {"code": types.METHOD_NOT_FOUND, "message": "Method not found"}
        request = types.ListToolsRequest.model_validate({"method": "tools/list", "params": params})
        return await _outcome(getattr(handler, "__wrapped__", handler), request)


def _carried(carrier: Carrier, handler: Callable[..., Any], handlers: _Handlers) -> Callable[..., Any]:
    if getattr(handler, "__mcp_idempotency__", False):
        return handler

    async def carried(request: Any) -> Any:
        context = request_ctx.get(None)
        if context is None or request is None:
            # Not a client's request: the SDK fetches its own tool list (`request` None) to
            # validate a call's arguments.
            return await handler(request)
        wire = request.model_dump(by_alias=True, mode="json", exclude_none=True)

        async def run(params: Any) -> Outcome:
            if params is wire.get("params"):
                return await _outcome(handler, request)
            rewritten = type(request).model_validate({"method": request.method, "params": params})
            # The tool sees the rewritten `_meta` (the key the gateway hands it) in its context.
            meta = rewritten.params.meta if rewritten.params is not None else None
            token = request_ctx.set(dataclasses.replace(context, meta=meta))
            try:
                return await _outcome(handler, rewritten)
            finally:
                request_ctx.reset(token)

        result, error = await carrier.carry(
            context, context.request_id, request.method, wire.get("params"), run, handlers.list_tools
        )
        # A call the client cancelled ran to its end (`cancel=absorb`) and is recorded; the SDK
        # answered the cancellation itself and must not answer twice: the cancellation goes on
        # from here, as the SDK expects it.
        await anyio.lowlevel.checkpoint()
        if error is not None:
            raise McpError(types.ErrorData.model_validate(error))
        return types.ServerResult.model_validate(result)

    carried.__mcp_idempotency__ = True  # type: ignore[attr-defined]
    carried.__wrapped__ = handler  # type: ignore[attr-defined]
    return carried


async def _outcome(handler: Callable[..., Any], request: Any) -> Outcome:
    """The handler's wire result, or the error the client is sent (as `_handle_request` sends it)."""
    try:
        result = await handler(request)
    except McpError as error:
        return None, error.error.model_dump(by_alias=True, mode="json", exclude_none=True)
    except ValidationError:
        return None, {"code": types.INVALID_PARAMS, "message": "Invalid request parameters", "data": ""}
    except Exception as error:  # noqa: BLE001 - recorded and sent as the SDK sends it
        return None, {"code": 0, "message": str(error)}
    if isinstance(result, types.ErrorData):
        return None, result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return wire_result(result), None
