#!/usr/bin/env python3
"""System calls per call of `mcp-idem wrap` on SQLite, counted by strace.

    cargo build --release -p mcp-idem --bins
    python3 scripts/wrap-syscalls.py [CALLS]        # default 2000; MCP_IDEM_BIN for another build

Runs `strace -c -f mcp-idem wrap --store sqlite:<fresh file> -- mcp-idem demo-server`, makes the
legacy handshake, then CALLS sequential `tools/call`s of `noop`, each with a fresh
`idempotencyKey` (so each executes and is recorded), one JSON-RPC message per line. `-f` counts
the wrapped demo server too: it is the same in every build, so differences between builds are
wrap's. Prints the total per call, then each system call made at least 0.05 times per call.
Needs strace (Debian package `strace`).
"""
import json
import os
import subprocess
import sys
import tempfile
import uuid

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = os.environ.get("MCP_IDEM_BIN", os.path.join(root, "target/release/mcp-idem"))
with tempfile.TemporaryDirectory() as work:
    counts = os.path.join(work, "strace.txt")
    wrap = subprocess.Popen(
        ["strace", "-c", "-f", "-o", counts, binary, "wrap", "--store",
         "sqlite:" + os.path.join(work, "records.sqlite3"), "--", binary, "demo-server"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, MCP_IDEM_LOG="error"))

    def send(message):
        wrap.stdin.write((json.dumps(message) + "\n").encode())
        wrap.stdin.flush()

    def answer():
        return json.loads(wrap.stdout.readline())

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "wrap-syscalls", "version": "1"}}})
    answer()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    for i in range(1, calls + 1):
        send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "noop", "arguments": {"n": i}, "idempotencyKey": str(uuid.uuid4())}})
        reply = answer()
        if "result" not in reply:
            sys.exit("call %d: %r" % (i, reply))
    wrap.stdin.close()
    wrap.wait()
    # strace's summary: "% time, seconds, usecs/call, calls, [errors,] syscall".
    per_call = {}
    with open(counts) as summary:
        for line in summary:
            fields = line.split()
            if len(fields) >= 5 and fields[0].replace(".", "").isdigit() and fields[-1] != "total":
                per_call[fields[-1]] = int(fields[3]) / calls
    print("system calls per call: %.2f" % sum(per_call.values()))
    print(", ".join("%s %.2f" % (name, n) for name, n in per_call.items() if n >= 0.05))
