#!/usr/bin/env python3
"""What SEP-3182 adds to a keyed tool call: in process through a binding, against the same server
behind `mcp-idem wrap`, same tool, same store, measured in one run.

    cargo build --release -p mcp-idem
    bindings/python/install.sh && bindings/node/install.sh
    python3 scripts/binding-latency.py [CALLS] [ROUNDS]     # default 400 calls, 5 rounds

For each binding (Python `MCPServer`, TypeScript `McpServer`) and each store (`memory`, a SQLite
file) three servers run the payments server of the binding's tests over stdio:

- plain:       the server without the binding (`--plain`): the baseline;
- in process:  the server with the binding (`--store S`);
- inline:      on SQLite only, the same with `store-io = inline` (SQLite's transactions on the
               server's thread instead of the library's runtime);
- wrap:        `mcp-idem wrap --store S -- <the plain server>`.

Each is spoken to with one JSON-RPC message per line, after the legacy handshake and 100 uncounted
warm-up calls: CALLS sequential `tools/call`s of `noop`, each with a fresh `idempotencyKey` (each
executes and is recorded; the plain server ignores the key). The three run in turn, ROUNDS times,
so that a drift of the machine's speed hits each alike. Printed per binding and store: the p50
round trip of each, the added p50 (in process - plain, wrap - plain) and their ratio, the
target being in process < 0.5 x wrap. MCP_IDEM_BIN measures another build of the binary.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

args = sys.argv[1:]
calls = int(args[0]) if args else 400
rounds = int(args[1]) if len(args) > 1 else 5
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = os.environ.get("MCP_IDEM_BIN", os.path.join(root, "target/release/mcp-idem"))
if not os.access(binary, os.X_OK):
    sys.exit("binding-latency: no %s (cargo build --release -p mcp-idem)" % binary)
servers = {
    "python": ["python3", os.path.join(root, "bindings/python/tests/payments_server.py")],
    "node": ["node", os.path.join(root, "bindings/node/test/payments-server.mjs")],
}
WARMUP = 100


class Peer:
    """A stdio MCP server spoken to line by line."""

    def __init__(self, command, stderr):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=stderr, bufsize=0)
        self.next_id = 0

    def request(self, method, params):
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise SystemExit("binding-latency: the server closed its output")
            answer = json.loads(line)
            if answer.get("id") == self.next_id:
                if "error" in answer or answer["result"].get("isError"):
                    raise SystemExit("binding-latency: %s failed: %s" % (method, answer))
                return answer

    def notify(self, method):
        message = {"jsonrpc": "2.0", "method": method}
        self.process.stdin.write((json.dumps(message) + "\n").encode())

    def handshake(self):
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "binding-latency", "version": "0"}})
        self.notify("notifications/initialized")

    def keyed_noop(self):
        key = uuid.uuid4().hex
        started = time.perf_counter_ns()
        self.request("tools/call", {"name": "noop", "arguments": {}, "idempotencyKey": key})
        return (time.perf_counter_ns() - started) / 1000.0

    def close(self):
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def one_batch(command, log):
    peer = Peer(command, log)
    try:
        peer.handshake()
        for _ in range(WARMUP):
            peer.keyed_noop()
        return [peer.keyed_noop() for _ in range(calls)]
    finally:
        peer.close()


def main():
    print("binding-latency: %d keyed noop calls per batch, %d rounds, p50 round trip in us"
          % (calls, rounds))
    work = tempfile.mkdtemp(prefix="binding-latency-")
    log = open(os.path.join(work, "servers.log"), "ab")
    for language, server in servers.items():
        for store_kind in ["memory", "sqlite"]:
            store = ("memory" if store_kind == "memory"
                     else "sqlite:" + os.path.join(work, "%s.sqlite3" % language))
            ledger = os.path.join(work, "%s-ledger.jsonl" % language)
            plain = server + ["--ledger", ledger, "--plain"]
            rows = {
                "plain": plain,
                "in process": server + ["--ledger", ledger, "--store", store],
                "wrap": [binary, "wrap", "--store", store, "--"] + plain,
            }
            if store_kind == "sqlite":
                rows["inline"] = server + ["--ledger", ledger, "--store", store,
                                           "--option", "store_io=inline"]
            samples = {name: [] for name in rows}
            for _ in range(rounds):
                for name, command in rows.items():
                    samples[name].extend(one_batch(command, log))
            p50 = {name: statistics.median(values) for name, values in samples.items()}
            in_process = p50["in process"] - p50["plain"]
            wrap = p50["wrap"] - p50["plain"]
            ratio = in_process / wrap if wrap > 0 else float("inf")
            print("%-6s %-6s plain %7.1f  in process %7.1f  wrap %7.1f  |  added: in process "
                  "%+7.1f  wrap %+7.1f  ratio %.2f (target < 0.50)"
                  % (language, store_kind, p50["plain"], p50["in process"], p50["wrap"],
                     in_process, wrap, ratio))
            if "inline" in p50:
                inline = p50["inline"] - p50["plain"]
                print("%-6s %-6s inline (store-io) %7.1f  |  added: inline %+7.1f  ratio %.2f"
                      % (language, store_kind, p50["inline"], inline,
                         inline / wrap if wrap > 0 else float("inf")))
            sys.stdout.flush()


main()
