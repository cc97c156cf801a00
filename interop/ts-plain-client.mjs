// An UNMODIFIED TypeScript SDK v2 (@modelcontextprotocol/client) client that sends no idempotency
// key: it launches a stdio server (e.g. `mcp-idem bridge URL`) with the SDK's DEFAULT version
// negotiation (the legacy `initialize` handshake) and makes N sequential `charge_payment` calls
// with the SDK's plain `client.callTool(...)`. It prints what it saw as one JSON document on
// stdout; the Rust tests (crates/mcp-idem/tests/integration/bridge_sdk_clients.rs) make the
// assertions.
//
//   node ts-plain-client.mjs charges N AMOUNT_BASE stdio -- COMMAND [ARGS...]
//
// Call i (0-based) charges AMOUNT_BASE + i US cents. Per call the report holds the result's
// `structuredContent` (and `isError`) or the JSON-RPC error `{code, message, data}`. It also
// reports the capabilities the SDK parsed from the handshake (`getServerCapabilities()`) and the
// raw `initialize` result as it came off the wire (the transport's messages are only observed).
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

// Generous: the stdio server (the bridge) does its own re-issuing within this time.
const TIMEOUT_MS = 120_000;

function usage() {
    process.stderr.write('usage: ts-plain-client.mjs charges N AMOUNT_BASE stdio -- COMMAND [ARGS...]\n');
    process.exit(2);
}

const [scenario, n, base, kind, dashes, command, ...args] = process.argv.slice(2);
const calls = Number.parseInt(n, 10);
const amountBase = Number.parseInt(base, 10);
if (scenario !== 'charges' || kind !== 'stdio' || dashes !== '--' || !command) usage();
if (!Number.isInteger(calls) || !Number.isInteger(amountBase)) usage();

const transport = new StdioClientTransport({ command, args, stderr: 'inherit' });

// Observe (never change) what arrives: the raw result of the `initialize` request.
let initializeId;
let rawInitialize = null;
const send = transport.send.bind(transport);
transport.send = (message, options) => {
    if (message.method === 'initialize') initializeId = message.id;
    return send(message, options);
};
let onmessage;
Object.defineProperty(transport, 'onmessage', {
    configurable: true,
    get: () => onmessage,
    set: handler => {
        onmessage =
            handler &&
            ((message, extra) => {
                if (initializeId !== undefined && message.id === initializeId && 'result' in message) {
                    rawInitialize = structuredClone(message.result);
                }
                return handler(message, extra);
            });
    }
});

const client = new Client({ name: 'mcp-idem-plain-ts', version: '1.0.0' });

async function charge(amount) {
    try {
        const result = await client.callTool(
            { name: 'charge_payment', arguments: { amount, currency: 'usd' } },
            { timeout: TIMEOUT_MS }
        );
        return { structuredContent: result.structuredContent ?? null, isError: result.isError ?? false };
    } catch (error) {
        return { error: { code: error.code, message: error.message, data: error.data } };
    }
}

await client.connect(transport, { timeout: TIMEOUT_MS });
const results = [];
for (let i = 0; i < calls; i++) results.push(await charge(amountBase + i));
const report = {
    sdk: 'typescript',
    protocolVersion: client.getNegotiatedProtocolVersion() ?? null,
    parsedCapabilities: client.getServerCapabilities() ?? null,
    initialize: rawInitialize,
    calls: results
};
await client.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
