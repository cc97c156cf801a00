// The package as npm ships it: `npm pack` holds the prebuilt linux-x64-gnu addon, and a project
// that installs the tarball loads it without building anything (elsewhere install.js builds it
// from source, as bindings/node/install.sh does in this checkout). Its peer dependencies (the
// SDK v1, the SDK v2) are both optional, and fastmcp is none (idempotent() checks its version):
// installed beside a project on one SDK line or on any fastmcp, it adds itself and nothing else,
// and never changes the project's SDK or fastmcp.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { OPTIONS } from '../index.js';
import { sandbox } from './support.mjs';

const packageDirectory = join(dirname(fileURLToPath(import.meta.url)), '..');
const { platformTriple } = await import(join(packageDirectory, 'triple.js'));

/** `npm pack` of this package into a fresh folder: `[folder, tarball path]`. */
function packed() {
    const directory = sandbox();
    execFileSync('npm', ['pack', '--pack-destination', directory, '--loglevel=error'], { cwd: packageDirectory, stdio: 'pipe' });
    const [tarball] = readdirSync(directory).filter((name) => name.endsWith('.tgz'));
    return [directory, join(directory, tarball)];
}

test('the packed package installs with its prebuilt addon and loads without a build', { skip: platformTriple() !== 'linux-x64-gnu' }, () => {
    const [directory, tarball] = packed();
    const files = execFileSync('tar', ['tzf', tarball], { encoding: 'utf8' }).split('\n');
    assert.ok(files.includes('package/mcp-idempotency.linux-x64-gnu.node'), files.join(' '));

    const project = join(directory, 'project');
    execFileSync('mkdir', [project]);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'project', version: '1.0.0', private: true }));
    // The SDK is a peer dependency; this test needs only the package itself, offline.
    const log = execFileSync('npm', ['install', '--offline', '--legacy-peer-deps', '--no-audit', '--no-fund', tarball], {
        cwd: project,
        encoding: 'utf8',
        stdio: 'pipe'
    });
    assert.ok(!log.includes('building it from source'), log);
    const probe = "const m = require('mcp-idempotency'); process.stdout.write(JSON.stringify([typeof m.idempotent, m.OPTIONS.length]))";
    // The library's options, as this checkout's package has them.
    assert.equal(execFileSync('node', ['-e', probe], { cwd: project, encoding: 'utf8' }), JSON.stringify(['function', OPTIONS.length]));
});

/** A fastmcp release of the major before the one `idempotent` wires (its newest, 3.x). */
const FASTMCP_3 = '3.35.0';

/** What `npm install --dry-run` would do in `project`, with `more` packages: `['add NAME VERSION', ...]`. */
function wouldInstall(project, ...more) {
    const log = execFileSync('npm', ['install', '--dry-run', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', ...more], {
        cwd: project,
        encoding: 'utf8',
        stdio: 'pipe'
    });
    return log.split('\n').filter((line) => /^(add|change|remove) \S+ \S+$/.test(line));
}

test('installed beside a project on one SDK line, it adds itself and no other SDK, and changes none', () => {
    const [directory, tarball] = packed();
    const lines = {
        'TypeScript SDK v1': { dependencies: { '@modelcontextprotocol/sdk': '1.32.2' }, absent: /^add (@modelcontextprotocol\/(server|client|core)|fastmcp) / },
        'TypeScript SDK v2': { dependencies: { '@modelcontextprotocol/server': '2.4.0' }, absent: /^add (@modelcontextprotocol\/sdk|fastmcp) / },
        // A fastmcp this package does not wire: it installs all the same (idempotent() then
        // throws), and the project keeps its fastmcp.
        [`punkpeye's fastmcp ${FASTMCP_3}`]: { dependencies: { fastmcp: FASTMCP_3 }, absent: /^(add|change) fastmcp (?!3\.35\.0$)/ }
    };
    for (const [line, { dependencies, absent }] of Object.entries(lines)) {
        const project = join(directory, line.replace(/[^\w.]+/g, '-'));
        mkdirSync(project);
        writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'project', version: '1.0.0', private: true, dependencies }));
        const without = wouldInstall(project);
        const withPackage = wouldInstall(project, tarball);
        // The project's own tree and this package, nothing else: no other SDK line, no fastmcp,
        // no other version of the project's SDK.
        assert.deepEqual(
            withPackage.filter((action) => !without.includes(action)),
            ['add mcp-idempotency 0.1.0'],
            `${line}: ${withPackage.join(', ')}`
        );
        assert.deepEqual(without.filter((action) => !withPackage.includes(action)), [], line);
        for (const [name, version] of Object.entries(dependencies)) assert.ok(withPackage.includes(`add ${name} ${version}`), `${line}: ${withPackage.join(', ')}`);
        assert.deepEqual(withPackage.filter((action) => absent.test(action)), [], line);
    }
});

test(`in a project on punkpeye's fastmcp ${FASTMCP_3} it installs, leaves fastmcp as it is, and idempotent() throws`, { skip: platformTriple() !== 'linux-x64-gnu' }, () => {
    const [directory, tarball] = packed();
    const project = join(directory, 'fastmcp-3-project');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'project', version: '1.0.0', private: true, dependencies: { fastmcp: FASTMCP_3 } }));
    // A real install from the npm registry, as a user runs it: no --legacy-peer-deps, no --force.
    execFileSync('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', tarball], { cwd: project, encoding: 'utf8', stdio: 'pipe' });
    const manifest = (name) => JSON.parse(readFileSync(join(project, 'node_modules', name, 'package.json'), 'utf8'));
    assert.equal(manifest('fastmcp').version, FASTMCP_3);
    assert.equal(manifest('mcp-idempotency').version, '0.1.0');
    const probe = [
        "import { FastMCP } from 'fastmcp';",
        "import { idempotent } from 'mcp-idempotency';",
        'try {',
        "    idempotent(new FastMCP({ name: 'v3', version: '1.0.0' }), { store: 'memory' });",
        "    process.stdout.write(JSON.stringify(['accepted']));",
        '} catch (error) {',
        '    process.stdout.write(JSON.stringify([error.constructor.name, error.message]));',
        '}'
    ].join('\n');
    const [thrown, message] = JSON.parse(execFileSync('node', ['--input-type=module', '-e', probe], { cwd: project, encoding: 'utf8' }));
    assert.equal(thrown, 'TypeError', message);
    assert.match(message, new RegExp(`got a FastMCP of fastmcp ${FASTMCP_3.replaceAll('.', '\\.')} \\(.*\\); it supports fastmcp \\^4\\.0\\.0 \\(>=4\\.0\\.0 <5\\.0\\.0`));
});
