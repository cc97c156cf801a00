#!/usr/bin/env python3
"""How many times does a charge run when the OpenAI Agents SDK's MCP client meets lost answers?

Driven by scripts/agents-loss.sh, which prepares the venv and the mcp-idem binary. Two commands:

  agents_loss.py serve --ledger FILE [--store S --namespace N [--tools JSON]]
      The upstream: a Streamable HTTP MCP server (official `mcp` SDK, stateless, JSON answers)
      with one tool, `charge(order_id, amount)`, that appends one JSON line to FILE per
      execution. Prints `listening on http://127.0.0.1:PORT/mcp` on stderr. With --store, the
      server is protected in process by the Python binding: `mcp_idempotency.idempotent(server,
      store=S, namespace=N, tools=JSON)`.

  agents_loss.py run --bin MCP_IDEM --out REPORT.md [options]
      Runs the same scripted agent against the set-ups of --configs (default c,a,b) and prints
      one markdown table:
        (c) client -> lossy forwarder -> server                      (no proxy: the baseline)
        (a) client -> lossy forwarder -> mcp-idem proxy -> server    (no tool policy)
        (b) as (a), proxy started with `--config` holding [tools.charge] key-from = ["/order_id"]
        (d) client -> lossy forwarder -> server protected in process by the Python binding,
            tools={"charge": {"key-from": ["/order_id"], "required": True}}  (no proxy)
        (e) the same on the TypeScript SDK with the Node binding (scripts/agents-loss-node-server.mjs)
        (d0), (e0) as (d), (e) without `tools`: the binding alone, no policy
      (d), (d0) need an interpreter with `mcp_idempotency` (--binding-python); (e), (e0) need
      the Node binding built with its node_modules (--node-binding).

The client is the unmodified `agents.mcp.MCPServerStreamableHttp` with `max_retry_attempts`
set, called through its public `call_tool`. The lossy forwarder (here, plain asyncio) sits
between the client and whatever is next; for each `tools/call` POST it draws from a seeded RNG:
lose the answer after the call ran (close the connection, or hold it until the client gives up),
answer 504 after the call ran, or pass it on. Everything else passes untouched. Each charge has
its own order_id; when the SDK call finally raises, the script calls again with the same
arguments (a model retrying the tool), up to --model-retries times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

POLICY_TOML = """\
[tools.charge]
key-from = ["/order_id"]   # the business identifier argument decides: same order_id = same operation
required = true
"""

# The same policy as the bindings' `tools=` argument, for (d) and (e).
POLICY = {"charge": {"key-from": ["/order_id"], "required": True}}

# The `_meta` member mcp-idem adds to a result it replays for a key the client did not send.
REPLAYED_META = "mcp-idem/replayed"

CONFIGS = {
    "c": "(c) no proxy",
    "a": "(a) proxy, no policy",
    "b": "(b) proxy + key-from policy",
    "d": "(d) Python binding + key-from policy",
    "e": "(e) Node binding + key-from policy",
    "d0": "(d0) Python binding, no policy",
    "e0": "(e0) Node binding, no policy",
}
# Set-ups with a store: each gets a fresh Redis namespace per run.
STORED = ("a", "b", "d", "e", "d0", "e0")

# ---------------------------------------------------------------------------------------------
# The upstream charge server
# ---------------------------------------------------------------------------------------------


def serve(ledger: Path, store: str | None, namespace: str | None, tools: str | None) -> None:
    """Serves `charge` over Streamable HTTP on a free loopback port until SIGTERM; with `store`,
    protected in process by the Python binding (`tools`: the policy as JSON, or none)."""
    import uuid

    import uvicorn
    from mcp.server import MCPServer

    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    server = MCPServer("agents-loss-charge")

    @server.tool()
    def charge(order_id: str, amount: int) -> dict:
        """Charge `amount` cents for order `order_id`. Not idempotent: every call charges."""
        charge_id = "ch_" + uuid.uuid4().hex[:16]
        line = {"order_id": order_id, "amount": amount, "charge_id": charge_id, "at": time.time()}
        # One write(2) on an O_APPEND descriptor: lines never interleave.
        os.write(fd, (json.dumps(line) + "\n").encode())
        return {"charge_id": charge_id, "order_id": order_id, "amount": amount}

    if store is not None:
        from mcp_idempotency import idempotent

        # A bad option or an unreachable store fails here, before the server listens.
        idempotent(
            server,
            store=store,
            namespace=namespace,
            tools=json.loads(tools) if tools is not None else None,
        )
    app = server.streamable_http_app(stateless_http=True, json_response=True, host="127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    runner = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(runner.serve(sockets=[sock]))
        while not runner.started and not task.done():
            await asyncio.sleep(0.05)
        print(f"listening on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
        await task

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# The lossy forwarder
# ---------------------------------------------------------------------------------------------


@dataclass
class FaultCounts:
    tool_posts: int = 0
    lost_closed: int = 0
    lost_hung: int = 0
    http_504: int = 0
    upstream_failed: int = 0
    methods: Counter = field(default_factory=Counter)


class Forwarder:
    """An HTTP/1.1 forwarder that loses the answers of some `tools/call` POSTs.

    One upstream connection per request (`Connection: close` both ways), so a fault on one
    request never touches another. Faulty requests are always forwarded and their answer read
    in full first: the tool has run, only the answer is lost.
    """

    def __init__(self, upstream: str, seed: int, loss: float, http_504: float):
        parts = urlsplit(upstream)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        self.rng = random.Random(seed)
        self.loss = loss
        self.http_504 = http_504
        self.counts = FaultCounts()
        self.url = ""
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}{self.path}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _decide(self, method: str, body: bytes) -> str:
        if method != "POST":
            self.counts.methods[method] += 1
            return "pass"
        try:
            message = json.loads(body)
        except ValueError:
            message = None
        name = message.get("method") if isinstance(message, dict) else None
        self.counts.methods[name or "other POST"] += 1
        if name != "tools/call":
            return "pass"
        self.counts.tool_posts += 1
        draw = self.rng.random()
        if draw < self.loss / 2:
            return "close"
        if draw < self.loss:
            return "hang"
        if draw < self.loss + self.http_504:
            return "504"
        return "pass"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            request = await read_request(reader)
            if request is None:
                return
            method, target, headers, body = request
            fault = self._decide(method, body)
            await self._forward(method, target, headers, body, fault, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _forward(self, method, target, headers, body, fault, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            self.counts.upstream_failed += 1
            writer.write(simple_response(502, "Bad Gateway"))
            await writer.drain()
            return
        try:
            head = [f"{method} {target} HTTP/1.1"]
            head += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
            head += [f"content-length: {len(body)}", "connection: close", "", ""]
            up_writer.write("\r\n".join(head).encode("latin-1") + body)
            await up_writer.drain()
            status_line, response_headers = await read_head(up_reader)
            if fault == "pass":
                kept = [
                    f"{k}: {v}"
                    for k, v in response_headers
                    if k.lower() not in ("connection", "keep-alive")
                ]
                writer.write(
                    "\r\n".join([status_line, *kept, "connection: close", "", ""]).encode("latin-1")
                )
                while chunk := await up_reader.read(65536):
                    writer.write(chunk)
                    await writer.drain()
                return
            # The call has reached the server; let the answer come back in full, then lose it.
            while await up_reader.read(65536):
                pass
            if fault == "close":
                self.counts.lost_closed += 1
                return
            if fault == "504":
                self.counts.http_504 += 1
                writer.write(simple_response(504, "Gateway Timeout"))
                await writer.drain()
                return
            # "hang": say nothing until the client gives up and closes its end.
            self.counts.lost_hung += 1
            while await reader.read(65536):
                pass
        finally:
            up_writer.close()


HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te"}


async def read_head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


async def read_request(reader: asyncio.StreamReader):
    """(method, target, headers, body) of the next request, or None at EOF."""
    try:
        request_line, headers = await read_head(reader)
    except asyncio.IncompleteReadError:
        return None
    method, target, _ = request_line.split(" ", 2)
    values = {k.lower(): v for k, v in headers}
    if "chunked" in values.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(values.get("content-length", "0")))
    return method, target, headers, body


def simple_response(code: int, reason: str) -> bytes:
    text = reason.encode()
    return (
        f"HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(text)}\r\nconnection: close\r\n\r\n"
    ).encode() + text


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


class Child:
    """A child process whose stderr goes to a file; ready once a line holding `marker` appears."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None):
        self.name = name
        self.log = log
        self._log_file = open(log, "wb")
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT, env=env
        )

    async def ready(self, marker: str, timeout: float) -> str | None:
        """The rest of the first line holding `marker`; None if the process exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if marker in line:
                    return line.split(marker, 1)[1].strip()
            if self.process.poll() is not None:
                return None
            await asyncio.sleep(0.05)
        raise RuntimeError(
            f"{self.name} did not print {marker!r} within {timeout}s:\n{self.output()}"
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace").strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


# ---------------------------------------------------------------------------------------------
# One configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    config: str
    unavailable: str | None = None
    requested: int = 0
    executions: int = 0
    per_order: Counter = field(default_factory=Counter)
    answered: int = 0
    succeeded: int = 0
    failed: int = 0
    failed_orders: list[str] = field(default_factory=list)
    model_retries: int = 0
    answers_in_ledger: int = 0
    replayed: int = 0
    faults: FaultCounts = field(default_factory=FaultCounts)
    seconds: float = 0.0
    errors: Counter = field(default_factory=Counter)


async def run_config(key: str, opts, workdir: Path) -> Result:
    from agents.mcp import MCPServerStreamableHttp

    result = Result(config=key)
    ledger = workdir / "ledger.jsonl"
    ledger.touch()
    children: list[Child] = []
    forwarder = None
    started = time.monotonic()
    namespace = f"agents-loss-{key}-{os.getpid()}-{time.time_ns()}"
    try:
        argv = server_argv(key, opts, ledger, namespace)
        if isinstance(argv, str):
            result.unavailable = argv
            return result
        server = Child("charge server", argv, workdir / "server.log")
        children.append(server)
        url = await server.ready("listening on ", opts.start_timeout)
        if url is None:
            if key in ("d", "e", "d0", "e0"):
                output = server.output().splitlines()
                result.unavailable = output[-1] if output else "the charge server exited"
                return result
            raise RuntimeError(f"the charge server exited:\n{server.output()}")

        if key in ("a", "b"):
            argv = [
                opts.bin,
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                url,
                "--store",
                opts.redis,
                "--namespace",
                namespace,
            ]
            if key == "b":
                policy = workdir / "policy.toml"
                policy.write_text(POLICY_TOML)
                argv += ["--config", str(policy)]
            env = dict(os.environ, MCP_IDEM_LOG=os.environ.get("MCP_IDEM_LOG", "warn"))
            proxy = Child("mcp-idem proxy", argv, workdir / "proxy.log", env)
            children.append(proxy)
            base = await proxy.ready("mcp-idem proxy: listening on ", opts.start_timeout)
            if base is None:
                error = proxy.output().splitlines()
                reason = next(
                    (line for line in error if "rror" in line), error[-1] if error else "exited"
                )
                if key == "b":
                    reason = reason.strip()
                    result.unavailable = reason.split(" (")[0] if len(reason) > 200 else reason
                    return result
                raise RuntimeError(f"mcp-idem proxy exited:\n{proxy.output()}")
            url = base + "/mcp"

        forwarder = Forwarder(url, opts.seed, opts.loss, opts.http_504)
        await forwarder.start()

        client = MCPServerStreamableHttp(
            params={
                "url": forwarder.url,
                "timeout": opts.timeout,
                "sse_read_timeout": opts.timeout,
            },
            client_session_timeout_seconds=opts.timeout,
            max_retry_attempts=opts.sdk_retries,
            retry_backoff_seconds_base=opts.backoff_base,
            retry_backoff_seconds_max=opts.backoff_max,
            name=f"charges-{key}",
        )
        answers: dict[str, str | None] = {}
        await connect(client, opts)
        try:
            for i in range(1, opts.charges + 1):
                order_id = f"order-{i:03d}"
                arguments = {"order_id": order_id, "amount": 1000 + i}
                result.requested += 1
                for attempt in range(opts.model_retries + 1):
                    if attempt:
                        result.model_retries += 1
                    try:
                        answer = await asyncio.wait_for(
                            client.call_tool("charge", arguments), opts.call_deadline
                        )
                    except Exception as err:  # what a model would see as a failed tool call
                        result.errors[type(err).__name__] += 1
                        continue
                    result.answered += 1
                    if not answer.is_error:
                        result.succeeded += 1
                        answers[order_id] = charge_id_of(answer)
                        if REPLAYED_META in (getattr(answer, "meta", None) or {}):
                            result.replayed += 1
                    break
                else:
                    result.failed += 1
                    result.failed_orders.append(order_id)
                progress(key, i, opts.charges)
        finally:
            await asyncio.wait_for(client.cleanup(), 30)
        # A lost or refused answer still lets its call finish first; give stragglers a moment.
        await asyncio.sleep(0.5)
        result.faults = forwarder.counts
        charges = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
        result.executions = len(charges)
        result.per_order = Counter(c["order_id"] for c in charges)
        by_order: dict[str, set[str]] = {}
        for c in charges:
            by_order.setdefault(c["order_id"], set()).add(c["charge_id"])
        result.answers_in_ledger = sum(
            1
            for order, cid in answers.items()
            if cid is not None and cid in by_order.get(order, ())
        )
    finally:
        result.seconds = time.monotonic() - started
        if forwarder is not None:
            await forwarder.stop()
        for child in reversed(children):
            child.stop()
    return result


def server_argv(key: str, opts, ledger: Path, namespace: str) -> list[str] | str:
    """How to start the charge server of set-up `key`, or why it cannot start here."""
    if key in ("c", "a", "b"):
        return [sys.executable, __file__, "serve", "--ledger", str(ledger)]
    binding = ["--store", opts.redis, "--namespace", namespace]
    if key in ("d", "e"):
        binding += ["--tools", json.dumps(POLICY)]
    if key in ("d", "d0"):
        python = opts.binding_python
        check = subprocess.run(
            [python, "-c", "import mcp_idempotency, mcp, uvicorn"],
            check=False,
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            return (
                f"`{python}` cannot import mcp_idempotency (install it with "
                f"`PYTHON={python} bindings/python/install.sh`, or pass --binding-python)"
            )
        return [python, __file__, "serve", "--ledger", str(ledger), *binding]
    package = Path(opts.node_binding)
    if not list(package.glob("*.node")) or not (package / "node_modules").is_dir():
        return (
            f"no built Node binding in {package} (run bindings/node/install.sh, or pass "
            "--node-binding DIR)"
        )
    server = Path(__file__).with_name("agents-loss-node-server.mjs")
    return [opts.node, str(server), "--ledger", str(ledger), "--binding", str(package), *binding]


async def connect(client, opts) -> None:
    """`connect()`, retried: the forwarder passes everything but `tools/call` untouched, so a
    failure here is the machine being slow, not a fault under test."""
    for attempt in range(5):
        try:
            await asyncio.wait_for(client.connect(), opts.start_timeout)
            return
        except Exception:
            if attempt == 4:
                raise
            await asyncio.sleep(1)


def charge_id_of(answer) -> str | None:
    structured = getattr(answer, "structured_content", None) or getattr(
        answer, "structuredContent", None
    )
    if isinstance(structured, dict):
        value = structured.get("result", structured)
        if isinstance(value, dict) and "charge_id" in value:
            return value["charge_id"]
    for block in answer.content or []:
        try:
            value = json.loads(getattr(block, "text", "") or "")
        except ValueError:
            continue
        if isinstance(value, dict) and "charge_id" in value:
            return value["charge_id"]
    return None


def progress(key: str, done: int, total: int) -> None:
    if done == total or done % 10 == 0:
        print(f"  {CONFIGS[key]}: {done}/{total} charges", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    header = "| | " + " | ".join(CONFIGS[r.config] for r in results) + " |"
    lines = [header, "|---" * (len(results) + 1) + "|"]

    def row(label: str, cell) -> None:
        cells = [("n/a" if r.unavailable else str(cell(r))) for r in results]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("charges requested (distinct order_id)", lambda r: r.requested)
    row("**tool executions (ledger lines)**", lambda r: f"**{r.executions}**")
    row("orders executed exactly once", lambda r: sum(1 for n in r.per_order.values() if n == 1))
    row("orders executed more than once", lambda r: sum(1 for n in r.per_order.values() if n > 1))
    row("orders never executed", lambda r: r.requested - len(r.per_order))
    row("executions per order (times: orders)", histogram)
    row("charges that got an answer", lambda r: r.answered)
    row("charges the client reported as success", lambda r: r.succeeded)
    row("successes naming a charge of that order in the ledger", lambda r: r.answers_in_ledger)
    row(f'of which replays (`_meta["{REPLAYED_META}"]`)', lambda r: r.replayed)
    row("charges failed after all model retries", lambda r: r.failed)
    row("model-level retries (new call, same arguments)", lambda r: r.model_retries)
    row("`tools/call` POSTs seen by the forwarder", lambda r: r.faults.tool_posts)
    row("answers lost: connection closed", lambda r: r.faults.lost_closed)
    row("answers lost: never answered (client timeout)", lambda r: r.faults.lost_hung)
    row("answered 504 after forwarding", lambda r: r.faults.http_504)
    row("other messages through the forwarder", others)
    row("SDK call errors seen by the script", errors)
    row("wall time (s)", lambda r: f"{r.seconds:.0f}")
    notes = []
    for r in results:
        if r.unavailable:
            notes.append(f"{CONFIGS[r.config]} not available in this build: {r.unavailable}")
            continue
        repeated = [f"{order} ×{n}" for order, n in sorted(r.per_order.items()) if n > 1]
        notes.append(
            f"{CONFIGS[r.config]}, orders run more than once: {', '.join(repeated) or 'none'}"
        )
        if r.failed_orders:
            failed = [f"{order} (run {r.per_order[order]}×)" for order in r.failed_orders]
            notes.append(f"{CONFIGS[r.config]}, orders reported failed: {', '.join(failed)}")
    return "\n".join(lines + [""] + [f"{note}  " for note in notes])


def histogram(r: Result) -> str:
    times = Counter(r.per_order.values())
    never = r.requested - len(r.per_order)
    if never:
        times[0] = never
    return ", ".join(f"{n}×: {times[n]}" for n in sorted(times))


def others(r: Result) -> str:
    counts = [(m, n) for m, n in r.faults.methods.most_common() if m != "tools/call"]
    return ", ".join(f"{m} {n}" for m, n in counts) or "none"


def errors(r: Result) -> str:
    return ", ".join(f"{name} {n}" for name, n in r.errors.most_common()) or "none"


def versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{p} {version(p)}" for p in ("openai-agents", "mcp"))


async def run(opts) -> int:
    logging.basicConfig(level=logging.CRITICAL)
    # SIGTERM cancels the run, so that every child is stopped on the way out (as on Ctrl-C).
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    redis = urlsplit(opts.redis)
    keys = [k.strip() for k in opts.configs.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CONFIGS]
    if unknown:
        print(
            f"error: unknown set-up {', '.join(unknown)} (known: {', '.join(CONFIGS)})",
            file=sys.stderr,
        )
        return 2
    if any(k in STORED for k in keys):
        try:
            socket.create_connection((redis.hostname or "127.0.0.1", redis.port or 6379), 5).close()
        except OSError as err:
            print(f"error: Redis is not reachable at {opts.redis}: {err}", file=sys.stderr)
            return 2
    settings = [
        f"seed {opts.seed} (Python `random.Random`, one draw per `tools/call` POST, in order)",
        f"{opts.charges} charges, order_id order-001..order-{opts.charges:03d}, one after another",
        f"faults per `tools/call` POST, after the call ran: {opts.loss:.0%} answer lost (half "
        f"connection closed, half never answered), {opts.http_504:.0%} answered 504",
        f"SDK: max_retry_attempts {opts.sdk_retries}, client_session_timeout_seconds "
        f"{opts.timeout:g}, retry_backoff_seconds_base {opts.backoff_base:g}, "
        f"retry_backoff_seconds_max {opts.backoff_max:g}; model retries {opts.model_retries}",
        f"{versions()}; mcp-idem `{opts.bin}`; store `{opts.redis}`",
    ]
    if any(k in ("d", "d0") for k in keys):
        settings.append(f"Python binding: `{opts.binding_python}` imports `mcp_idempotency`")
    if any(k in ("e", "e0") for k in keys):
        settings.append(f"Node binding: `{opts.node_binding}` with `{opts.node}`")
    print("\n".join(settings), file=sys.stderr, flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="agents-loss-") as tmp:
        for key in keys:
            workdir = Path(tmp) / key
            workdir.mkdir()
            print(f"{CONFIGS[key]} ...", file=sys.stderr, flush=True)
            result = await run_config(key, opts, workdir)
            if result.unavailable:
                print(
                    f"{CONFIGS[key]} not available in this build: {result.unavailable}",
                    file=sys.stderr,
                )
            results.append(result)
    report = "\n".join(f"- {line}" for line in settings) + f"\n\n{table(results)}\n"
    print(report)
    Path(opts.out).write_text(report)
    print(f"written to {opts.out}", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--ledger", required=True, type=Path)
    s.add_argument("--store", help="protect the server with the Python binding on this store")
    s.add_argument("--namespace")
    s.add_argument("--tools", help="the binding's tools= policy, as JSON")
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True, help="the mcp-idem binary")
    r.add_argument("--out", required=True, help="write the markdown report here")
    r.add_argument(
        "--configs",
        default="c,a,b",
        help=f"which set-ups, in order, of {','.join(CONFIGS)} (default c,a,b)",
    )
    r.add_argument("--charges", type=int, default=40)
    r.add_argument("--seed", type=int, default=3182)
    r.add_argument("--loss", type=float, default=0.30, help="share of tools/call answers lost")
    r.add_argument(
        "--http-504", type=float, default=0.10, help="share answered 504 after forwarding"
    )
    r.add_argument("--sdk-retries", type=int, default=5, help="max_retry_attempts of the SDK")
    r.add_argument("--model-retries", type=int, default=3, help="calls again after the SDK raised")
    r.add_argument("--timeout", type=float, default=5.0, help="client_session_timeout_seconds")
    r.add_argument("--backoff-base", type=float, default=0.25)
    r.add_argument("--backoff-max", type=float, default=2.0)
    r.add_argument("--call-deadline", type=float, default=300.0, help="cap on one SDK call_tool")
    r.add_argument("--start-timeout", type=float, default=60.0)
    r.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    r.add_argument(
        "--binding-python",
        default=os.environ.get("AGENTS_LOSS_BINDING_PYTHON", sys.executable),
        help="interpreter with mcp_idempotency for (d), (d0) (default: this one)",
    )
    r.add_argument("--node", default="node", help="Node.js for (e), (e0)")
    r.add_argument(
        "--node-binding",
        default=os.environ.get(
            "AGENTS_LOSS_NODE_BINDING", str(Path(__file__).resolve().parents[1] / "bindings/node")
        ),
        help="the Node binding's package dir, built, with node_modules (default bindings/node)",
    )
    opts = parser.parse_args()
    if opts.command == "serve":
        serve(opts.ledger, opts.store, opts.namespace, opts.tools)
        return 0
    try:
        return asyncio.run(run(opts))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every child process was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
