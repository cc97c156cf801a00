//! Bad input to `mcp-idem wrap` (stdio), against the real binary around the demo payment server
//! (docs/reliability.md, "Bad input"). For each input it proves what the gateway answers (a
//! specific JSON-RPC error, or a pass-through where that is the documented behaviour), that nothing
//! runs that must not (the demo server's ledger counts executed charges), that `wrap` never panics,
//! and that the same session keeps serving keyed calls afterwards.

use serde_json::json;

use crate::support::common::{ledger_lines, meta_2026, StdioPeer, TIMEOUT};
use crate::support::wrap::{
    assert_rejected, call, charge, charge_id, padded_charge, peak_rss_kb, sh_quote, Sandbox, EXE,
};

/// A keyed charge still executes once and replays: the session survived what came before.
fn assert_still_serving(wrap: &mut StdioPeer, id: u64, key: &str) {
    let arguments = json!({"amount":1,"currency":"EUR"});
    let first = charge_id(&wrap.request(charge(id, arguments.clone(), key)));
    let again = charge_id(&wrap.request(charge(id + 1, arguments, key)));
    assert_eq!(first, again);
}

fn assert_no_panic(wrap: &StdioPeer) {
    let stderr = wrap.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A keyed `charge_payment` line whose `arguments` are the raw JSON text `arguments`.
fn raw_keyed_charge(id: u64, key: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{},"name":"charge_payment","idempotencyKey":"{key}","arguments":{arguments}}}}}"#,
        meta_2026()
    )
}

#[test]
fn malformed_json_and_invalid_utf8_lines_pass_through() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);

    wrap.send_raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"#);
    wrap.send_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"charge_payment\",\"idempotencyKey\":\"\xff\xfe\",\"arguments\":{\"amount\":1,\"currency\":\"EUR\"}}}\n");
    // Neither line is a message the gateway can read: both reach the server as they are, and
    // neither executes a charge (the server cannot read them either).
    assert_still_serving(&mut wrap, 10, "after-malformed");
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn a_3_mb_arguments_line_is_refused_as_too_large_and_wrap_survives() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    assert_still_serving(&mut wrap, 1, "before-huge");

    // Under the 4 MiB line limit (`limits_stdio` has lines over it), over the 1 MiB
    // arguments limit. The line is streamed while `wrap` reads it (the pipe holds 64 kB).
    let line = padded_charge(3, "huge-1", 3 << 20, false);
    let len = line.len();
    wrap.send_bytes(&line);
    drop(line);
    let response = wrap.response(&json!(3));
    let error = assert_rejected(
        &response,
        -32602,
        "idempotency_arguments_too_large",
        Some("huge-1"),
    );
    assert_eq!(error["data"]["limit"], 1 << 20, "{response}");
    let peak_kb = peak_rss_kb(wrap.pid());
    eprintln!("wrap read a {len}-byte line; peak RSS {peak_kb} kB");
    assert!(peak_kb < 100_000, "peak RSS {peak_kb} kB");

    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_still_serving(&mut wrap, 4, "after-huge");
    assert_no_panic(&wrap);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn arguments_nested_100k_levels_deep_are_refused_as_invalid() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let levels = 100_000;
    for (id, open, close) in [(1, "[", "]"), (2, r#"{"a":"#, "}")] {
        let nested = format!("{}0{}", open.repeat(levels), close.repeat(levels));
        let arguments = format!(r#"{{"amount":1,"currency":"EUR","deep":{nested}}}"#);
        wrap.send_raw(&raw_keyed_charge(id, &format!("deep-{id}"), &arguments));
        let response = wrap.response(&json!(id));
        let error = assert_rejected(&response, -32602, "idempotency_arguments_invalid", None);
        assert!(
            error["message"].as_str().unwrap().contains("128"),
            "the message names the limit: {response}"
        );
    }
    assert!(ledger_lines(&sandbox.ledger()).is_empty());
    assert_still_serving(&mut wrap, 10, "after-deep");
    assert_no_panic(&wrap);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn huge_exponents_are_exact_or_refused() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let args = |note: &str| format!(r#"{{"amount":5,"currency":"EUR","note":{note}}}"#);

    // An exponent of 10^20 is refused before anything runs.
    wrap.send_raw(&raw_keyed_charge(
        1,
        "huger-exp",
        &args("1e99999999999999999999"),
    ));
    assert_rejected(
        &wrap.response(&json!(1)),
        -32602,
        "idempotency_arguments_invalid",
        None,
    );

    // 1e999999999 is accepted (claimed and forwarded). The demo server cannot parse it (serde_json
    // without arbitrary precision) and never answers, so the call stays in flight; the retries
    // show the comparison is exact: 10e999999998 is the same number (in progress), 1e999999998
    // is not (conflict).
    wrap.send_raw(&raw_keyed_charge(2, "big-exp", &args("1e999999999")));
    wrap.send_raw(&raw_keyed_charge(3, "big-exp", &args("10e999999998")));
    assert_rejected(
        &wrap.response(&json!(3)),
        -32602,
        "idempotency_key_in_progress",
        Some("big-exp"),
    );
    wrap.send_raw(&raw_keyed_charge(4, "big-exp", &args("1e999999998")));
    assert_rejected(
        &wrap.response(&json!(4)),
        -32602,
        "idempotency_key_conflict",
        Some("big-exp"),
    );
    assert!(ledger_lines(&sandbox.ledger()).is_empty());
    assert_still_serving(&mut wrap, 10, "after-exponents");
    assert_no_panic(&wrap);
    // At EOF the unanswered call is answered as outcome-unknown.
    wrap.close_stdin();
    let orphan = wrap.response(&json!(2));
    assert_eq!(
        orphan["error"]["data"]["type"], "idempotency_outcome_unknown",
        "{orphan}"
    );
    assert_eq!(wrap.wait(TIMEOUT).code(), Some(0));
}

#[test]
fn duplicate_member_names_last_one_wins() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);

    wrap.send_raw(&raw_keyed_charge(
        1,
        "dup-1",
        r#"{"amount":1,"currency":"EUR","amount":2}"#,
    ));
    let first = wrap.response(&json!(1));
    let replay = wrap.request(charge(2, json!({"amount":2,"currency":"EUR"}), "dup-1"));
    assert_eq!(replay["result"], first["result"], "{replay}");
    assert_eq!(replay["error"], first["error"], "{replay}");
    let conflict = wrap.request(charge(3, json!({"amount":1,"currency":"EUR"}), "dup-1"));
    assert_rejected(&conflict, -32602, "idempotency_key_conflict", Some("dup-1"));
    // The demo server (serde_json) reads the last member too: it charged 2.
    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["amount"], 2, "{lines:?}");
    assert_eq!(charge_id(&first), lines[0]["chargeId"].as_str().unwrap());
    assert_still_serving(&mut wrap, 10, "after-dup");
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn an_id_reused_while_in_flight_is_refused_with_invalid_request() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let slow = json!({"amount":3,"currency":"EUR","delay_ms":1500});

    // A keyed call in flight, then another keyed call and a plain request with its id.
    wrap.send(&charge(1, slow.clone(), "reuse-a"));
    let keyed = wrap.request(charge(1, json!({"amount":4,"currency":"EUR"}), "reuse-b"));
    assert_eq!(keyed["error"]["code"], -32600, "{keyed}");
    // (The request above took the first answer with id 1; make sure it was the refusal.)
    assert!(keyed.get("result").is_none(), "{keyed}");

    // A plain request in flight, then a keyed call with its id.
    wrap.send(&call("plain", "charge_payment", slow.clone(), None));
    let after_plain = wrap.request(charge(
        "plain",
        json!({"amount":5,"currency":"EUR"}),
        "reuse-c",
    ));
    assert_eq!(after_plain["error"]["code"], -32600, "{after_plain}");
    assert!(after_plain.get("result").is_none(), "{after_plain}");

    let original = wrap.response(&json!(1));
    charge_id(&original);
    charge_id(&wrap.response(&json!("plain")));
    // Only the two originals ran; the refused ones left their keys free.
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    let b = wrap.request(charge(2, json!({"amount":4,"currency":"EUR"}), "reuse-b"));
    charge_id(&b);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 3);
    assert_no_panic(&wrap);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn a_response_nobody_asked_for_passes_through() {
    let sandbox = Sandbox::new();
    // A fake upstream: the demo server, after a response to an id no request used.
    let script = format!(
        r#"printf '%s\n' '{{"jsonrpc":"2.0","id":"nobody-asked","result":{{"stray":true}}}}'; exec {} demo-server --ledger {}"#,
        sh_quote(EXE),
        sh_quote(sandbox.ledger())
    );
    let mut command = sandbox.wrap_command(&[], &["sh".into(), "-c".into(), script.into()]);
    command.env("MCP_IDEM_LOG", "warn,mcp_idempotency::interceptor=debug");
    let mut wrap = StdioPeer::spawn(command, &sandbox.path("wrap.stray.stderr"));
    let stray = wrap
        .try_response(&json!("nobody-asked"), TIMEOUT)
        .expect("the stray response passes through");
    assert_eq!(stray["result"], json!({"stray": true}));
    // ... and logged (at debug level).
    crate::support::wrap::wait_until("the stray response is logged", TIMEOUT, || {
        wrap.stderr()
            .contains("passing through a response to no known request")
    });
    assert_still_serving(&mut wrap, 1, "after-stray");
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_no_panic(&wrap);
    assert_eq!(wrap.finish().code(), Some(0));
}
