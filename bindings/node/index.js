// SEP-3182 request idempotency in process, for MCP servers on the official TypeScript SDK (v1,
// `@modelcontextprotocol/sdk`, and v2, `@modelcontextprotocol/server`) and on punkpeye's `fastmcp`.
//
//     import { idempotent } from 'mcp-idempotency';
//     idempotent(server);          // an McpServer or a low-level Server, before it is connected;
//                                  // or a FastMCP, before start()
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
//
// Never silently unprotected: anything else (another class, a server already connected, a
// fastmcp whose sessions cannot be wired) throws at once, and a FastMCP session that connects
// outside the wired server's start() or connect() is refused before it serves a message.
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
 * Gives `server` SEP-3182 and returns it. `server` is one of:
 *
 * - an `McpServer` or a low-level `Server` of the TypeScript SDK v1 (`@modelcontextprotocol/sdk`)
 *   or v2 (`@modelcontextprotocol/server`): call it before `connect` (inside the factory that
 *   `createMcpHandler` or `serveStdio` takes, or that builds a server per HTTP request);
 * - a `FastMCP` of punkpeye's `fastmcp` 4.x: call it before `start()` (stdio or `httpStream`) or
 *   `connect()`; every session the server opens is wired.
 *
 * Anything else throws a `TypeError` at once, naming what it got and what it takes, as does a
 * server already connected or already given SEP-3182.
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
    const target = targetOf(server);
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
    const gateway = openGateway(namespace ?? native.serverNamespace(target.name ?? 'unnamed'), settings);
    const principalOf = typeof principal === 'function' ? principal : authenticatedClient;
    target.wire((transport) => carry(transport, (extra) => gateway.connect(principalOf(extra) ?? undefined)));
    return server;
}

/** What `idempotent` takes, as its errors say. */
const SUPPORTED =
    'an McpServer or a low-level Server of the TypeScript SDK (@modelcontextprotocol/sdk 1.x or ' +
    "@modelcontextprotocol/server 2.x), or a FastMCP of punkpeye's fastmcp 4.x";

/** The SDK servers and FastMCPs `idempotent` gave SEP-3182. */
const wired = new WeakSet();

/**
 * How `server` is wired: `{ name, wire(carryOf) }`, where `wire` makes every transport the
 * server is connected to pass through `carryOf`. Throws a `TypeError` for anything it cannot wire.
 */
function targetOf(server) {
    if (classNames(server).includes('FastMCP')) return fastmcpTarget(server);
    if (isSdkServer(server?.server) && typeof server.registerTool === 'function') return sdkTarget(server.server, server);
    if (isSdkServer(server)) return sdkTarget(server, server);
    throw new TypeError(`idempotent() got ${described(server)}; it takes ${SUPPORTED}`);
}

/** A low-level `Server` of the SDK, v1 or v2: a client has no `getClientCapabilities`. */
function isSdkServer(value) {
    return ['connect', 'setRequestHandler', 'getClientCapabilities'].every((method) => typeof value?.[method] === 'function');
}

function sdkTarget(lowlevel, server) {
    if (wired.has(lowlevel)) throw new TypeError(`idempotent() got ${described(server)} it already gave SEP-3182: call it once per server`);
    if (lowlevel.transport !== undefined) {
        throw new TypeError(`idempotent() got ${described(server)} that is already connected: call it before connect(), or its transport is not protected`);
    }
    return { name: lowlevel._serverInfo?.name, wire: (carryOf) => wireConnect(lowlevel, carryOf) };
}

/** Every transport `lowlevel.connect` takes goes through `carryOf`; its other arguments pass as they are. */
function wireConnect(lowlevel, carryOf) {
    wired.add(lowlevel);
    const connect = lowlevel.connect;
    lowlevel.connect = function connectCarried(transport, ...rest) {
        return connect.call(this, carryOf(transport), ...rest);
    };
}

// punkpeye's fastmcp builds an SDK v1 `Server` per session inside `start()` (one for stdio, one
// per HTTP session or stateless request, through mcp-proxy) and connects it in
// `FastMCPSession.connect`, the one hook every session passes. That hook is wired once per
// fastmcp module; a wired FastMCP runs its `start()` and `connect()` inside `fastmcpServing`, so
// the hook knows whose session connects (the HTTP server that start() creates carries it to
// every request).
const { AsyncLocalStorage } = require('node:async_hooks');

/** The wired FastMCP whose start() or connect() is running: `{ carryOf, sessions }`. */
const fastmcpServing = new AsyncLocalStorage();
/** Names of the wired FastMCPs: a session of one of them connecting outside them is refused. */
const fastmcpNames = new Set();
/** The FastMCPSession classes whose `connect` is hooked. */
const hookedSessions = new WeakSet();
/** The fastmcp versions `idempotent` wires, as its errors say. */
const FASTMCP_RANGE = '^4.0.0 (>=4.0.0 <5.0.0; tested with 4.20.16)';
/** The transport types of `start()` whose sessions the hook is known to see. */
const FASTMCP_TRANSPORTS = ['stdio', 'httpStream'];

function fastmcpTarget(server) {
    const { module, version, root } = fastmcpModule(server);
    // fastmcp is no peer dependency of this package (npm would refuse to install it beside any
    // other major): the version is checked here.
    if (version.split('.')[0] !== '4') {
        throw new TypeError(`idempotent() got a FastMCP of fastmcp ${version} (${root}); it supports fastmcp ${FASTMCP_RANGE}`);
    }
    const Session = module.FastMCPSession;
    const hooks =
        typeof Session?.prototype?.connect === 'function' &&
        typeof Object.getOwnPropertyDescriptor(Session.prototype, 'server')?.get === 'function' &&
        typeof server.start === 'function';
    if (!hooks) {
        throw new TypeError(
            `idempotent() got a FastMCP of fastmcp ${version} (${root}), whose sessions it cannot wire: it wires ` +
                'fastmcp 4.x through FastMCPSession.connect and FastMCPSession.server (tested with 4.20.16)'
        );
    }
    if (wired.has(server)) throw new TypeError(`idempotent() got ${described(server)} it already gave SEP-3182: call it once per server`);
    const name = server.options?.name;
    return {
        name,
        wire(carryOf) {
            wired.add(server);
            hookSessions(Session);
            fastmcpNames.add(name);
            const serving = { carryOf, sessions: new WeakSet() };
            const { start, connect } = server;
            server.start = function startWired(startOptions, ...rest) {
                const type = startOptions?.transportType;
                if (type !== undefined && !FASTMCP_TRANSPORTS.includes(type)) {
                    return Promise.reject(
                        new TypeError(`idempotent(): FastMCP "${name}" was started with transportType ${shown(type)}, whose sessions it does not wire; it wires ${FASTMCP_TRANSPORTS.join(' and ')}`)
                    );
                }
                return fastmcpServing.run(serving, () => start.call(this, startOptions, ...rest));
            };
            if (typeof connect === 'function') {
                server.connect = function connectWired(...args) {
                    return fastmcpServing.run(serving, () => connect.apply(this, args));
                };
            }
            // A session fastmcp announces without the hook having seen it was served some other
            // way: fail its start (stdio) or its first request (HTTP) loudly.
            server.on?.('connect', ({ session }) => {
                if (!serving.sessions.has(session)) {
                    throw new Error(`idempotent(): a session of FastMCP "${name}" connected without passing FastMCPSession.connect; it is not protected`);
                }
            });
        }
    };
}

/** Wires, once per class, every session that connects while a wired FastMCP serves. */
function hookSessions(Session) {
    if (hookedSessions.has(Session)) return;
    hookedSessions.add(Session);
    const connect = Session.prototype.connect;
    Session.prototype.connect = function connectWired(...args) {
        const serving = fastmcpServing.getStore();
        const lowlevel = this.server;
        if (serving === undefined) {
            const name = lowlevel?._serverInfo?.name;
            if (fastmcpNames.has(name)) {
                return Promise.reject(
                    new Error(`idempotent(): a session of FastMCP "${name}" connected outside its start() or connect(), so it is not protected; it was refused`)
                );
            }
            return connect.apply(this, args);
        }
        if (!wired.has(lowlevel)) wireConnect(lowlevel, serving.carryOf);
        serving.sessions.add(this);
        return connect.apply(this, args);
    };
}

/**
 * The fastmcp module `server` was made by (its CommonJS or its ES build, as resolved from the
 * application or from this package), with its version and folder; throws a `TypeError` when
 * neither is it.
 */
function fastmcpModule(server) {
    const { dirname, join } = require('node:path');
    const { readFileSync } = require('node:fs');
    const bases = [process.cwd(), require.main?.filename && dirname(require.main.filename), process.argv[1] && dirname(process.argv[1]), __dirname];
    const seen = [];
    for (const base of bases.filter(Boolean)) {
        let entry;
        try {
            entry = require.resolve('fastmcp', { paths: [base] });
        } catch {
            continue;
        }
        let root = dirname(entry);
        while (root !== dirname(root) && !existsPackage(join(root, 'package.json'), 'fastmcp')) root = dirname(root);
        const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
        const esm = [manifest.exports?.['.']?.import, manifest.module].find((path) => typeof path === 'string');
        // The build the application loaded first: CommonJS if it required it, else ES (required
        // here, Node >= 20.19, it is the very module the application imported).
        const builds = esm === undefined ? [entry] : require.cache[entry] ? [entry, join(root, esm)] : [join(root, esm), entry];
        for (const build of builds) {
            let module;
            try {
                module = require(build);
            } catch (error) {
                seen.push(`${build} (${error.code ?? error.message})`);
                continue;
            }
            if (typeof module.FastMCP === 'function' && server instanceof module.FastMCP) return { module, version: manifest.version, root };
            seen.push(build);
        }
    }
    throw new TypeError(
        `idempotent() got ${described(server)}, which is not a FastMCP of the fastmcp package it can load ` +
            `(${seen.length > 0 ? `tried ${[...new Set(seen)].join(', ')}` : 'fastmcp cannot be resolved from here'}); it takes ${SUPPORTED}`
    );
}

function existsPackage(file, name) {
    try {
        return JSON.parse(require('node:fs').readFileSync(file, 'utf8')).name === name;
    } catch {
        return false;
    }
}

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
            // Until the server sets its handlers, those set on the transport before (mcp-proxy's
            // session cleanup, say) are the ones it reads and chains.
            if (property === 'onmessage') return serverOnMessage ?? target.onmessage;
            if (property === 'onclose') return serverOnClose ?? target.onclose;
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
