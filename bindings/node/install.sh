#!/usr/bin/env bash
# Builds the `mcp-idempotency` npm package's native addon from source and installs what its tests
# need: `npm ci` takes @napi-rs/cli and the TypeScript SDK from the npm registry (pinned by
# package-lock.json), and the package's own install hook (install.js) builds the addon with
# napi-rs (`mcp-idempotency.linux-x64-gnu.node` here). Needs a Rust toolchain and Node.js >= 20.
# The binding's tests: (cd bindings/node && npm test)
set -euo pipefail
cd "$(dirname "$0")"
rm -f ./*.node
npm ci --no-audit --no-fund --loglevel=error
node -e 'require("./index.js"); console.log("mcp-idempotency addon loads:", require("./triple.js").platformTriple())'
