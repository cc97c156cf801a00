#!/usr/bin/env python3
"""What one keyed call costs in the bindings' native layer alone, without an MCP SDK: claim, then
completion, through `Connection.from_client` and `Connection.from_server`, in a loop, from Python
(the wheel) and from Node.js (the addon), on each store. The floor under the in-process rows of
scripts/binding-latency.py (docs/benchmarks.md, "Bindings in process against wrap").

    bindings/python/install.sh && bindings/node/install.sh
    python3 scripts/binding-core-cost.py [CALLS]        # default 2000 calls per row

Rows: the memory store; SQLite with its transactions on the library's runtime (the default,
`store-io = runtime`: each claim and completion handed to a runtime thread and its answer back to
the loop); SQLite with `store-io = inline` (run on the loop's thread). Each row prints the wall
time per call and the CPU time per call of all the process's threads (in brackets).
MCP_IDEM_PYTHON (a Python with another build of the wheel) and MCP_IDEM_ADDON (another build of
the addon) measure another build; BUILDS=old,new with MCP_IDEM_PYTHON_OLD, MCP_IDEM_ADDON_OLD
measures two builds, interleaved row by row.
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

gateway = Gateway.open("binding-core-cost", [("store", sys.argv[1]), *([("store_io", sys.argv[3])] if sys.argv[3] != "-" else [])])
answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})

async def main(calls):
    completions = _LoopCompletions.of_running_loop()
    cpu = time.process_time()
    started = time.perf_counter()
    for _ in range(calls):
        connection = gateway.connect()
        call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "noop", "arguments": {}, "idempotencyKey": uuid.uuid4().hex}})
        step = await completions.settled(connection.from_client(call, completions.native))
        assert step[0] == "rewritten", step
        await completions.settled(connection.from_server(answer, completions.native))
    print((time.perf_counter() - started) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6)

asyncio.run(main(int(sys.argv[2])))
"""

NODE = r"""
const { randomUUID } = require('node:crypto');
const native = require(process.argv[1]);
const options = { store: process.argv[2] };
if (process.argv[4] !== '-') options.storeIo = process.argv[4];
const gateway = native.open('binding-core-cost', options);
const answer = JSON.stringify({ jsonrpc: '2.0', id: 1, result: { content: [] } });
(async () => {
    const calls = Number(process.argv[3]);
    const cpu = process.cpuUsage();
    const started = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) {
        const connection = gateway.connect();
        const call = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call',
            params: { name: 'noop', arguments: {}, idempotencyKey: randomUUID() } });
        const step = await connection.fromClient(call);
        if (step.action !== 'rewritten') throw new Error(JSON.stringify(step));
        await connection.fromServer(answer);
    }
    const wall = Number(process.hrtime.bigint() - started) / 1000 / calls;
    const used = process.cpuUsage(cpu);
    console.log(wall, (used.user + used.system) / calls);
})();
"""


def builds():
    """(label, python, addon) of each build measured."""
    new = (os.environ.get("MCP_IDEM_PYTHON", sys.executable),
           os.environ.get("MCP_IDEM_ADDON", os.path.join(root, "bindings/node/mcp-idempotency.linux-x64-gnu.node")))
    if os.environ.get("BUILDS") != "old,new":
        return [("", *new)]
    old = (os.environ["MCP_IDEM_PYTHON_OLD"], os.environ["MCP_IDEM_ADDON_OLD"])
    return [("old ", *old), ("new ", *new)]


ROWS = [("memory", "memory", "-"), ("sqlite", "sqlite", "-"), ("sqlite inline", "sqlite", "inline")]


def main():
    work = tempfile.mkdtemp(prefix="binding-core-cost-")
    print("binding-core-cost: %d keyed calls per row (claim + completion), us per call: wall (cpu)" % calls)
    for label, store, store_io in ROWS:
        for build, python, addon in builds():
            if store_io != "-" and build == "old ":
                continue  # the option is new
            row = []
            for language in ["python", "node"]:
                name = "%s-%s-%s.sqlite3" % (language, build.strip() or "new", store_io)
                url = "memory" if store == "memory" else "sqlite:" + os.path.join(work, name)
                if language == "python":
                    command = [python, "-c", PYTHON, url, str(calls), store_io]
                else:
                    command = ["node", "-e", NODE, addon, url, str(calls), store_io]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                wall, cpu = (float(x) for x in out.split())
                row.append("%s %7.1f (%6.1f)" % (language, wall, cpu))
            print("%-18s %s" % (build + label, "   ".join(row)))
            sys.stdout.flush()


main()
