// A client built on the TypeScript SDK v2 (@modelcontextprotocol/client), pinned to protocol
// 2026-07-28, that runs one scenario against a server and prints what it saw as one JSON document
// on stdout. The Rust tests (crates/mcp-idem/tests/integration/interop_*.rs) make the assertions.
//
//   node ts-client.mjs SCENARIO stdio -- COMMAND [ARGS...]
//   node ts-client.mjs SCENARIO http URL
//
// Scenarios:
// - dedup (against `mcp-idem demo-server` behind the gateway): the raw server/discover result; a
//   keyed charge_payment; its retry (same key, same arguments); the key reused with other
//   arguments; two concurrent calls with one key (a slow charge, delay_ms 3000) and a retry after
//   both answered.
// - mrtr (against ts-server.mjs behind the gateway): confirm_charge with a key, twice. The SDK
//   answers the server's input_required round itself (the elicitation handler accepts) and
//   re-sends the original params, idempotencyKey included, with inputResponses and requestState.
//   Every tools/call the client puts on the wire is reported under `sent`.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import * as z from 'zod';

const PROTOCOL = '2026-07-28';

function usage() {
    process.stderr.write('usage: ts-client.mjs (dedup|mrtr) (stdio -- COMMAND [ARGS...] | http URL)\n');
    process.exit(2);
}

const [scenario, kind, ...rest] = process.argv.slice(2);
let transport;
if (kind === 'stdio' && rest[0] === '--' && rest.length > 1) {
    transport = new StdioClientTransport({ command: rest[1], args: rest.slice(2), stderr: 'inherit' });
} else if (kind === 'http' && rest.length === 1) {
    transport = new StreamableHTTPClientTransport(new URL(rest[0]));
} else {
    usage();
}

const sent = [];
const send = transport.send.bind(transport);
transport.send = (message, options) => {
    if (message.method === 'tools/call') sent.push(structuredClone(message.params));
    return send(message, options);
};

const client = new Client(
    { name: 'mcp-idem-interop-ts', version: '1.0.0' },
    { versionNegotiation: { mode: { pin: PROTOCOL } }, capabilities: { elicitation: { form: {} } } }
);
client.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { confirm: true } }));

/** A tools/call with idempotencyKey: `{result}` or `{error: {code, message, data}}`. */
async function call(name, args, idempotencyKey) {
    try {
        const result = await client.request({ method: 'tools/call', params: { name, arguments: args, idempotencyKey } });
        return { result };
    } catch (error) {
        return { error: { code: error.code, message: error.message, data: error.data } };
    }
}

async function dedup() {
    const charge = { amount: 4200, currency: 'usd' };
    const first = await call('charge_payment', charge, 'interop-key-1');
    const retry = await call('charge_payment', charge, 'interop-key-1');
    const conflict = await call('charge_payment', { amount: 9900, currency: 'usd' }, 'interop-key-1');
    const slow = { amount: 100, currency: 'eur', delay_ms: 3000 };
    const [concurrentA, concurrentB] = await Promise.all([
        call('charge_payment', slow, 'interop-key-2'),
        call('charge_payment', slow, 'interop-key-2')
    ]);
    const concurrentRetry = await call('charge_payment', slow, 'interop-key-2');
    return { first, retry, conflict, concurrentA, concurrentB, concurrentRetry };
}

async function mrtr() {
    const first = await call('confirm_charge', { amount: 7 }, 'interop-mrtr-key');
    const again = await call('confirm_charge', { amount: 7 }, 'interop-mrtr-key');
    return { first, again };
}

const scenarios = { dedup, mrtr };
if (!scenarios[scenario]) usage();

await client.connect(transport);
const discover = await client.request({ method: 'server/discover', params: {} }, z.looseObject({}));
const parsedCapabilities = client.getServerCapabilities() ?? null;
const steps = await scenarios[scenario]();
await client.close();
process.stdout.write(`${JSON.stringify({ sdk: 'typescript', discover, parsedCapabilities, steps, sent })}\n`);
