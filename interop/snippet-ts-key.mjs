// Sending the SEP-3182 idempotency key yourself from the TypeScript SDK v2 client. Tested by
// crates/mcp-idem/tests/integration/bridge_sdk_clients.rs:   node snippet-ts-key.mjs COMMAND [ARGS...]
import { randomUUID } from 'node:crypto';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const [command, ...args] = process.argv.slice(2);
const client = new Client({ name: 'my-app', version: '1.0.0' });
await client.connect(new StdioClientTransport({ command, args }));

// One key per logical operation, reused on every retry of it. callTool sends params as given.
const params = {
    name: 'charge_payment',
    arguments: { amount: 4200, currency: 'usd' },
    idempotencyKey: randomUUID()
};
const first = await client.callTool(params);
const retry = await client.callTool(params); // replayed by the server: no second charge
console.log(JSON.stringify([first, retry]));
await client.close();
