"""A store that goes down mid-run: keyed calls are refused while it is down (nothing runs), a call
that ran while it went down is answered and its outcome reaches the store once it is back, and
nothing recorded is lost."""

from __future__ import annotations

import time

import pytest

from conftest import ledger_lines

CHARGE = {"amount": 7, "currency": "eur"}


def charge_id(answer: dict) -> str:
    assert "result" in answer, answer
    return answer["result"]["structuredContent"]["chargeId"]


def error_type(answer: dict) -> str | None:
    return (answer.get("error") or {}).get("data", {}).get("type")


def outcome_once_settled(peer, arguments: dict, key: str, waiting: tuple[str, ...]) -> dict:
    """The answer to a retry once the call is no longer in one of the `waiting` states."""
    deadline = time.monotonic() + 30
    while True:
        answer = peer.call("charge_payment", arguments, key)
        if "result" in answer or time.monotonic() > deadline:
            return answer
        assert error_type(answer) in waiting, answer
        time.sleep(0.1)


def test_a_store_down_mid_run_refuses_new_calls_and_loses_no_outcome(bound, own_redis, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    peer = bound("--store", own_redis.url, "--namespace", "store-down")

    before = charge_id(peer.call("charge_payment", CHARGE, "before"))

    # A call that runs while the store goes down: the tool finishes and the client gets its answer.
    slow = dict(CHARGE, delay_ms=1500)
    running_id = peer.start("tools/call", {"name": "charge_payment", "arguments": slow, "idempotencyKey": "during"})
    time.sleep(0.5)
    own_redis.stop()
    during = charge_id(peer.answer(running_id))

    # While the store is down a keyed call is refused, as `wrap` refuses it, and does not run.
    refused = peer.call("charge_payment", CHARGE, "while-down")
    assert error_type(refused) == "idempotency_store_unavailable", refused
    assert refused["error"]["code"] == -32603
    assert len(ledger_lines(ledger)) == 2

    own_redis.start()

    # Once the store is back, the outcome of the call that ran while it was down is replayed
    # (it was held and sent again), and so is the one recorded before.
    retry = outcome_once_settled(
        peer, slow, "during", ("idempotency_key_in_progress", "idempotency_store_unavailable")
    )
    assert charge_id(retry) == during
    assert charge_id(peer.call("charge_payment", CHARGE, "before")) == before

    # The refused call never ran: with the store back it runs, once.
    after = charge_id(peer.call("charge_payment", CHARGE, "while-down"))
    assert charge_id(peer.call("charge_payment", CHARGE, "while-down")) == after
    assert [line["key"] for line in ledger_lines(ledger)] == ["before", "during", "while-down"]


def test_a_cancelled_keyed_call_still_runs_once_and_its_retry_replays_it(bound, tmp_path):
    """`cancel=absorb` (the default, as `wrap`'s): clients cancel on a timeout, which is how a lost
    answer looks, so the call runs to its end and the retry that follows gets its outcome."""
    peer = bound("--store", "memory")
    slow = dict(CHARGE, delay_ms=500)
    cancelled_id = peer.start("tools/call", {"name": "charge_payment", "arguments": slow, "idempotencyKey": "cancelled"})
    time.sleep(0.1)
    peer.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": cancelled_id, "reason": "timed out"}})
    retry = outcome_once_settled(peer, slow, "cancelled", ("idempotency_key_in_progress",))
    [line] = ledger_lines(tmp_path / "ledger.jsonl")
    assert charge_id(retry) == line["chargeId"]


def test_records_are_scoped_to_the_principal(bound, tmp_path):
    """Two servers on one store: the same key from another principal is another call; from the
    same principal it is the replay."""
    store = f"sqlite:{tmp_path / 'shared.sqlite3'}"
    ledger = tmp_path / "ledger.jsonl"
    alice = bound("--store", store, "--option", "principal=alice", ledger=ledger)
    bob = bound("--store", store, "--option", "principal=bob", ledger=ledger)
    alice_again = bound("--store", store, "--option", "principal=alice", ledger=ledger)
    first = charge_id(alice.call("charge_payment", CHARGE, "shared-key"))
    assert charge_id(bob.call("charge_payment", CHARGE, "shared-key")) != first
    assert charge_id(alice_again.call("charge_payment", CHARGE, "shared-key")) == first
    assert len(ledger_lines(ledger)) == 2


@pytest.mark.parametrize("store_io", ["runtime", "inline"])
def test_store_io_either_way_replays_a_keyed_call_and_refuses_a_conflict(store_io, bound, tmp_path):
    """`store_io="inline"` runs SQLite's transactions on the server's thread instead of the
    library's runtime: the same records, replays and conflicts."""
    ledger = tmp_path / "ledger.jsonl"
    peer = bound("--store", f"sqlite:{tmp_path / 'records.sqlite3'}", "--option", f"store_io={store_io}")
    first = charge_id(peer.call("charge_payment", CHARGE, "store-io"))
    assert charge_id(peer.call("charge_payment", CHARGE, "store-io")) == first
    conflict = peer.call("charge_payment", dict(CHARGE, amount=8), "store-io")
    assert error_type(conflict) == "idempotency_key_conflict", conflict
    assert len(ledger_lines(ledger)) == 1
