#!/usr/bin/env python3
"""Instructions per call of each stdio gateway, counted by valgrind's callgrind (or, with
--syscalls, its system calls per call, counted by strace): the stdio counterpart of
scripts/proxy-instructions.sh, the same figure on every run of one build, whatever else the machine
is doing.

    cargo build --release -p mcp-idem --bins --bench stdio_latency
    python3 scripts/stdio-instructions.py [--syscalls] [CALLS]   # default 2000 calls per row
    ROWS=relay,sqlite python3 scripts/stdio-instructions.py       # only the rows with these words

Each row is a process in front of one `mcp-idem demo-server`, spoken to over its stdin and stdout
with one JSON-RPC message per line, as the stdio_latency bench does: the poll relay of that bench
(`--as-poll-relay`: one poll(2) loop copying bytes), its tokio relay (`--as-tokio-relay`: lines
relayed whole on wrap's runtime, nothing parsed; the floor of a gateway on tokio), its reading
relay (`--as-reading-relay`: the tokio relay handing each message to wrap's interceptor; the floor
of a gateway that reads every message), `mcp-idem wrap` passing calls without a key through, and
`wrap` on the memory and SQLite stores with a fresh `idempotencyKey` per call (each executes and is
recorded). After the legacy handshake and 300 uncounted warm-up calls,
CALLS sequential `tools/call`s of `noop` are counted: under callgrind with instrumentation off until
then (`callgrind_control -i on/off`), or with `strace -c -f` attached for them. Only the front
process is counted (its threads too), never the demo server behind it. Instructions are user-space
instructions: the kernel's side of the same calls is what --syscalls counts. Needs valgrind
(Debian package `valgrind`) or strace. MCP_IDEM_BIN measures another build.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

args = sys.argv[1:]
syscalls = bool(args) and args[0] == "--syscalls"
if syscalls:
    args = args[1:]
calls = int(args[0]) if args else 2000
rows_wanted = [word for word in os.environ.get("ROWS", "").lower().split(",") if word]
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = os.environ.get("MCP_IDEM_BIN", os.path.join(root, "target/release/mcp-idem"))
benches = [path for path in glob.glob(os.path.join(root, "target/release/deps/stdio_latency-*"))
           if not path.endswith(".d")]
for tool in ["strace"] if syscalls else ["valgrind", "callgrind_control"]:
    if subprocess.run(["which", tool], capture_output=True).returncode != 0:
        sys.exit("stdio-instructions: %s is missing" % tool)
if not os.access(binary, os.X_OK):
    sys.exit("stdio-instructions: no %s (cargo build --release -p mcp-idem --bins)" % binary)
if not benches:
    sys.exit("stdio-instructions: no bench binary "
             "(cargo build --release -p mcp-idem --bench stdio_latency)")
bench = max(benches, key=os.path.getmtime)
server = [binary, "demo-server"]


def measure(work, label, keyed, command):
    """Starts `command`, warms it up, counts CALLS calls and returns (total, per name)."""
    out = os.path.join(work, label.replace(" ", "-") + ".out")
    front = command
    if not syscalls:
        front = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                 "--callgrind-out-file=" + out] + command
    log = open(os.path.join(work, "front.log"), "w")
    process = subprocess.Popen(front, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                               env=dict(os.environ, MCP_IDEM_LOG="error"))

    def send(message):
        process.stdin.write((json.dumps(message) + "\n").encode())
        process.stdin.flush()

    def call(i):
        params = {"name": "noop", "arguments": {"n": i}}
        if keyed:
            params["idempotencyKey"] = str(uuid.uuid4())
        send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})
        reply = json.loads(process.stdout.readline())
        if "result" not in reply:
            sys.exit("%s, call %d: %r" % (label, i, reply))

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "stdio-instructions", "version": "1"}}})
    process.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    for i in range(1, 301):
        call(i)
    if syscalls:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(process.pid), "-o", out],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1)  # strace attaches to every thread before the calls start
    else:
        subprocess.run(["callgrind_control", "-i", "on", str(process.pid)], check=True,
                       capture_output=True)
    for i in range(301, 301 + calls):
        call(i)
    if syscalls:
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
    else:
        subprocess.run(["callgrind_control", "-i", "off", str(process.pid)], check=True,
                       capture_output=True)
    process.stdin.close()
    process.wait()
    per_name = {}
    if syscalls:
        # strace's summary: "% time, seconds, usecs/call, calls, [errors,] syscall".
        for line in open(out):
            fields = line.split()
            if len(fields) >= 5 and fields[0].replace(".", "").isdigit() and fields[-1] != "total":
                per_name[fields[-1]] = int(fields[3]) / calls
        return sum(per_name.values()), per_name
    totals = [line.split()[1] for line in open(out) if line.startswith("totals:")]
    return int(totals[0]) / calls, per_name


rows = [
    ("poll relay", False, [bench, "--as-poll-relay"] + server),
    ("tokio relay", False, [bench, "--as-tokio-relay"] + server),
    ("reading relay", False, [bench, "--as-reading-relay"] + server),
    ("wrap, no key", False, [binary, "wrap", "--store", "memory", "--"] + server),
    ("wrap, memory", True, [binary, "wrap", "--store", "memory", "--"] + server),
    ("wrap, SQLite", True, None),
]
if syscalls:
    print("| configuration | system calls per call | of which, per call |")
else:
    print("| configuration | instructions per call | / poll relay |")
print("| --- | --- | --- |")
floor = None
with tempfile.TemporaryDirectory() as work:
    for label, keyed, command in rows:
        if rows_wanted and not any(word in label.lower() for word in rows_wanted):
            continue
        if command is None:
            command = [binary, "wrap", "--store",
                       "sqlite:" + os.path.join(work, "records.sqlite3"), "--"] + server
        total, per_name = measure(work, label, keyed, command)
        if syscalls:
            parts = ", ".join("%s %.2f" % (name, n) for name, n in per_name.items() if n >= 0.01)
            print("| %s | %.2f | %s |" % (label, total, parts))
        else:
            floor = floor or total
            print("| %s | %d | %.2f |" % (label, total, total / floor))
print("(%d calls per row; %s)" % (calls, binary))
