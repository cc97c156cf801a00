#!/usr/bin/env python3
"""What one keyed call costs in the bindings' native layer alone, without an MCP SDK: claim, then
completion, through `Connection.from_client` and `Connection.from_server`, in a loop, from Python
(the wheel) and from Node.js (the addon), on each store. The floor under the in-process rows of
scripts/binding-latency.py (docs/benchmarks.md, "Bindings in process against wrap").

    bindings/python/install.sh && bindings/node/install.sh
    python3 scripts/binding-core-cost.py [CALLS]        # default 2000 calls per row
"""
import json
import os
import subprocess
import sys
import tempfile

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PYTHON = r"""
import asyncio, json, sys, time, uuid
from mcp_idempotency import _LoopCompletions
from mcp_idempotency._native import Gateway

gateway = Gateway.open("binding-core-cost", [("store", sys.argv[1])])
answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})

async def main(calls):
    completions = _LoopCompletions.of_running_loop()
    started = time.perf_counter()
    for _ in range(calls):
        connection = gateway.connect()
        call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "noop", "arguments": {}, "idempotencyKey": uuid.uuid4().hex}})
        step = await completions.settled(connection.from_client(call, completions.native))
        assert step[0] == "rewritten", step
        await completions.settled(connection.from_server(answer, completions.native))
    print((time.perf_counter() - started) / calls * 1e6)

asyncio.run(main(int(sys.argv[2])))
"""

NODE = r"""
const { randomUUID } = require('node:crypto');
const native = require(process.argv[1]);
const gateway = native.open('binding-core-cost', { store: process.argv[2] });
const answer = JSON.stringify({ jsonrpc: '2.0', id: 1, result: { content: [] } });
(async () => {
    const calls = Number(process.argv[3]);
    const started = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) {
        const connection = gateway.connect();
        const call = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call',
            params: { name: 'noop', arguments: {}, idempotencyKey: randomUUID() } });
        const step = await connection.fromClient(call);
        if (step.action !== 'rewritten') throw new Error(JSON.stringify(step));
        await connection.fromServer(answer);
    }
    console.log(Number(process.hrtime.bigint() - started) / 1000 / calls);
})();
"""


def main():
    work = tempfile.mkdtemp(prefix="binding-core-cost-")
    addon = os.path.join(root, "bindings/node/mcp-idempotency.linux-x64-gnu.node")
    print("binding-core-cost: %d keyed calls per row (claim + completion), us per call" % calls)
    for store in ["memory", "sqlite"]:
        row = []
        for language in ["python", "node"]:
            url = "memory" if store == "memory" else "sqlite:" + os.path.join(work, language + ".sqlite3")
            if language == "python":
                command = [sys.executable, "-c", PYTHON, url, str(calls)]
            else:
                command = ["node", "-e", NODE, addon, url, str(calls)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            row.append("%s %7.1f" % (language, float(out.strip())))
        print("%-7s %s" % (store, "   ".join(row)))


main()
