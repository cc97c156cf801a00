// A small MCP server built on the TypeScript SDK v2 (@modelcontextprotocol/server), the upstream of
// the gateway in crates/mcp-idem/tests/integration/interop_servers.rs and interop_ts_mrtr.rs.
//
//   node ts-server.mjs --executions FILE            serve stdio
//   node ts-server.mjs --executions FILE --http     serve Streamable HTTP on 127.0.0.1, a free port;
//                                                  the first stderr line is
//                                                  "listening on http://127.0.0.1:PORT/mcp"
//
// Every executed side effect appends one JSON line to FILE, so a test counts real executions.
// Tools:
// - charge {amount, currency}: appends {tool:"charge", executionId, amount, currency, key} and
//   returns {executionId} (text and structuredContent). `key` is what the gateway put in
//   _meta["mcp-idem/idempotencyKey"] (null when absent).
// - confirm_charge {amount}: a multi-round-trip (MRTR) tool. Without an accepted `confirm`
//   elicitation in inputResponses it appends {tool:"confirm_charge", phase:"asked", ...} and
//   answers input_required with requestState "confirm:<amount>"; with one it appends
//   {phase:"executed", requestState, ...} and completes with {executionId}.
import { appendFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

import { McpServer, acceptedContent, createMcpHandler, inputRequired } from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import * as z from 'zod';

import { serveFetchHandler } from './serve-fetch.mjs';

const { values: options } = parseArgs({
    options: { executions: { type: 'string' }, http: { type: 'boolean', default: false } }
});
if (!options.executions) {
    process.stderr.write('usage: ts-server.mjs --executions FILE [--http]\n');
    process.exit(2);
}

const META_KEY = 'mcp-idem/idempotencyKey';

function record(entry) {
    appendFileSync(options.executions, `${JSON.stringify({ pid: process.pid, ...entry })}\n`);
}

function completed(structured) {
    return { content: [{ type: 'text', text: JSON.stringify(structured) }], structuredContent: structured };
}

function buildServer() {
    const server = new McpServer({ name: 'interop-ts-server', version: '1.0.0' }, { capabilities: { tools: {} } });

    server.registerTool(
        'charge',
        {
            description: 'Charge once: appends one execution line.',
            inputSchema: z.object({ amount: z.number(), currency: z.string() })
        },
        async ({ amount, currency }, ctx) => {
            const executionId = randomUUID();
            record({ tool: 'charge', executionId, amount, currency, key: ctx.mcpReq._meta?.[META_KEY] ?? null });
            return completed({ executionId });
        }
    );

    server.registerTool(
        'confirm_charge',
        {
            description: 'Asks the client to confirm (MRTR elicitation), then charges.',
            inputSchema: z.object({ amount: z.number() })
        },
        async ({ amount }, ctx) => {
            const key = ctx.mcpReq._meta?.[META_KEY] ?? null;
            const confirmed = acceptedContent(ctx.mcpReq.inputResponses, 'confirm');
            if (confirmed?.confirm !== true) {
                record({ tool: 'confirm_charge', phase: 'asked', amount, key });
                return inputRequired({
                    inputRequests: {
                        confirm: inputRequired.elicit({
                            message: `Charge ${amount}?`,
                            requestedSchema: {
                                type: 'object',
                                properties: { confirm: { type: 'boolean' } },
                                required: ['confirm']
                            }
                        })
                    },
                    requestState: `confirm:${amount}`
                });
            }
            const executionId = randomUUID();
            record({
                tool: 'confirm_charge',
                phase: 'executed',
                executionId,
                amount,
                key,
                requestState: ctx.mcpReq.requestState() ?? null
            });
            return completed({ executionId });
        }
    );
    return server;
}

if (options.http) {
    serveFetchHandler(createMcpHandler(buildServer));
} else {
    serveStdio(buildServer);
}
