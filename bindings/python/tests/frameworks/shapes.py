"""Run in a framework environment: `idempotent()` on each shape it must refuse, and on each it
supports there. Prints one JSON object: shape name -> "ok" or "ExceptionType: message".

    python3 shapes.py sdk2|sdk1|fastmcp
"""

import importlib.metadata
import json
import sys

import mcp_idempotency
from mcp_idempotency import idempotent

line = sys.argv[1]


def attempt(make):
    try:
        idempotent(make(), store="memory")
        return "ok"
    except Exception as error:  # noqa: BLE001 - the shape's outcome is what is printed
        return f"{type(error).__name__}: {error}"


class HasMiddleware:
    """Not the SDK's: a `.middleware` list of its own (as jlowin's FastMCP has)."""

    name = "impostor"
    middleware: list = []


def wired_twice(make, again):
    """`make()` wired, then `again(server)` (the server, or its low-level server) wired again."""
    server = make()
    idempotent(server, store="memory")
    return attempt(lambda: again(server))


def with_version(package, fake, make):
    """`make()` wired while the installed `package` reads as version `fake`: the version gate."""
    real = importlib.metadata.version

    def version(name):
        return fake if name == package else real(name)

    mcp_idempotency.version = version  # the name idempotent() reads the installed mcp with
    importlib.metadata.version = version  # and the one the fastmcp adapter imports
    try:
        return attempt(make)
    finally:
        mcp_idempotency.version = real
        importlib.metadata.version = real


if line == "sdk2":
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import MCPServer

    supported = {"MCPServer": lambda: MCPServer("shapes"), "low-level Server": lambda: Server("shapes")}
    lowlevel = {"MCPServer": lambda server: server._lowlevel_server, "low-level Server": lambda server: server}
elif line == "sdk1":
    from mcp.server.fastmcp import FastMCP
    from mcp.server.lowlevel import Server

    supported = {"FastMCP": lambda: FastMCP("shapes"), "low-level Server": lambda: Server("shapes")}
    lowlevel = {"FastMCP": lambda server: server._mcp_server, "low-level Server": lambda server: server}
else:
    from fastmcp import FastMCP

    supported = {"fastmcp.FastMCP": lambda: FastMCP("shapes")}
    lowlevel = {"fastmcp.FastMCP": lambda server: server._mcp_server}

first = next(iter(supported.values()))
shapes = {name: attempt(make) for name, make in supported.items()}
for name, make in supported.items():
    shapes[f"{name}, wired twice"] = wired_twice(make, lambda server: server)
    shapes[f"{name}, then its low-level server"] = wired_twice(make, lowlevel[name])
shapes["an object"] = attempt(object)
shapes["a string"] = attempt(lambda: "server")
shapes["a server class, not an instance"] = attempt(lambda: type(first()))
shapes["an object with a .middleware list"] = attempt(HasMiddleware)
shapes["mcp 1.23.0"] = with_version("mcp", "1.23.0", first)
shapes["mcp 2.1.0"] = with_version("mcp", "2.1.0", first)
shapes["mcp 3.0.0"] = with_version("mcp", "3.0.0", first)
if line == "fastmcp":
    shapes["fastmcp.FastMCP's own middleware list"] = attempt(lambda: first().middleware)
    shapes["fastmcp 2.14.7"] = with_version("fastmcp", "2.14.7", first)
    shapes["fastmcp 5.0.0"] = with_version("fastmcp", "5.0.0", first)

    def without_lowlevel():
        server = first()
        del server._mcp_server  # a fastmcp whose low-level server is not where it is read
        return server

    shapes["fastmcp.FastMCP without its low-level server"] = attempt(without_lowlevel)
print(json.dumps(shapes))
