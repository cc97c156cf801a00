// The payments server of the binding's tests on the TypeScript SDK v1 (`@modelcontextprotocol/sdk`
// 1.x): `McpServer` (or, with --lowlevel, the low-level `Server`) with SEP-3182 in process through
// `idempotent` of this package, served as the SDK's README serves it: `connect(new
// StdioServerTransport())`, or over Streamable HTTP a server and a stateless
// `StreamableHTTPServerTransport` per request. Command line, ledger and tools: payments.mjs.
import { createServer } from 'node:http';

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, ErrorCode, ListToolsRequestSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';

import { idempotencyKey, idempotent } from '../index.js';
import { BALANCE_DESCRIPTION, CHARGE_DESCRIPTION, LOWLEVEL_TOOLS, Ledger, announce, chargePayment, lowlevelCall, serverArgs, structured } from './payments.mjs';

const { args, options } = serverArgs();
const ledger = new Ledger(args.ledger);
const failed = (message, data) => new McpError(ErrorCode.InternalError, message, data);

function buildMcpServer() {
    const server = new McpServer({ name: 'payments', version: '1.0.0' });
    server.registerTool(
        'charge_payment',
        {
            description: CHARGE_DESCRIPTION,
            inputSchema: {
                amount: z.number(),
                currency: z.string(),
                order_id: z.string().optional(),
                delay_ms: z.number().int().nonnegative().optional(),
                fail_after_charge: z.boolean().optional()
            }
        },
        async (input, extra) => {
            const charge = await chargePayment(ledger, input, idempotencyKey(extra));
            if (input.fail_after_charge) throw failed(`charge ${charge.chargeId} was recorded, then the call failed (fail_after_charge)`, { chargeId: charge.chargeId });
            return structured(`charged ${charge.amount} ${charge.currency}: ${charge.chargeId}`, charge);
        }
    );
    server.registerTool('get_balance', { description: BALANCE_DESCRIPTION }, async () => {
        const balance = ledger.balance();
        return structured(`${balance.charges} charges`, balance);
    });
    return server;
}

function buildLowlevelServer() {
    const server = new Server({ name: 'payments', version: '1.0.0' }, { capabilities: { tools: {} } });
    server.setRequestHandler(ListToolsRequestSchema, () => ({ tools: LOWLEVEL_TOOLS }));
    server.setRequestHandler(CallToolRequestSchema, (request) => lowlevelCall(ledger, request.params, idempotencyKey(request.params), failed));
    return server;
}

function buildServer() {
    const server = args.lowlevel ? buildLowlevelServer() : buildMcpServer();
    return args.plain ? server : idempotent(server, options);
}

if (args.http) {
    const http = createServer(async (req, res) => {
        if (req.method !== 'POST') {
            res.writeHead(405, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'Method not allowed.' }, id: null }));
            return;
        }
        try {
            const chunks = [];
            for await (const chunk of req) chunks.push(chunk);
            const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
            const server = buildServer();
            const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
            res.on('close', () => {
                transport.close();
                server.close();
            });
            await server.connect(transport);
            await transport.handleRequest(req, res, body);
        } catch (error) {
            process.stderr.write(`request failed: ${error?.stack ?? error}\n`);
            if (!res.headersSent) res.writeHead(500).end();
        }
    });
    http.listen(0, '127.0.0.1', 511, () => announce(http));
} else {
    await buildServer().connect(new StdioServerTransport());
}
