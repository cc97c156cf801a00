// punkpeye's fastmcp builds an SDK v1 `Server` per session inside `start()` (one for stdio, one
// per HTTP session or stateless request, through mcp-proxy) and connects it in
// `FastMCPSession.connect`, the one hook every session passes. That hook is wired once per
// fastmcp module; a wired FastMCP runs its `start()` and `connect()` inside `fastmcpServing`, so
// the hook knows whose session connects (the HTTP server that start() creates carries it to
// every request).
'use strict';

const { AsyncLocalStorage } = require('node:async_hooks');
const { SUPPORTED, classNames, described, shown, wired } = require('./core.js');
const { wireConnect } = require('./sdk.js');

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

/** Whether `server` is a FastMCP (of any fastmcp: fastmcpTarget checks which). */
function isFastmcp(server) {
    return classNames(server).includes('FastMCP');
}

module.exports = { isFastmcp, fastmcpTarget };
