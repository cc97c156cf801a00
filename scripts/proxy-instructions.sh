#!/usr/bin/env bash
# Instructions per call of each HTTP proxy, counted by valgrind's callgrind: the same figure on
# every run of the same build, whatever else the machine is doing (unlike CPU time on a shared
# 2-core machine), so a change of a few hundred instructions per call shows. With --syscalls,
# the system calls per call instead, counted by strace (the kernel's side of the same calls).
#
#   cargo build --release -p mcp-idem --bins --bench http_throughput
#   scripts/proxy-instructions.sh [--syscalls] [CALLS]   # default 2000 calls per configuration
#   IN_FLIGHT=16 scripts/proxy-instructions.sh ...        # CALLS over 16 connections at once
#   ROWS=nginx,sqlite scripts/proxy-instructions.sh ...   # only the rows whose names have these
#
# One `mcp-idem demo-server --http` is the upstream. 300 calls warm each proxy up, then CALLS
# sequential `tools/call`s of the `noop` tool on one keep-alive connection (IN_FLIGHT, default 1,
# connections at once) are counted: under
# callgrind with instrumentation off until then (`callgrind_control -i on/off`), or with
# `strace -c -f` attached for them. Keyed rows carry a fresh `idempotencyKey` per call, so every
# call executes and is recorded. The rows: nginx (Debian package nginx-light, configured as the
# http_throughput bench's, `support/nginx.rs`, but with `master_process off`: its one worker's
# event loop in one process; left out when nginx is not installed), the bare hyper proxy of the
# bench (streaming, and reading each body whole: the floors), then `mcp-idem proxy --threads 1`
# without a key, and keyed on the memory and SQLite stores, and on Redis at REDIS_URL (default
# redis://127.0.0.1:6379) when it answers.
# Instructions: the proxy's user-space instructions only (the kernel's socket work is not in
# them). Not for `wrap`: it starts its server through /proc/self/exe, which under valgrind is
# valgrind. Needs valgrind (Debian package `valgrind`), strace for --syscalls, and python3. Set
# MCP_IDEM_BIN to measure another build.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=instructions
if [ "${1:-}" = --syscalls ]; then
    mode=syscalls
    shift
fi
calls=${1:-2000}
in_flight=${IN_FLIGHT:-1}
bin=${MCP_IDEM_BIN:-target/release/mcp-idem}
bench=$(ls -t target/release/deps/http_throughput-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
tools=(valgrind callgrind_control python3)
[ $mode = instructions ] || tools=(strace python3)
for tool in "${tools[@]}"; do
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
import http.client, json, sys, threading, uuid
port, calls, keyed, in_flight = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-06-18"}
failed = []
def run(first):
    connection = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(first, calls, in_flight):
        params = {"name": "noop", "arguments": {"n": i}}
        if keyed:
            params["idempotencyKey"] = str(uuid.uuid4())
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})
        connection.request("POST", "/mcp", body, dict(headers, **{"x-tenant": "t%d" % (i % 64)}))
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200 or b'"result"' not in answer:
            failed.append("call %d: %d %r" % (i, response.status, answer[:200]))
            return
threads = [threading.Thread(target=run, args=(first,)) for first in range(in_flight)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
if failed:
    sys.exit(failed[0])
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

# Waits until something listens on 127.0.0.1:$1.
wait_for_port() {
    for _ in $(seq 1 300); do
        python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$1" \
            2>/dev/null && return 0
        sleep 0.1
    done
    echo "proxy-instructions: nothing listens on port $1" >&2
    return 1
}

floor=""
# Starts the command, warms it up, counts CALLS calls, and prints its row. $port: the port to
# call, or empty to read it from what the command prints.
measure() { # label keyed port command...
    local label=$1 keyed=$2 port=$3; shift 3
    if [ -n "${ROWS:-}" ] && ! grep -qiE "${ROWS//,/|}" <<<"$label"; then return 0; fi
    local out=$work/$label.out
    if [ $mode = instructions ]; then
        MCP_IDEM_LOG=error valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
            "$@" 2>"$work/$label.log" &
    else
        MCP_IDEM_LOG=error "$@" 2>"$work/$label.log" &
    fi
    local pid=$!
    pids+=($pid)
    if [ -n "$port" ]; then wait_for_port "$port"; else port=$(port_of "$work/$label.log"); fi
    python3 "$work/load.py" "$port" 300 "$keyed" "$in_flight"
    if [ $mode = instructions ]; then
        callgrind_control -i on "$pid" >/dev/null
        python3 "$work/load.py" "$port" "$calls" "$keyed" "$in_flight"
        callgrind_control -i off "$pid" >/dev/null
        callgrind_control -d "$pid" >/dev/null
    else
        strace -c -f -p "$pid" -o "$out" 2>/dev/null &
        local tracer=$!
        sleep 1 # strace attaches to every thread before the calls start
        python3 "$work/load.py" "$port" "$calls" "$keyed" "$in_flight"
        kill -INT "$tracer"
        wait "$tracer" 2>/dev/null || true
    fi
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    if [ $mode = instructions ]; then
        local total
        total=$(awk '/^totals:/ {print $2}' "$out.1")
        local per_call=$((total / calls))
        [ -n "$floor" ] || floor=$per_call
        printf '| %s | %s | %s |\n' "$label" "$per_call" \
            "$(awk -v a="$per_call" -v b="$floor" 'BEGIN {printf "%.2f", a / b}')"
    else
        # strace's summary: "% time, seconds, usecs/call, calls, [errors,] syscall"; the name is
        # the last field, the count the fourth. Calls made by idle threads on their own clock
        # (SQLite's checkpointer's sleeps) are counted too, and show as such.
        awk -v label="$label" -v calls="$calls" '
            $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {
                per = $4 / calls; all += per
                if (per >= 0.01) parts = parts sprintf("%s%s %.2f", parts == "" ? "" : ", ", $NF, per)
            }
            END { printf "| %s | %.2f | %s |\n", label, all, parts }' "$out"
    fi
}

proxy=(proxy --listen 127.0.0.1:0 --upstream "$upstream" --threads 1 --scope-by header:x-tenant
    --max-records-per-scope 1000000000 --max-records-total 1000000000)
if [ $mode = instructions ]; then
    echo "| configuration | instructions per call | / nginx |"
    echo "| --- | --- | --- |"
else
    echo "| configuration | system calls per call | of which, per call |"
    echo "| --- | --- | --- |"
fi
nginx=$(command -v nginx || ls /usr/sbin/nginx 2>/dev/null || true)
if [ -n "$nginx" ]; then
    nginx_port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    mkdir -p "$work/nginx"
    cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    upstream mcp {
        server ${upstream#http://};
        keepalive 32;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
            proxy_buffering off;
        }
    }
}
EOF
    measure "nginx" 1 "$nginx_port" "$nginx" -e stderr -p "$work/nginx" -c "$work/nginx/nginx.conf"
else
    echo "(nginx is not installed: its row is left out, and the ratios are to the next row)"
fi
measure "bare hyper, buffered" 1 "" "$bench" --as-hyper-proxy "$upstream" buffered
measure "bare hyper proxy" 1 "" "$bench" --as-hyper-proxy "$upstream"
measure "proxy, no key" 0 "" "$bin" "${proxy[@]}" --store memory
measure "proxy, memory" 1 "" "$bin" "${proxy[@]}" --store memory
measure "proxy, SQLite" 1 "" "$bin" "${proxy[@]}" --store "sqlite:$work/idem.sqlite3"
redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
if [ "$(redis-cli -u "$redis_url" ping 2>/dev/null)" = PONG ]; then
    measure "proxy, Redis" 1 "" "$bin" "${proxy[@]}" --store "$redis_url" \
        --namespace "proxy-instructions-$$" --retention 10m
else
    echo "(no Redis answered at $redis_url: its row is left out)"
fi
echo "($calls calls per row; $bin)"
