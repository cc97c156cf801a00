// What the framework adapters share (sdk.js, fastmcp.js) and index.js: the native addon, the
// error it reports a setup failure with, and how errors name what they got.
'use strict';

const native = loadNative();

/** A gateway that cannot be set up: `type` is the error's stable type, `code` its JSON-RPC code. */
class IdempotencyError extends Error {
    constructor(message, type, code) {
        super(message);
        this.name = 'IdempotencyError';
        this.type = type;
        this.code = code;
    }
}

/** A gateway that cannot be set up, as the library says why. */
function setupError(failure) {
    return new IdempotencyError(failure.message, failure.type, failure.code);
}

/** What `idempotent` takes, as its errors say. */
const SUPPORTED =
    'an McpServer or a low-level Server of the TypeScript SDK (@modelcontextprotocol/sdk 1.x or ' +
    "@modelcontextprotocol/server 2.x), or a FastMCP of punkpeye's fastmcp 4.x";

/** The SDK servers and FastMCPs `idempotent` gave SEP-3182. */
const wired = new WeakSet();

/** The class names of `value`'s prototype chain, nearest first. */
function classNames(value) {
    const names = [];
    for (let prototype = value == null ? null : Object.getPrototypeOf(value); prototype; prototype = Object.getPrototypeOf(prototype)) {
        const name = prototype.constructor?.name;
        if (name) names.push(name);
    }
    return names;
}

/** `value` as an error names it: `a FastMCPSession`, `a plain object`, `undefined`, `a string`. */
function described(value) {
    if (value === null || value === undefined) return String(value);
    if (typeof value !== 'object' && typeof value !== 'function') return `a ${typeof value} (${shown(value)})`;
    if (typeof value === 'function') return `the function ${value.name || '(anonymous)'}`;
    const [name] = classNames(value);
    if (name === undefined || name === 'Object') return 'a plain object';
    return `${/^[AEIOU]/.test(name) ? 'an' : 'a'} ${name}`;
}

function shown(value) {
    if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
    try {
        return JSON.stringify(value) ?? String(value);
    } catch {
        return String(value);
    }
}

function loadNative() {
    const { existsSync } = require('node:fs');
    const { join } = require('node:path');
    const triple = require('../triple.js').platformTriple();
    // The prebuilt file the package ships, or the one install.js built from source.
    const addon = join(__dirname, '..', `mcp-idempotency.${triple}.node`);
    if (!existsSync(addon)) {
        throw new Error(
            `mcp-idempotency has no native addon for ${triple}: build it from source with \`npm run build\` ` +
                `in ${join(__dirname, '..')} (needs a Rust toolchain)`
        );
    }
    return require(addon);
}

module.exports = { native, IdempotencyError, setupError, SUPPORTED, wired, classNames, described, shown };
