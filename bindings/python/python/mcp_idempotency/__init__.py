"""SEP-3182 request idempotency in process, for MCP servers on the official Python SDK (`mcp` 2.x).

    from mcp_idempotency import idempotent
    idempotent(server)          # an MCPServer or a low-level Server

The server then advertises `capabilities.tools.idempotency`, and a `tools/call` carrying an
`idempotencyKey` is deduplicated exactly as `mcp-idem wrap` does it: the retry of a recorded call
gets the recorded outcome (success or error) without running the tool again, the key reused with
other arguments is refused (`idempotency_key_conflict`), a duplicate of a call still running is
refused at once (`idempotency_key_in_progress`), and a call whose server died mid-call answers
`idempotency_outcome_unknown`. Calls without that key are protected per tool by `tools=` policies
(a business identifier, a key argument, a duplicate window) and `_meta` keys, as under `mcp-idem
wrap --tools`. Every decision, the equivalence of arguments and the stores are the
Rust library's (`mcp-idempotency`); this module only carries the SDK's messages to it, in the
SDK's own middleware chain, so stdio and Streamable HTTP (JSON or SSE, sessions or not) are covered
alike. Tools run on the server's event loop; store I/O runs on the library's tokio runtime.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import datetime
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, RequestParams
from pydantic import ValidationError

from ._native import (
    META_KEY,
    OPTIONS,
    Completions,
    Gateway,
    IdempotencyError,
    client_principal,
    invalid_option,
    server_namespace,
    settle_at_exit,
)

# `META_KEY`: where a claimed call's key reaches the tool, `params._meta["mcp-idem/idempotencyKey"]`.
__all__ = ["META_KEY", "OPTIONS", "IdempotencyError", "idempotency_key", "idempotent"]

# Outcomes the store failed to take at first are still being sent as the process exits: the
# library gives them a moment (`_native.SETTLE_GRACE_SECONDS`, as `wrap`).
atexit.register(settle_at_exit)

Server = TypeVar("Server")


def idempotent(
    server: Server,
    *,
    store: str | None = None,
    namespace: str | None = None,
    principal: str | Callable[[Any], str | None] | None = None,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    meta_key: str | Sequence[str] | None = None,
    **options: Any,
) -> Server:
    """Give `server` SEP-3182 and return it.

    `store` is a store URL as `mcp-idem wrap --store` takes it (`memory`, `sqlite:PATH`,
    `redis://`, `rediss://`, `redis-cluster://`, `postgres://`, ...); by default the SQLite file
    `mcp-idem/records.sqlite3` in the user's data directory. `namespace` separates this server's
    records from others' in a shared store (default: `mcp-server:` and the server's name, as under
    `mcp-idem wrap`, so a server moved between them keeps its records).
    `principal` scopes records to a caller: a string, or a function of the request context that
    returns one (or None); by default the authenticated client of an HTTP request (the SDK's
    access token), else the local user. Every other option of `wrap` is taken by its name, `_` for
    `-`: `retention="24h"`, `lease="5m"`, `after_crash="reject"`, `forward_key=False`,
    `cancel="absorb"`, `max_key_bytes=256`, `max_argument_bytes=...`, ...

    `tools` protects calls that carry no SEP key, per tool: a dict of tool name (or `"*"`, every
    tool) to its settings, exactly the config file's `[tools.NAME]` tables (`-` or `_` in names):
    `key_from` (JSON Pointers into the arguments: `["/order_id"]`), `key_argument`, `window`
    (`"30s"` or a timedelta), `required`, `on_error`, `store_down`, `wait`, as under `mcp-idem wrap
    --tools`. `meta_key` names more `params._meta` members a client's key is read from (a string
    or a list of them), beside `_meta.idempotencyKey`, always read:

        idempotent(server, tools={"charge": {"key_from": ["/order_id"], "required": True}})

    The store is opened here, once per namespace and options (servers built per request share
    it): a bad option or policy, a store URL that does not parse or a store that cannot be
    reached raises `IdempotencyError` (with `.type` and `.code`) at once.
    """
    lowlevel = getattr(server, "_lowlevel_server", server)
    if not hasattr(lowlevel, "middleware"):
        raise TypeError(f"idempotent() takes an MCPServer or a low-level mcp Server, not {type(server).__name__}")
    settings: list[tuple[str, str]] = []
    if store is not None:
        settings.append(("store", _option_text("store", store)))
    if isinstance(principal, str):
        settings.append(("principal", principal))
    elif principal is not None and not callable(principal):
        raise invalid_option("principal", repr(principal), "expected a string or a function")
    if tools is not None:
        settings.append(("tools", _tools_text(tools)))
    if meta_key is not None:
        settings.append(("meta-key", _meta_key_text(meta_key)))
    for name, value in options.items():
        settings.append((name, _option_text(name, value)))
    # One gateway per namespace and options (the library's): servers built per request or per
    # session share one store.
    gateway = Gateway.open(namespace or server_namespace(lowlevel.name), settings)
    resolve = principal if callable(principal) else _authenticated_client
    lowlevel.middleware.append(
        IdempotencyMiddleware(gateway, principal=resolve, absorb_cancel=gateway.absorbs_cancellations)
    )
    return server


def idempotency_key(context: Any) -> str | None:
    """The idempotency key of the call a tool is running for (`None` without one).

    Takes an `MCPServer` tool's `Context` or a low-level handler's request context.
    """
    request_context = getattr(context, "request_context", context)
    params = getattr(request_context, "params", None) or {}
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    key = meta.get(META_KEY) if isinstance(meta, Mapping) else None
    return key if isinstance(key, str) else None


class IdempotencyMiddleware:
    """The SDK middleware that hands each request and its answer to the gateway.

    Each request is a connection of its own to the library: its claim lives in the store, so
    duplicates on other requests, sessions or processes sharing the store see it. The SDK runs each
    request in a task of its own and hands the client's responses (an elicitation answer) to the
    waiting request directly, so a key-less duplicate waiting here for a running call's outcome
    (up to its tool's `wait`) holds up no other message, not even the answer that call waits for.
    """

    def __init__(self, gateway: Gateway, *, principal: Callable[[Any], str | None], absorb_cancel: bool):
        self.gateway = gateway
        self._principal = principal
        self._absorb_cancel = absorb_cancel

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        if ctx.request_id is None:
            # A notification: the SDK handles cancellations itself (see `absorb_cancel`), and no
            # call of a per-request connection can be in flight for anything else to concern.
            return await call_next(ctx)
        request_id = ctx.request_id
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": ctx.method}
        if ctx.params is not None:
            request["params"] = ctx.params
        connection = self.gateway.connect(self._principal(ctx))
        completions = _LoopCompletions.of_running_loop()
        action, message = await completions.settled(connection.from_client(_dumps(request), completions.native))
        if action == "respond":
            return _result_or_raise(json.loads(message))
        if action == "rewritten":
            params = json.loads(message).get("params")
            ctx = dataclasses.replace(ctx, params=params, meta=_meta_of(params))
        try:
            if self._absorb_cancel and action == "rewritten":
                # A claimed call runs to its end and is recorded even if the client cancels it
                # (`cancel=absorb`, as `wrap` does): the retry that follows gets its outcome. Not
                # the library's `ClientAction::Absorb` (dropping the notification, as `wrap` and
                # the Node binding do): this SDK's dispatcher acts on `notifications/cancelled`
                # itself, cancelling the handler before any middleware sees the notification, so
                # only a shield keeps the handler running.
                with anyio.CancelScope(shield=True):
                    result, error = await _outcome(call_next, ctx)
            else:
                result, error = await _outcome(call_next, ctx)
        except BaseException:
            # Cancelled (the client with `cancel=forward`, or the server shutting down): the
            # call may or may not have taken effect.
            with anyio.CancelScope(shield=True):
                await completions.settled(connection.close(completions.native))
            raise
        if error is not None:
            answer = {"jsonrpc": "2.0", "id": request_id, "error": _error_body(error)}
        else:
            answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
        action, message = await completions.settled(connection.from_server(_dumps(answer), completions.native))
        if error is not None:
            raise error
        if action == "rewritten":
            return json.loads(message)["result"]
        return result


async def _outcome(call_next: Callable[[Any], Any], ctx: Any) -> tuple[Any, MCPError | None]:
    """The handler's wire result, or the error the client is sent (the same for the replay)."""
    try:
        result = await call_next(ctx)
    except MCPError as error:
        return None, error
    except ValidationError:
        return None, MCPError(code=INVALID_PARAMS, message="Invalid request parameters", data="")
    except Exception as error:  # noqa: BLE001 - recorded and sent as the internal error it is
        return None, MCPError(code=INTERNAL_ERROR, message=str(error))
    if result is None:
        return {}, None
    if hasattr(result, "model_dump"):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True), None
    return dict(result), None


class _LoopCompletions:
    """The answers of store round trips for one asyncio loop.

    A decision that waits on the store runs on the library's runtime and comes back as a ticket;
    its answer is queued natively, and the loop is woken through a socket it watches. The answers
    are taken here, on the loop, which resolves the futures waiting for them.
    """

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopCompletions] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.native = Completions()
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        loop.add_reader(self.native.fileno(), self._take)

    @classmethod
    def of_running_loop(cls) -> _LoopCompletions:
        loop = asyncio.get_running_loop()
        completions = cls._by_loop.get(loop)
        if completions is None:
            completions = cls._by_loop[loop] = cls(loop)
        return completions

    async def settled(self, step: Any) -> Any:
        """A step of the library: ready at once, or a ticket awaited while the store answers."""
        if not isinstance(step, int):
            return step
        waiting = self.waiting[step] = self.loop.create_future()
        return await waiting

    def _take(self) -> None:
        for ticket, answer in self.native.take():
            waiting = self.waiting.pop(ticket, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(answer)


def _result_or_raise(response: Mapping[str, Any]) -> dict[str, Any]:
    error = response.get("error")
    if error is not None:
        raise MCPError(code=error.get("code", INTERNAL_ERROR), message=error.get("message", ""), data=error.get("data"))
    return response.get("result", {})


def _error_body(error: MCPError) -> dict[str, Any]:
    return error.error.model_dump(by_alias=True, mode="json", exclude_none=True)


def _meta_of(params: Any) -> Any:
    if not isinstance(params, Mapping) or "_meta" not in params:
        return None
    try:
        return RequestParams.model_validate(params, by_name=False).meta
    except ValidationError:
        return None


def _authenticated_client(ctx: Any) -> str | None:
    """The client of an authenticated HTTP request (the SDK's access token), else None."""
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
    except ImportError:  # pragma: no cover - an SDK without its auth module
        return None
    token = get_access_token()
    return None if token is None else client_principal(token.client_id)


def _dumps(message: Mapping[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def _option_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return f"{int(value.total_seconds() * 1000)}ms"
    raise invalid_option(name, repr(value), "expected a string, a number, a bool or a timedelta")


def _tools_text(tools: Any) -> str:
    """The `tools` option as the library reads it: the policies as JSON text (durations as `Nms`)."""

    def duration(value: Any) -> str:
        if isinstance(value, datetime.timedelta):
            return f"{int(value.total_seconds() * 1000)}ms"
        raise TypeError(f"{type(value).__name__} is not a JSON value")

    try:
        return json.dumps(tools, default=duration, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise invalid_option("tools", repr(tools), f"expected a dict of tool name to settings ({error})") from None


def _meta_key_text(meta_key: Any) -> str:
    """The `meta-key` option as the library reads it: the names, comma-separated."""
    names = [meta_key] if isinstance(meta_key, str) else meta_key
    if not isinstance(names, Sequence) or not all(isinstance(name, str) for name in names):
        raise invalid_option("meta-key", repr(meta_key), "expected a string or a list of strings")
    if any("," in name for name in names):
        raise invalid_option("meta-key", repr(meta_key), "a name must not contain a comma")
    return ",".join(names)
