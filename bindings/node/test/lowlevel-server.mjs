// A low-level `Server` of the TypeScript SDK v2 with one tool, `charge`, whose answer holds a fresh
// charge id, and SEP-3182 through `idempotent` (store: the first argument); serves stdio.
import { randomUUID } from 'node:crypto';

import { Server } from '@modelcontextprotocol/server';
import { StdioServerTransport } from '@modelcontextprotocol/server/stdio';

import { idempotent } from '../index.js';

const server = idempotent(new Server({ name: 'lowlevel-payments', version: '1.0.0' }, { capabilities: { tools: {} } }), {
    store: process.argv[2]
});
server.setRequestHandler('tools/list', () => ({
    tools: [{ name: 'charge', inputSchema: { type: 'object', properties: { amount: { type: 'number' } } } }]
}));
server.setRequestHandler('tools/call', () => ({ content: [{ type: 'text', text: `ch_${randomUUID()}` }] }));
await server.connect(new StdioServerTransport());
