// Never silently unprotected: `idempotent(x)` on anything it cannot wire throws at once, naming
// what it got and what it takes; where serving starts later (a FastMCP's `start()`), a path the
// wiring does not see fails before it serves a message. And what it wires passes every argument
// of `connect` through (fastmcp's `connect(transport, auth)`).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Client as ClientV2 } from '@modelcontextprotocol/client';
import { McpServer as McpServerV2 } from '@modelcontextprotocol/server';
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { McpServer as McpServerV1 } from '@modelcontextprotocol/sdk/server/mcp.js';
import { Server as ServerV1 } from '@modelcontextprotocol/sdk/server/index.js';
import { FastMCP, FastMCPSession } from 'fastmcp';
import { EdgeFastMCP } from 'fastmcp/edge';

import { idempotent } from '../index.js';

const SUPPORTED = /it takes an McpServer or a low-level Server of the TypeScript SDK \(@modelcontextprotocol\/sdk 1\.x or @modelcontextprotocol\/server 2\.x\), or a FastMCP of punkpeye's fastmcp 4\.x/;
const quiet = { debug() {}, log() {}, info() {}, warn() {}, error() {} };

/** The TypeError `idempotent(value)` throws at once; `named` is in its message. */
function refusal(value, named) {
    let thrown;
    try {
        idempotent(value, { store: 'memory' });
    } catch (error) {
        thrown = error;
    }
    assert.ok(thrown instanceof TypeError, `idempotent() accepted ${named}: ${thrown}`);
    assert.ok(thrown.message.includes(named), thrown.message);
    return thrown.message;
}

test('values and classes it cannot wire are refused at once, naming what they are and what it takes', () => {
    const shapes = [
        [undefined, 'got undefined'],
        [null, 'got null'],
        ['payments', 'got a string ("payments")'],
        [{}, 'got a plain object'],
        [{ connect() {} }, 'got a plain object'],
        [() => {}, 'got the function'],
        [new ClientV2({ name: 'c', version: '0' }), 'got a Client'],
        [new ClientV1({ name: 'c', version: '0' }), 'got a Client'],
        [new EdgeFastMCP({ name: 'edge', version: '0', logger: quiet }), 'got an EdgeFastMCP'],
        [new FastMCPSession({ name: 'session', version: '0', tools: [], prompts: [], resources: [], resourcesTemplates: [], logger: quiet, transportType: 'stdio' }), 'got a FastMCPSession']
    ];
    for (const [value, named] of shapes) assert.match(refusal(value, named), SUPPORTED);
});

test('a class named FastMCP that is not the fastmcp package it can load is refused', () => {
    class FastMCPLookalike {
        start() {}
    }
    Object.defineProperty(FastMCPLookalike, 'name', { value: 'FastMCP' });
    const message = refusal(new FastMCPLookalike(), 'which is not a FastMCP of the fastmcp package it can load');
    assert.match(message, /tried .*fastmcp/);
});

test('a fastmcp whose session hook is missing is refused at once', () => {
    const hook = Object.getOwnPropertyDescriptor(FastMCPSession.prototype, 'connect');
    delete FastMCPSession.prototype.connect;
    try {
        refusal(new FastMCP({ name: 'no-hook', version: '0', logger: quiet }), 'whose sessions it cannot wire');
    } finally {
        Object.defineProperty(FastMCPSession.prototype, 'connect', hook);
    }
});

test('a server already connected is refused: its transport would not be protected', async () => {
    for (const server of [new McpServerV1({ name: 'connected', version: '0' }), new ServerV1({ name: 'connected', version: '0' }, { capabilities: { tools: {} } })]) {
        const [, serverSide] = InMemoryTransport.createLinkedPair();
        await server.connect(serverSide);
        refusal(server, 'that is already connected: call it before connect()');
    }
});

test('a server given SEP-3182 twice is refused', () => {
    const servers = [new McpServerV2({ name: 'twice', version: '0' }), new McpServerV1({ name: 'twice', version: '0' }), new FastMCP({ name: 'twice', version: '0', logger: quiet })];
    for (const server of servers) {
        idempotent(server, { store: 'memory' });
        refusal(server, 'it already gave SEP-3182');
    }
});

test("a FastMCP started with a transport type the wiring does not see fails at start, serving nothing", async () => {
    const server = idempotent(new FastMCP({ name: 'unseen-transport', version: '0', logger: quiet }), { store: 'memory' });
    await assert.rejects(server.start({ transportType: 'sse' }), (error) => {
        assert.ok(error instanceof TypeError, error);
        assert.match(error.message, /started with transportType "sse", whose sessions it does not wire; it wires stdio and httpStream/);
        return true;
    });
    assert.equal(server.sessions.length, 0);
});

test("a session of a wired FastMCP that connects outside its start() or connect() is refused before serving", async () => {
    idempotent(new FastMCP({ name: 'outside', version: '0', logger: quiet }), { store: 'memory' });
    const session = new FastMCPSession({ name: 'outside', version: '0', tools: [], prompts: [], resources: [], resourcesTemplates: [], logger: quiet, transportType: 'stdio' });
    const [, serverSide] = InMemoryTransport.createLinkedPair();
    await assert.rejects(session.connect(serverSide), /a session of FastMCP "outside" connected outside its start\(\) or connect\(\)/);
    assert.equal(session.server.transport, undefined);
});

test('a session fastmcp announces without the hook having seen it fails loudly', () => {
    const server = idempotent(new FastMCP({ name: 'announced', version: '0', logger: quiet }), { store: 'memory' });
    assert.throws(() => server.emit('connect', { session: {} }), /connected without passing FastMCPSession.connect; it is not protected/);
});

test("fastmcp's connect(transport, auth) is wired and keeps its auth: the capability is advertised, a retry replays", async () => {
    const server = new FastMCP({ name: 'connect-auth', version: '0', logger: quiet });
    let runs = 0;
    server.addTool({
        name: 'whoami',
        description: 'The session auth fastmcp gives the tool, and a fresh run number.',
        execute: async (_args, context) => {
            runs += 1;
            return JSON.stringify({ session: context.session, run: runs });
        }
    });
    idempotent(server, { store: 'memory' });
    // A raw client: the SDK's Client drops the capability it does not know from what it parsed.
    const [client, serverSide] = InMemoryTransport.createLinkedPair();
    const answers = new Map();
    client.onmessage = (message) => answers.get(message.id)?.(message);
    await client.start();
    const request = (id, method, params) => {
        const answer = new Promise((resolve) => answers.set(id, resolve));
        client.send({ jsonrpc: '2.0', id, method, params });
        return answer;
    };
    const connected = server.connect(serverSide, { user: 'alice' });
    const initialized = await request(1, 'initialize', { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'c', version: '0' } });
    // The session pings its client every 5 s until it is closed.
    const session = await connected;
    await client.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
    try {
        assert.ok(initialized.result.capabilities.tools.idempotency, JSON.stringify(initialized));
        const call = (id) => request(id, 'tools/call', { name: 'whoami', arguments: {}, idempotencyKey: 'auth-key' });
        const first = await call(2);
        const retry = await call(3);
        assert.deepEqual(JSON.parse(first.result.content[0].text), { session: { user: 'alice' }, run: 1 });
        assert.deepEqual(retry.result, first.result);
        assert.equal(runs, 1);
    } finally {
        await session.close();
        await client.close();
    }
});
