#!/usr/bin/env bash
# Builds the `mcp-idempotency` wheel from source (maturin, abi3 for Python >= 3.10) and installs it
# into the Python that runs the tests (`python3`, or $PYTHON). Needs a Rust toolchain; maturin
# comes from PyPI. The binding's tests: python3 -m pytest bindings/python/tests
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
"$python" -m pip install --quiet --root-user-action=ignore "maturin>=1.9,<2" "pytest>=8"
# The host triple, as napi-rs builds: both bindings then share one build of the library.
rm -rf dist
"$python" -m maturin build --release --quiet --out dist --target "$(rustc -vV | sed -n "s/^host: //p")"
"$python" -m pip install --quiet --root-user-action=ignore --force-reinstall --no-deps dist/*.whl
"$python" -c 'import mcp_idempotency; print("mcp_idempotency installed:", mcp_idempotency.__file__)'
