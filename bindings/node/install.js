// npm's install hook: a platform whose addon the package ships prebuilt (linux-x64-gnu:
// mcp-idempotency.linux-x64-gnu.node) needs nothing; any other is built from source with napi-rs
// and the Rust toolchain (`cargo`), which must be installed.
'use strict';
const { existsSync } = require('node:fs');
const { join } = require('node:path');
const { execFileSync } = require('node:child_process');
const { platformTriple } = require('./triple.js');

const addon = join(__dirname, `mcp-idempotency.${platformTriple()}.node`);
if (!existsSync(addon)) {
    const local = join(__dirname, 'node_modules', '.bin', 'napi');
    // @napi-rs/cli has two executables (`napi`, `napi-raw`): npx is told which package and which one.
    const [program, prefix] = existsSync(local)
        ? [local, []]
        : ['npx', ['--yes', '--package=@napi-rs/cli@3.10.12', 'napi']];
    console.error(`mcp-idempotency: no prebuilt addon for ${platformTriple()}; building it from source`);
    execFileSync(program, [...prefix, 'build', '--platform', '--release', '--no-js', '--dts', 'native.d.ts'], {
        cwd: __dirname,
        stdio: 'inherit'
    });
}
