// The official TypeScript SDK, v1 (`@modelcontextprotocol/sdk`) and v2
// (`@modelcontextprotocol/server`): an `McpServer` or a low-level `Server`, wired at its
// `connect`, so every transport it is connected to passes through the library.
'use strict';

const { described, wired } = require('./core.js');

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

module.exports = { isSdkServer, sdkTarget, wireConnect };
