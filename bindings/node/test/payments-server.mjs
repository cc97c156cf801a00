// The payments server of the binding's tests: `mcp-idem demo-server`'s tools and ledger on the
// TypeScript SDK v2's `McpServer`, with SEP-3182 in process through `idempotent` of this package.
//
//   node payments-server.mjs --ledger FILE [--store S] [--namespace N] [--lease D] [--option NAME=VALUE ...]
//                             [--tools JSON] [--meta-key NAME ...]   key policies (idempotent's
//                                                      `tools` and `metaKey`)
//   node payments-server.mjs --ledger FILE ... --http   stateless Streamable HTTP on 127.0.0.1, a free
//                                                      port; the first stderr line is
//                                                      "listening on http://127.0.0.1:PORT/mcp"
//   node payments-server.mjs --ledger FILE --plain     the same server without the binding
//
// Tools (as the demo server's):
// - charge_payment {amount, currency, order_id?, delay_ms?, fail_after_charge?}: sleeps delay_ms,
//   appends one JSON line {chargeId, amount, currency, orderId, pid, unixMs, key} to the ledger
//   (one write on an O_APPEND descriptor, so servers may share it), answers {chargeId, amount,
//   currency}; with fail_after_charge it charges, then fails with a JSON-RPC internal error naming
//   the charge.
// - confirm_charge {order_id, amount, currency}: asks the client to confirm (MCP elicitation,
//   `elicitation/create`), then charges as charge_payment does; declined, it charges nothing.
// - get_balance: the number of charges in the ledger and the sum per currency.
// - noop, work_1ms: no ledger write; answer at once, or after 1 ms.
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';

import { McpServer, ProtocolError, createMcpHandler } from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import * as z from 'zod';

import { serveFetchHandler } from '../../../interop/serve-fetch.mjs';
import { idempotencyKey, idempotent } from '../index.js';

const { values: args } = parseArgs({
    options: {
        ledger: { type: 'string' },
        store: { type: 'string' },
        namespace: { type: 'string' },
        lease: { type: 'string' },
        option: { type: 'string', multiple: true, default: [] },
        tools: { type: 'string' },
        'meta-key': { type: 'string', multiple: true },
        http: { type: 'boolean', default: false },
        plain: { type: 'boolean', default: false }
    }
});
if (!args.ledger) {
    process.stderr.write('usage: payments-server.mjs --ledger FILE [--store S] [--http] [--plain]\n');
    process.exit(2);
}

const ledger = openSync(args.ledger, 'a');
process.on('exit', () => closeSync(ledger));

const options = Object.fromEntries(args.option.map((option) => option.split(/=(.*)/s, 2)));
if (args.store !== undefined) options.store = args.store;
if (args.namespace !== undefined) options.namespace = args.namespace;
if (args.lease !== undefined) options.lease = args.lease;
if (args.tools !== undefined) options.tools = JSON.parse(args.tools);
if (args['meta-key'] !== undefined) options.metaKey = args['meta-key'];

function structured(text, content) {
    return { content: [{ type: 'text', text }], structuredContent: content };
}

function charge(amount, currency, orderId, ctx) {
    const chargeId = `ch_${randomBytes(16).toString('hex')}`;
    const line = { chargeId, amount, currency, orderId: orderId ?? null, pid: process.pid, unixMs: Date.now(), key: idempotencyKey(ctx) ?? null };
    writeSync(ledger, `${JSON.stringify(line)}\n`);
    return chargeId;
}

function buildServer() {
    const server = new McpServer({ name: 'payments', version: '1.0.0' }, { capabilities: { tools: {} } });

    server.registerTool(
        'charge_payment',
        {
            description: 'Charge a payment: appends one line to the ledger and returns its chargeId.',
            inputSchema: z.object({
                amount: z.number(),
                currency: z.string(),
                order_id: z.string().optional(),
                delay_ms: z.number().int().nonnegative().optional(),
                fail_after_charge: z.boolean().optional()
            })
        },
        async ({ amount, currency, order_id: orderId, delay_ms: delay = 0, fail_after_charge: fail = false }, ctx) => {
            if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
            const chargeId = charge(amount, currency, orderId, ctx);
            if (fail) {
                throw new ProtocolError(-32603, `charge ${chargeId} was recorded, then the call failed (fail_after_charge)`, {
                    chargeId
                });
            }
            return structured(`charged ${amount} ${currency}: ${chargeId}`, { chargeId, amount, currency });
        }
    );

    server.registerTool(
        'confirm_charge',
        {
            description: 'Ask the client to confirm the charge (elicitation), then charge it.',
            inputSchema: z.object({ order_id: z.string(), amount: z.number(), currency: z.string() })
        },
        async ({ order_id: orderId, amount, currency }, ctx) => {
            const answer = await ctx.mcpReq.elicitInput({
                mode: 'form',
                message: `Charge ${amount} ${currency} for ${orderId}?`,
                requestedSchema: { type: 'object', properties: { confirm: { type: 'boolean' } }, required: ['confirm'] }
            });
            if (answer.action !== 'accept' || answer.content?.confirm !== true) {
                throw new ProtocolError(-32603, `the charge for ${orderId} was not confirmed`);
            }
            const chargeId = charge(amount, currency, orderId, ctx);
            return structured(`charged ${amount} ${currency}: ${chargeId}`, { chargeId, amount, currency });
        }
    );

    server.registerTool('get_balance', { description: 'Number of charges in the ledger and the sum per currency.' }, async () => {
        const sums = {};
        let charges = 0;
        for (const line of readFileSync(args.ledger, 'utf8').split('\n').slice(0, -1)) {
            const charge = JSON.parse(line);
            charges += 1;
            sums[charge.currency] = (sums[charge.currency] ?? 0) + charge.amount;
        }
        return structured(`${charges} charges`, { charges, sums });
    });

    server.registerTool('noop', { description: 'Do nothing and answer at once (no ledger write).' }, async () => ({
        content: [{ type: 'text', text: 'ok' }]
    }));

    server.registerTool('work_1ms', { description: 'Wait on a 1 ms timer, then answer (no ledger write).' }, async () => {
        await new Promise((resolve) => setTimeout(resolve, 1));
        return { content: [{ type: 'text', text: 'ok' }] };
    });

    return args.plain ? server : idempotent(server, options);
}

if (args.http) {
    serveFetchHandler(createMcpHandler(buildServer));
} else {
    // A bad option or an unreachable store fails here, before the first message.
    buildServer();
    serveStdio(buildServer);
}
