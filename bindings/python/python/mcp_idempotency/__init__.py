"""SEP-3182 request idempotency in process, for MCP servers in Python.

    from mcp_idempotency import idempotent
    idempotent(server)

`server` is one of (anything else raises `TypeError` at once, naming what it got):
- the official SDK `mcp` 2.x (>= 2.3): an `MCPServer` or a low-level `mcp.server.lowlevel.Server`;
- the official SDK `mcp` 1.x (>= 1.24): a `mcp.server.fastmcp.FastMCP` or a low-level `Server`;
- jlowin's `fastmcp` (PyPI `fastmcp`) 4.x on `mcp` 2.x, or 3.x (>= 3.4) on `mcp` 1.x: a
  `fastmcp.FastMCP`.

The server then advertises `capabilities.tools.idempotency`, and a `tools/call` carrying an
`idempotencyKey` is deduplicated exactly as `mcp-idem wrap` does it: the retry of a recorded call
gets the recorded outcome (success or error) without running the tool again, the key reused with
other arguments is refused (`idempotency_key_conflict`), a duplicate of a call still running is
refused at once (`idempotency_key_in_progress`), and a call whose server died mid-call answers
`idempotency_outcome_unknown`. Calls without that key are protected per tool by `tools=` policies
(a business identifier, a key argument, a duplicate window) and `_meta` keys, as under `mcp-idem
wrap --tools`. Every decision, the equivalence of arguments and the stores are the
Rust library's (`mcp-idempotency`); this package only carries the SDK's messages to it, at the
one place of each SDK line that sees every request as the client sent it and its answer
(`_sdk2`, `_sdk1`, `_fastmcp`), so stdio and Streamable HTTP (JSON or SSE, sessions or not) are
covered alike. Tools run on the server's event loop; store I/O runs on the library's tokio runtime.
"""

from __future__ import annotations

import atexit
import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from ._core import Carrier, already_wired, authenticated_client
from ._native import (
    META_KEY,
    OPTIONS,
    Gateway,
    IdempotencyError,
    invalid_option,
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
    tools: Mapping[str, Mapping[str, Any]] | str | None = None,
    meta_key: str | Sequence[str] | None = None,
    **options: Any,
) -> Server:
    """Give `server` SEP-3182 and return it.

    `store` is a store URL as `mcp-idem wrap --store` takes it (`memory`, `sqlite:PATH`,
    `redis://`, `rediss://`, `redis-cluster://`, `postgres://`, ...); by default the SQLite file
    `mcp-idem/records.sqlite3` in the user's data directory. `namespace` separates this server's
    records from others' in a shared store (default: `mcp-server:` and the server's name, as under
    `mcp-idem wrap`, so a server moved between them keeps its records; a server with an empty
    name needs one).
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

    `tools="suggested"` applies what `mcp-idem tools` prints for each tool the server lists (the
    binding lists them itself, on the server's own `tools/list` handler, before the first call it
    decides, as `wrap` does). Without any tool policy, the tools a key-less retry would run again
    are logged on stderr at the first `tools/list` (`MCP_IDEM_LOG` filters the library's logs, as
    `wrap`'s).

    Call it once per server: a server already wired (or the low-level server beneath one that
    is) raises `TypeError`. The store is opened here, once per namespace and options (servers
    built per request share it): a bad option or policy, a store URL that does not parse or a store that cannot be
    reached raises `IdempotencyError` (with `.type` and `.code`) at once. Every option is read by
    the library (`mcp_idempotency::embedded::Settings::from_json`), and an error names it as you
    wrote it, with what it takes: `after_crash: expected reject or reexecute, got "retry"`.
    """
    # Every option as the user wrote it, read (and refused, naming it so) by the library; a
    # principal that is a function stays here, called per request.
    given = {"store": store, "namespace": namespace, "tools": tools, "meta_key": meta_key, **options}
    if not callable(principal):
        given["principal"] = principal
    settings = _options_json(given)

    def carrier_for(lowlevel: Any) -> Carrier:
        # One gateway per server name and options (the library's): servers built per request or
        # per session share one store. A server without a name needs `namespace`.
        gateway = Gateway.open(getattr(lowlevel, "name", None), settings)
        return Carrier(gateway, principal if callable(principal) else authenticated_client)

    mcp_major = _mcp_line(server)
    from . import _fastmcp

    if _fastmcp.is_fastmcp(server):
        return _fastmcp.install(server, carrier_for, mcp_major)
    if mcp_major == 2:
        from . import _sdk2 as sdk
    else:
        from . import _sdk1 as sdk  # type: ignore[no-redef]
    lowlevel = sdk.lowlevel_of(server)
    if lowlevel is None:
        raise TypeError(f"idempotent() cannot wire {_named(server)}: it takes {SUPPORTED}")
    if sdk.wired(lowlevel):
        raise already_wired(server)
    sdk.install(lowlevel, carrier_for(lowlevel))
    return server


# What `idempotent()` wires; anything else raises at once.
SUPPORTED = (
    "an mcp 2.x (>=2.3) MCPServer or low-level Server, an mcp 1.x (>=1.24) mcp.server.fastmcp.FastMCP "
    "or low-level Server, or a jlowin fastmcp.FastMCP (fastmcp 4.x on mcp 2.x, 3.x >=3.4 on mcp 1.x)"
)


def _named(server: Any) -> str:
    if isinstance(server, type):
        return f"the class {server.__module__}.{server.__qualname__} (not an instance of it)"
    cls = type(server)
    return f"a {cls.__module__}.{cls.__qualname__}"


def _mcp_line(server: Any) -> int:
    """The installed `mcp`'s major version, when it is in the supported range; else raises."""
    try:
        installed = version("mcp")
    except PackageNotFoundError:
        raise TypeError(f"idempotent() cannot wire {_named(server)}: the mcp package is not installed") from None
    try:
        major, minor = (int(part) for part in installed.split(".")[:2])
    except ValueError:
        raise TypeError(f"idempotent() does not know mcp {installed}; it supports mcp >=1.24,<2 and >=2.3,<3") from None
    if (major, minor) < (1, 24) or (2, 0) <= (major, minor) < (2, 3) or major >= 3:
        raise TypeError(f"idempotent() supports mcp >=1.24,<2 and >=2.3,<3, not mcp {installed} (given {_named(server)})")
    return major


def idempotency_key(context: Any) -> str | None:
    """The idempotency key of the call a tool is running for (`None` without one).

    Takes a tool's `Context` (`MCPServer`, `mcp.server.fastmcp.FastMCP`, jlowin's `FastMCP`) or
    a low-level handler's request context: the params' `_meta` (`mcp` 2.x) or the parsed `meta`
    (`mcp` 1.x, whose models keep unknown members).
    """
    request_context = getattr(context, "request_context", context)
    params = getattr(request_context, "params", None)
    if isinstance(params, Mapping):
        meta = params.get("_meta")
    else:
        meta = getattr(request_context, "meta", None)
        if hasattr(meta, "model_dump"):
            meta = meta.model_dump(by_alias=True)
    key = meta.get(META_KEY) if isinstance(meta, Mapping) else None
    return key if isinstance(key, str) else None


def _options_json(options: Mapping[str, Any]) -> str:
    """The options as the library reads them: a JSON object of each option, named as the user
    wrote it, to its value (a `timedelta` as `Nms`; `None` is an option not given)."""

    def duration(value: Any) -> str:
        if isinstance(value, datetime.timedelta):
            return f"{int(value.total_seconds() * 1000)}ms"
        raise TypeError(f"{type(value).__name__} is not a JSON value")

    members = []
    for name, value in options.items():
        try:
            text = json.dumps(value, default=duration, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise invalid_option(name, repr(value), f"expected a JSON value or a timedelta ({error})") from None
        members.append(f"{json.dumps(name)}:{text}")
    return "{" + ",".join(members) + "}"
