"""What every adapter shares: one request and its answer carried through the library's gateway.

The adapters (`_sdk2`, `_sdk1`, `_fastmcp`) differ only in where they catch a request and how
they hand the answer back to their framework; every decision is the library's. Nothing here
imports `mcp`: each adapter brings its SDK's error type.
"""

from __future__ import annotations

import asyncio
import json
import select
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

try:
    import anyio
except ImportError as missing:  # anyio comes with mcp, which the wheel does not require
    raise ImportError(
        "mcp_idempotency runs on the official SDK `mcp` (>=1.24,<2 or >=2.3,<3), which is not installed: "
        "install your server's SDK, or pip install 'mcp-idempotency[mcp]'"
    ) from missing

from ._native import Completions, Gateway

# (result, None) or (None, error body): a handler's outcome as the client is sent it.
Outcome = tuple[Any, Any]


class Carrier:
    """A gateway and how an adapter uses it: the principal of a request and the cancel policy."""

    def __init__(self, gateway: Gateway, principal: Callable[[Any], str | None]):
        self.gateway = gateway
        self.principal = principal
        self.absorb_cancel = gateway.absorbs_cancellations
        self.lists_tools = gateway.lists_tools

    async def carry(
        self,
        context: Any,
        request_id: Any,
        method: str,
        params: Any,
        run: Callable[[Any], Awaitable[Outcome]],
        list_tools: Callable[[Any], Awaitable[Outcome]] | None = None,
    ) -> Outcome:
        """Carries one request (`params`: its JSON params or None) and its answer through the
        gateway. `run(params)` runs the handler with the params the gateway forwards (rewritten
        or not) and returns its outcome; the answer is the outcome the client is to be sent.
        `list_tools(params)` runs the server's own `tools/list` handler: with
        `tools="suggested"`, the gateway lists the tools itself before it decides the first
        call, as `wrap` does, whether or not a client listed them.

        Each request is a connection of its own to the library: its claim lives in the store, so
        duplicates on other requests, sessions or processes sharing the store see it. The SDKs
        run each request in a task of its own and hand the client's responses (an elicitation
        answer) to the waiting request directly, so a key-less duplicate waiting here for a
        running call's outcome (up to its tool's `wait`) holds up no other message, not even the
        answer that call waits for.
        """
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            request["params"] = params
        connection = self.gateway.connect(self.principal(context))
        completions = _LoopCompletions.of_running_loop()
        message = dumps(request)
        if self.lists_tools and list_tools is not None and method == "tools/call":
            await _learn_tools(connection, message, list_tools, completions)
        action, message = await completions.settled(connection.from_client(message, completions.native))
        if action == "respond":
            answer = json.loads(message)
            return answer.get("result"), answer.get("error")
        if action == "rewritten":
            params = json.loads(message).get("params")
        try:
            if self.absorb_cancel and action == "rewritten":
                # A claimed call runs to its end and is recorded even if the client cancels it
                # (`cancel=absorb`, as `wrap` does): the retry that follows gets its outcome. Not
                # the library's `ClientAction::Absorb` (dropping the notification, as `wrap` and
                # the Node binding do): the SDKs act on `notifications/cancelled` themselves,
                # cancelling the handler before any hook sees the notification, so only a
                # shield keeps the handler running.
                with anyio.CancelScope(shield=True):
                    result, error = await run(params)
            else:
                result, error = await run(params)
        except BaseException:
            # Cancelled (the client with `cancel=forward`, or the server shutting down): the
            # call may or may not have taken effect.
            with anyio.CancelScope(shield=True):
                await completions.settled(connection.close(completions.native))
            raise
        if error is not None:
            answer = {"jsonrpc": "2.0", "id": request_id, "error": error}
        else:
            answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
        action, message = await completions.settled(connection.from_server(dumps(answer), completions.native))
        if error is None and action == "rewritten":
            return json.loads(message)["result"], None
        return result, error

    def advertised(self, capabilities: Mapping[str, Any]) -> dict[str, Any]:
        """`capabilities` as the library advertises them in an `initialize` result (with
        `tools.idempotency` when `wrap` would add it): for SDKs that build that result outside
        any hook a request passes through. Synchronous: the library answers it without the
        store."""
        connection = self.gateway.connect(None)
        native = Completions()
        request = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "mcp-idempotency", "version": "0"}}}
        _wait(native, connection.from_client(dumps(request), native))
        result = {"protocolVersion": "2025-11-25", "capabilities": dict(capabilities),
                  "serverInfo": {"name": "mcp-idempotency", "version": "0"}}
        action, message = _wait(native, connection.from_server(dumps({"jsonrpc": "2.0", "id": 0, "result": result}), native))
        _wait(native, connection.close(native))
        if action == "rewritten":
            return json.loads(message)["result"]["capabilities"]
        return dict(capabilities)


async def _learn_tools(
    connection: Any, message: str, list_tools: Callable[[Any], Awaitable[Outcome]], completions: _LoopCompletions
) -> None:
    """Runs the `tools/list` requests the gateway asks for before `message` on the server's own
    handler (every page), and hands it the answers, which it keeps to itself."""
    while (asked := connection.tools_request(message)) is not None:
        request = json.loads(asked)
        result, error = await list_tools(request.get("params"))
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if error is not None:
            answer["error"] = error
        else:
            answer["result"] = result
        await completions.settled(connection.from_server(dumps(answer), completions.native))


def _wait(native: Completions, step: Any) -> Any:
    """A step of the library, waited for here (outside any event loop)."""
    if not isinstance(step, int):
        return step
    while True:
        select.select([native.fileno()], [], [])
        for ticket, answer in native.take():
            if ticket == step:
                return answer


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


def already_wired(server: Any) -> TypeError:
    """The refusal of a server an earlier `idempotent()` wired (it, or the low-level server it runs
    on): a second gateway in front of the first would claim each key, then meet its own claim in
    progress, and the tool would never run."""
    cls = type(server)
    return TypeError(
        f"idempotent() got a {cls.__module__}.{cls.__qualname__} that is already wired: an earlier "
        "idempotent() gave it (or the low-level server it runs on) SEP-3182; call it once per server"
    )


def wire_result(result: Any) -> Any:
    """A handler's result as its JSON (a pydantic model dumped as the SDKs dump it)."""
    if result is None:
        return {}
    if hasattr(result, "model_dump"):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(result)


def authenticated_client(_context: Any) -> str | None:
    """The client of an authenticated HTTP request (the SDK's access token), else None. Both
    SDK lines keep the token in `mcp.server.auth.middleware.auth_context`."""
    from ._native import client_principal

    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
    except ImportError:  # pragma: no cover - an SDK without its auth module
        return None
    token = get_access_token()
    return None if token is None else client_principal(token.client_id)


def dumps(message: Mapping[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)
