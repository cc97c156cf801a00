// The charge server of scripts/agents_loss.py on the TypeScript SDK v2, for set-ups (e) and (e0):
// the same `charge(order_id, amount)` tool and ledger lines as `agents_loss.py serve`, protected
// in process by the npm binding's `idempotent` (bindings/node). See docs/agents-under-loss.md.
//
//   node scripts/agents-loss-node-server.mjs --ledger FILE [--binding DIR] [--store S]
//                                            [--namespace N] [--tools JSON] [--plain]
//
// --binding: the binding's package directory, with its built addon and its node_modules (the
// TypeScript SDK and zod come from there); default AGENTS_LOSS_NODE_BINDING, else this checkout's
// bindings/node (built by bindings/node/install.sh). --plain: the same server without the binding.
// Stateless Streamable HTTP (`createMcpHandler`; JSON answers, as `charge` sends no notification)
// on 127.0.0.1, a free port; the first stderr line is "listening on http://127.0.0.1:PORT/mcp".
import { randomBytes } from 'node:crypto';
import { closeSync, openSync, writeSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { serveFetchHandler } from '../interop/serve-fetch.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values: args } = parseArgs({
    options: {
        ledger: { type: 'string' },
        binding: { type: 'string', default: process.env.AGENTS_LOSS_NODE_BINDING || join(root, 'bindings/node') },
        store: { type: 'string' },
        namespace: { type: 'string' },
        tools: { type: 'string' },
        plain: { type: 'boolean', default: false }
    }
});
if (!args.ledger) {
    process.stderr.write('usage: agents-loss-node-server.mjs --ledger FILE [--binding DIR] [--store S] [--tools JSON]\n');
    process.exit(2);
}

// Everything from the binding's package, through one require (CommonJS builds of the SDK and zod),
// so that the server the binding wraps is an instance of the SDK it was built against.
const require = createRequire(join(resolve(args.binding), 'package.json'));
const { McpServer, createMcpHandler } = require('@modelcontextprotocol/server');
const z = require('zod');
const { idempotent } = require(resolve(args.binding));

const options = {};
if (args.store !== undefined) options.store = args.store;
if (args.namespace !== undefined) options.namespace = args.namespace;
if (args.tools !== undefined) options.tools = JSON.parse(args.tools);

const ledger = openSync(args.ledger, 'a');
process.on('exit', () => closeSync(ledger));

function buildServer() {
    const server = new McpServer({ name: 'agents-loss-charge', version: '1.0.0' }, { capabilities: { tools: {} } });
    server.registerTool(
        'charge',
        {
            description: 'Charge `amount` cents for order `order_id`. Not idempotent: every call charges.',
            inputSchema: z.object({ order_id: z.string(), amount: z.number().int() })
        },
        async ({ order_id: orderId, amount }) => {
            const chargeId = `ch_${randomBytes(8).toString('hex')}`;
            const line = { order_id: orderId, amount, charge_id: chargeId, at: Date.now() / 1000 };
            // One write(2) on an O_APPEND descriptor: lines never interleave.
            writeSync(ledger, `${JSON.stringify(line)}\n`);
            const result = { charge_id: chargeId, order_id: orderId, amount };
            return { content: [{ type: 'text', text: JSON.stringify(result) }], structuredContent: result };
        }
    );
    return args.plain ? server : idempotent(server, options);
}

// A bad option or an unreachable store fails here, before the first request.
buildServer();
serveFetchHandler(createMcpHandler(buildServer));
