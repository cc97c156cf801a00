//! `mcp-idem wrap` advertises SEP-3182 in both protocol eras: the legacy `initialize` result and the
//! 2026-07-28 `server/discover` result get `capabilities.tools.idempotency = {}`, and every other
//! member is the upstream's, unchanged. Each test compares the wrapped answer with the answer of
//! the bare demo server to the same request.

use serde_json::{json, Value};

use crate::support::common::{meta_2026, StdioPeer};
use crate::support::wrap::{charge_id, discover, legacy_initialize, raw_outcome, Sandbox};

/// `response["result"]` of the bare demo server, with `tools.idempotency = {}` added.
fn expected_with_capability(bare: &Value) -> Value {
    let mut expected = bare["result"].clone();
    assert!(
        expected["capabilities"]["tools"].is_object(),
        "the demo server has a tools capability: {bare}"
    );
    expected["capabilities"]["tools"]["idempotency"] = json!({});
    expected
}

#[test]
fn legacy_initialize_advertises_idempotency_and_keeps_the_rest() {
    let sandbox = Sandbox::new();
    let mut bare = StdioPeer::demo_server(&sandbox.path("bare-ledger.jsonl"));
    let bare_init = bare.request(legacy_initialize(1));
    let mut wrapped = sandbox.wrap_demo(&[]);
    let init = wrapped.request(legacy_initialize(1));

    let result = &init["result"];
    assert_eq!(
        result["capabilities"]["tools"]["idempotency"],
        json!({}),
        "{init}"
    );
    assert_eq!(result["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(
        result["serverInfo"]["name"], "mcp-idem-demo-server",
        "{init}"
    );
    assert!(result["instructions"].is_string(), "{init}");
    assert_eq!(*result, expected_with_capability(&bare_init), "{init}");
    assert_eq!(init["jsonrpc"], "2.0");
    assert_eq!(init["id"], 1);

    // The rest of the legacy session passes through: tools/list is the upstream's.
    for peer in [&mut bare, &mut wrapped] {
        peer.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    }
    let list = json!({"jsonrpc":"2.0","id":2,"method":"tools/list"});
    let bare_list = bare.request(list.clone());
    let wrapped_list = wrapped.request(list);
    assert_eq!(wrapped_list, bare_list);

    // Keyed calls work in this era too (no per-request `_meta`).
    let keyed = |id: u64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"charge_payment","arguments":{"amount":5,"currency":"EUR"},
            "idempotencyKey":"legacy-1"}})
    };
    let first = wrapped.request(keyed(3));
    let id = charge_id(&first);
    let again = wrapped.request(keyed(4));
    assert_eq!(charge_id(&again), id);
    assert_eq!(
        raw_outcome(&wrapped, &json!(4)),
        raw_outcome(&wrapped, &json!(3))
    );
    assert_eq!(
        crate::support::common::ledger_lines(&sandbox.ledger()).len(),
        1
    );

    assert_eq!(bare.finish().code(), Some(0));
    assert_eq!(wrapped.finish().code(), Some(0));
}

#[test]
fn server_discover_advertises_idempotency_and_keeps_the_rest() {
    let sandbox = Sandbox::new();
    let mut bare = StdioPeer::demo_server(&sandbox.path("bare-ledger.jsonl"));
    let bare_discover = bare.request(discover(1));
    let mut wrapped = sandbox.wrap_demo(&[]);
    let response = wrapped.request(discover(1));

    let result = &response["result"];
    assert_eq!(
        result["capabilities"]["tools"]["idempotency"],
        json!({}),
        "{response}"
    );
    assert_eq!(result["resultType"], "complete", "{response}");
    assert!(
        result["supportedVersions"]
            .as_array()
            .is_some_and(|versions| versions.contains(&json!("2026-07-28"))),
        "{response}"
    );
    assert!(result["ttlMs"].is_u64(), "{response}");
    assert!(result["cacheScope"].is_string(), "{response}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcp-idem-demo-server",
        "{response}"
    );
    assert_eq!(
        *result,
        expected_with_capability(&bare_discover),
        "{response}"
    );

    // A string id is matched too, and discovery can be repeated.
    let again = wrapped.request(discover("discover-2"));
    assert_eq!(again["id"], "discover-2");
    assert_eq!(again["result"], *result);

    // A discover that the upstream rejects (no `_meta`) is passed through untouched.
    let bare_error = bare.request(json!({"jsonrpc":"2.0","id":3,"method":"server/discover"}));
    let error = wrapped.request(json!({"jsonrpc":"2.0","id":3,"method":"server/discover"}));
    assert_eq!(error, bare_error);
    assert!(error.get("error").is_some(), "{error}");

    // Other requests and their ids are not mistaken for discovery.
    let list =
        json!({"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta": meta_2026()}});
    let bare_list = bare.request(list.clone());
    assert_eq!(wrapped.request(list), bare_list);

    assert_eq!(bare.finish().code(), Some(0));
    assert_eq!(wrapped.finish().code(), Some(0));
}

/// A tool policy naming a tool the server does not list is logged when the first `tools/list`
/// answer passes (once), and the answer reaches the client untouched (issue 34).
#[test]
fn a_policy_for_an_unlisted_tool_is_logged_at_the_first_tools_list() {
    let sandbox = Sandbox::new();
    let tools = r#"{"charge_paymnet": {"window": "5s"}, "charge_payment": {"window": "5s"}}"#;
    let mut wrap = sandbox.wrap_demo(&["--tools", tools]);
    let _ = wrap.request(legacy_initialize(1));
    let listed = wrap.request(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(names.contains(&"charge_payment"), "{listed}");
    crate::support::wrap::wait_for_log(&wrap, "does not list");
    let _ = wrap.request(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
    let stderr = wrap.stderr();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("does not list"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("charge_paymnet"), "{stderr}");
}
