"""The binding on every framework it supports, each in a venv of its own with its pinned release
from PyPI (bindings/python/frameworks/*.txt: mcp 2.3 with jlowin's fastmcp 4.2, mcp 1.30 with fastmcp 3.4, mcp
1.24, and mcp 1.20, which it does not support; built by bindings/python/frameworks.sh):

- the wheel installs into each (with its dependencies, no --no-deps) without changing a version,
  also beside an `mcp` it does not support (1.20, `frameworks/mcp1-unsupported.txt`), where
  `idempotent()` then raises, naming the version and the supported range: the wheel requires no
  `mcp` (its `mcp` extra does);
- `idempotent()` refuses at once what it cannot wire (an arbitrary object, an object with a
  `.middleware` of its own, an SDK or fastmcp version out of range, a fastmcp missing its hook, a
  server wired already), and a server given to it twice keeps serving through its first wiring;
- for each framework API, a payments server passes `mcp-idem check` over stdio and over
  Streamable HTTP (11 ledger lines, as `wrap` around the demo server), and a server SIGKILLed
  while a keyed call runs leaves a claim that a restarted server answers
  `idempotency_outcome_unknown`, never running the tool a second time.

Without the environments the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import select
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import HERE, IN_CI, REPO, Peer, ledger_lines, mcp_idem_binary

PINNED = REPO / "bindings/python/frameworks"
ENVIRONMENTS = Path(os.environ.get("MCP_IDEM_FRAMEWORKS", REPO / "bindings/python/.frameworks"))
SERVERS = HERE / "frameworks"
LEGACY_ONLY = {"mrtr.continuation", "capability.discover"}  # mcp 1.x speaks no server/discover
CURRENT = {"mrtr.continuation"}  # no tool of the payments servers asks for input (MRTR)

# (environment, payments server, the checks `check` skips)
MATRIX = {
    "mcp2.3-MCPServer": ("mcp2", HERE / "payments_server.py", CURRENT),
    "mcp2.3-lowlevel": ("mcp2", SERVERS / "sdk2_lowlevel.py", CURRENT),
    "mcp1.30-FastMCP": ("mcp1", SERVERS / "sdk1_fastmcp.py", LEGACY_ONLY),
    "mcp1.30-lowlevel": ("mcp1", SERVERS / "sdk1_lowlevel.py", LEGACY_ONLY),
    "mcp1.24-FastMCP": ("mcp1-oldest", SERVERS / "sdk1_fastmcp.py", LEGACY_ONLY),
    "mcp1.24-lowlevel": ("mcp1-oldest", SERVERS / "sdk1_lowlevel.py", LEGACY_ONLY),
    "fastmcp4.2-mcp2.3": ("mcp2", SERVERS / "jlowin_fastmcp.py", CURRENT),
    "fastmcp3.4-mcp1.30": ("mcp1", SERVERS / "jlowin_fastmcp.py", LEGACY_ONLY),
}
WITNESS = [
    "--tool", "charge_payment",
    "--args", '{"amount": 12.5, "currency": "usd"}',
    "--slow-args", '{"amount": 12.5, "currency": "usd", "delay_ms": 1500}',
    "--error-args", '{"amount": 12.5, "currency": "usd", "fail_after_charge": true}',
    "--observe-tool", "get_balance",
    "--json",
]
# As `wrap` around the demo server: two unkeyed calls, then one per key that ran.
CHARGES_OF_A_PASSING_RUN = 11


def python_of(environment: str) -> str:
    python = ENVIRONMENTS / environment / "bin/python"
    if not python.exists():
        why = f"no framework environment {environment} at {python.parent.parent}: run bindings/python/frameworks.sh"
        if IN_CI:
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return str(python)


def pinned(environment: str) -> dict[str, str]:
    lines = (PINNED / f"{environment}.txt").read_text().splitlines()
    return dict(line.lower().split("==") for line in lines if line and not line.startswith("#"))


def installed(python: str) -> dict[str, str]:
    listing = subprocess.run([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                             capture_output=True, text=True, check=True).stdout
    return {package["name"].lower(): package["version"] for package in json.loads(listing)}


@pytest.mark.parametrize("environment", sorted(path.stem for path in PINNED.glob("*.txt")))
def test_the_wheel_installs_with_its_dependencies_and_changes_no_version(environment):
    python = python_of(environment)
    [wheel] = (REPO / "bindings/python/dist").glob("*.whl")
    pip = [python, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "uninstall", "--yes", "mcp-idempotency"], check=True)
    before = installed(python)
    subprocess.run([*pip, "install", str(wheel)], check=True)  # no --no-deps
    after = installed(python)
    assert after.pop("mcp-idempotency", None), "the wheel did not install"
    assert after == before
    # What was installed is the pinned tree, framework and mcp included.
    for package, version in pinned(environment).items():
        assert after.get(package) == version, (package, version, after.get(package))


def test_the_wheel_requires_no_sdk_and_offers_one_as_an_extra():
    """No `Requires-Dist` on `mcp` but under the `mcp` extra: pip never changes a user's SDK."""
    [wheel] = (REPO / "bindings/python/dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        fields = email.parser.Parser().parsestr(archive.read(metadata).decode())
    requires = fields.get_all("Requires-Dist") or []
    assert [requirement for requirement in requires if "extra ==" not in requirement] == [], requires
    assert "mcp" in (fields.get_all("Provides-Extra") or []), fields.get_all("Provides-Extra")
    assert any(re.match(r"mcp\W.*;\s*extra\s*==\s*['\"]mcp['\"]", requirement) for requirement in requires), requires


def test_into_a_venv_without_mcp_the_wheel_adds_none_and_the_import_says_what_to_install(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv/bin/python")
    [wheel] = (REPO / "bindings/python/dist").glob("*.whl")
    pip = [python, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    before = installed(python)
    subprocess.run([*pip, "install", str(wheel)], check=True)
    after = installed(python)
    assert after.pop("mcp-idempotency", None), "the wheel did not install"
    assert after == before
    run = subprocess.run([python, "-c", "import mcp_idempotency"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    said = "ImportError: mcp_idempotency runs on the official SDK `mcp` (>=1.24,<2 or >=2.3,<3), which is not installed"
    assert said in run.stderr, run.stderr
    assert "pip install 'mcp-idempotency[mcp]'" in run.stderr, run.stderr


# An `mcp` the binding does not support, with the wheel installed beside it (frameworks.sh).
UNSUPPORTED = ("mcp1-unsupported", "1.20.0")


def test_an_unsupported_mcp_is_left_as_it_is_and_idempotent_raises_naming_it():
    environment, release = UNSUPPORTED
    probe = (
        "import importlib.metadata, json\n"
        "from mcp.server.fastmcp import FastMCP\n"
        "from mcp.server.lowlevel import Server\n"
        "from mcp_idempotency import idempotent\n"
        "outcomes = {'mcp': importlib.metadata.version('mcp')}\n"
        "for name, make in (('FastMCP', lambda: FastMCP('old')), ('low-level Server', lambda: Server('old'))):\n"
        "    try:\n"
        "        idempotent(make(), store='memory')\n"
        "        outcomes[name] = 'ok'\n"
        "    except Exception as error:\n"
        "        outcomes[name] = f'{type(error).__name__}: {error}'\n"
        "print(json.dumps(outcomes))\n"
    )
    run = subprocess.run([python_of(environment), "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    outcomes = json.loads(run.stdout)
    assert outcomes.pop("mcp") == release, outcomes
    for name, outcome in outcomes.items():
        assert outcome.startswith(f"TypeError: idempotent() supports mcp >=1.24,<2 and >=2.3,<3, not mcp {release}"), (
            name, outcome)


@pytest.mark.parametrize("environment,line", [("mcp2", "sdk2"), ("mcp2", "fastmcp"), ("mcp1", "sdk1"),
                                              ("mcp1", "fastmcp"), ("mcp1-oldest", "sdk1")])
def test_what_cannot_be_wired_is_refused_at_once(environment, line):
    python = python_of(environment)
    run = subprocess.run([python, str(SERVERS / "shapes.py"), line], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    shapes = json.loads(run.stdout)
    supported = {"sdk2": ["MCPServer", "low-level Server"], "sdk1": ["FastMCP", "low-level Server"],
                 "fastmcp": ["fastmcp.FastMCP"]}[line]
    for name, outcome in shapes.items():
        if name in supported:
            assert outcome == "ok", (name, outcome)
        else:
            # Raised before anything is wired, naming what it got and what is supported.
            assert outcome.startswith("TypeError: "), (name, outcome)
            assert "supports" in outcome or "runs on mcp" in outcome or "takes" in outcome or (
                "already wired" in outcome and "call it once per server" in outcome), (name, outcome)
    # A server wired twice, or its low-level server after it: one gateway per server.
    for name in supported:
        for again in (f"{name}, wired twice", f"{name}, then its low-level server"):
            assert shapes[again].startswith("TypeError: idempotent() got a "), (again, shapes[again])
            assert "that is already wired" in shapes[again], (again, shapes[again])
    assert "TypeError: idempotent() cannot wire a builtins.object" in shapes["an object"]
    assert "test_frameworks" not in shapes["an object with a .middleware list"]
    assert "HasMiddleware" in shapes["an object with a .middleware list"]
    assert "not mcp 1.23.0" in shapes["mcp 1.23.0"] and "not mcp 3.0.0" in shapes["mcp 3.0.0"]


def assert_passes(run: subprocess.CompletedProcess, skipped: set[str], ledger: Path) -> None:
    report = json.loads(run.stdout)
    failed = [check for check in report["checks"] if check["status"] == "fail"]
    assert not failed, json.dumps(failed, indent=1)
    assert {check["name"] for check in report["checks"] if check["status"] == "skip"} == skipped, report
    assert "capability.initialize" in {check["name"] for check in report["checks"] if check["status"] == "pass"}
    assert report["conformant"] and run.returncode == 0, run.stderr
    assert len(ledger_lines(ledger)) == CHARGES_OF_A_PASSING_RUN, report


@pytest.mark.parametrize("framework", MATRIX)
def test_check_passes_over_stdio(framework, tmp_path):
    environment, server, skipped = MATRIX[framework]
    python = python_of(environment)
    ledger = tmp_path / "ledger.jsonl"
    target = [python, str(server), "--ledger", str(ledger), "--store", f"sqlite:{tmp_path / 'records.sqlite3'}"]
    run = subprocess.run([mcp_idem_binary(), "check", *WITNESS, "--", *target],
                         capture_output=True, text=True, timeout=300)
    assert_passes(run, skipped, ledger)


class HttpServer:
    """A payments server over stateless Streamable HTTP; its URL read from its first stderr line."""

    def __init__(self, command: list[str], stderr: Path):
        self.stderr = stderr
        with open(stderr, "wb") as sink:
            self.process = subprocess.Popen([*command, "--http"], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=sink)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in stderr.read_text(errors="replace").splitlines():
                if line.startswith("listening on "):
                    self.url = line.removeprefix("listening on ").strip()
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"the server did not start: {stderr.read_text(errors='replace')}")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.mark.parametrize("framework", MATRIX)
def test_check_passes_over_streamable_http(framework, tmp_path):
    environment, server, skipped = MATRIX[framework]
    python = python_of(environment)
    ledger = tmp_path / "ledger.jsonl"
    bound = HttpServer([python, str(server), "--ledger", str(ledger), "--store", "memory"], tmp_path / "server.stderr")
    try:
        run = subprocess.run([mcp_idem_binary(), "check", *WITNESS, "--url", bound.url],
                             capture_output=True, text=True, timeout=300)
    finally:
        bound.kill()
    assert_passes(run, skipped, ledger)


def answers(peer: Peer, seconds: float):
    """The responses `peer` sends within `seconds` (it is one JSON-RPC message per line)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([peer.process.stdout], [], [], left)
        if not ready:
            return
        line = peer.process.stdout.readline()
        if not line:
            return
        message = json.loads(line)
        if "id" in message and ("result" in message or "error" in message):
            yield message


def error_type(answer: dict) -> str | None:
    data = answer.get("error", {}).get("data")
    return data.get("type") if isinstance(data, dict) else None


@pytest.mark.parametrize("framework", MATRIX)
def test_a_server_killed_mid_call_leaves_outcome_unknown_never_a_second_run(framework, tmp_path):
    environment, server, _ = MATRIX[framework]
    python = python_of(environment)
    ledger = tmp_path / "ledger.jsonl"
    command = [python, str(server), "--ledger", str(ledger), "--store", f"sqlite:{tmp_path / 'records.sqlite3'}",
               "--lease", "1s"]
    call = {"name": "charge_payment", "arguments": {"amount": 100, "currency": "eur", "delay_ms": 60_000},
            "idempotencyKey": "killed"}
    first = Peer(command, tmp_path / "first.stderr")
    try:
        # The call is claimed once a duplicate is told it is in progress (whichever of the two
        # reached the store first runs; both are the same call).
        first.start("tools/call", call)
        first.start("tools/call", call)
        told = next((answer for answer in answers(first, 30) if error_type(answer) == "idempotency_key_in_progress"), None)
        assert told is not None, "the call was never claimed"
    finally:
        first.process.kill()
        first.close()
    second = Peer(command, tmp_path / "second.stderr")
    try:
        deadline = time.monotonic() + 30
        while True:
            second.start("tools/call", call)
            retry = next(answers(second, 30), None)
            assert retry is not None, "the retry was not answered: did the tool run again?"
            # The dead owner's lease (1 s) has not run out yet.
            if error_type(retry) != "idempotency_key_in_progress" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert error_type(retry) == "idempotency_outcome_unknown", retry
    finally:
        second.close()
    assert ledger_lines(ledger) == [], "the killed call ran again, or finished"


@pytest.mark.parametrize("framework", MATRIX)
def test_key_policies_and_meta_keys_hold(framework, tmp_path):
    """`tools=` (a business identifier) and `meta_key=` work on every framework as on `MCPServer`:
    a key-less retry with the same `order_id`, and a retry with the same key in a `_meta` member
    named by `meta_key`, replay the first charge; the tool reads the key it ran under."""
    environment, server, _ = MATRIX[framework]
    ledger = tmp_path / "ledger.jsonl"
    policies = json.dumps({"charge_payment": {"key_from": ["/order_id"]}})
    command = [python_of(environment), str(server), "--ledger", str(ledger), "--store", "memory",
               "--tools", policies, "--meta-key", "io.example/key"]
    peer = Peer(command, tmp_path / "server.stderr")
    try:
        def charge(order_id: str | None, meta: dict | None = None) -> dict:
            arguments = {"amount": 7, "currency": "eur"} | ({"order_id": order_id} if order_id else {})
            params = {"name": "charge_payment", "arguments": arguments} | ({"_meta": meta} if meta else {})
            return peer.request("tools/call", params)

        first, retry = charge("o-1"), charge("o-1")
        [charged] = ledger_lines(ledger)
        assert charged["chargeId"] in json.dumps(first) and charged["chargeId"] in json.dumps(retry), (first, retry)
        assert charged["key"], charged  # the key the policy made reached the tool
        charge("o-2")
        assert len(ledger_lines(ledger)) == 2
        first, retry = charge(None, {"io.example/key": "meta-key-1"}), charge(None, {"io.example/key": "meta-key-1"})
        charges = ledger_lines(ledger)
        assert len(charges) == 3 and charges[2]["key"], charges
        assert charges[2]["chargeId"] in json.dumps(retry), retry
    finally:
        peer.close()


@pytest.mark.parametrize("framework", MATRIX)
def test_suggested_policies_hold_though_no_client_lists_the_tools(framework, tmp_path):
    """`tools="suggested"` on every framework: the binding runs the server's own `tools/list`
    before it decides the first call (no client here lists the tools), so a key-less retry of the
    charge with the same arguments replays it (the suggested window)."""
    environment, server, _ = MATRIX[framework]
    ledger = tmp_path / "ledger.jsonl"
    command = [python_of(environment), str(server), "--ledger", str(ledger), "--store", "memory",
               "--tools", json.dumps("suggested")]
    peer = Peer(command, tmp_path / "server.stderr")
    try:
        call = {"name": "charge_payment", "arguments": {"amount": 7, "currency": "eur"}}
        first, retry = peer.request("tools/call", call), peer.request("tools/call", call)
    finally:
        peer.close()
    [charged] = ledger_lines(ledger)
    assert charged["chargeId"] in json.dumps(first) and charged["chargeId"] in json.dumps(retry), (first, retry)


@pytest.mark.parametrize("framework", MATRIX)
def test_a_second_idempotent_on_one_server_raises_and_the_first_still_serves(framework, tmp_path):
    """`idempotent(server)` a second time raises `TypeError`, naming that the server is already
    wired, and leaves the first wiring as it was: a call keyed in `_meta.idempotencyKey` (and one
    keyed by SEP) runs once and its retry replays it. Accepted, two gateways in a row answered every
    `_meta`-keyed call `idempotency_key_in_progress`, and the tool never ran."""
    environment, server, _ = MATRIX[framework]
    ledger = tmp_path / "ledger.jsonl"
    stderr = tmp_path / "server.stderr"
    peer = Peer([python_of(environment), str(server), "--ledger", str(ledger), "--store", "memory", "--wire-twice"],
                stderr)
    try:
        arguments = {"amount": 4, "currency": "eur"}
        by_meta = {"name": "charge_payment", "arguments": arguments, "_meta": {"idempotencyKey": "twice-meta"}}
        by_sep = {"name": "charge_payment", "arguments": arguments, "idempotencyKey": "twice-sep"}
        answers = [peer.request("tools/call", call) for call in (by_meta, by_meta, by_sep, by_sep)]
    finally:
        peer.close()
    charges = ledger_lines(ledger)
    assert len(charges) == 2, (charges, answers)
    for charged, (first, retry) in zip(charges, (answers[:2], answers[2:])):
        assert charged["key"], charged
        assert "result" in first and charged["chargeId"] in json.dumps(first), first
        assert "result" in retry and charged["chargeId"] in json.dumps(retry), retry
    said = stderr.read_text(errors="replace")
    assert "the second idempotent() raised TypeError: " in said, said
    assert "that is already wired" in said and "call it once per server" in said, said


@pytest.mark.parametrize("framework", MATRIX)
def test_a_cancelled_keyed_call_runs_once_and_its_retry_replays_it(framework, tmp_path):
    """`cancel=absorb` (the default): a keyed call the client cancels runs to its end, its retry
    gets its outcome, and the server goes on serving (the SDK's own answer to the cancellation is
    the only one sent)."""
    environment, server, _ = MATRIX[framework]
    ledger = tmp_path / "ledger.jsonl"
    peer = Peer([python_of(environment), str(server), "--ledger", str(ledger), "--store", "memory"],
                tmp_path / "server.stderr")
    try:
        call = {"name": "charge_payment", "arguments": {"amount": 3, "currency": "eur", "delay_ms": 500},
                "idempotencyKey": "cancelled"}
        cancelled = peer.start("tools/call", call)
        time.sleep(0.1)
        peer.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": cancelled, "reason": "timed out"}})
        deadline = time.monotonic() + 30
        while True:
            retry = peer.request("tools/call", call)
            if error_type(retry) != "idempotency_key_in_progress" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        [charged] = ledger_lines(ledger)
        assert charged["chargeId"] in json.dumps(retry), retry
        balance = peer.request("tools/call", {"name": "get_balance", "arguments": {}})
        assert "result" in balance, balance
    finally:
        peer.close()
