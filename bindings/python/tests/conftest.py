"""What the binding's tests share: the payments server over stdio, spoken to line by line, the same
server behind `mcp-idem wrap` to compare with, and a Redis of the test's own that it can stop."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SERVER = HERE / "payments_server.py"
REPO = HERE.parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")


def mcp_idem_binary() -> str:
    """The `mcp-idem` binary (`MCP_IDEM_BIN`, else the workspace's debug or release build)."""
    candidates = [os.environ.get("MCP_IDEM_BIN", ""), REPO / "target/debug/mcp-idem", REPO / "target/release/mcp-idem"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    if IN_CI:
        pytest.fail("CI=true but no mcp-idem binary: cargo build -p mcp-idem")
    pytest.skip("no mcp-idem binary: cargo build -p mcp-idem")


class Peer:
    """An MCP server over stdio, spoken to with one JSON-RPC message per line (2025-11-25 handshake)."""

    def __init__(self, command: list[str], stderr_path: Path):
        self.stderr = open(stderr_path, "ab")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, bufsize=0
        )
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "binding-tests", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict) -> None:
        self.process.stdin.write((json.dumps(message) + "\n").encode())

    def start(self, method: str, params: dict) -> int:
        """Sends a request without waiting for its answer; returns its id."""
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return self.next_id

    def request(self, method: str, params: dict) -> dict:
        return self.answer(self.start(method, params))

    def answer(self, request_id: int) -> dict:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"the server closed its output; stderr: {self.stderr.name}")
            message = json.loads(line)
            if message.get("id") == request_id:
                return message

    def call(self, name: str, arguments: object, key: object = None) -> dict:
        return self.request("tools/call", {"name": name, "arguments": arguments, "idempotencyKey": key})

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def ledger_lines(ledger: Path) -> list[dict]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines()]


@pytest.fixture
def bound(tmp_path):
    """`bound(*options)`: the payments server with the binding, over stdio; closed after the test."""
    peers = []

    def start(*options: str, ledger: Path | None = None) -> Peer:
        ledger = ledger or tmp_path / "ledger.jsonl"
        command = [sys.executable, str(SERVER), "--ledger", str(ledger), *options]
        peer = Peer(command, tmp_path / "bound.stderr")
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.close()


@pytest.fixture
def wrapped(tmp_path):
    """`wrapped(*wrap_options)`: the plain payments server behind `mcp-idem wrap`, over stdio."""
    peers = []
    binary = mcp_idem_binary()

    def start(*options: str) -> Peer:
        ledger = tmp_path / "wrapped-ledger.jsonl"
        server = [sys.executable, str(SERVER), "--ledger", str(ledger), "--plain"]
        peer = Peer([binary, "wrap", *options, "--", *server], tmp_path / "wrap.stderr")
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class OwnRedis:
    """A redis-server of the test's own on a free loopback port, that the test stops and starts
    again; with an append-only file fsynced at every write, so a restart keeps every record."""

    def __init__(self, directory: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            if IN_CI:
                pytest.fail("CI=true but redis-server is not installed")
            pytest.skip("redis-server is not installed")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as connection:
                    connection.sendall(b"PING\r\n")
                    if connection.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"redis-server did not come up on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def own_redis(tmp_path):
    redis = OwnRedis(tmp_path)
    yield redis
    redis.stop()
