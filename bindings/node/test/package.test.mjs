// The package as npm ships it: `npm pack` holds the prebuilt linux-x64-gnu addon, and a project
// that installs the tarball loads it without building anything (elsewhere install.js builds it
// from source, as bindings/node/install.sh does in this checkout).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { OPTIONS } from '../index.js';
import { sandbox } from './support.mjs';

const packageDirectory = join(dirname(fileURLToPath(import.meta.url)), '..');
const { platformTriple } = await import(join(packageDirectory, 'triple.js'));

test('the packed package installs with its prebuilt addon and loads without a build', { skip: platformTriple() !== 'linux-x64-gnu' }, () => {
    const directory = sandbox();
    execFileSync('npm', ['pack', '--pack-destination', directory, '--loglevel=error'], { cwd: packageDirectory, stdio: 'pipe' });
    const [tarball] = readdirSync(directory).filter((name) => name.endsWith('.tgz'));
    const files = execFileSync('tar', ['tzf', join(directory, tarball)], { encoding: 'utf8' }).split('\n');
    assert.ok(files.includes('package/mcp-idempotency.linux-x64-gnu.node'), files.join(' '));

    const project = join(directory, 'project');
    execFileSync('mkdir', [project]);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'project', version: '1.0.0', private: true }));
    // The SDK is a peer dependency; this test needs only the package itself, offline.
    const log = execFileSync('npm', ['install', '--offline', '--legacy-peer-deps', '--no-audit', '--no-fund', join(directory, tarball)], {
        cwd: project,
        encoding: 'utf8',
        stdio: 'pipe'
    });
    assert.ok(!log.includes('building it from source'), log);
    const probe = "const m = require('mcp-idempotency'); process.stdout.write(JSON.stringify([typeof m.idempotent, m.OPTIONS.length]))";
    // The library's options, as this checkout's package has them.
    assert.equal(execFileSync('node', ['-e', probe], { cwd: project, encoding: 'utf8' }), JSON.stringify(['function', OPTIONS.length]));
});
