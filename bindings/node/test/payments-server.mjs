// The payments server of the binding's tests on the TypeScript SDK v2: `mcp-idem demo-server`'s
// tools and ledger on `McpServer` (or, with --lowlevel, the low-level `Server`), with SEP-3182 in
// process through `idempotent` of this package. Command line, ledger and the shared tools:
// payments.mjs; over HTTP it serves `createMcpHandler` (stateless).
//
// Besides charge_payment and get_balance, the McpServer has:
// - confirm_charge {order_id, amount, currency}: asks the client to confirm (MCP elicitation,
//   `elicitation/create`), then charges as charge_payment does; declined, it charges nothing.
// - noop, work_1ms: no ledger write; answer at once, or after 1 ms.
import { McpServer, ProtocolError, Server, createMcpHandler } from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import * as z from 'zod';

import { serveFetchHandler } from '../../../interop/serve-fetch.mjs';
import { idempotencyKey, idempotent } from '../index.js';
import { BALANCE_DESCRIPTION, CHARGE_DESCRIPTION, LOWLEVEL_TOOLS, Ledger, chargePayment, lowlevelCall, serverArgs, structured } from './payments.mjs';

const { args, options } = serverArgs();
const ledger = new Ledger(args.ledger);

function buildMcpServer() {
    const server = new McpServer({ name: 'payments', version: '1.0.0' }, { capabilities: { tools: {} } });

    server.registerTool(
        'charge_payment',
        {
            description: CHARGE_DESCRIPTION,
            inputSchema: z.object({
                amount: z.number(),
                currency: z.string(),
                order_id: z.string().optional(),
                delay_ms: z.number().int().nonnegative().optional(),
                fail_after_charge: z.boolean().optional()
            })
        },
        async (input, ctx) => {
            const charge = await chargePayment(ledger, input, idempotencyKey(ctx));
            if (input.fail_after_charge) {
                throw new ProtocolError(-32603, `charge ${charge.chargeId} was recorded, then the call failed (fail_after_charge)`, {
                    chargeId: charge.chargeId
                });
            }
            return structured(`charged ${charge.amount} ${charge.currency}: ${charge.chargeId}`, charge);
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
            const chargeId = ledger.charge(amount, currency, orderId, idempotencyKey(ctx));
            return structured(`charged ${amount} ${currency}: ${chargeId}`, { chargeId, amount, currency });
        }
    );

    server.registerTool('get_balance', { description: BALANCE_DESCRIPTION, annotations: { readOnlyHint: true } }, async () => {
        const balance = ledger.balance();
        return structured(`${balance.charges} charges`, balance);
    });

    server.registerTool('noop', { description: 'Do nothing and answer at once (no ledger write).' }, async () => ({
        content: [{ type: 'text', text: 'ok' }]
    }));

    server.registerTool('work_1ms', { description: 'Wait on a 1 ms timer, then answer (no ledger write).' }, async () => {
        await new Promise((resolve) => setTimeout(resolve, 1));
        return { content: [{ type: 'text', text: 'ok' }] };
    });
    return server;
}

function buildLowlevelServer() {
    const server = new Server({ name: 'payments', version: '1.0.0' }, { capabilities: { tools: {} } });
    const failed = (message, data) => new ProtocolError(-32603, message, data);
    server.setRequestHandler('tools/list', () => ({ tools: LOWLEVEL_TOOLS }));
    server.setRequestHandler('tools/call', (request) => lowlevelCall(ledger, request.params, idempotencyKey(request.params), failed));
    return server;
}

function buildServer() {
    const server = args.lowlevel ? buildLowlevelServer() : buildMcpServer();
    return args.plain ? server : idempotent(server, options);
}

if (args.http) {
    serveFetchHandler(createMcpHandler(buildServer));
} else {
    // A bad option or an unreachable store fails here, before the first message.
    buildServer();
    serveStdio(buildServer);
}
