#!/usr/bin/env bash
# Builds the `mcp-idempotency` wheel that users install, the manylinux2014 one of scripts/dist.sh
# (maturin with zig, abi3 for Python >= 3.10, into target/dist/), copies it to
# bindings/python/dist/, and installs it into the Python that runs the tests (`python3`, or
# $PYTHON). Needs a Rust toolchain; the build tools come from PyPI (see scripts/dist.sh).
# The binding's tests: python3 -m pytest bindings/python/tests
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
"$python" -m pip install --quiet --root-user-action=ignore "pytest>=8"
../../scripts/dist.sh wheel
dist_dir=${DIST_DIR:-$(cd ../.. && pwd)/target/dist}
rm -rf dist
mkdir dist
cp "$dist_dir"/mcp_idempotency-*.whl dist/
"$python" -m pip install --quiet --root-user-action=ignore --force-reinstall --no-deps dist/*.whl
"$python" -c 'import mcp_idempotency; print("mcp_idempotency installed:", mcp_idempotency.__file__)'
