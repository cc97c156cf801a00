"""The adapter for jlowin's `fastmcp` (PyPI `fastmcp`): 4.x on `mcp` 2.x and 3.x on `mcp` 1.x.

FastMCP serves through a low-level server of the SDK beneath it (`FastMCP._mcp_server`), which
sees each request as the client sent it: FastMCP's own middleware does not (in 4.x its
`on_call_tool` message is rebuilt from the tool's name and arguments, without `idempotencyKey`).
So the SDK line's adapter is installed there:

- 4.x: the SDK 2.x middleware, first in the low-level server's list, outside FastMCP's root
  dispatch, which rebuilds the `initialize` and `server/discover` results as typed models and
  would drop `tools.idempotency` from them;
- 3.x: the SDK 1.x handlers and capabilities; FastMCP answers `initialize` from
  `create_initialization_options()`, hence from `get_capabilities`, which the library extends.
"""

from __future__ import annotations

from typing import Any

from ._core import Carrier, already_wired

# The lines this adapter wires (tested: 3.4.11 on mcp 1.30.0, 4.2.3 on mcp 2.3.0).
SUPPORTED = "fastmcp >=3.4,<5"


def is_fastmcp(server: Any) -> bool:
    """Whether `server` is a jlowin `fastmcp.FastMCP` (without importing fastmcp)."""
    return any(
        cls.__name__ == "FastMCP" and cls.__module__.split(".")[0] == "fastmcp" for cls in type(server).__mro__
    )


def install(server: Any, carrier_for: Any, mcp_major: int) -> Any:
    """Wires `server`; `carrier_for(lowlevel)` opens the gateway once the server is known good."""
    from importlib.metadata import version

    fastmcp_version = version("fastmcp")
    major, minor = (int(part) for part in fastmcp_version.split(".")[:2])
    expected = {4: 2, 3: 1}.get(major)
    if (major, minor) < (3, 4) or expected is None:
        raise TypeError(f"idempotent() supports {SUPPORTED}, not fastmcp {fastmcp_version}")
    if expected != mcp_major:
        raise TypeError(
            f"idempotent() supports fastmcp {major}.x on mcp {expected}.x, not with mcp {mcp_major}.x (installed)"
        )
    lowlevel = getattr(server, "_mcp_server", None)
    missing = f"fastmcp {fastmcp_version}'s FastMCP has no low-level server where it is read (`_mcp_server`)"
    if major == 4:
        from . import _sdk2

        if _sdk2.lowlevel_of(lowlevel) is None or not isinstance(getattr(lowlevel, "middleware", None), list):
            raise TypeError(f"{missing} (an mcp 2.x Server with a middleware list): idempotent() supports {SUPPORTED}")
        if _sdk2.wired(lowlevel):
            raise already_wired(server)
        carrier: Carrier = carrier_for(lowlevel)
        _sdk2.install(lowlevel, carrier, outermost=True)
    else:
        from . import _sdk1

        if _sdk1.lowlevel_of(lowlevel) is None:
            raise TypeError(f"{missing} (an mcp 1.x Server): idempotent() supports {SUPPORTED}")
        if _sdk1.wired(lowlevel):
            raise already_wired(server)
        _sdk1.install(lowlevel, carrier_for(lowlevel))
    return server
