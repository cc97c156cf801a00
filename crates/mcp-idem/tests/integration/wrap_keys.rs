//! `mcp-idem wrap` around the demo payment server: what a key does to a `tools/call`. Executions are
//! counted in the demo server's ledger (one line per executed charge).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::common::{ledger_lines, meta_2026};
use crate::support::wrap::{
    assert_rejected, call, captured, charge, charge_id, raw_outcome, wait_until, Sandbox,
};

#[test]
fn a_keyed_charge_executes_once_and_retries_replay_it_byte_for_byte() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let key = "order-1";

    let first = wrap.request(charge(1, json!({"amount":4200,"currency":"usd"}), key));
    let charged = charge_id(&first);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    let original = raw_outcome(&wrap, &json!(1));

    // Same key, new JSON-RPC id: the recorded result, byte for byte, under the new id.
    let retry = wrap.request(charge(2, json!({"amount":4200,"currency":"usd"}), key));
    assert_eq!(retry["id"], 2);
    assert_eq!(raw_outcome(&wrap, &json!(2)), original);

    // Equal arguments written differently replay too: `1` vs `1.0` (and an exponent), reordered
    // members, whitespace, escapes, another `_meta`, a string id.
    let meta = meta_2026().to_string();
    for (id, arguments) in [
        (3, r#"{"currency":"usd","amount":4200.0}"#),
        (4, r#"{ "amount" : 4.2e3 , "currency" : "\u0075sd" }"#),
        (5, r#"{"currency":"usd","amount":42000e-1}"#),
    ] {
        wrap.send_raw(&format!(
            r#"{{"params":{{"idempotencyKey":"{key}","arguments":{arguments},"name":"charge_payment","_meta":{meta}}},"method":"tools/call","id":{id},"jsonrpc":"2.0"}}"#
        ));
        let replay = wrap.response(&json!(id));
        assert_eq!(charge_id(&replay), charged, "{arguments}");
        assert_eq!(raw_outcome(&wrap, &json!(id)), original, "{arguments}");
    }
    let string_id = wrap.request(charge("six", json!({"amount":4200,"currency":"usd"}), key));
    assert_eq!(string_id["id"], "six");
    assert_eq!(raw_outcome(&wrap, &json!("six")), original);

    // Same key, different arguments or another tool: a conflict; nothing runs.
    for (id, message) in [
        (7, charge(7, json!({"amount":4201,"currency":"usd"}), key)),
        (8, charge(8, json!({"amount":4200,"currency":"USD"}), key)),
        (9, charge(9, json!({"amount":4200}), key)),
        (10, call(10, "noop", json!({}), Some(json!(key)))),
    ] {
        let conflict = wrap.request(message);
        assert_rejected(&conflict, -32602, "idempotency_key_conflict", Some(key));
        assert_eq!(conflict["id"], id);
    }
    // ... and the original is still replayed after the conflicts.
    let last = wrap.request(charge(11, json!({"amount":4200,"currency":"usd"}), key));
    assert_eq!(raw_outcome(&wrap, &json!(11)), original);
    assert_eq!(charge_id(&last), charged);

    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn a_failed_call_is_replayed_as_the_same_error() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let arguments = json!({"amount":7,"currency":"EUR","fail_after_charge":true});

    let first = wrap.request(charge(1, arguments.clone(), "fails-1"));
    assert!(first.get("result").is_none(), "{first}");
    assert_eq!(first["error"]["code"], -32603, "{first}");
    let charged = first["error"]["data"]["chargeId"]
        .as_str()
        .unwrap()
        .to_owned();

    let retry = wrap.request(charge(2, arguments, "fails-1"));
    assert_eq!(raw_outcome(&wrap, &json!(2)), raw_outcome(&wrap, &json!(1)));
    assert_eq!(retry["error"], first["error"]);

    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "the failed charge ran once: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn invalid_keys_are_refused_before_anything_runs() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let arguments = json!({"amount":1,"currency":"EUR"});
    let too_long = "k".repeat(256);
    let one_megabyte = "k".repeat(1 << 20);
    let invalid = [
        json!(7),
        json!(1.5),
        json!(null),
        json!(""),
        json!(too_long),
        json!(one_megabyte),
        json!({"key":"k"}),
        json!(["k"]),
        json!(true),
        json!("line\nbreak"),
        json!("tab\there"),
        json!("nul\u{0}byte"),
        json!("esc\u{1b}[31m"),
        json!("del\u{7f}"),
    ];
    for (id, key) in invalid.iter().enumerate() {
        let response = wrap.request(call(
            id,
            "charge_payment",
            arguments.clone(),
            Some(key.clone()),
        ));
        let error = assert_rejected(&response, -32602, "idempotency_key_invalid", None);
        if key.as_str() == Some(too_long.as_str()) || key.as_str() == Some(one_megabyte.as_str()) {
            assert!(
                error["data"].get("idempotencyKey").is_none(),
                "an over-long key is not echoed: {} bytes",
                response.to_string().len()
            );
            assert!(response.to_string().len() < 4096, "the answer stays small");
        }
    }
    assert!(
        ledger_lines(&sandbox.ledger()).is_empty(),
        "no invalid key reached the server"
    );

    // The limits: 255 bytes is fine, and so is any printable Unicode.
    let longest = "k".repeat(255);
    for (id, key) in [(100, longest.as_str()), (101, "ключ-🔑")] {
        let response = wrap.request(charge(id, arguments.clone(), key));
        charge_id(&response);
    }
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn calls_without_a_key_execute_every_time() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let arguments = json!({"amount":3,"currency":"EUR"});
    let first = wrap.request(call(1, "charge_payment", arguments.clone(), None));
    let second = wrap.request(call(2, "charge_payment", arguments, None));
    assert_ne!(charge_id(&first), charge_id(&second));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    assert_eq!(wrap.finish().code(), Some(0));
}

/// What the upstream receives, captured with `tee` between `wrap` and the demo server.
#[test]
fn the_key_reaches_the_server_in_meta_only_unless_forwarded() {
    for forward in [false, true] {
        let sandbox = Sandbox::new();
        let capture = sandbox.path("upstream.jsonl");
        let options: &[&str] = if forward { &["--forward-key"] } else { &[] };
        let mut wrap = sandbox.wrap(
            options,
            &sandbox.demo_with_capture(&sandbox.ledger(), &capture),
        );
        let arguments = json!({"amount":12,"currency":"EUR"});
        let first = wrap.request(charge(1, arguments.clone(), "k-meta"));
        let replay = wrap.request(charge(2, arguments.clone(), "k-meta"));
        assert_eq!(charge_id(&first), charge_id(&replay));
        let unkeyed = call(3, "charge_payment", arguments.clone(), None);
        wrap.request(unkeyed.clone());
        assert_eq!(wrap.finish().code(), Some(0));

        // `wrap` exited after its upstream (`sh`, which waits for `tee`): the capture is complete.
        wait_until("tee captures both calls", Duration::from_secs(5), || {
            captured(&capture)
                .iter()
                .filter(|line| line["method"] == "tools/call")
                .count()
                >= 2
        });
        let lines = captured(&capture);
        let calls: Vec<&Value> = lines
            .iter()
            .filter(|line| line["method"] == "tools/call")
            .collect();
        assert_eq!(
            calls.len(),
            2,
            "the replay (id 2) never reaches the server: {lines:?}"
        );
        let keyed = calls[0];
        assert_eq!(keyed["id"], 1);
        let params = &keyed["params"];
        assert_eq!(params["arguments"], arguments);
        assert_eq!(params["name"], "charge_payment");
        assert_eq!(
            params["_meta"]["mcp-idem/idempotencyKey"], "k-meta",
            "{keyed}"
        );
        for (name, value) in meta_2026().as_object().unwrap() {
            assert_eq!(
                params["_meta"][name], *value,
                "the client's _meta is kept: {keyed}"
            );
        }
        if forward {
            assert_eq!(params["idempotencyKey"], "k-meta", "{keyed}");
        } else {
            assert!(params.get("idempotencyKey").is_none(), "{keyed}");
        }
        // A call without a key is forwarded untouched.
        assert_eq!(*calls[1], unkeyed);
        assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    }
}

/// Outcomes are kept for `--retention`; after that the key is new again (the SEP allows it).
#[test]
fn a_key_is_new_again_once_its_retention_ran_out() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&["--retention", "1s"]);
    let arguments = json!({"amount":8,"currency":"EUR"});
    let first = charge_id(&wrap.request(charge(1, arguments.clone(), "short-lived")));
    assert_eq!(
        charge_id(&wrap.request(charge(2, arguments.clone(), "short-lived"))),
        first
    );
    std::thread::sleep(Duration::from_millis(1100));
    let later = charge_id(&wrap.request(charge(3, arguments, "short-lived")));
    assert_ne!(later, first);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    assert_eq!(wrap.finish().code(), Some(0));
}
