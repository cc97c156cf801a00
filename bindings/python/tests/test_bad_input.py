"""Bad input gets the error `mcp-idem wrap` gives, and nothing executes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer

from conftest import HERE, Peer, free_port, ledger_lines, mcp_idem_binary
from mcp_idempotency import IdempotencyError, idempotent


def wrap_refusal(*options: str) -> str:
    """What `mcp-idem wrap` prints when it refuses to start with these options."""
    run = subprocess.run([mcp_idem_binary(), "wrap", *options, "--", "true"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0, run
    return run.stderr


def refused(**options) -> IdempotencyError:
    with pytest.raises(IdempotencyError) as refusal:
        idempotent(MCPServer("bad-input"), **options)
    return refusal.value


def test_a_store_url_that_does_not_parse_is_refused_at_once_with_wraps_words():
    error = refused(store="mysql://db")
    assert error.type == "idempotency_invalid_store_url"
    assert error.code == -32602
    assert str(error) in wrap_refusal("--store", "mysql://db")


def test_a_store_that_is_down_at_start_is_refused_at_once_with_wraps_words():
    url = f"redis://127.0.0.1:{free_port()}"
    error = refused(store=url)
    assert error.type == "idempotency_store_unavailable"
    assert error.code == -32603
    assert str(error).startswith(f"cannot open the record store {url}"), error
    assert str(error) in wrap_refusal("--store", url)


def test_unknown_options_and_bad_values_are_refused():
    assert refused(store="memory", retension="2h").type == "idempotency_invalid_option"
    bad_lease = refused(store="memory", lease="soon")
    assert bad_lease.type == "idempotency_invalid_option" and bad_lease.code == -32602
    assert str(bad_lease) == 'lease: expected a duration such as 24h, 30m or 500ms, got "soon"', bad_lease
    assert refused(store="memory", max_key_bytes=0).type == "idempotency_invalid_option"
    assert refused(store="memory", max_key_bytes=[1]).type == "idempotency_invalid_option"
    assert refused(store="memory", after_crash="retry").type == "idempotency_invalid_option"
    assert refused(store="memory", principal=7).type == "idempotency_invalid_option"
    assert refused(store="memory", store_io="elsewhere").type == "idempotency_invalid_option"
    inline_on_redis = refused(store="redis://127.0.0.1:1", store_io="inline")
    assert str(inline_on_redis).startswith("store_io: only the sqlite: and memory stores"), inline_on_redis


def test_a_misspelled_option_is_named_as_written_with_the_options_in_pythons_spelling():
    error = refused(store="memory", after_crsh="reject")
    assert error.type == "idempotency_invalid_option" and error.code == -32602
    assert str(error).startswith('unknown option "after_crsh"; expected one of: store, namespace'), error
    assert ", after_crash, forward_key, " in str(error), error


def test_a_bad_value_names_the_option_as_written_and_what_it_accepts():
    assert str(refused(store="memory", retention="forever")) == (
        'retention: expected a duration such as 24h, 30m or 500ms, got "forever"'
    )
    assert str(refused(store="memory", after_crash="retry")) == 'after_crash: expected reject or reexecute, got "retry"'
    assert str(refused(store="memory", max_key_bytes=[1])) == "max_key_bytes: expected a positive whole number, got [1]"
    assert str(refused(store="memory", principal=7)) == (
        "principal: expected a string, or a function of the request that returns one, got 7"
    )
    assert str(refused(store="memory", meta_key=["ok", ""])) == (
        'meta_key: expected `_meta` member names, none of them empty, got ["ok",""]'
    )
    not_json = refused(store="memory", lease=object())
    assert str(not_json).startswith("lease: expected a JSON value or a timedelta"), not_json


def test_a_misspelled_policy_setting_is_named_as_written():
    error = refused(store="memory", tools={"charge": {"key_frm": ["/order_id"]}})
    assert error.type == "idempotency_invalid_option"
    assert str(error).startswith('tools: tool policy [tools."charge"]: unknown setting `key_frm`; expected key-from'), error
    bad_value = refused(store="memory", tools={"charge": {"key_from": 5}})
    assert str(bad_value).startswith('tools: tool policy [tools."charge"]: `key_from`: '), bad_value


def test_a_server_without_a_name_needs_a_namespace():
    """The library's one rule for both bindings: no made-up name to keep records under."""
    server = MCPServer("unnamed-at-first")
    server._lowlevel_server.name = ""
    error = refused_for(server, store="memory")
    assert error.type == "idempotency_invalid_option"
    assert str(error).startswith("the server has no name (its serverInfo.name) to keep its records under"), error
    named = MCPServer("unnamed-too")
    named._lowlevel_server.name = ""
    idempotent(named, store="memory", namespace="payments")


def refused_for(server, **options) -> IdempotencyError:
    with pytest.raises(IdempotencyError) as refusal:
        idempotent(server, **options)
    return refusal.value


def test_a_server_that_is_not_an_mcp_server_is_a_type_error():
    with pytest.raises(TypeError):
        idempotent(object(), store="memory")


def test_a_server_wired_twice_is_a_type_error_and_keeps_one_gateway():
    """A second gateway in front of the first would answer every `_meta`-keyed call in progress:
    the second `idempotent()` on a server, or on the low-level server beneath it, raises."""
    for server in (MCPServer("twice"), Server("twice")):
        idempotent(server, store="memory")
        with pytest.raises(TypeError, match=r"that is already wired: .* call it once per server"):
            idempotent(server, store="memory")
    server = idempotent(MCPServer("twice-beneath"), store="memory")
    with pytest.raises(TypeError, match="mcp.server.lowlevel.server.Server that is already wired"):
        idempotent(server._lowlevel_server, store="memory")
    assert len([m for m in server._lowlevel_server.middleware if hasattr(m, "carrier")]) == 1


# Each case: (arguments, key); sent with the key in `idempotencyKey`.
BAD_CALLS = {
    "a number as key": ({"amount": 5, "currency": "eur"}, 12345),
    "null as key": ({"amount": 5, "currency": "eur"}, None),
    "an object as key": ({"amount": 5, "currency": "eur"}, {"k": 1}),
    "an empty key": ({"amount": 5, "currency": "eur"}, ""),
    "a 300-byte key": ({"amount": 5, "currency": "eur"}, "k" * 300),
    "2 kB of arguments": ({"amount": 5, "currency": "eur", "note": "x" * 2000}, "big-arguments"),
    "arguments that are not an object": ([5, "eur"], "array-arguments"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_keys_and_arguments_get_wraps_answer_and_nothing_runs(case, bound, wrapped, tmp_path):
    arguments, key = BAD_CALLS[case]
    in_process = bound("--store", "memory", "--option", "max-argument-bytes=1024")
    behind_wrap = wrapped("--store", "memory", "--max-argument-bytes", "1024")
    ours = in_process.call("charge_payment", arguments, key)
    theirs = behind_wrap.call("charge_payment", arguments, key)
    assert "error" in ours, ours
    if case == "2 kB of arguments":
        # The SDK hands the middleware parsed arguments, measured as compact JSON; `wrap` measures
        # the client's own text (here with spaces): the same refusal, a few bytes apart.
        assert ours["error"]["message"].endswith("bytes, more than the limit of 1024 bytes"), ours
        ours["error"]["message"] = theirs["error"]["message"]
    assert ours["error"] == theirs["error"]
    assert ledger_lines(tmp_path / "ledger.jsonl") == []
    assert ledger_lines(tmp_path / "wrapped-ledger.jsonl") == []


def test_the_key_reaches_the_tool_in_meta(bound, tmp_path):
    peer = bound("--store", "memory")
    answer = peer.call("charge_payment", {"amount": 5, "currency": "eur"}, "key-for-the-tool")
    assert "result" in answer, answer
    [line] = ledger_lines(tmp_path / "ledger.jsonl")
    assert line["key"] == "key-for-the-tool"
    assert answer["result"]["structuredContent"]["chargeId"] == line["chargeId"]


def test_a_low_level_server_is_made_idempotent_too(tmp_path):
    peer = Peer([sys.executable, str(HERE / "lowlevel_server.py"), "memory"], tmp_path / "lowlevel.stderr")
    try:
        first = peer.call("charge", {"amount": 1}, "lowlevel-key")
        assert "result" in first, first
        assert peer.call("charge", {"amount": 1}, "lowlevel-key")["result"] == first["result"]
        other = peer.call("charge", {"amount": 1}, "another-key")
        assert other["result"] != first["result"]
        conflict = peer.call("charge", {"amount": 2}, "lowlevel-key")
        assert conflict["error"]["data"]["type"] == "idempotency_key_conflict", conflict
    finally:
        peer.close()


def test_servers_with_the_same_options_share_one_gateway():
    first = MCPServer("shared")
    second = MCPServer("shared")
    idempotent(first, store="memory")
    idempotent(second, store="memory")
    [ours] = [m for m in first._lowlevel_server.middleware if hasattr(m, "carrier")]
    [theirs] = [m for m in second._lowlevel_server.middleware if hasattr(m, "carrier")]
    assert ours.carrier.gateway == theirs.carrier.gateway
