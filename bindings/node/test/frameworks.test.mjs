// The frameworks the binding supports, each from its own unmodified release on npm (pinned by
// package-lock.json), over each transport it serves, with one payments server per framework API:
//
// - the TypeScript SDK v2 (`@modelcontextprotocol/server`): `McpServer` and the low-level `Server`
//   (payments-server.mjs), over `serveStdio` and stateless `createMcpHandler`;
// - the TypeScript SDK v1 (`@modelcontextprotocol/sdk`): `McpServer` and the low-level `Server`
//   (sdk-v1-server.mjs), over `StdioServerTransport` and a stateless
//   `StreamableHTTPServerTransport` per request;
// - punkpeye's `fastmcp` (fastmcp-server.mjs), with `start({transportType: 'stdio'})` and
//   `start({transportType: 'httpStream'})`, with sessions and stateless.
//
// For each: `mcp-idem check` passes every SEP scenario (the 2026-07-28 `server/discover` is skipped
// where the framework speaks only the 2025 protocol, as MRTR continuations are for every server),
// with the charges of a passing run in the ledger; and a server SIGKILLed while a keyed call runs
// leaves a claim that a restarted server answers `idempotency_outcome_unknown`, the tool never
// running a second time; and with `tools: 'suggested'` a key-less retry is replayed though no client
// listed the tools.
import assert from 'node:assert/strict';
import { dirname, join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { CHARGES_OF_A_PASSING_RUN, HttpPeer, HttpServer, Peer, check, errorType, ledgerLines, sandbox } from './support.mjs';

const here = dirname(fileURLToPath(import.meta.url));

const SERVERS = [
    { name: 'TypeScript SDK v2 McpServer', script: 'payments-server.mjs', args: [], current: true },
    { name: 'TypeScript SDK v2 low-level Server', script: 'payments-server.mjs', args: ['--lowlevel'], current: true },
    { name: 'TypeScript SDK v1 McpServer', script: 'sdk-v1-server.mjs', args: [] },
    { name: 'TypeScript SDK v1 low-level Server', script: 'sdk-v1-server.mjs', args: ['--lowlevel'] },
    { name: "punkpeye's fastmcp", script: 'fastmcp-server.mjs', args: [] },
    { name: "punkpeye's fastmcp, stateless httpStream", script: 'fastmcp-server.mjs', args: ['--stateless'], transports: ['http'] }
];

/** `node SCRIPT --ledger LEDGER ARGS... EXTRA...`. */
function command(server, ledger, ...extra) {
    return ['node', join(here, server.script), '--ledger', ledger, ...server.args, ...extra];
}

function statuses(report, status) {
    return report.checks.filter((each) => each.status === status).map((each) => each.name);
}

/** Every check passes but those that cannot run here: MRTR (no tool asks for input) and, on a 2025-only framework, `server/discover`. */
function assertPasses(server, { code, report }, ledger) {
    const skipped = ['mrtr.continuation', ...(server.current ? [] : ['capability.discover'])];
    assert.deepEqual(statuses(report, 'fail'), [], JSON.stringify(report, null, 2));
    assert.deepEqual(statuses(report, 'skip').sort(), skipped.sort(), JSON.stringify(report, null, 2));
    assert.ok(statuses(report, 'pass').includes('capability.initialize'), JSON.stringify(report, null, 2));
    assert.equal(code, 0);
    assert.equal(ledgerLines(ledger).length, CHARGES_OF_A_PASSING_RUN, JSON.stringify(report, null, 2));
}

const SLOW_CHARGE = { amount: 100, currency: 'eur', delay_ms: 60_000 };
const CHARGE = { amount: 7, currency: 'eur' };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * After the SIGKILL: the retry on a restarted server, once the dead claim's lease (1 s) ran out,
 * is answered `idempotency_outcome_unknown`; `call` sends it.
 */
async function retryAfterKill(call) {
    const deadline = Date.now() + 30_000;
    for (;;) {
        const answer = await call();
        if (errorType(answer) !== 'idempotency_key_in_progress' || Date.now() > deadline) return answer;
        await sleep(100);
    }
}

for (const server of SERVERS) {
    describe(server.name, () => {
        // The stateless variant of a framework is its HTTP transport only.
        const overStdio = (server.transports ?? ['stdio', 'http']).includes('stdio') ? test : () => {};
        overStdio('over stdio: mcp-idem check passes every SEP scenario', async () => {
            const directory = sandbox();
            const ledger = join(directory, 'ledger.jsonl');
            const run = await check(['--', ...command(server, ledger, '--store', `sqlite:${join(directory, 'r.sqlite3')}`)]);
            assertPasses(server, run, ledger);
        });

        test('over Streamable HTTP: mcp-idem check passes every SEP scenario', async () => {
            const directory = sandbox();
            const ledger = join(directory, 'ledger.jsonl');
            const [program, ...args] = command(server, ledger, '--store', 'memory', '--http');
            const http = await HttpServer.start(program, args);
            try {
                assertPasses(server, await check(['--url', http.url]), ledger);
            } finally {
                await http.stop();
            }
        });

        overStdio('over stdio: a SIGKILL mid-call ends outcome unknown, never a second run', async () => {
            const directory = sandbox();
            const ledger = join(directory, 'ledger.jsonl');
            const [program, ...args] = command(server, ledger, '--store', `sqlite:${join(directory, 'r.sqlite3')}`, '--lease', '1s');
            const first = await Peer.start(program, args);
            assert.ok(first.capabilities?.tools?.idempotency, JSON.stringify(first.capabilities));
            first.call('charge_payment', SLOW_CHARGE, 'killed');
            // Messages of one connection are decided in order: the duplicate finds the call claimed.
            const duplicate = await first.call('charge_payment', SLOW_CHARGE, 'killed');
            assert.equal(errorType(duplicate), 'idempotency_key_in_progress', JSON.stringify(duplicate));
            const exited = new Promise((resolve) => first.process.once('exit', resolve));
            first.process.kill('SIGKILL');
            await exited;

            const second = await Peer.start(program, args);
            try {
                const answer = await retryAfterKill(() => second.call('charge_payment', SLOW_CHARGE, 'killed'));
                assert.equal(errorType(answer), 'idempotency_outcome_unknown', JSON.stringify(answer));
                assert.deepEqual(ledgerLines(ledger), []);
            } finally {
                await second.close();
            }
        });

        // `tools: 'suggested'`: the binding lists the server's tools itself before it decides the
        // first call (these clients never list them), so a key-less retry of the charge with the
        // same arguments replays it (the suggested window).
        overStdio("over stdio: tools 'suggested' replays a key-less retry no client listed the tools for", async () => {
            const ledger = join(sandbox(), 'ledger.jsonl');
            const [program, ...args] = command(server, ledger, '--store', 'memory', '--tools', '"suggested"');
            const peer = await Peer.start(program, args);
            try {
                const first = await peer.request('tools/call', { name: 'charge_payment', arguments: CHARGE });
                const retry = await peer.request('tools/call', { name: 'charge_payment', arguments: CHARGE });
                assert.equal(retry.result?.structuredContent?.chargeId, first.result?.structuredContent?.chargeId, JSON.stringify({ first, retry }));
            } finally {
                await peer.close();
            }
            assert.equal(ledgerLines(ledger).length, 1);
        });

        test("over Streamable HTTP: tools 'suggested' replays a key-less retry no client listed the tools for", async () => {
            const ledger = join(sandbox(), 'ledger.jsonl');
            const [program, ...args] = command(server, ledger, '--store', 'memory', '--tools', '"suggested"', '--http');
            const http = await HttpServer.start(program, args);
            try {
                const first = await (await HttpPeer.start(http.url)).request('tools/call', { name: 'charge_payment', arguments: CHARGE });
                const retry = await (await HttpPeer.start(http.url)).request('tools/call', { name: 'charge_payment', arguments: CHARGE });
                assert.equal(retry.result?.structuredContent?.chargeId, first.result?.structuredContent?.chargeId, `${JSON.stringify({ first, retry })}\n${http.log.join('\n')}`);
            } finally {
                await http.stop();
            }
            assert.equal(ledgerLines(ledger).length, 1);
        });

        test('over Streamable HTTP: a SIGKILL mid-call ends outcome unknown, never a second run', async () => {
            const directory = sandbox();
            const ledger = join(directory, 'ledger.jsonl');
            const [program, ...args] = command(server, ledger, '--store', `sqlite:${join(directory, 'r.sqlite3')}`, '--lease', '1s', '--http');
            const first = await HttpServer.start(program, args);
            const client = await HttpPeer.start(first.url);
            assert.ok(client.capabilities?.tools?.idempotency, JSON.stringify(client.capabilities));
            const running = (await HttpPeer.start(first.url)).call('charge_payment', SLOW_CHARGE, 'killed').catch(() => undefined);
            // The call is claimed once a duplicate is told it is in progress. A duplicate that
            // reached the server first runs instead (the same call): it is given up after a
            // second, and the next one finds it running.
            const deadline = Date.now() + 30_000;
            for (;;) {
                const duplicate = await client.call('charge_payment', SLOW_CHARGE, 'killed', AbortSignal.timeout(1_000)).catch((error) => error);
                if (errorType(duplicate) === 'idempotency_key_in_progress') break;
                assert.ok(Date.now() < deadline, `the call was never claimed: ${duplicate?.stack ?? JSON.stringify(duplicate)}\n${first.log.join('\n')}`);
                await sleep(50);
            }
            await first.stop('SIGKILL');
            await running;

            const second = await HttpServer.start(program, args);
            try {
                const retry = await HttpPeer.start(second.url);
                const answer = await retryAfterKill(() => retry.call('charge_payment', SLOW_CHARGE, 'killed'));
                assert.equal(errorType(answer), 'idempotency_outcome_unknown', `${JSON.stringify(answer)}\n${second.log.join('\n')}`);
                assert.deepEqual(ledgerLines(ledger), []);
            } finally {
                await second.stop();
            }
        });
    });
}
