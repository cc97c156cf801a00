#!/usr/bin/env bash
# Instructions per call of each HTTP proxy, counted by valgrind's callgrind: the same figure on
# every run of the same build, whatever else the machine is doing (unlike CPU time on a shared
# 2-core machine), so a change of a few hundred instructions per call shows.
#
#   cargo build --release -p mcp-idem --bins --bench http_throughput
#   scripts/proxy-instructions.sh [CALLS]        # default 2000 calls per configuration
#
# One `mcp-idem demo-server --http` is the upstream. Each proxy runs under callgrind with
# instrumentation off; 300 calls warm it up, then CALLS sequential `tools/call`s of the `noop` tool
# on one keep-alive connection are counted (`callgrind_control -i on/off`). Keyed rows carry a
# fresh `idempotencyKey` per call, so every call executes and is recorded. The rows: the bare hyper
# proxy of the http_throughput bench (streaming, and reading each body whole: the floors), then
# `mcp-idem proxy --threads 1` without a key, and keyed on the memory and SQLite stores, and on
# Redis at REDIS_URL (default redis://127.0.0.1:6379) when it answers.
# Counted: the proxy's user-space instructions only (the kernel's socket work is not in them).
# Not for `wrap`: it starts its server through /proc/self/exe, which under valgrind is valgrind.
# Needs valgrind (Debian package `valgrind`) and python3. Set MCP_IDEM_BIN to measure another build.
set -euo pipefail
cd "$(dirname "$0")/.."

calls=${1:-2000}
bin=${MCP_IDEM_BIN:-target/release/mcp-idem}
bench=$(ls -t target/release/deps/http_throughput-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
for tool in valgrind callgrind_control python3; do
    command -v $tool >/dev/null || { echo "proxy-instructions: $tool is missing" >&2; exit 1; }
done
[ -x "$bin" ] || { echo "proxy-instructions: no $bin (cargo build --release -p mcp-idem --bins)" >&2; exit 1; }
[ -n "$bench" ] || { echo "proxy-instructions: no bench binary (cargo build --release -p mcp-idem --bench http_throughput)" >&2; exit 1; }

work=$(mktemp -d /tmp/proxy-instructions.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/load.py" <<'EOF'
import http.client, json, sys, uuid
port, calls, keyed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
connection = http.client.HTTPConnection("127.0.0.1", port)
headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-06-18"}
for i in range(calls):
    params = {"name": "noop", "arguments": {"n": i}}
    if keyed:
        params["idempotencyKey"] = str(uuid.uuid4())
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})
    connection.request("POST", "/mcp", body, dict(headers, **{"x-tenant": "t%d" % (i % 64)}))
    response = connection.getresponse()
    answer = response.read()
    if response.status != 200 or b'"result"' not in answer:
        sys.exit("call %d: %d %r" % (i, response.status, answer[:200]))
EOF

# Prints the port a process announced with "listening on http://127.0.0.1:PORT" in file $1.
port_of() {
    for _ in $(seq 1 300); do
        local port
        port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$1" 2>/dev/null | head -1 | sed 's/.*://')
        if [ -n "$port" ]; then echo "$port"; return 0; fi
        sleep 0.1
    done
    echo "proxy-instructions: no address in $1:" >&2
    cat "$1" >&2
    return 1
}

MCP_IDEM_LOG=error "$bin" demo-server --http 127.0.0.1:0 --ledger "$work/ledger.jsonl" 2>"$work/server.log" &
pids+=($!)
upstream=http://127.0.0.1:$(port_of "$work/server.log")

floor=""
measure() { # label keyed command...
    local label=$1 keyed=$2; shift 2
    local out=$work/$label.callgrind
    MCP_IDEM_LOG=error valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
        "$@" 2>"$work/$label.log" &
    local pid=$!
    pids+=($pid)
    local port
    port=$(port_of "$work/$label.log")
    python3 "$work/load.py" "$port" 300 "$keyed"
    callgrind_control -i on "$pid" >/dev/null
    python3 "$work/load.py" "$port" "$calls" "$keyed"
    callgrind_control -i off "$pid" >/dev/null
    callgrind_control -d "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local total
    total=$(awk '/^totals:/ {print $2}' "$out.1")
    local per_call=$((total / calls))
    [ -n "$floor" ] || floor=$per_call
    printf '| %s | %s | %s |\n' "$label" "$per_call" \
        "$(awk -v a="$per_call" -v b="$floor" 'BEGIN {printf "%.2f", a / b}')"
}

proxy=(proxy --listen 127.0.0.1:0 --upstream "$upstream" --threads 1 --scope-by header:x-tenant
    --max-records-per-scope 1000000000 --max-records-total 1000000000)
echo "| configuration | instructions per call | / bare hyper, buffered |"
echo "| --- | --- | --- |"
measure "bare hyper, buffered" 1 "$bench" --as-hyper-proxy "$upstream" buffered
measure "bare hyper proxy" 1 "$bench" --as-hyper-proxy "$upstream"
measure "proxy, no key" 0 "$bin" "${proxy[@]}" --store memory
measure "proxy, memory" 1 "$bin" "${proxy[@]}" --store memory
measure "proxy, SQLite" 1 "$bin" "${proxy[@]}" --store "sqlite:$work/idem.sqlite3"
redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
if [ "$(redis-cli -u "$redis_url" ping 2>/dev/null)" = PONG ]; then
    measure "proxy, Redis" 1 "$bin" "${proxy[@]}" --store "$redis_url" \
        --namespace "proxy-instructions-$$" --retention 10m
else
    echo "(no Redis answered at $redis_url: its row is left out)"
fi
echo "($calls calls per row; $bin)"
