// SEP-3182 request idempotency in process, for MCP servers on the official TypeScript SDK v2
// (`@modelcontextprotocol/server`).
//
//     import { idempotent } from 'mcp-idempotency';
//     idempotent(server);          // an McpServer or a low-level Server, before it is connected
//
// The server then advertises `capabilities.tools.idempotency`, and a `tools/call` carrying an
// `idempotencyKey` is deduplicated exactly as `mcp-idem wrap` does it: the retry of a recorded
// call gets the recorded outcome (success or error) without running the tool again, the key
// reused with other arguments is refused (`idempotency_key_conflict`), a duplicate of a call still
// running is refused at once (`idempotency_key_in_progress`), and a call whose server died
// mid-call answers `idempotency_outcome_unknown`. Calls without that key are protected per tool by
// `tools` policies (a business identifier, a key argument, a duplicate window) and `_meta` keys,
// as under `mcp-idem wrap --tools`. Every decision, the equivalence of arguments and
// the stores are the Rust library's (the native addon); this file only carries the messages of
// every transport the server is connected to (stdio, Streamable HTTP per request or per session)
// to it. Tools run on Node's event loop; store I/O runs on the addon's tokio runtime.
'use strict';

const native = loadNative();

/** Where a claimed call's key reaches the tool: `params._meta['mcp-idem/idempotencyKey']`. */
const META_KEY = native.metaKey();

/** Every option `idempotent` takes besides `store`, `namespace` and `principal`, by `wrap`'s names. */
const OPTIONS = native.options();

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

// Outcomes the store failed to take at first are still being sent as the process exits: the
// library gives them a moment (`settleGraceMs()`, as `wrap`).
process.once('exit', () => native.settleAtExit());

/**
 * Gives `server` SEP-3182 and returns it. Call it before `connect` (inside the factory that
 * `createMcpHandler` or `serveStdio` takes, if you use one).
 *
 * - `store`: a store URL as `mcp-idem wrap --store` takes it (`memory`, `sqlite:PATH`,
 *   `redis://`, `rediss://`, `redis-cluster://`, `postgres://`, ...); by default the SQLite file
 *   `mcp-idem/records.sqlite3` in the user's data directory.
 * - `namespace`: separates this server's records in a shared store (default `mcp-server:NAME`, as
 *   under `mcp-idem wrap`, so a server moved between them keeps its records).
 * - `principal`: scopes records to a caller: a string, or a function of the first message's
 *   `extra` (`{ authInfo, request }`) returning one; by default the authenticated client
 *   (`authInfo.clientId`) of an HTTP request, else the local user.
 * - `tools`: protects calls that carry no SEP key, per tool: tool name (or `'*'`, every tool) to
 *   its settings, exactly the config file's `[tools.NAME]` tables (kebab-case or camelCase):
 *   `keyFrom` (JSON Pointers into the arguments: `['/order_id']`), `keyArgument`, `window`
 *   (`'30s'`), `required`, `onError`, `storeDown`, `wait`, as under `mcp-idem wrap --tools`;
 *   e.g. `tools: { charge: { keyFrom: ['/order_id'], required: true } }`.
 * - `metaKey`: more `params._meta` members a client's key is read from (a string or an array of
 *   them), beside `_meta.idempotencyKey`, always read.
 * - every other option of `wrap`, camelCase or kebab-case: `retention: '24h'`, `lease: '5m'`,
 *   `afterCrash: 'reject'`, `forwardKey: false`, `cancel: 'absorb'`, `maxKeyBytes: 256`, ...
 *
 * The store is opened here: a bad option or policy, a store URL that does not parse or a store
 * that cannot be reached throws an `IdempotencyError` at once.
 */
function idempotent(server, options = {}) {
    const lowlevel = server?.server ?? server;
    if (typeof lowlevel?.connect !== 'function') {
        throw new TypeError('idempotent() takes an McpServer or a low-level Server of @modelcontextprotocol/server');
    }
    const { store, namespace, principal, tools, metaKey, ...rest } = options;
    const settings = {};
    if (store !== undefined) settings.store = optionText('store', store);
    if (tools !== undefined) settings.tools = toolsText(tools);
    if (metaKey !== undefined) settings['meta-key'] = metaKeyText(metaKey);
    if (typeof principal === 'string') settings.principal = principal;
    else if (principal !== undefined && typeof principal !== 'function') {
        throw setupError(native.invalidOption('principal', shown(principal), 'expected a string or a function'));
    }
    for (const [name, value] of Object.entries(rest)) settings[name] = optionText(name, value);
    const gateway = openGateway(namespace ?? native.serverNamespace(lowlevel._serverInfo?.name ?? 'unnamed'), settings);
    const principalOf = typeof principal === 'function' ? principal : authenticatedClient;
    const connect = lowlevel.connect.bind(lowlevel);
    lowlevel.connect = (transport) => connect(carry(transport, (extra) => gateway.connect(principalOf(extra) ?? undefined)));
    return server;
}

/** The idempotency key of the call a tool runs for (`undefined` without one), from its `ctx`. */
function idempotencyKey(ctx) {
    const key = (ctx?.mcpReq ?? ctx)?._meta?.[META_KEY];
    return typeof key === 'string' ? key : undefined;
}

/** One gateway per namespace and options (the library's): a server factory called per request opens its store once. */
function openGateway(namespace, settings) {
    const opened = native.open(namespace, settings);
    if (!(opened instanceof native.Gateway)) throw setupError(opened);
    return opened;
}

function authenticatedClient(extra) {
    const client = extra?.authInfo?.clientId;
    return typeof client === 'string' ? native.clientPrincipal(client) : undefined;
}

function optionText(name, value) {
    if (typeof value === 'boolean') return value ? 'true' : 'false';
    if (typeof value === 'string' || (typeof value === 'number' && Number.isFinite(value))) return String(value);
    throw setupError(native.invalidOption(name, shown(value), 'expected a string, a number or a boolean'));
}

/** The `tools` option as the library reads it: the policies as JSON text. */
function toolsText(tools) {
    let text;
    try {
        text = JSON.stringify(tools);
    } catch {
        text = undefined;
    }
    if (text === undefined) {
        throw setupError(native.invalidOption('tools', shown(tools), 'expected an object of tool name to settings'));
    }
    return text;
}

/** The `meta-key` option as the library reads it: the names, comma-separated. */
function metaKeyText(metaKey) {
    const names = typeof metaKey === 'string' ? [metaKey] : metaKey;
    if (!Array.isArray(names) || !names.every((name) => typeof name === 'string')) {
        throw setupError(native.invalidOption('meta-key', shown(metaKey), 'expected a string or an array of strings'));
    }
    if (names.some((name) => name.includes(','))) {
        throw setupError(native.invalidOption('meta-key', shown(metaKey), 'a name must not contain a comma'));
    }
    return names.join(',');
}

function shown(value) {
    try {
        return JSON.stringify(value) ?? String(value);
    } catch {
        return String(value);
    }
}

/**
 * `transport`, as the server sees it: every message from the client goes to the connection
 * before the server (in the order it came), every message from the server goes to it before the
 * client. The connection is opened at the first message, whose `extra` names the caller.
 */
function carry(transport, open) {
    let connection;
    let serverOnMessage;
    let serverOnClose;
    // Messages whose decision waits on the store, and those after them, are delivered in order
    // (but for a waiting duplicate, below).
    let queue = Promise.resolve();
    let queued = 0;
    const report = (error) => transport.onerror?.(error instanceof Error ? error : new Error(String(error)));

    const deliver = (step, message, extra) => {
        switch (step.action) {
            case 'forward':
                serverOnMessage?.(message, extra);
                break;
            case 'rewritten':
                serverOnMessage?.(JSON.parse(step.message), extra);
                break;
            case 'respond':
                transport.send(JSON.parse(step.message)).catch(report);
                break;
            default: // 'drop'
        }
    };

    const onmessage = (message, extra) => {
        connection ??= open(extra);
        const step = connection.fromClient(JSON.stringify(message));
        if (step instanceof native.Waiting) {
            // A duplicate that may wait for a running call's outcome (a key the client did not
            // send): delivered after the messages before it, but the messages after it do not wait
            // for it, since the running call may be waiting for one of them (the client's answer
            // to its elicitation), as `wrap` decides such calls beside its reads.
            Promise.all([step.decided(), queue])
                .then(([settled]) => deliver(settled, message, extra))
                .catch(report);
            return;
        }
        if (queued === 0 && !(step instanceof Promise)) {
            deliver(step, message, extra);
            return;
        }
        queued += 1;
        queue = queue
            .then(() => step)
            .then((settled) => deliver(settled, message, extra))
            .catch(report)
            .finally(() => {
                queued -= 1;
            });
    };

    const send = async (message, options) => {
        if (connection === undefined) return transport.send(message, options);
        let step = connection.fromServer(JSON.stringify(message));
        if (step instanceof Promise) step = await step;
        if (step.action === 'drop') return;
        return transport.send(step.action === 'rewritten' ? JSON.parse(step.message) : message, options);
    };

    const onclose = () => {
        // Calls still running are recorded outcome-unknown; their answers cannot be sent any more.
        connection?.close().catch(report);
        serverOnClose?.();
    };

    return new Proxy(transport, {
        get(target, property) {
            if (property === 'send') return send;
            if (property === 'onmessage') return serverOnMessage;
            if (property === 'onclose') return serverOnClose;
            const value = Reflect.get(target, property, target);
            return typeof value === 'function' ? value.bind(target) : value;
        },
        set(target, property, value) {
            if (property === 'onmessage') {
                serverOnMessage = value;
                target.onmessage = value === undefined ? undefined : onmessage;
                return true;
            }
            if (property === 'onclose') {
                serverOnClose = value;
                target.onclose = onclose;
                return true;
            }
            return Reflect.set(target, property, value, target);
        }
    });
}

function loadNative() {
    const { existsSync } = require('node:fs');
    const { join } = require('node:path');
    const triple = require('./triple.js').platformTriple();
    // The prebuilt file the package ships, or the one install.js built from source.
    const addon = join(__dirname, `mcp-idempotency.${triple}.node`);
    if (!existsSync(addon)) {
        throw new Error(
            `mcp-idempotency has no native addon for ${triple}: build it from source with \`npm run build\` ` +
                `in ${__dirname} (needs a Rust toolchain)`
        );
    }
    return require(addon);
}

module.exports = { idempotent, idempotencyKey, IdempotencyError, META_KEY, OPTIONS };
