// The payments server of the binding's tests on punkpeye's `fastmcp` (npm `fastmcp`, on the
// TypeScript SDK v1), with SEP-3182 in process through `idempotent` of this package, started as
// fastmcp's README starts it: `server.start({ transportType: 'stdio' })`, or with --http
// `server.start({ transportType: 'httpStream', httpStream: { port } })` (sessions, SSE answers;
// with --stateless, `stateless: true`: a session per request). Command line, ledger and tools:
// payments.mjs.
import { FastMCP, UserError } from 'fastmcp';
import * as z from 'zod';

import { idempotent } from '../index.js';
import { BALANCE_DESCRIPTION, CHARGE_DESCRIPTION, Ledger, chargePayment, serverArgs, structured } from './payments.mjs';
import { freePort } from './support.mjs';

const { args, options } = serverArgs();
const ledger = new Ledger(args.ledger);

// fastmcp logs with console.* by default, which is stdout: the stdio transport's.
const stderr = (...parts) => process.stderr.write(`${parts.join(' ')}\n`);
const logger = { debug() {}, log: stderr, info: stderr, warn: stderr, error: stderr };

const server = new FastMCP({ name: 'payments', version: '1.0.0', logger });

server.addTool({
    name: 'charge_payment',
    description: CHARGE_DESCRIPTION,
    parameters: z.object({
        amount: z.number(),
        currency: z.string(),
        order_id: z.string().optional(),
        delay_ms: z.number().int().nonnegative().optional(),
        fail_after_charge: z.boolean().optional()
    }),
    execute: async (input) => {
        // fastmcp's tool context has no `_meta`: the key does not reach the tool.
        const charge = await chargePayment(ledger, input, undefined);
        if (input.fail_after_charge) throw new UserError(`charge ${charge.chargeId} was recorded, then the call failed (fail_after_charge)`);
        return structured(`charged ${charge.amount} ${charge.currency}: ${charge.chargeId}`, charge);
    }
});

server.addTool({
    name: 'get_balance',
    description: BALANCE_DESCRIPTION,
    execute: async () => {
        const balance = ledger.balance();
        return structured(`${balance.charges} charges`, balance);
    }
});

if (!args.plain) idempotent(server, options);

if (args.http) {
    const port = await freePort();
    await server.start({ transportType: 'httpStream', httpStream: { port, host: '127.0.0.1', stateless: args.stateless } });
    process.stderr.write(`listening on http://127.0.0.1:${port}/mcp\n`);
} else {
    await server.start({ transportType: 'stdio' });
}
