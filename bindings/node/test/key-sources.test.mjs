// Key sources for calls without a SEP key (issue 34), through the official TypeScript SDK v2
// client (unmodified) against the payments server with the binding over stdio: the key in `_meta`
// (`callTool({ ..., _meta })`), the `tools` policies (`keyFrom`, `required`, `window`), a duplicate
// that waits for a running call while that call waits for its elicitation answer, and bad policies
// refused at `idempotent()`. Every charge is a ledger line.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';

import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { McpServer } from '@modelcontextprotocol/server';

import { IdempotencyError, idempotent } from '../index.js';
import { Peer, SERVER, bound, ledgerLines, sandbox } from './support.mjs';

const REPLAYED = 'mcp-idem/replayed';
const CHARGE = { amount: 5, currency: 'eur' };

/** The official client connected to the payments server with the binding (memory store, these policies). */
async function connect(ledger, { tools, metaKey = [], onElicit } = {}) {
    const args = [SERVER, '--ledger', ledger, '--store', 'memory'];
    if (tools !== undefined) args.push('--tools', JSON.stringify(tools));
    for (const name of metaKey) args.push('--meta-key', name);
    const transport = new StdioClientTransport({ command: 'node', args, stderr: 'inherit' });
    const capabilities = onElicit ? { elicitation: { form: {} } } : {};
    const client = new Client({ name: 'key-sources-test', version: '0' }, { capabilities });
    if (onElicit) client.setRequestHandler('elicitation/create', onElicit);
    await client.connect(transport);
    return { client, transport };
}

/** `callTool` as a model's client makes it: `{ result }` or `{ error: { code, message, data } }`. */
async function call(client, name, args, meta) {
    try {
        const params = meta === undefined ? { name, arguments: args } : { name, arguments: args, _meta: meta };
        return { result: await client.callTool(params) };
    } catch (error) {
        return { error: { code: error.code, message: error.message, data: error.data } };
    }
}

function chargeId(answer) {
    assert.ok(answer.result, JSON.stringify(answer));
    return answer.result.structuredContent.chargeId;
}

function errorType(answer) {
    return answer.error?.data?.type;
}

test('a key in _meta replays, conflicts and is in progress as a SEP key', async () => {
    const ledger = join(sandbox(), 'ledger.jsonl');
    const { client } = await connect(ledger);
    try {
        const key = { idempotencyKey: 'ts-meta-1' };
        const first = await call(client, 'charge_payment', CHARGE, key);
        const retry = await call(client, 'charge_payment', CHARGE, key);
        // Replayed byte for byte, as for a SEP key: no replay marker.
        assert.deepEqual(retry, first);
        const conflict = await call(client, 'charge_payment', { ...CHARGE, amount: 6 }, key);
        assert.equal(errorType(conflict), 'idempotency_key_conflict', JSON.stringify(conflict));

        const slow = { ...CHARGE, delay_ms: 1500 };
        const concurrent = await Promise.all([
            call(client, 'charge_payment', slow, { idempotencyKey: 'ts-meta-2' }),
            call(client, 'charge_payment', slow, { idempotencyKey: 'ts-meta-2' })
        ]);
        const ran = concurrent.find((answer) => answer.result);
        const busy = concurrent.find((answer) => answer.error);
        // A client's key: the duplicate is refused at once, not made to wait.
        assert.equal(errorType(busy), 'idempotency_key_in_progress', JSON.stringify(concurrent));
        const again = await call(client, 'charge_payment', slow, { idempotencyKey: 'ts-meta-2' });
        assert.equal(chargeId(again), chargeId(ran));
    } finally {
        await client.close();
    }
    const lines = ledgerLines(ledger);
    assert.deepEqual(
        lines.map((line) => line.key),
        ['ts-meta-1', 'ts-meta-2']
    );
});

test('more _meta names by metaKey', async () => {
    const ledger = join(sandbox(), 'ledger.jsonl');
    const { client } = await connect(ledger, { metaKey: ['io.mcp-gateway/idempotency-key'] });
    try {
        const key = { 'io.mcp-gateway/idempotency-key': 'gw-1' };
        const first = await call(client, 'charge_payment', CHARGE, key);
        assert.deepEqual(await call(client, 'charge_payment', CHARGE, key), first);
    } finally {
        await client.close();
    }
    assert.equal(ledgerLines(ledger).length, 1);
});

test('a business identifier replays a model-style retry and conflicts on another amount', async () => {
    const ledger = join(sandbox(), 'ledger.jsonl');
    const { client } = await connect(ledger, { tools: { charge_payment: { keyFrom: ['/order_id'] } } });
    try {
        const order = { ...CHARGE, order_id: 'ord-1' };
        const first = await call(client, 'charge_payment', order);
        assert.equal(first.result._meta?.[REPLAYED], undefined);
        // A model-style retry: a new request, the same arguments, no key.
        const retry = await call(client, 'charge_payment', order);
        assert.equal(chargeId(retry), chargeId(first));
        assert.equal(retry.result._meta[REPLAYED], 'key-from');
        // With a fresh key of the client's own each attempt, the identifier still decides.
        const fresh = await call(client, 'charge_payment', order, { idempotencyKey: 'attempt-2' });
        assert.equal(chargeId(fresh), chargeId(first));
        // The identifier with another amount: a conflict that names it.
        const conflict = await call(client, 'charge_payment', { ...order, amount: 6 });
        assert.equal(errorType(conflict), 'idempotency_key_conflict', JSON.stringify(conflict));
        assert.ok(conflict.error.message.includes('/order_id = "ord-1"'), conflict.error.message);
        const other = await call(client, 'charge_payment', { ...CHARGE, order_id: 'ord-2' });
        assert.notEqual(chargeId(other), chargeId(first));
    } finally {
        await client.close();
    }
    const lines = ledgerLines(ledger);
    assert.deepEqual(
        lines.map((line) => line.orderId),
        ['ord-1', 'ord-2']
    );
    // The derived key reached the tool in `_meta`, as a client's key does.
    assert.ok(lines[0].key.startsWith('charge_payment:'), lines[0].key);
});

test('required refuses a call without its identifier and runs nothing', async () => {
    const ledger = join(sandbox(), 'ledger.jsonl');
    const { client } = await connect(ledger, { tools: { charge_payment: { 'key-from': '/order_id', required: true } } });
    try {
        const refused = await call(client, 'charge_payment', CHARGE);
        assert.equal(refused.error?.code, -32602, JSON.stringify(refused));
        assert.ok(refused.error.message.includes('/order_id'), refused.error.message);
    } finally {
        await client.close();
    }
    assert.deepEqual(ledgerLines(ledger), []);
});

test('a window merges identical calls and runs them again after it', async () => {
    const ledger = join(sandbox(), 'ledger.jsonl');
    const { client } = await connect(ledger, { tools: { charge_payment: { window: '3s' } } });
    try {
        const first = await call(client, 'charge_payment', CHARGE);
        const merged = await call(client, 'charge_payment', CHARGE);
        assert.equal(chargeId(merged), chargeId(first));
        assert.equal(merged.result._meta[REPLAYED], 'window');
        await new Promise((resolve) => setTimeout(resolve, 3300));
        const later = await call(client, 'charge_payment', CHARGE);
        assert.notEqual(chargeId(later), chargeId(first));
        assert.equal(later.result._meta?.[REPLAYED], undefined);
    } finally {
        await client.close();
    }
    assert.equal(ledgerLines(ledger).length, 2);
});

test('a waiting duplicate does not hold up the elicitation answer the running call waits for', async () => {
    // The first call asks the client to confirm; the client sends a duplicate (a model-style
    // retry), and only then answers. Over stdio the answer travels behind the duplicate, which
    // waits for the first call's outcome: it must not hold the answer up.
    const ledger = join(sandbox(), 'ledger.jsonl');
    const order = { order_id: 'ord-elicit', amount: 9, currency: 'eur' };
    let elicitations = 0;
    let duplicate;
    let duplicateSent;
    const sent = new Promise((resolve) => {
        duplicateSent = resolve;
    });
    const { client, transport } = await connect(ledger, {
        tools: { confirm_charge: { keyFrom: ['/order_id'], wait: '20s' } },
        onElicit: async () => {
            elicitations += 1;
            duplicate = call(client, 'confirm_charge', order);
            // The answer goes out behind the duplicate, on the same pipe.
            await sent;
            return { action: 'accept', content: { confirm: true } };
        }
    });
    let calls = 0;
    const send = transport.send.bind(transport);
    transport.send = async (message, options) => {
        await send(message, options);
        if (message.method === 'tools/call' && ++calls === 2) duplicateSent();
    };
    try {
        const first = await call(client, 'confirm_charge', order);
        const second = await duplicate;
        assert.equal(elicitations, 1);
        assert.equal(chargeId(second), chargeId(first), JSON.stringify({ first, second }));
        assert.equal(second.result._meta[REPLAYED], 'key-from');
    } finally {
        await client.close();
    }
    const [line, ...more] = ledgerLines(ledger);
    assert.deepEqual(more, []);
    assert.equal(line.orderId, 'ord-elicit');
});

test('suggested policies hold from the first call though no client lists the tools', async () => {
    // A raw client that never sends tools/list (the SDK's own lists the tools to check results):
    // the binding lists the server's tools itself before it decides the first call, as `wrap`
    // does. A key-less retry of the charge with the same arguments is the first call's replay
    // (the suggested window); the read-only get_balance is left alone and runs each time.
    const ledger = join(sandbox(), 'ledger.jsonl');
    const peer = await bound(ledger, '--store', 'memory', '--tools', JSON.stringify('suggested'));
    const toolsCall = async (name, args) => {
        const answer = await peer.request('tools/call', { name, arguments: args });
        assert.ok(answer.result, JSON.stringify(answer));
        return answer.result;
    };
    try {
        const before = await toolsCall('get_balance', {});
        const first = await toolsCall('charge_payment', CHARGE);
        const retry = await toolsCall('charge_payment', CHARGE);
        const after = await toolsCall('get_balance', {});
        assert.equal(retry.structuredContent.chargeId, first.structuredContent.chargeId, JSON.stringify(retry));
        assert.equal(retry._meta?.[REPLAYED], 'window', JSON.stringify(retry));
        assert.equal(ledgerLines(ledger).length, 1);
        // The balance ran again: it sees the charge made in between, and is no replay.
        assert.equal(before.structuredContent.charges, 0, JSON.stringify(before));
        assert.equal(after.structuredContent.charges, 1, JSON.stringify(after));
        assert.equal(after._meta?.[REPLAYED], undefined, JSON.stringify(after));
    } finally {
        await peer.close();
    }
});

test('without a tool policy the tools at risk are logged once at the first tools/list', async () => {
    // As `wrap` does: on stderr, the tools a key-less retry would run again; not the read-only
    // get_balance.
    const ledger = join(sandbox(), 'ledger.jsonl');
    const peer = await Peer.start('node', [SERVER, '--ledger', ledger, '--store', 'memory'], { stderr: 'pipe' });
    try {
        for (let i = 0; i < 2; i++) {
            const listed = await peer.request('tools/list', {});
            assert.ok(listed.result.tools.some((tool) => tool.name === 'charge_payment'), JSON.stringify(listed));
        }
    } finally {
        const drained = new Promise((resolve) => peer.process.once('close', resolve));
        await peer.close();
        await drained;
    }
    const logged = peer.stderr.split('\n').filter((line) => line.includes('no tool policy is set'));
    assert.equal(logged.length, 1, peer.stderr);
    assert.ok(logged[0].includes('charge_payment') && !logged[0].includes('get_balance'), peer.stderr);
});

const BAD_POLICIES = {
    'a window out of range': [{ tools: { charge: { window: '1h' } } }, 'tool policy [tools."charge"]: `window`'],
    'a pointer without its slash': [{ tools: { charge: { keyFrom: 'order_id' } } }, 'is not a JSON Pointer'],
    'required without an identifier': [{ tools: { charge: { required: true } } }, '`required = true` needs'],
    'an unknown setting': [{ tools: { charge: { keyForm: '/order_id' } } }, 'keyForm'],
    'not an object': [{ tools: ['charge'] }, '`tools` must be a table of tool names'],
    'not a JSON value': [{ tools: { charge: { wait: 10n } } }, 'expected a JSON value'],
    'an empty meta key': [{ metaKey: '' }, 'none of them empty'],
    'a meta key that is not a string': [{ metaKey: 5 }, 'expected a name or an array of names']
};

test('a bad policy is refused at idempotent() with the words of the library', () => {
    for (const [name, [options, words]] of Object.entries(BAD_POLICIES)) {
        const server = new McpServer({ name: 'bad-policy', version: '0' });
        assert.throws(
            () => idempotent(server, { store: 'memory', ...options }),
            (error) => {
                assert.ok(error instanceof IdempotencyError, `${name}: ${error}`);
                assert.equal(error.type, 'idempotency_invalid_option', name);
                assert.equal(error.code, -32602, name);
                // Named as the user wrote it.
                const option = 'metaKey' in options ? 'metaKey' : 'tools';
                assert.ok(error.message.startsWith(`${option}: `), `${name}: ${error.message}`);
                assert.ok(error.message.includes(words), `${name}: ${error.message}`);
                return true;
            },
            name
        );
    }
});
