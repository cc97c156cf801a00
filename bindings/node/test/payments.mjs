// What the binding's payments servers share, whatever framework serves them: their command line,
// the options they give `idempotent`, and the demo server's ledger (`mcp-idem demo-server`'s), one
// JSON line per charge. Each server (payments-server.mjs on the TypeScript SDK v2, sdk-v1-server.mjs
// on v1, fastmcp-server.mjs on punkpeye's fastmcp) serves the same tools:
//
// - charge_payment {amount, currency, order_id?, delay_ms?, fail_after_charge?}: sleeps delay_ms,
//   appends one JSON line {chargeId, amount, currency, orderId, pid, unixMs, key} to the ledger
//   (one write on an O_APPEND descriptor, so servers may share it), answers {chargeId, amount,
//   currency}; with fail_after_charge it charges, then fails naming the charge.
// - get_balance (readOnlyHint): the number of charges in the ledger and the sum per currency.
//
//   node SERVER --ledger FILE [--store S] [--namespace N] [--lease D] [--option NAME=VALUE ...]
//               [--tools JSON] [--meta-key NAME ...]   key policies (idempotent's `tools`, `metaKey`)
//               [--http]     Streamable HTTP on 127.0.0.1, a free port; the first stderr line is
//                            "listening on http://127.0.0.1:PORT/mcp"
//               [--lowlevel] the SDK's low-level `Server` instead of `McpServer` (SDK servers)
//               [--stateless] with --http, stateless HTTP where the framework has both (fastmcp)
//               [--plain]    the same server without the binding
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';

/** The command line of a payments server, and the options it gives `idempotent`. */
export function serverArgs() {
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
            lowlevel: { type: 'boolean', default: false },
            stateless: { type: 'boolean', default: false },
            plain: { type: 'boolean', default: false }
        }
    });
    if (!args.ledger) {
        process.stderr.write('usage: SERVER --ledger FILE [--store S] [--http] [--lowlevel] [--plain]\n');
        process.exit(2);
    }
    const options = Object.fromEntries(args.option.map((option) => option.split(/=(.*)/s, 2)));
    if (args.store !== undefined) options.store = args.store;
    if (args.namespace !== undefined) options.namespace = args.namespace;
    if (args.lease !== undefined) options.lease = args.lease;
    if (args.tools !== undefined) options.tools = JSON.parse(args.tools);
    if (args['meta-key'] !== undefined) options.metaKey = args['meta-key'];
    return { args, options };
}

/** The ledger file: one JSON line per charge. */
export class Ledger {
    constructor(path) {
        this.path = path;
        this.descriptor = openSync(path, 'a');
        process.on('exit', () => closeSync(this.descriptor));
    }

    /** Appends one charge; returns its id. `key`: the call's idempotency key, if the tool sees it. */
    charge(amount, currency, orderId, key) {
        const chargeId = `ch_${randomBytes(16).toString('hex')}`;
        const line = { chargeId, amount, currency, orderId: orderId ?? null, pid: process.pid, unixMs: Date.now(), key: key ?? null };
        writeSync(this.descriptor, `${JSON.stringify(line)}\n`);
        return chargeId;
    }

    /** `{charges, sums}`: the number of charges and the sum per currency. */
    balance() {
        const sums = {};
        let charges = 0;
        for (const line of readFileSync(this.path, 'utf8').split('\n').slice(0, -1)) {
            const charge = JSON.parse(line);
            charges += 1;
            sums[charge.currency] = (sums[charge.currency] ?? 0) + charge.amount;
        }
        return { charges, sums };
    }
}

export const CHARGE_DESCRIPTION = 'Charge a payment: appends one line to the ledger and returns its chargeId.';
export const BALANCE_DESCRIPTION = 'Number of charges in the ledger and the sum per currency.';

/** A tool result with text and structured content. */
export function structured(text, content) {
    return { content: [{ type: 'text', text }], structuredContent: content };
}

/** charge_payment's arguments, after its schema: sleeps `delay_ms`, then charges; `{chargeId, amount, currency}`. */
export async function chargePayment(ledger, { amount, currency, order_id: orderId, delay_ms: delay = 0 }, key) {
    if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
    return { chargeId: ledger.charge(amount, currency, orderId, key), amount, currency };
}

/** The tools of a low-level `Server` (v1 or v2), as `tools/list` answers them. */
export const LOWLEVEL_TOOLS = [
    {
        name: 'charge_payment',
        description: CHARGE_DESCRIPTION,
        inputSchema: {
            type: 'object',
            properties: {
                amount: { type: 'number' },
                currency: { type: 'string' },
                order_id: { type: 'string' },
                delay_ms: { type: 'integer', minimum: 0 },
                fail_after_charge: { type: 'boolean' }
            },
            required: ['amount', 'currency']
        }
    },
    { name: 'get_balance', description: BALANCE_DESCRIPTION, inputSchema: { type: 'object', properties: {} }, annotations: { readOnlyHint: true } }
];

/**
 * A low-level `Server`'s `tools/call`: the result, or `failed(message, data)` thrown (the SDK's
 * error class with code -32603) for a charge with fail_after_charge, or an unknown tool.
 */
export async function lowlevelCall(ledger, params, key, failed) {
    const args = params.arguments ?? {};
    if (params.name === 'get_balance') {
        const balance = ledger.balance();
        return structured(`${balance.charges} charges`, balance);
    }
    if (params.name !== 'charge_payment') throw failed(`unknown tool ${params.name}`);
    if (typeof args.amount !== 'number' || typeof args.currency !== 'string') throw failed('charge_payment takes {amount: number, currency: string}');
    const charge = await chargePayment(ledger, args, key);
    if (args.fail_after_charge === true) {
        throw failed(`charge ${charge.chargeId} was recorded, then the call failed (fail_after_charge)`, { chargeId: charge.chargeId });
    }
    return structured(`charged ${charge.amount} ${charge.currency}: ${charge.chargeId}`, charge);
}

/** Prints the line the tests wait for, once `server` (node:http) listens. */
export function announce(server) {
    process.stderr.write(`listening on http://127.0.0.1:${server.address().port}/mcp\n`);
}
