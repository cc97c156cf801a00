#!/usr/bin/env bash
# Builds the `mcp-idempotency` npm package's native addon as users get it, prebuilt in the package:
# scripts/dist.sh's npm step (`npm ci` of @napi-rs/cli and the TypeScript SDK, pinned by
# package-lock.json, without the install hook; the addon built with zig for glibc 2.17 into this
# folder, `mcp-idempotency.linux-x64-gnu.node` here; the package packed into target/dist/).
# Needs a Rust toolchain and Node.js >= 20.
# The binding's tests: (cd bindings/node && npm test)
set -euo pipefail
cd "$(dirname "$0")"
../../scripts/dist.sh npm
node -e 'require("./index.js"); console.log("mcp-idempotency addon loads:", require("./triple.js").platformTriple())'
