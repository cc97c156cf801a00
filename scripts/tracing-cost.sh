#!/usr/bin/env bash
# What OpenTelemetry tracing costs per call, in instructions counted by callgrind (the same figure
# on every run of a build, whatever else the machine does), for `proxy` and `wrap` keyed on the
# memory store and without a key: the previous build with no tracing at all (OLD_BIN), this
# build with tracing off, then on (the standard OTEL_* variables) with every trace sampled and
# with one in ten (`parentbased_traceidratio`, the calls carry no traceparent so each starts a
# trace). The spans go over OTLP/HTTP to a sink on loopback that answers every export with 200
# (a collector's cost is not ours); exports run every 50 ms, so the spans of the counted calls
# are exported while they are counted. Rows and their columns: docs/benchmarks.md, "Tracing
# cost". Then, with the endpoint at a closed port, the same rows: what a call costs when the
# collector cannot be reached (its spans dropped and counted).
#
#   cargo build --release -p mcp-idem --bins --bench http_throughput --bench stdio_latency
#   OLD_BIN=/path/to/previous/mcp-idem scripts/tracing-cost.sh [CALLS]   # default 2000
#
# Needs what scripts/proxy-instructions.sh and scripts/stdio-instructions.py need (valgrind,
# python3).
set -euo pipefail
cd "$(dirname "$0")/.."
calls=${1:-2000}
new=${MCP_IDEM_BIN:-$PWD/target/release/mcp-idem}
old=${OLD_BIN:?set OLD_BIN to the mcp-idem of the previous build}

work=$(mktemp -d /tmp/tracing-cost.XXXXXX)
sink_pid=
cleanup() {
    [ -z "$sink_pid" ] || kill "$sink_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The sink: every POST answered 200 with an empty ExportTraceServiceResponse.
cat >"$work/sink.py" <<'EOF'
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
EOF
python3 "$work/sink.py" >"$work/sink.port" &
sink_pid=$!
for _ in $(seq 1 50); do [ -s "$work/sink.port" ] && break; sleep 0.1; done
sink=http://127.0.0.1:$(cat "$work/sink.port")
closed=http://127.0.0.1:9 # discard: nothing listens on loopback

rows() { # title, env...
    local title=$1
    shift
    echo "== $title"
    env "$@" ROWS="no key,memory" scripts/proxy-instructions.sh "$calls" | grep -E 'proxy'
    env "$@" ROWS="no key,memory" python3 scripts/stdio-instructions.py "$calls" | grep -E 'wrap'
}
tracing=(OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=50)
rows "previous build ($old)" MCP_IDEM_BIN="$old"
rows "this build, tracing off" MCP_IDEM_BIN="$new"
rows "this build, tracing on, every trace sampled" MCP_IDEM_BIN="$new" "${tracing[@]}" \
    OTEL_EXPORTER_OTLP_ENDPOINT="$sink" OTEL_TRACES_SAMPLER=parentbased_always_on
rows "this build, tracing on, one trace in ten" MCP_IDEM_BIN="$new" "${tracing[@]}" \
    OTEL_EXPORTER_OTLP_ENDPOINT="$sink" OTEL_TRACES_SAMPLER=parentbased_traceidratio \
    OTEL_TRACES_SAMPLER_ARG=0.1
rows "this build, tracing on, the collector unreachable" MCP_IDEM_BIN="$new" "${tracing[@]}" \
    OTEL_EXPORTER_OTLP_ENDPOINT="$closed"
