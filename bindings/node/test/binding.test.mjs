// Bad input gets the error `mcp-idem wrap` gives and nothing executes; a store that goes down
// mid-run refuses keyed calls while it is down and loses no outcome.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { McpServer } from '@modelcontextprotocol/server';

import { IdempotencyError, idempotent } from '../index.js';
import { OwnRedis, Peer, bound, chargeId, errorType, freePort, ledgerLines, sandbox, wrapRefusal, wrapped } from './support.mjs';

function refused(options) {
    const server = new McpServer({ name: 'bad-input', version: '0' });
    try {
        idempotent(server, options);
    } catch (error) {
        assert.ok(error instanceof IdempotencyError, error);
        return error;
    }
    assert.fail(`idempotent() accepted ${JSON.stringify(options)}`);
}

test('a store URL that does not parse is refused at once with the words of wrap', () => {
    const error = refused({ store: 'mysql://db' });
    assert.equal(error.type, 'idempotency_invalid_store_url');
    assert.equal(error.code, -32602);
    assert.ok(wrapRefusal('--store', 'mysql://db').includes(error.message), error.message);
});

test('a store that is down at start is refused at once with the words of wrap', async () => {
    const url = `redis://127.0.0.1:${await freePort()}`;
    const error = refused({ store: url });
    assert.equal(error.type, 'idempotency_store_unavailable');
    assert.equal(error.code, -32603);
    assert.ok(error.message.startsWith(`cannot open the record store ${url}`), error.message);
    assert.ok(wrapRefusal('--store', url).includes(error.message), error.message);
});

test('unknown options and bad values are refused', () => {
    assert.equal(refused({ store: 'memory', retension: '2h' }).type, 'idempotency_invalid_option');
    const badLease = refused({ store: 'memory', lease: 'soon' });
    assert.equal(badLease.code, -32602);
    assert.equal(badLease.message, 'lease: expected a duration such as 24h, 30m or 500ms, got "soon"');
    assert.equal(refused({ store: 'memory', maxKeyBytes: 0 }).type, 'idempotency_invalid_option');
    assert.equal(refused({ store: 'memory', maxKeyBytes: [1] }).type, 'idempotency_invalid_option');
    assert.equal(refused({ store: 'memory', afterCrash: 'retry' }).type, 'idempotency_invalid_option');
    assert.equal(refused({ store: 'memory', principal: 7 }).type, 'idempotency_invalid_option');
    assert.equal(refused({ store: 'memory', storeIo: 'elsewhere' }).type, 'idempotency_invalid_option');
    const inlineOnRedis = refused({ store: 'redis://127.0.0.1:1', storeIo: 'inline' });
    assert.ok(inlineOnRedis.message.startsWith('storeIo: only the sqlite: and memory stores'), inlineOnRedis.message);
    assert.throws(() => idempotent({}, { store: 'memory' }), TypeError);
});

test("a misspelled option is named as written, with the options in Node's spelling", () => {
    const error = refused({ store: 'memory', afterCrsh: 'reject' });
    assert.equal(error.type, 'idempotency_invalid_option');
    assert.equal(error.code, -32602);
    assert.ok(error.message.startsWith('unknown option "afterCrsh"; expected one of: store, namespace'), error.message);
    assert.ok(error.message.includes(', afterCrash, forwardKey, '), error.message);
});

test('a bad value names the option as written and what it accepts', () => {
    assert.equal(refused({ store: 'memory', retention: 'forever' }).message, 'retention: expected a duration such as 24h, 30m or 500ms, got "forever"');
    assert.equal(refused({ store: 'memory', afterCrash: 'retry' }).message, 'afterCrash: expected reject or reexecute, got "retry"');
    assert.equal(refused({ store: 'memory', maxKeyBytes: [1] }).message, 'maxKeyBytes: expected a positive whole number, got [1]');
    assert.equal(refused({ store: 'memory', maxKeyBytes: Number.NaN }).message, 'maxKeyBytes: expected a JSON value, got NaN');
    assert.equal(
        refused({ store: 'memory', principal: 7 }).message,
        'principal: expected a string, or a function of the request that returns one, got 7'
    );
    assert.equal(refused({ store: 'memory', maxKeyBytes: 1, 'max-key-bytes': 2 }).message, '"max-key-bytes" and "maxKeyBytes" are one option; give it once');
});

test('a misspelled policy setting is named as written', () => {
    const error = refused({ store: 'memory', tools: { charge: { keyFrm: ['/order_id'] } } });
    assert.equal(error.type, 'idempotency_invalid_option');
    assert.ok(error.message.startsWith('tools: tool policy [tools."charge"]: unknown setting `keyFrm`; expected key-from'), error.message);
    const badValue = refused({ store: 'memory', tools: { charge: { keyFrom: 5 } } });
    assert.ok(badValue.message.startsWith('tools: tool policy [tools."charge"]: `keyFrom`: '), badValue.message);
});

test('a server without a name needs a namespace', () => {
    // The library's one rule for both bindings: no made-up name to keep records under.
    const nameless = () => {
        const server = new McpServer({ name: 'nameless', version: '0' });
        server.server._serverInfo = { ...server.server._serverInfo, name: '' };
        return server;
    };
    const server = nameless();
    assert.throws(
        () => idempotent(server, { store: 'memory' }),
        (error) => {
            assert.ok(error instanceof IdempotencyError, error);
            assert.equal(error.type, 'idempotency_invalid_option');
            assert.ok(error.message.startsWith('the server has no name (its serverInfo.name) to keep its records under'), error.message);
            return true;
        }
    );
    idempotent(nameless(), { store: 'memory', namespace: 'payments' });
});

const CHARGE = { amount: 5, currency: 'eur' };
const BAD_CALLS = {
    'a number as key': [CHARGE, 12345],
    'null as key': [CHARGE, null],
    'an object as key': [CHARGE, { k: 1 }],
    'an empty key': [CHARGE, ''],
    'a 300-byte key': [CHARGE, 'k'.repeat(300)],
    '2 kB of arguments': [{ ...CHARGE, note: 'x'.repeat(2000) }, 'big-arguments'],
    'arguments that are not an object': [[5, 'eur'], 'array-arguments']
};

test('bad keys and arguments get the answer of wrap, and nothing runs', async () => {
    const directory = sandbox();
    const ours = await bound(join(directory, 'ledger.jsonl'), '--store', 'memory', '--option', 'max-argument-bytes=1024');
    const theirs = await wrapped(join(directory, 'wrapped.jsonl'), '--store', 'memory', '--max-argument-bytes', '1024');
    try {
        for (const [name, [args, key]] of Object.entries(BAD_CALLS)) {
            const [mine, wraps] = await Promise.all([ours.call('charge_payment', args, key), theirs.call('charge_payment', args, key)]);
            assert.ok(mine.error, `${name}: ${JSON.stringify(mine)}`);
            assert.deepEqual(mine.error, wraps.error, name);
        }
        assert.deepEqual(ledgerLines(join(directory, 'ledger.jsonl')), []);
        assert.deepEqual(ledgerLines(join(directory, 'wrapped.jsonl')), []);
    } finally {
        await Promise.all([ours.close(), theirs.close()]);
    }
});

test('the key reaches the tool in _meta', async () => {
    const ledger = join(sandbox(), 'ledger.jsonl');
    const peer = await bound(ledger, '--store', 'memory');
    try {
        const answer = await peer.call('charge_payment', CHARGE, 'key-for-the-tool');
        const [line] = ledgerLines(ledger);
        assert.equal(line.key, 'key-for-the-tool');
        assert.equal(chargeId(answer), line.chargeId);
    } finally {
        await peer.close();
    }
});

test('a store down mid-run refuses new keyed calls and loses no outcome', async () => {
    const directory = sandbox();
    const ledger = join(directory, 'ledger.jsonl');
    const redis = await OwnRedis.start(directory);
    const peer = await bound(ledger, '--store', redis.url, '--namespace', 'store-down');
    try {
        const before = chargeId(await peer.call('charge_payment', CHARGE, 'before'));

        // A call that runs while the store goes down: the tool finishes, the client gets its answer.
        const slow = { ...CHARGE, delay_ms: 1500 };
        const running = peer.call('charge_payment', slow, 'during');
        await new Promise((resolve) => setTimeout(resolve, 500));
        await redis.stop();
        const during = chargeId(await running);

        // While the store is down a keyed call is refused, as wrap refuses it, and does not run.
        const refusal = await peer.call('charge_payment', CHARGE, 'while-down');
        assert.equal(errorType(refusal), 'idempotency_store_unavailable', JSON.stringify(refusal));
        assert.equal(refusal.error.code, -32603);
        assert.equal(ledgerLines(ledger).length, 2);

        // Once the store is back, the outcome of the call that ran while it was down is replayed
        // (it was held and sent again), and so is the one recorded before.
        await redis.start();
        const deadline = Date.now() + 30_000;
        let retry;
        for (;;) {
            retry = await peer.call('charge_payment', slow, 'during');
            if (retry.result || Date.now() > deadline) break;
            assert.ok(['idempotency_key_in_progress', 'idempotency_store_unavailable'].includes(errorType(retry)), JSON.stringify(retry));
            await new Promise((resolve) => setTimeout(resolve, 200));
        }
        assert.equal(chargeId(retry), during);
        assert.equal(chargeId(await peer.call('charge_payment', CHARGE, 'before')), before);

        // The refused call never ran: with the store back it runs, once.
        const after = chargeId(await peer.call('charge_payment', CHARGE, 'while-down'));
        assert.equal(chargeId(await peer.call('charge_payment', CHARGE, 'while-down')), after);
        assert.deepEqual(
            ledgerLines(ledger).map((line) => line.key),
            ['before', 'during', 'while-down']
        );
    } finally {
        await peer.close();
        await redis.stop();
    }
});

test('a cancelled keyed call still runs once and its retry replays it', async () => {
    // `cancel: 'absorb'` (the default, as wrap's): clients cancel on a timeout, which is how a lost
    // answer looks, so the call runs to its end and the retry that follows gets its outcome.
    const ledger = join(sandbox(), 'ledger.jsonl');
    const peer = await bound(ledger, '--store', 'memory');
    try {
        const slow = { ...CHARGE, delay_ms: 500 };
        void peer.call('charge_payment', slow, 'cancelled');
        const cancelledId = peer.nextId;
        await new Promise((resolve) => setTimeout(resolve, 100));
        peer.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: cancelledId, reason: 'timed out' } });
        const deadline = Date.now() + 20_000;
        let retry;
        for (;;) {
            retry = await peer.call('charge_payment', slow, 'cancelled');
            if (retry.result || Date.now() > deadline) break;
            assert.equal(errorType(retry), 'idempotency_key_in_progress', JSON.stringify(retry));
            await new Promise((resolve) => setTimeout(resolve, 100));
        }
        const lines = ledgerLines(ledger);
        assert.equal(lines.length, 1);
        assert.equal(chargeId(retry), lines[0].chargeId);
    } finally {
        await peer.close();
    }
});

for (const storeIo of ['runtime', 'inline']) {
    test(`storeIo ${storeIo} replays a keyed call and refuses a conflict`, async () => {
        // `storeIo: 'inline'` runs SQLite's transactions on Node's thread instead of the library's
        // runtime: the same records, replays and conflicts.
        const dir = sandbox();
        const ledger = join(dir, 'ledger.jsonl');
        const peer = await bound(ledger, '--store', `sqlite:${join(dir, 'records.sqlite3')}`, '--option', `storeIo=${storeIo}`);
        try {
            const first = chargeId(await peer.call('charge_payment', CHARGE, 'store-io'));
            assert.equal(chargeId(await peer.call('charge_payment', CHARGE, 'store-io')), first);
            const conflict = await peer.call('charge_payment', { ...CHARGE, amount: 8 }, 'store-io');
            assert.equal(errorType(conflict), 'idempotency_key_conflict', JSON.stringify(conflict));
            assert.equal(ledgerLines(ledger).length, 1);
        } finally {
            await peer.close();
        }
    });
}

test('a low-level Server is made idempotent too', async () => {
    const peer = await Peer.start('node', [fileURLToPath(new URL('./lowlevel-server.mjs', import.meta.url)), 'memory']);
    try {
        const first = await peer.call('charge', { amount: 1 }, 'lowlevel-key');
        assert.ok(first.result, JSON.stringify(first));
        assert.deepEqual((await peer.call('charge', { amount: 1 }, 'lowlevel-key')).result, first.result);
        assert.notDeepEqual((await peer.call('charge', { amount: 1 }, 'another-key')).result, first.result);
        const conflict = await peer.call('charge', { amount: 2 }, 'lowlevel-key');
        assert.equal(errorType(conflict), 'idempotency_key_conflict', JSON.stringify(conflict));
    } finally {
        await peer.close();
    }
});
