#!/usr/bin/env bash
# The OpenAI Agents SDK's MCP client (its own retries, plus a model that calls again) against a
# charge server whose answers get lost: tool executions per charge without mcp-idem, behind
# `mcp-idem proxy`, behind `mcp-idem proxy` with a key-from tool policy, and (on request) with
# the server protected in process by the Python or Node binding. See docs/agents-under-loss.md.
#
#   scripts/agents-loss.sh [REPORT.md] [options of scripts/agents_loss.py run]
#
# REPORT.md defaults to target/agents-loss.md. Options (see `agents_loss.py run --help`):
# --charges N, --seed S, --loss P, --http-504 P, --sdk-retries N, --model-retries N,
# --timeout S, --configs c,a,b (default; also d, e: Python / Node binding + key-from policy, d0,
# e0: the bindings without a policy), --binding-python PY, --node-binding DIR.
# Environment: AGENTS_LOSS_VENV (default target/agents-venv), MCP_IDEM_BIN (default: the debug
# binary of this checkout, built with cargo; not built when --configs names neither a nor b),
# REDIS_URL (default redis://127.0.0.1:6379), PYTHON (default python3, to create the venv),
# AGENTS_LOSS_BINDING_PYTHON (for d, d0: a Python with mcp_idempotency, default the venv's; e.g.
# `PYTHON=$venv/bin/python bindings/python/install.sh`), AGENTS_LOSS_NODE_BINDING (for e, e0: the
# built binding with node_modules, default bindings/node after `bindings/node/install.sh`).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Pinned: the current releases when this harness was written.
OPENAI_AGENTS_VERSION=0.24.0
MCP_VERSION=2.3.0

out=target/agents-loss.md
if [[ $# -gt 0 && $1 != -* ]]; then
    out=$1
    shift
fi

venv=${AGENTS_LOSS_VENV:-target/agents-venv}
if ! "$venv/bin/python" -c "
import sys
from importlib.metadata import version
sys.exit(version('openai-agents') != '$OPENAI_AGENTS_VERSION' or version('mcp') != '$MCP_VERSION')
" 2>/dev/null; then
    echo "setting up $venv (openai-agents==$OPENAI_AGENTS_VERSION, mcp==$MCP_VERSION)" >&2
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "openai-agents==$OPENAI_AGENTS_VERSION" "mcp==$MCP_VERSION"
fi

# The proxy set-ups (a), (b) need the binary; the others do not.
configs=c,a,b
for ((i = 1; i <= $#; i++)); do
    case ${!i} in
        --configs=*) configs=${!i#--configs=} ;;
        --configs) j=$((i + 1)); configs=${!j:-} ;;
    esac
done
bin=${MCP_IDEM_BIN:-}
if [[ -z $bin && ! ,$configs, =~ ,(a|b), ]]; then
    bin=none
elif [[ -z $bin ]]; then
    echo "building mcp-idem (cargo build -p mcp-idem)" >&2
    cargo build --quiet -p mcp-idem --bin mcp-idem
    bin=$root/target/debug/mcp-idem
fi

mkdir -p "$(dirname "$out")"
exec "$venv/bin/python" scripts/agents_loss.py run --bin "$bin" --out "$out" "$@"
