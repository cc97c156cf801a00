"""Key sources for calls without a SEP key (issue 34), through the official Python SDK client
(`mcp` 2.x, unmodified) against the payments server with the binding over stdio: the key in
`_meta` (`call_tool(..., meta=...)`), the `tools=` policies (`key_from`, `required`, `window`), a
duplicate that waits for a running call while that call waits for its elicitation answer, and bad
policies refused at `idempotent()`. Every charge is a ledger line."""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import ElicitResult

from conftest import SERVER, ledger_lines
from mcp_idempotency import IdempotencyError, idempotent

REPLAYED = "mcp-idem/replayed"
CHARGE = {"amount": 5, "currency": "eur"}


def server(ledger: Path, *options: str, tools: dict[str, Any] | None = None) -> StdioServerParameters:
    """The payments server with the binding, on a memory store, with these key policies."""
    args = [str(SERVER), "--ledger", str(ledger), "--store", "memory", *options]
    if tools is not None:
        args += ["--tools", json.dumps(tools)]
    return StdioServerParameters(command=sys.executable, args=args)


async def call(client: Client, name: str, arguments: dict[str, Any], **keywords: Any) -> dict[str, Any]:
    """`session.call_tool` as a model's client makes it: `{result}` or `{error}`."""
    try:
        result = await client.session.call_tool(name, arguments, **keywords)
    except MCPError as error:
        return {"error": {"code": error.code, "message": error.message, "data": error.data}}
    return {"result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}


def charge_id(answer: dict[str, Any]) -> str:
    assert "result" in answer, answer
    return answer["result"]["structuredContent"]["chargeId"]


def error_type(answer: dict[str, Any]) -> str | None:
    data = answer.get("error", {}).get("data")
    return data.get("type") if isinstance(data, dict) else None


def run(scenario: Any) -> None:
    anyio.run(scenario)


def test_a_key_in_meta_replays_conflicts_and_is_in_progress_as_a_sep_key(tmp_path):
    ledger = tmp_path / "ledger.jsonl"

    async def scenario() -> None:
        async with Client(server(ledger)) as client:
            key = {"idempotencyKey": "py-meta-1"}
            first = await call(client, "charge_payment", CHARGE, meta=key)
            retry = await call(client, "charge_payment", CHARGE, meta=key)
            # Replayed byte for byte, as for a SEP key: no replay marker.
            assert retry == first
            conflict = await call(client, "charge_payment", {**CHARGE, "amount": 6}, meta=key)
            assert error_type(conflict) == "idempotency_key_conflict", conflict

            slow = {**CHARGE, "delay_ms": 1500}
            answers: dict[str, dict[str, Any]] = {}

            async def concurrent(name: str) -> None:
                answers[name] = await call(client, "charge_payment", slow, meta={"idempotencyKey": "py-meta-2"})

            async with anyio.create_task_group() as group:
                group.start_soon(concurrent, "a")
                group.start_soon(concurrent, "b")
            outcomes = sorted(answers.values(), key=lambda answer: "error" in answer)
            ran, busy = outcomes
            # A client's key: the duplicate is refused at once, not made to wait.
            assert error_type(busy) == "idempotency_key_in_progress", busy
            again = await call(client, "charge_payment", slow, meta={"idempotencyKey": "py-meta-2"})
            assert charge_id(again) == charge_id(ran)
        lines = ledger_lines(ledger)
        assert [line["key"] for line in lines] == ["py-meta-1", "py-meta-2"]
        assert lines[0]["chargeId"] == charge_id(first)

    run(scenario)


def test_more_meta_names_by_meta_key(tmp_path):
    ledger = tmp_path / "ledger.jsonl"

    async def scenario() -> None:
        async with Client(server(ledger, "--meta-key", "io.mcp-gateway/idempotency-key")) as client:
            key = {"io.mcp-gateway/idempotency-key": "gw-1"}
            first = await call(client, "charge_payment", CHARGE, meta=key)
            assert await call(client, "charge_payment", CHARGE, meta=key) == first
        assert len(ledger_lines(ledger)) == 1

    run(scenario)


def test_a_business_identifier_replays_a_model_style_retry_and_conflicts_on_another_amount(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    tools = {"charge_payment": {"key_from": ["/order_id"]}}

    async def scenario() -> None:
        async with Client(server(ledger, tools=tools)) as client:
            order = {**CHARGE, "order_id": "ord-1"}
            first = await call(client, "charge_payment", order)
            assert REPLAYED not in first["result"].get("_meta", {})
            # A model-style retry: a new request, the same arguments, no key.
            retry = await call(client, "charge_payment", order)
            assert charge_id(retry) == charge_id(first)
            assert retry["result"]["_meta"][REPLAYED] == "key-from"
            # With a fresh key of the client's own each attempt, the identifier still decides.
            fresh = await call(client, "charge_payment", order, meta={"idempotencyKey": "attempt-2"})
            assert charge_id(fresh) == charge_id(first)
            # The identifier with another amount: a conflict that names it.
            conflict = await call(client, "charge_payment", {**order, "amount": 6})
            assert error_type(conflict) == "idempotency_key_conflict", conflict
            assert '/order_id = "ord-1"' in conflict["error"]["message"], conflict
            # Another identifier is another charge.
            other = await call(client, "charge_payment", {**CHARGE, "order_id": "ord-2"})
            assert charge_id(other) != charge_id(first)
        lines = ledger_lines(ledger)
        assert [line["orderId"] for line in lines] == ["ord-1", "ord-2"]
        # The derived key reached the tool in `_meta`, as a client's key does.
        assert lines[0]["key"].startswith("charge_payment:"), lines[0]

    run(scenario)


def test_required_refuses_a_call_without_its_identifier_and_runs_nothing(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    tools = {"charge_payment": {"key-from": "/order_id", "required": True}}

    async def scenario() -> None:
        async with Client(server(ledger, tools=tools)) as client:
            refused = await call(client, "charge_payment", CHARGE)
            assert refused["error"]["code"] == -32602, refused
            assert "/order_id" in refused["error"]["message"], refused

    run(scenario)
    assert ledger_lines(ledger) == []


def test_a_window_merges_identical_calls_and_runs_them_again_after_it(tmp_path):
    ledger = tmp_path / "ledger.jsonl"

    async def scenario() -> None:
        async with Client(server(ledger, tools={"charge_payment": {"window": "3s"}})) as client:
            first = await call(client, "charge_payment", CHARGE)
            merged = await call(client, "charge_payment", CHARGE)
            assert charge_id(merged) == charge_id(first)
            assert merged["result"]["_meta"][REPLAYED] == "window"
            await anyio.sleep(3.3)
            later = await call(client, "charge_payment", CHARGE)
            assert charge_id(later) != charge_id(first)
            assert REPLAYED not in later["result"].get("_meta", {})
        assert len(ledger_lines(ledger)) == 2

    run(scenario)


def test_suggested_policies_hold_from_the_first_call_though_no_client_lists_the_tools(bound, tmp_path):
    """`tools="suggested"` with a client that never sends `tools/list` (a raw client: the SDK's
    own lists the tools to check results): the binding lists the server's tools itself before it
    decides the first call, as `wrap` does. A key-less retry of the charge with the same
    arguments is the first call's replay (the suggested window); the read-only `get_balance` is
    left alone and runs each time."""
    ledger = tmp_path / "ledger.jsonl"
    peer = bound("--store", "memory", "--tools", json.dumps("suggested"), ledger=ledger)

    def tools_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        answer = peer.request("tools/call", {"name": name, "arguments": arguments})
        assert "result" in answer, answer
        return answer["result"]

    before = tools_call("get_balance", {})
    first = tools_call("charge_payment", CHARGE)
    retry = tools_call("charge_payment", CHARGE)
    after = tools_call("get_balance", {})
    assert retry["structuredContent"]["chargeId"] == first["structuredContent"]["chargeId"], retry
    assert retry["_meta"][REPLAYED] == "window", retry
    assert len(ledger_lines(ledger)) == 1
    # The balance ran again: it sees the charge made in between, and is no replay.
    assert before["structuredContent"]["charges"] == 0, before
    assert after["structuredContent"]["charges"] == 1, after
    assert REPLAYED not in after.get("_meta", {}), after


def test_without_a_tool_policy_the_tools_at_risk_are_logged_once_at_the_first_tools_list(bound, tmp_path):
    """As `wrap` does: no `tools=`, the first `tools/list` logs (on stderr) the tools a key-less
    retry would run again; the read-only `get_balance` is not one of them."""
    peer = bound("--store", "memory")
    for _ in range(2):
        listed = peer.request("tools/list", {})
        assert "charge_payment" in [tool["name"] for tool in listed["result"]["tools"]], listed
    stderr = (tmp_path / "bound.stderr").read_text()
    logged = [line for line in stderr.splitlines() if "no tool policy is set" in line]
    assert len(logged) == 1, stderr
    assert "charge_payment" in logged[0] and "get_balance" not in logged[0], stderr


class _Watched:
    """The client's write stream, calling `on_send` with each message handed to the transport."""

    def __init__(self, stream: Any, on_send: Any):
        self._stream = stream
        self._on_send = on_send

    async def send(self, message: Any) -> None:
        await self._stream.send(message)
        self._on_send(message)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched_stdio(parameters: StdioServerParameters, on_send: Any):
    async with stdio_client(parameters) as (read, write):
        yield read, _Watched(write, on_send)


def test_a_waiting_duplicate_does_not_hold_up_the_elicitation_answer_the_running_call_waits_for(tmp_path):
    """The first call asks the client to confirm; the client sends a duplicate (a model-style
    retry), and only then answers. Over stdio the answer travels behind the duplicate, which waits
    for the first call's outcome: it must not hold the answer up."""
    ledger = tmp_path / "ledger.jsonl"
    tools = {"confirm_charge": {"key-from": ["/order_id"], "wait": "20s"}}
    order = {"order_id": "ord-elicit", "amount": 9, "currency": "eur"}
    duplicate_sent = anyio.Event()
    calls_sent = 0
    elicitations = 0
    answers: dict[str, dict[str, Any]] = {}

    def on_send(message: Any) -> None:
        nonlocal calls_sent
        if getattr(message.message, "method", None) == "tools/call":
            calls_sent += 1
            if calls_sent == 2:
                duplicate_sent.set()

    async def scenario() -> None:
        async with anyio.create_task_group() as group:

            async def duplicate(client: Client) -> None:
                answers["duplicate"] = await call(client, "confirm_charge", order)

            async def confirm(context: Any, params: Any) -> ElicitResult:
                nonlocal elicitations
                elicitations += 1
                group.start_soon(duplicate, client)
                # The answer goes out behind the duplicate, on the same pipe.
                await duplicate_sent.wait()
                return ElicitResult(action="accept", content={"confirm": True})

            # The 2025-11-25 handshake: the server elicits with an `elicitation/create` request.
            transport = _watched_stdio(server(ledger, tools=tools), on_send)
            async with Client(transport, mode="legacy", elicitation_callback=confirm) as client:
                answers["first"] = await call(client, "confirm_charge", order)
                with anyio.fail_after(60):
                    while "duplicate" not in answers:
                        await anyio.sleep(0.05)

    run(scenario)
    first, duplicate = answers["first"], answers["duplicate"]
    assert elicitations == 1
    assert charge_id(duplicate) == charge_id(first), answers
    assert duplicate["result"]["_meta"][REPLAYED] == "key-from", duplicate
    [line] = ledger_lines(ledger)
    assert line["chargeId"] == charge_id(first)


BAD_POLICIES = {
    "a window out of range": ({"tools": {"charge": {"window": "1h"}}}, 'tool policy [tools."charge"]: `window`'),
    "a pointer without its slash": ({"tools": {"charge": {"key_from": "order_id"}}}, "is not a JSON Pointer"),
    "required without an identifier": ({"tools": {"charge": {"required": True}}}, "`required = true` needs"),
    "an unknown setting": ({"tools": {"charge": {"key_form": "/order_id"}}}, "key_form"),
    "not a dict": ({"tools": ["charge"]}, "`tools` must be a table of tool names"),
    "not a JSON value": ({"tools": {"charge": {"wait": object()}}}, "expected a JSON value or a timedelta"),
    "an empty meta key": ({"meta_key": ""}, "none of them empty"),
    "a meta key that is not a string": ({"meta_key": 5}, "expected a name or an array of names"),
}


@pytest.mark.parametrize("case", BAD_POLICIES)
def test_a_bad_policy_is_refused_at_idempotent_with_the_librarys_words(case):
    options, words = BAD_POLICIES[case]
    with pytest.raises(IdempotencyError) as refusal:
        idempotent(MCPServer("bad-policy"), store="memory", **options)
    assert refusal.value.type == "idempotency_invalid_option"
    assert refusal.value.code == -32602
    assert words in str(refusal.value), refusal.value
    # Named as the user wrote it.
    option = "meta_key" if "meta_key" in options else "tools"
    assert str(refusal.value).startswith(f"{option}: "), refusal.value
