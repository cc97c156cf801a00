#!/usr/bin/env bash
# Installs what the tests of deploy/ use (crates/mcp-idem/tests/integration/deploy_*.rs):
# - deploy/.tools/venv: kubernetes-validate, check-jsonschema, grafana-foundation-sdk and PyYAML
#   from PyPI, pinned by deploy/requirements.txt;
# - deploy/node_modules: the Prometheus Operator's schemas from npm
#   (@kubernetes-models/prometheus-operator), pinned by deploy/package-lock.json;
# - `promtool` and `prometheus` from Debian's `prometheus` package, when promtool is missing
#   (as root; waits for another apt-get to let go of its lock).
# Idempotent: run it again after changing a pin.
set -euo pipefail
cd "$(dirname "$0")"

python=${PYTHON:-python3}
venv=.tools/venv
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
echo "deploy tools: $("$venv/bin/kubernetes-validate" --version 2>&1 | tail -n 1), check-jsonschema $("$venv/bin/check-jsonschema" --version 2>&1 | awk '{ print $NF }')"

npm ci --no-audit --no-fund --silent

if ! command -v promtool >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt=(apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus)
    "${apt[@]}" || { apt-get -o DPkg::Lock::Timeout=600 update -qq && "${apt[@]}"; }
fi
promtool --version 2>&1 | head -n 1
