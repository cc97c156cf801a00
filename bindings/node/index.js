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
// as under `mcp-idem wrap --tools`. Every decision, the equivalence of arguments, the options
// and the stores are the Rust library's (the native addon); this package only carries the
// messages of every transport the server is connected to (stdio, Streamable HTTP per request or
// per session) to it (lib/carry.js), wired at one place per framework, as the Python package is:
// lib/sdk.js (the SDK v1 and v2), lib/fastmcp.js. Tools run on Node's event loop; store I/O runs
// on the addon's tokio runtime.
//
// Never silently unprotected: anything else (another class, a server already connected, a
// fastmcp whose sessions cannot be wired) throws at once, and a FastMCP session that connects
// outside the wired server's start() or connect() is refused before it serves a message.
'use strict';
const { IdempotencyError, SUPPORTED, described, native, setupError, shown } = require('./lib/core.js');
const { carry } = require('./lib/carry.js');
const { isFastmcp, fastmcpTarget } = require('./lib/fastmcp.js');
const { isSdkServer, sdkTarget } = require('./lib/sdk.js');

/** Where a claimed call's key reaches the tool: `params._meta['mcp-idem/idempotencyKey']`. */
const META_KEY = native.metaKey();

/** Every option `idempotent` takes besides `store`, `namespace` and `principal`, by `wrap`'s names. */
const OPTIONS = native.options();

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
 *   under `mcp-idem wrap`, so a server moved between them keeps its records; a server with an
 *   empty name needs one).
 * - `principal`: scopes records to a caller: a string, or a function of the first message's
 *   `extra` (`{ authInfo, request }`) returning one; by default the authenticated client
 *   (`authInfo.clientId`) of an HTTP request, else the local user.
 * - `tools`: protects calls that carry no SEP key, per tool: tool name (or `'*'`, every tool) to
 *   its settings, exactly the config file's `[tools.NAME]` tables (kebab-case or camelCase):
 *   `keyFrom` (JSON Pointers into the arguments: `['/order_id']`), `keyArgument`, `window`
 *   (`'30s'`), `required`, `onError`, `storeDown`, `wait`, as under `mcp-idem wrap --tools`;
 *   e.g. `tools: { charge: { keyFrom: ['/order_id'], required: true } }`. `tools: 'suggested'`
 *   applies what `mcp-idem tools` prints for each tool the server lists (the binding lists them
 *   itself before the first call it decides, as `wrap` does). Without any tool policy, the tools
 *   a key-less retry would run again are logged on stderr at the first `tools/list`
 *   (`MCP_IDEM_LOG` filters the library's logs, as `wrap`'s).
 * - `metaKey`: more `params._meta` members a client's key is read from (a string or an array of
 *   them), beside `_meta.idempotencyKey`, always read.
 * - every other option of `wrap`, camelCase or kebab-case: `retention: '24h'`, `lease: '5m'`,
 *   `afterCrash: 'reject'`, `forwardKey: false`, `cancel: 'absorb'`, `maxKeyBytes: 256`, ...
 *
 * The store is opened here: a bad option or policy, a store URL that does not parse or a store
 * that cannot be reached throws an `IdempotencyError` at once. Every option is read by the library
 * (`mcp_idempotency::embedded::Settings::from_json`), and an error names it as written, with what
 * it takes: `afterCrash: expected reject or reexecute, got "retry"`.
 */
function idempotent(server, options = {}) {
    const target = targetOf(server);
    if (options === null || typeof options !== 'object' || Array.isArray(options)) {
        throw setupError(native.invalidOption('options', shown(options), 'expected an object of option name to value'));
    }
    // Every option as the user wrote it, read (and refused, naming it so) by the library; a
    // principal that is a function stays here, called per connection.
    const { principal } = options;
    const given = typeof principal === 'function' ? { ...options, principal: undefined } : options;
    const gateway = openGateway(target.name, optionsJson(given));
    const principalOf = typeof principal === 'function' ? principal : authenticatedClient;
    const listsTools = gateway.listsTools;
    target.wire((transport) => carry(transport, (extra) => gateway.connect(principalOf(extra) ?? undefined), listsTools));
    return server;
}

/**
 * How `server` is wired: `{ name, wire(carryOf) }`, where `wire` makes every transport the
 * server is connected to pass through `carryOf`. Throws a `TypeError` for anything it cannot wire.
 */
function targetOf(server) {
    if (isFastmcp(server)) return fastmcpTarget(server);
    if (isSdkServer(server?.server) && typeof server.registerTool === 'function') return sdkTarget(server.server, server);
    if (isSdkServer(server)) return sdkTarget(server, server);
    throw new TypeError(`idempotent() got ${described(server)}; it takes ${SUPPORTED}`);
}

/** The idempotency key of the call a tool runs for (`undefined` without one), from its `ctx`. */
function idempotencyKey(ctx) {
    const key = (ctx?.mcpReq ?? ctx)?._meta?.[META_KEY];
    return typeof key === 'string' ? key : undefined;
}

/**
 * One gateway per server name and options (the library's): a server factory called per request
 * opens its store once. A server without a name needs the `namespace` option.
 */
function openGateway(serverName, options) {
    const opened = native.open(typeof serverName === 'string' ? serverName : undefined, options);
    if (!(opened instanceof native.Gateway)) throw setupError(opened);
    return opened;
}

function authenticatedClient(extra) {
    const client = extra?.authInfo?.clientId;
    return typeof client === 'string' ? native.clientPrincipal(client) : undefined;
}

/**
 * The options as the library reads them: a JSON object of each option, named as the user wrote
 * it, to its value (`undefined` is an option not given).
 */
function optionsJson(options) {
    const members = [];
    for (const [name, value] of Object.entries(options)) {
        if (value === undefined) continue;
        let text;
        try {
            text = typeof value === 'number' && !Number.isFinite(value) ? undefined : JSON.stringify(value);
        } catch {
            text = undefined;
        }
        if (text === undefined) throw setupError(native.invalidOption(name, shown(value), 'expected a JSON value'));
        members.push(`${JSON.stringify(name)}:${text}`);
    }
    return `{${members.join(',')}}`;
}

module.exports = { idempotent, idempotencyKey, IdempotencyError, META_KEY, OPTIONS };
