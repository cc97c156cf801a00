#!/usr/bin/env python3
"""A rolling upgrade across the release that made records keep their call's trace (issue 41),
on each shared store: this build's `proxy` (tracing on) and the previous release's `proxy` on the
same store, each answering a retry of what the other executed, both ways. Prints one line per
step; exits 1 if a retry ran the tool again or a call failed.

    git worktree add /tmp/old <previous release's commit>
    cargo build --release -p mcp-idem --bins --manifest-path /tmp/old/Cargo.toml
    python3 scripts/rolling-upgrade.py /tmp/old/target/release/mcp-idem [target/release/mcp-idem]

Stores: a SQLite file, Redis at REDIS_URL (default redis://127.0.0.1:6379) and PostgreSQL at
DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test), each in a namespace (and for
PostgreSQL a schema) of this run's own. The previous release opens a store this build prepared
(no schema version change: its statements name their columns, and its PostgreSQL functions are
kept beside this build's), and this build opens one the previous release made (its `trace`
column is added in place). `inspect` of this build shows the trace of the record it executed.
The upstream is `mcp-idem demo-server --http`; its ledger counts the charges.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

old = sys.argv[1]
new = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "target/release/mcp-idem")
work = tempfile.mkdtemp(prefix="rolling-upgrade.")
run_id = uuid.uuid4().hex[:8]
failed = []
children = []


def spawn(args, env=None, wait_for="listening on http://"):
    log = open(os.path.join(work, f"{len(children)}.log"), "w+")
    child = subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL,
                             env=dict(os.environ, MCP_IDEM_LOG="warn", **(env or {})))
    children.append(child)
    for _ in range(300):
        log.seek(0)
        for line in log.read().splitlines():
            if wait_for in line:
                return line.split(wait_for, 1)[1].split()[0]
        time.sleep(0.1)
    log.seek(0)
    sys.exit(f"{args[0]} did not start: {log.read()}")


def call(url, key, amount, id_=1):
    body = json.dumps({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {
        "name": "charge_payment", "arguments": {"amount": amount, "currency": "usd"},
        "idempotencyKey": key,
        "_meta": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}})
    request = urllib.request.Request(url, body.encode(), {
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-06-18"})
    answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    charge = answer.get("result", {}).get("structuredContent", {}).get("chargeId")
    if charge is None:
        failed.append(f"no charge: {answer}")
    return charge


ledger = os.path.join(work, "ledger.jsonl")
upstream = "http://" + spawn([new, "demo-server", "--http", "127.0.0.1:0", "--ledger", ledger])
tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_BSP_SCHEDULE_DELAY": "50"}
stores = [
    ("sqlite", f"sqlite:{work}/records.sqlite3"),
    ("redis", os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")),
    ("postgresql", os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
     + f"?schema=rolling_{run_id}"),
]
try:
    for name, store in stores:
        namespace = f"rolling-upgrade-{run_id}-{name}"
        args = ["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream, "--store", store,
                "--namespace", namespace]
        for first, second, label in [(new, old, "this build, then the previous release"),
                                     (old, new, "the previous release, then this build")]:
            a = "http://" + spawn([first] + args, tracing if first == new else None) + "/mcp"
            b = "http://" + spawn([second] + args, tracing if second == new else None) + "/mcp"
            key = f"{name}-{uuid.uuid4().hex[:8]}"
            charged = call(a, key, 7)
            replayed = call(b, key, 7, 2)
            lines = [json.loads(l) for l in open(ledger)] if os.path.exists(ledger) else []
            runs = sum(1 for l in lines if l.get("chargeId") == charged)
            ok = charged is not None and charged == replayed and runs == 1
            print(f"{name}: {label}: executed {charged}, the retry {'replayed it' if replayed == charged else 'got ' + str(replayed)}, ran {runs} time(s)")
            if not ok:
                failed.append(f"{name}: {label}")
            if first == new:
                shown = subprocess.run([new, "inspect", "--store", store, "show", key,
                                        "--namespace", namespace, "--json"],
                                       capture_output=True, text=True)
                trace = json.loads(shown.stdout or "{}").get("trace_id")
                print(f"{name}: this build's record of {key}: trace_id {trace}")
                if trace != "4bf92f3577b34da6a3ce929d0e0e4736":
                    failed.append(f"{name}: no trace in {shown.stdout} {shown.stderr}")
            for child in children[-2:]:
                child.terminate()
                child.wait()
finally:
    for child in children:
        child.kill()
if failed:
    sys.exit("FAILED: " + "; ".join(failed))
print("every retry replayed; nothing ran twice")
