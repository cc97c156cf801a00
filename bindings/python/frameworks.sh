#!/usr/bin/env bash
# Creates one venv per framework environment under bindings/python/.frameworks/NAME (or
# $MCP_IDEM_FRAMEWORKS/NAME) from its pinned dependency tree, bindings/python/frameworks/NAME.txt
# (mcp2: mcp 2.x with jlowin's fastmcp 4.x; mcp1: the newest mcp 1.x with fastmcp 3.x;
# mcp1-oldest: the oldest mcp 1.x supported; mcp1-unsupported: mcp 1.20, older than supported),
# and installs the wheel that install.sh built (dist/*.whl) into each, WITHOUT --no-deps: the
# wheel, which requires no mcp, must leave the pinned framework and mcp as they are, supported or
# not (bindings/python/tests/test_frameworks.py checks that, then runs the matrix). Venvs are kept
# between runs; pip then only installs what changed.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
root=${MCP_IDEM_FRAMEWORKS:-$PWD/.frameworks}
wheels=(dist/*.whl)
[ -f "${wheels[0]}" ] && [ ${#wheels[@]} -eq 1 ] || { echo "frameworks.sh: expected one wheel in dist/: run install.sh first" >&2; exit 1; }
for pinned in frameworks/*.txt; do
    name=$(basename "$pinned" .txt)
    venv=$root/$name
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
    "${pip[@]}" install -r "$pinned"
    "${pip[@]}" uninstall --yes mcp-idempotency 2>/dev/null || true
    "${pip[@]}" install "${wheels[0]}"
    echo "framework environment $name:" $("$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE '^(mcp|fastmcp|mcp-idempotency) ' | tr -s ' ')
done
