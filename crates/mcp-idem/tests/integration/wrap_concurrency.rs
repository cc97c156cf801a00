//! `mcp-idem wrap` with calls in flight: a duplicate of a running call is refused at once, and
//! responses that arrive out of order are matched (and recorded) by id.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::common::{count_charge, ledger_lines, TIMEOUT};
use crate::support::wrap::{
    assert_rejected, call, charge, charge_id, raw_outcome, request_while_in_progress, Sandbox,
};

#[test]
fn a_duplicate_of_a_running_call_is_refused_at_once_then_replays() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let arguments = json!({"amount":50,"currency":"EUR","delay_ms":1500});

    let started = Instant::now();
    wrap.send(&charge(1, arguments.clone(), "slow-1"));
    wrap.send(&charge(2, arguments.clone(), "slow-1"));
    let duplicate = wrap.response(&json!(2));
    let answered_after = started.elapsed();
    assert!(
        answered_after < Duration::from_millis(500),
        "the duplicate waited {answered_after:?}"
    );
    let error = assert_rejected(
        &duplicate,
        -32602,
        "idempotency_key_in_progress",
        Some("slow-1"),
    );
    // The default hint: 1 s, well inside the 30 s lease; the message says it too.
    assert_eq!(error["data"]["retryAfterMs"], 1000, "{duplicate}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("in 1000 ms"), "{message}");
    assert!(
        wrap.pending().iter().all(|message| message["id"] != 1),
        "the original has not answered yet: {:?}",
        wrap.pending()
    );

    // A request that reuses the id of the running call is refused without reaching the server;
    // the running call is not disturbed.
    let reused = wrap.request(call(1, "noop", json!({}), None));
    assert_eq!(reused["error"]["code"], -32600, "{reused}");

    let original = wrap.response(&json!(1));
    let charged = charge_id(&original);
    assert!(started.elapsed() >= Duration::from_millis(1500));

    let retry = wrap.request(charge(3, arguments, "slow-1"));
    assert_eq!(charge_id(&retry), charged);
    assert_eq!(raw_outcome(&wrap, &json!(3)), raw_outcome(&wrap, &json!(1)));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn a_short_lease_shortens_the_retry_hint_but_never_to_zero() {
    let sandbox = Sandbox::new();
    // A 900 ms lease, renewed every 300 ms: the running call's lease ends within 900 ms, sooner
    // than the 1 s default hint, so the hint is no longer than that, and never below 100 ms.
    let mut wrap = sandbox.wrap_demo(&["--lease", "900ms"]);
    let arguments = json!({"amount":51,"currency":"EUR","delay_ms":1500});
    wrap.send(&charge(1, arguments.clone(), "short-lease"));
    // The 1.5 s call is still running when its duplicate comes.
    let duplicate = wrap.request(charge(2, arguments, "short-lease"));
    let error = assert_rejected(
        &duplicate,
        -32602,
        "idempotency_key_in_progress",
        Some("short-lease"),
    );
    let hint = error["data"]["retryAfterMs"].as_u64().expect("a hint");
    assert!((100..=900).contains(&hint), "{duplicate}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(&format!("in {hint} ms")), "{message}");
    charge_id(&wrap.response(&json!(1)));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn out_of_order_responses_are_recorded_under_their_own_keys() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    // The ids 10 and "10" differ (JSON-RPC compares them by type and value).
    let slow = json!({"amount":1,"currency":"EUR","delay_ms":800});
    let fast = json!({"amount":2,"currency":"EUR","delay_ms":100});
    wrap.send(&charge(10, slow.clone(), "slow"));
    wrap.send(&charge("10", fast.clone(), "fast"));

    let first = wrap.next_message(TIMEOUT).expect("a response");
    assert_eq!(first["id"], "10", "the fast call answers first: {first}");
    assert_eq!(first["result"]["structuredContent"]["amount"], 2, "{first}");
    let second = wrap.response(&json!(10));
    assert_eq!(
        second["result"]["structuredContent"]["amount"], 1,
        "{second}"
    );
    let (fast_id, slow_id) = (charge_id(&first), charge_id(&second));
    assert_ne!(fast_id, slow_id);

    // Each retry replays its own call's charge.
    let slow_retry = wrap.request(charge(11, slow, "slow"));
    assert_eq!(charge_id(&slow_retry), slow_id);
    let fast_retry = wrap.request(charge(12, fast, "fast"));
    assert_eq!(charge_id(&fast_retry), fast_id);
    assert_eq!(
        raw_outcome(&wrap, &json!(11)),
        raw_outcome(&wrap, &json!(10))
    );
    assert_eq!(
        raw_outcome(&wrap, &json!(12)),
        raw_outcome(&wrap, &json!("10"))
    );

    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    assert_eq!(count_charge(&sandbox.ledger(), &slow_id), 1);
    assert_eq!(count_charge(&sandbox.ledger(), &fast_id), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}

/// `notifications/cancelled` for a running keyed call (what a client sends on timeout). The demo
/// server charges anyway (rmcp only drops the response), so the honest answers for a retry are the
/// recorded outcome (`--cancel absorb`, the default: the call is left to finish) or
/// `idempotency_outcome_unknown` (`--cancel forward`).
#[test]
fn a_cancelled_keyed_call_is_absorbed_by_default_or_forwarded_as_outcome_unknown() {
    for forward in [false, true] {
        let sandbox = Sandbox::new();
        let options: &[&str] = if forward {
            &["--cancel", "forward"]
        } else {
            &[]
        };
        let mut wrap = sandbox.wrap_demo(options);
        let arguments = json!({"amount":4,"currency":"EUR","delay_ms":300});
        wrap.send(&charge(1, arguments.clone(), "cancelled-1"));
        wrap.send(&json!({"jsonrpc":"2.0","method":"notifications/cancelled",
            "params":{"_meta": crate::support::common::meta_2026(), "requestId":1, "reason":"timeout"}}));
        let lines = crate::support::common::wait_for_ledger(&sandbox.ledger(), 1);

        // The server charged; `wrap` records its (dropped) response a moment later.
        let retry = request_while_in_progress(&mut wrap, 2, |id| {
            charge(id, arguments.clone(), "cancelled-1")
        });
        if forward {
            assert_rejected(
                &retry,
                -32603,
                "idempotency_outcome_unknown",
                Some("cancelled-1"),
            );
        } else {
            assert_eq!(charge_id(&retry), lines[0]["chargeId"].as_str().unwrap());
        }
        assert!(
            wrap.try_response(&json!(1), Duration::from_millis(100))
                .is_none(),
            "no response for the cancelled request"
        );
        assert_eq!(wrap.finish().code(), Some(0));
        assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    }
}

/// A call decided at once (the client's own key) sent right behind a call decided beside the
/// reads (no key, a `key-from` policy: its duplicates may wait) is answered, and so is a
/// duplicate that waits. The first call's decision leads the SQLite store's write batch; wrap
/// awaited the second's decision without polling the first, and hung for good (found by the
/// in-progress span test of issue 41).
#[test]
fn a_call_decided_at_once_behind_one_decided_beside_the_reads_is_answered() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[
        "--tools",
        r#"{"charge_payment": {"key-from": "/order_id"}}"#,
    ]);
    let arguments = json!({"amount": 8, "currency": "EUR", "order_id": "ord-8", "delay_ms": 1000});
    wrap.send(&call(1, "charge_payment", arguments.clone(), None));
    wrap.send(&charge(2, arguments.clone(), "own-key-2"));
    wrap.send(&call(3, "charge_payment", arguments, None));
    let refused = wrap.response(&json!(2));
    assert_rejected(
        &refused,
        -32602,
        "idempotency_key_in_progress",
        Some("own-key-2"),
    );
    let first = wrap.response(&json!(1));
    let waited = wrap.response(&json!(3));
    assert_eq!(charge_id(&waited), charge_id(&first));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}
