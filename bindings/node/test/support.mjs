// What the binding's tests share: the payments server over stdio, spoken to line by line, the same
// server behind `mcp-idem wrap` to compare with, a server over Streamable HTTP and a client of it,
// `mcp-idem check`, and a Redis of the test's own that it can stop.
import { execFile, spawn, spawnSync } from 'node:child_process';
import { accessSync, constants, existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const SERVER = join(here, 'payments-server.mjs');
const REPO = join(here, '..', '..', '..');
export const IN_CI = ['true', '1'].includes((process.env.CI ?? '').toLowerCase());

export function sandbox() {
    return mkdtempSync(join(tmpdir(), 'mcp-idempotency-node-'));
}

/** The `mcp-idem` binary (`MCP_IDEM_BIN`, else the workspace's debug or release build). */
export function mcpIdemBinary() {
    for (const candidate of [process.env.MCP_IDEM_BIN, join(REPO, 'target/debug/mcp-idem'), join(REPO, 'target/release/mcp-idem')]) {
        if (!candidate) continue;
        try {
            accessSync(candidate, constants.X_OK);
            return candidate;
        } catch {}
    }
    throw new Error('no mcp-idem binary: cargo build -p mcp-idem');
}

/** What `mcp-idem wrap` prints when it refuses to start with these options. */
export function wrapRefusal(...options) {
    const run = spawnSync(mcpIdemBinary(), ['wrap', ...options, '--', 'true'], { encoding: 'utf8', timeout: 60_000 });
    if (run.status === 0) throw new Error(`wrap started with ${options.join(' ')}`);
    return run.stderr;
}

/** An MCP server over stdio, spoken to with one JSON-RPC message per line (2025-11-25 handshake). */
export class Peer {
    /** `stderr: 'pipe'` keeps the server's stderr in `peer.stderr` (else it is the test's). */
    static async start(command, args, { stderr = 'inherit' } = {}) {
        const peer = new Peer(command, args, stderr);
        const answer = await peer.request('initialize', {
            protocolVersion: '2025-11-25',
            capabilities: {},
            clientInfo: { name: 'binding-tests', version: '0' }
        });
        peer.capabilities = answer.result?.capabilities;
        peer.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
        return peer;
    }

    constructor(command, args, stderr = 'inherit') {
        this.process = spawn(command, args, { stdio: ['pipe', 'pipe', stderr] });
        this.stderr = '';
        this.process.stderr?.setEncoding('utf8').on('data', (text) => {
            this.stderr += text;
        });
        this.nextId = 0;
        this.waiting = new Map();
        createInterface({ input: this.process.stdout }).on('line', (line) => {
            const message = JSON.parse(line);
            const resolve = this.waiting.get(message.id);
            if (resolve) {
                this.waiting.delete(message.id);
                resolve(message);
            }
        });
    }

    send(message) {
        this.process.stdin.write(`${JSON.stringify(message)}\n`);
    }

    /** Sends a request; resolves to its answer. */
    request(method, params) {
        this.nextId += 1;
        const id = this.nextId;
        const answer = new Promise((resolve) => this.waiting.set(id, resolve));
        this.send({ jsonrpc: '2.0', id, method, params });
        return answer;
    }

    call(name, args, key) {
        return this.request('tools/call', { name, arguments: args, idempotencyKey: key });
    }

    async close() {
        const exited = new Promise((resolve) => this.process.once('exit', resolve));
        this.process.stdin.end();
        const timer = setTimeout(() => this.process.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(timer);
    }
}

/** The payments server with the binding, over stdio. */
export function bound(ledger, ...options) {
    return Peer.start('node', [SERVER, '--ledger', ledger, ...options]);
}

/** The plain payments server behind `mcp-idem wrap`, over stdio. */
export function wrapped(ledger, ...wrapOptions) {
    return Peer.start(mcpIdemBinary(), ['wrap', ...wrapOptions, '--', 'node', SERVER, '--ledger', ledger, '--plain']);
}

export function ledgerLines(ledger) {
    if (!existsSync(ledger)) return [];
    return readFileSync(ledger, 'utf8')
        .split('\n')
        .filter((line) => line !== '')
        .map((line) => JSON.parse(line));
}

export function freePort() {
    return new Promise((resolve, reject) => {
        const probe = createServer();
        probe.once('error', reject);
        probe.listen(0, '127.0.0.1', () => {
            const { port } = probe.address();
            probe.close(() => resolve(port));
        });
    });
}

function redisAnswers(port) {
    return new Promise((resolve) => {
        const socket = createConnection({ host: '127.0.0.1', port }, () => socket.write('PING\r\n'));
        socket.once('data', (data) => {
            socket.destroy();
            resolve(data.toString().startsWith('+PONG'));
        });
        socket.once('error', () => resolve(false));
    });
}

/** A redis-server of the test's own on a free loopback port, with an append-only file fsynced at
 * every write, so a restart keeps every record. */
/** A server started with `--http`, once it printed "listening on URL" on stderr; its stderr is kept in `log`. */
export class HttpServer {
    static start(command, args) {
        return new Promise((resolve, reject) => {
            const server = new HttpServer(command, args);
            server.process.once('exit', (code, signal) => reject(new Error(`${command} ${args.join(' ')} exited (${code ?? signal}) before listening:\n${server.log.join('\n')}`)));
            createInterface({ input: server.process.stderr }).on('line', (line) => {
                server.log.push(line);
                const listening = /^listening on (\S+)/.exec(line);
                if (listening && server.url === undefined) {
                    server.url = listening[1];
                    resolve(server);
                }
            });
        });
    }

    constructor(command, args) {
        this.process = spawn(command, args, { stdio: ['ignore', 'ignore', 'pipe'] });
        this.log = [];
        this.url = undefined;
    }

    /** Ends the server with `signal` (SIGKILL: mid-call, nothing flushed) and waits for its exit. */
    async stop(signal = 'SIGTERM') {
        if (this.process.exitCode !== null || this.process.signalCode !== null) return;
        const exited = new Promise((resolve) => this.process.once('exit', resolve));
        this.process.kill(signal);
        await exited;
    }
}

/**
 * A client of a Streamable HTTP server as a 2025-11-25 client speaks to it: `initialize` first,
 * then every request with `MCP-Protocol-Version` and the session id the server gave, if any; an
 * answer is read from a JSON body or from the `data:` lines of an SSE stream.
 */
export class HttpPeer {
    static async start(url) {
        const peer = new HttpPeer(url);
        const answer = await peer.request('initialize', {
            protocolVersion: '2025-11-25',
            capabilities: {},
            clientInfo: { name: 'binding-tests', version: '0' }
        });
        if (!answer.result) throw new Error(`initialize failed: ${JSON.stringify(answer)}`);
        peer.version = answer.result.protocolVersion;
        peer.capabilities = answer.result.capabilities;
        await peer.post({ jsonrpc: '2.0', method: 'notifications/initialized' });
        return peer;
    }

    constructor(url) {
        this.url = url;
        this.nextId = 0;
        this.session = undefined;
        this.version = undefined;
    }

    /** POSTs one message; resolves to the answer to it (a request), else `undefined`. */
    async post(message, signal) {
        const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
        if (this.session !== undefined) headers['mcp-session-id'] = this.session;
        if (this.version !== undefined) headers['mcp-protocol-version'] = this.version;
        const response = await fetch(this.url, { method: 'POST', headers, body: JSON.stringify(message), signal });
        this.session ??= response.headers.get('mcp-session-id') ?? undefined;
        const text = await response.text();
        if (message.id === undefined) return undefined;
        const messages = (response.headers.get('content-type') ?? '').includes('text/event-stream')
            ? text
                  .split('\n')
                  .filter((line) => line.startsWith('data:') && line.slice(5).trim() !== '')
                  .map((line) => JSON.parse(line.slice(5)))
            : [JSON.parse(text)];
        const answer = messages.find((each) => each.id === message.id);
        if (answer === undefined) throw new Error(`no answer to ${message.method} (HTTP ${response.status}): ${text}`);
        return answer;
    }

    request(method, params, signal) {
        this.nextId += 1;
        return this.post({ jsonrpc: '2.0', id: this.nextId, method, params }, signal);
    }

    call(name, args, key, signal) {
        return this.request('tools/call', { name, arguments: args, idempotencyKey: key }, signal);
    }
}

/** The witness options of `mcp-idem check` for the payments servers' charge_payment, observed with get_balance. */
export const CHECK_WITNESS = [
    '--tool',
    'charge_payment',
    '--args',
    '{"amount": 12.5, "currency": "usd"}',
    '--slow-args',
    '{"amount": 12.5, "currency": "usd", "delay_ms": 1500}',
    '--error-args',
    '{"amount": 12.5, "currency": "usd", "fail_after_charge": true}',
    '--observe-tool',
    'get_balance',
    '--json'
];

/** The charges of a passing `check` run with CHECK_WITNESS: two calls without a key, then one per key that ran. */
export const CHARGES_OF_A_PASSING_RUN = 11;

/** `mcp-idem check` with CHECK_WITNESS against `target` (`['--url', URL]` or `['--', COMMAND...]`): `{ code, report }`. */
export function check(target) {
    return new Promise((resolve, reject) => {
        const options = { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, env: { ...process.env, MCP_IDEM_LOG: 'error' } };
        execFile(mcpIdemBinary(), ['check', ...CHECK_WITNESS, ...target], options, (error, stdout, stderr) => {
            if (error && typeof error.code !== 'number') return reject(error);
            try {
                resolve({ code: error ? error.code : 0, report: JSON.parse(stdout) });
            } catch {
                reject(new Error(`check printed no report (${error?.code ?? 0}):\n${stdout}\n${stderr}`));
            }
        });
    });
}

export class OwnRedis {
    static async start(directory) {
        const redis = new OwnRedis(directory, await freePort());
        await redis.start();
        return redis;
    }

    constructor(directory, port) {
        this.directory = directory;
        this.port = port;
        this.url = `redis://127.0.0.1:${port}`;
    }

    async start() {
        const args = ['--bind', '127.0.0.1', '--port', String(this.port), '--dir', this.directory, '--appendonly', 'yes', '--appendfsync', 'always', '--save', ''];
        this.process = spawn('redis-server', args, { stdio: 'ignore' });
        const deadline = Date.now() + 10_000;
        while (Date.now() < deadline) {
            if (await redisAnswers(this.port)) return;
            await new Promise((resolve) => setTimeout(resolve, 50));
        }
        throw new Error(`redis-server did not come up on port ${this.port}`);
    }

    async stop() {
        if (!this.process) return;
        const exited = new Promise((resolve) => this.process.once('exit', resolve));
        this.process.kill('SIGKILL');
        await exited;
        this.process = undefined;
    }
}

export function chargeId(answer) {
    if (!answer.result) throw new Error(`not a result: ${JSON.stringify(answer)}`);
    return answer.result.structuredContent.chargeId;
}

export function errorType(answer) {
    return answer.error?.data?.type;
}
