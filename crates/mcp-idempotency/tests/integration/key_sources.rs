//! Key sources for calls that carry no SEP key (issue 34), through the embedded driver (the
//! interceptor, the deduplicator and a real store, as `wrap`, `proxy` and the bindings use them):
//! the business identifier, the `_meta` carrier, the key argument, the duplicate window; what a
//! key-less duplicate, an error outcome and a store outage get; and bad input.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::embedded::{Embedded, FromClient, FromServer, Settings};
use mcp_idempotency::interceptor::{InterceptorConfig, META_KEY};
use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::{Deduplicator, EngineConfig, Scope, REPLAYED_META};
use serde_json::{json, Value};

use crate::deduplicator::failing_store::FlakyStore;
use crate::embedded::{answer, error_type, forwarded, responded};

async fn gateway(tools: Value) -> Embedded {
    let mut settings = Settings::new("key-sources");
    settings.set("store", "memory").unwrap();
    settings.set("tools", &tools.to_string()).unwrap();
    settings.open().await.unwrap()
}

fn call(id: u64, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

fn charge(id: u64, order: Value, amount: u64) -> String {
    call(
        id,
        json!({"name": "charge", "arguments": {"order_id": order, "amount": amount}}),
    )
}

fn failed(id: u64, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id,
           "result": {"content": [{"type": "text", "text": text}], "isError": true}})
    .to_string()
}

fn text(response: &Value) -> &str {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_business_identifier_decides_even_over_a_fresh_client_key_per_call() {
    let gateway = gateway(json!({"charge": {"key-from": ["/order_id"]}})).await;
    let first = gateway.connect(None);
    let mut params = json!({"name": "charge", "arguments": {"order_id": "ord_1", "amount": 5},
                            "idempotencyKey": "model-attempt-1"});
    let sent = forwarded(first.from_client(&call(1, params.clone())).await);
    let key = sent["params"]["_meta"][META_KEY]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(key.starts_with("charge:"), "{key}");
    assert!(!key.contains('\u{1f}'));
    assert_eq!(
        first.from_server(&answer(1, "ch_1")).await,
        FromServer::Forward
    );

    // A model-style retry: a new request, a new key, the same identifier (spelled otherwise).
    params["idempotencyKey"] = json!("model-attempt-2");
    params["arguments"] = json!({"amount": 5.0, "order_id": "ord\u{5f}1"});
    let retry = gateway.connect(None);
    let replay = responded(retry.from_client(&call(2, params)).await);
    assert_eq!(text(&replay), "ch_1");
    assert_eq!(replay["result"]["_meta"][REPLAYED_META], "key-from");

    // The identifier with another amount is a conflict that names the identifier.
    let conflict = responded(retry.from_client(&charge(3, json!("ord_1"), 6)).await);
    assert_eq!(error_type(&conflict), "idempotency_key_conflict");
    let message = conflict["error"]["message"].as_str().unwrap();
    assert!(message.contains(r#"/order_id = "ord_1""#), "{message}");

    // Another identifier is another operation.
    let _ = forwarded(retry.from_client(&charge(4, json!("ord_2"), 5)).await);
}

#[tokio::test]
async fn numbers_in_an_identifier_compare_as_exact_decimals() {
    let gateway = gateway(json!({"charge": {"key-from": ["/order_id", "/amount"]}})).await;
    let connection = gateway.connect(None);
    let _ = forwarded(connection.from_client(&charge(1, json!(17), 5)).await);
    let _ = connection.from_server(&answer(1, "ch_17")).await;
    let same = call(
        2,
        json!({"name": "charge",
                              "arguments": {"order_id": 17.0, "amount": 5e0}}),
    );
    // serde_json writes 17.0 and 5.0: the same decimals as 17 and 5.
    assert_eq!(
        text(&responded(connection.from_client(&same).await)),
        "ch_17"
    );
    let _ = forwarded(connection.from_client(&charge(3, json!("17"), 5)).await);
}

#[tokio::test]
async fn a_meta_key_is_a_clients_key_replayed_byte_for_byte() {
    let gateway = gateway(json!({})).await;
    let a = gateway.connect(None);
    let keyed = |id, amount| {
        call(
            id,
            json!({"name": "charge", "arguments": {"amount": amount},
                        "_meta": {"idempotencyKey": "meta-1", "progressToken": 7}}),
        )
    };
    let sent = forwarded(a.from_client(&keyed(1, 5)).await);
    assert_eq!(sent["params"]["_meta"]["idempotencyKey"], "meta-1");
    assert_eq!(sent["params"]["_meta"][META_KEY], "meta-1");
    assert_eq!(sent["params"]["_meta"]["progressToken"], 7);

    // In progress at once (a client's key: it can retry), then the outcome as it was.
    let b = gateway.connect(None);
    let busy = responded(b.from_client(&keyed(2, 5)).await);
    assert_eq!(error_type(&busy), "idempotency_key_in_progress");
    let _ = a.from_server(&answer(1, "ch_meta")).await;
    let replay = responded(b.from_client(&keyed(3, 5)).await);
    assert_eq!(
        replay,
        json!({"jsonrpc": "2.0", "id": 3,
               "result": {"content": [{"type": "text", "text": "ch_meta"}]}})
    );
    let conflict = responded(b.from_client(&keyed(4, 6)).await);
    assert_eq!(error_type(&conflict), "idempotency_key_conflict");

    // Not a string: refused before anything runs, naming the carrier.
    let bad = call(
        5,
        json!({"name": "charge", "_meta": {"idempotencyKey": 42}}),
    );
    let refused = responded(b.from_client(&bad).await);
    assert_eq!(error_type(&refused), "idempotency_key_invalid");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("_meta"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_meta_key_never_names_a_sep_keys_record_nor_a_derived_one() {
    let gateway = gateway(json!({})).await;
    let connection = gateway.connect(None);
    let sep = call(1, json!({"name": "charge", "idempotencyKey": "k"}));
    let _ = forwarded(connection.from_client(&sep).await);
    let _ = connection.from_server(&answer(1, "sep")).await;
    let meta = call(
        2,
        json!({"name": "charge", "_meta": {"idempotencyKey": "k"}}),
    );
    let _ = forwarded(connection.from_client(&meta).await);
}

#[tokio::test]
async fn more_meta_names_by_option() {
    let mut settings = Settings::new("key-sources");
    settings.set("store", "memory").unwrap();
    settings
        .set("meta-key", "io.mcp-gateway/idempotency-key")
        .unwrap();
    let gateway = settings.open().await.unwrap();
    let connection = gateway.connect(None);
    let keyed = |id| {
        call(
            id,
            json!({"name": "charge",
                        "_meta": {"io.mcp-gateway/idempotency-key": "gw-1"}}),
        )
    };
    let _ = forwarded(connection.from_client(&keyed(1)).await);
    let _ = connection.from_server(&answer(1, "gw")).await;
    assert_eq!(
        text(&responded(connection.from_client(&keyed(2)).await)),
        "gw"
    );
}

#[tokio::test]
async fn a_key_argument_reaches_the_tool_and_decides() {
    let gateway = gateway(json!({"refund": {"key-argument": "idempotency_key"}})).await;
    let connection = gateway.connect(None);
    let refund = |id, key: Value, amount| {
        call(
            id,
            json!({"name": "refund",
                        "arguments": {"idempotency_key": key, "amount": amount}}),
        )
    };
    let sent = forwarded(connection.from_client(&refund(1, json!("rk-1"), 5)).await);
    assert_eq!(sent["params"]["arguments"]["idempotency_key"], "rk-1");
    assert_eq!(sent["params"]["_meta"][META_KEY], "refund:rk-1");
    let _ = connection.from_server(&answer(1, "re_1")).await;
    let replay = responded(connection.from_client(&refund(2, json!("rk-1"), 5)).await);
    assert_eq!(replay["result"]["_meta"][REPLAYED_META], "argument");
    let conflict = responded(connection.from_client(&refund(3, json!("rk-1"), 6)).await);
    assert_eq!(error_type(&conflict), "idempotency_key_conflict");
    assert!(conflict["error"]["message"]
        .as_str()
        .unwrap()
        .contains("idempotency_key"));

    // An empty key argument is missing, as an absent one is: it runs unprotected.
    let empty = refund(4, json!(""), 5);
    assert_eq!(connection.from_client(&empty).await, FromClient::Forward);
    let absent = call(5, json!({"name": "refund", "arguments": {"amount": 5}}));
    assert_eq!(connection.from_client(&absent).await, FromClient::Forward);
}

#[tokio::test]
async fn required_refuses_a_call_without_its_identifier_and_runs_nothing() {
    let gateway = gateway(json!({"charge": {"key-from": "/order_id", "required": true}})).await;
    let connection = gateway.connect(None);
    for arguments in [json!({"amount": 5}), json!({"order_id": null}), json!(null)] {
        let missing = call(1, json!({"name": "charge", "arguments": arguments}));
        let refused = responded(connection.from_client(&missing).await);
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("/order_id") && message.contains("nothing ran"),
            "{message}"
        );
    }
    // Without `required`, it runs unprotected.
    let lenient = gateway_without_required().await;
    let connection = lenient.connect(None);
    let missing = call(1, json!({"name": "charge", "arguments": {"amount": 5}}));
    assert_eq!(connection.from_client(&missing).await, FromClient::Forward);
}

async fn gateway_without_required() -> Embedded {
    gateway(json!({"charge": {"key-from": "/order_id"}})).await
}

#[tokio::test]
async fn an_identifier_that_is_an_object_or_an_array_is_refused() {
    let gateway = gateway(json!({"charge": {"key-from": "/order"}})).await;
    let connection = gateway.connect(None);
    for (order, kind) in [(json!({"id": 1}), "object"), (json!([1]), "array")] {
        let bad = call(1, json!({"name": "charge", "arguments": {"order": order}}));
        let refused = responded(connection.from_client(&bad).await);
        assert_eq!(refused["error"]["code"], -32602);
        assert!(
            refused["error"]["message"].as_str().unwrap().contains(kind),
            "{refused}"
        );
    }
    // A pointer may reach into them.
    let deep = gateway_with(json!({"charge": {"key-from": ["/order/id", "/items/1"]}})).await;
    let connection = deep.connect(None);
    let nested = call(
        1,
        json!({"name": "charge",
                                "arguments": {"order": {"id": "o"}, "items": ["a", "b"]}}),
    );
    let _ = forwarded(connection.from_client(&nested).await);
}

async fn gateway_with(tools: Value) -> Embedded {
    gateway(tools).await
}

#[tokio::test]
async fn a_window_merges_identical_calls_and_lets_them_run_again_after_it() {
    let gateway = gateway(json!({"notify": {"window": "1s"}})).await;
    let connection = gateway.connect(None);
    let send = |id| {
        call(
            id,
            json!({"name": "notify", "arguments": {"to": "bob", "text": "hi"}}),
        )
    };
    let sent = forwarded(connection.from_client(&send(1)).await);
    assert!(sent["params"]["_meta"][META_KEY]
        .as_str()
        .unwrap()
        .starts_with("notify:"));
    let _ = connection.from_server(&answer(1, "sent")).await;
    let merged = responded(connection.from_client(&send(2)).await);
    assert_eq!(merged["result"]["_meta"][REPLAYED_META], "window");
    // Other arguments are another call.
    let other = call(
        3,
        json!({"name": "notify", "arguments": {"to": "bob", "text": "bye"}}),
    );
    let _ = forwarded(connection.from_client(&other).await);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _ = forwarded(connection.from_client(&send(4)).await);
}

#[tokio::test]
async fn a_keyless_duplicate_waits_for_the_running_call_and_gets_its_outcome() {
    let gateway = gateway(json!({"charge": {"key-from": "/order_id", "wait": "10s"}})).await;
    let first = gateway.connect(None);
    let _ = forwarded(first.from_client(&charge(1, json!("o"), 5)).await);
    let second = gateway.connect(None);
    let waiting = tokio::spawn(async move { second.from_client(&charge(2, json!("o"), 5)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    let _ = first.from_server(&answer(1, "ch_o")).await;
    let got = responded(waiting.await.unwrap());
    assert_eq!(got["id"], 2);
    assert_eq!(text(&got), "ch_o");

    // With `wait = "0s"`, in progress at once, as for a client's key.
    let impatient = gateway_with(json!({"charge": {"key-from": "/order_id", "wait": "0s"}})).await;
    let a = impatient.connect(None);
    let _ = forwarded(a.from_client(&charge(1, json!("o"), 5)).await);
    let busy = responded(
        impatient
            .connect(None)
            .from_client(&charge(2, json!("o"), 5))
            .await,
    );
    assert_eq!(error_type(&busy), "idempotency_key_in_progress");
}

#[tokio::test]
async fn an_error_outcome_is_replayed_by_default_and_forgotten_when_the_tool_says_so() {
    let replaying = gateway(json!({"charge": {"key-from": "/order_id"}})).await;
    let connection = replaying.connect(None);
    let _ = forwarded(connection.from_client(&charge(1, json!("o"), 5)).await);
    let _ = connection.from_server(&failed(1, "card declined")).await;
    let replay = responded(connection.from_client(&charge(2, json!("o"), 5)).await);
    assert_eq!(replay["result"]["isError"], true);

    let forgetting =
        gateway(json!({"charge": {"key-from": "/order_id", "on-error": "forget"}})).await;
    let connection = forgetting.connect(None);
    let _ = forwarded(connection.from_client(&charge(1, json!("o"), 5)).await);
    let _ = connection.from_server(&failed(1, "card declined")).await;
    let _ = forwarded(connection.from_client(&charge(2, json!("o"), 5)).await);
    let error = json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32603, "message": "boom"}});
    let _ = connection.from_server(&error.to_string()).await;
    let _ = forwarded(connection.from_client(&charge(3, json!("o"), 5)).await);
    let _ = connection.from_server(&answer(3, "ch_3")).await;
    // A success is kept.
    assert_eq!(
        text(&responded(
            connection.from_client(&charge(4, json!("o"), 5)).await
        )),
        "ch_3"
    );
}

#[tokio::test]
async fn a_store_outage_fails_closed_by_default_or_runs_unprotected_when_the_tool_says_so() {
    let store = Arc::new(FlakyStore::default());
    store.fail_claim.store(true, Ordering::SeqCst);
    let policies = ToolPolicies::from_json(&json!({
        "charge": {"key-from": "/order_id"},
        "notify": {"window": "30s", "store-down": "run-unprotected"},
    }))
    .unwrap();
    let gateway = Embedded::new(
        Deduplicator::new(EngineConfig::default(), store),
        Scope::new("key-sources", "alice"),
        InterceptorConfig::default().tool_policies(policies),
    );
    let connection = gateway.connect(None);
    let refused = responded(connection.from_client(&charge(1, json!("o"), 5)).await);
    assert_eq!(error_type(&refused), "idempotency_store_unavailable");
    let notify = call(2, json!({"name": "notify", "arguments": {"to": "bob"}}));
    let sent = forwarded(connection.from_client(&notify).await);
    assert!(sent["params"]["_meta"].get(META_KEY).is_none(), "{sent}");
    // A SEP key is never run unprotected, whatever the tool's policy.
    let keyed = call(
        3,
        json!({"name": "notify", "arguments": {"to": "bob"}, "idempotencyKey": "k"}),
    );
    let refused = responded(connection.from_client(&keyed).await);
    assert_eq!(error_type(&refused), "idempotency_store_unavailable");
}

#[tokio::test]
async fn a_long_derived_key_is_hashed_not_refused() {
    let mut settings = Settings::new("key-sources");
    settings.set("store", "memory").unwrap();
    settings.set("max-key-bytes", "16").unwrap();
    settings
        .set(
            "tools",
            &json!({"charge": {"key-argument": "k"}}).to_string(),
        )
        .unwrap();
    let gateway = settings.open().await.unwrap();
    let connection = gateway.connect(None);
    // The argument itself is a client's key: it obeys the limit.
    let long = call(
        1,
        json!({"name": "charge", "arguments": {"k": "x".repeat(17)}}),
    );
    assert_eq!(
        error_type(&responded(connection.from_client(&long).await)),
        "idempotency_key_invalid"
    );
    // Within the limit, the key with the tool's name is longer: hashed.
    let ok = call(
        2,
        json!({"name": "charge", "arguments": {"k": "x".repeat(16)}}),
    );
    let sent = forwarded(connection.from_client(&ok).await);
    let key = sent["params"]["_meta"][META_KEY].as_str().unwrap();
    assert!(key.starts_with("sha256:"), "{key}");
}

#[tokio::test]
async fn calls_no_policy_names_pass_untouched() {
    let gateway = gateway(json!({"charge": {"key-from": "/order_id"}})).await;
    let connection = gateway.connect(None);
    let other = call(1, json!({"name": "lookup", "arguments": {"order_id": "o"}}));
    assert_eq!(connection.from_client(&other).await, FromClient::Forward);
}

#[tokio::test]
async fn a_clients_own_key_beside_a_business_identifier_keeps_the_seps_rules() {
    let gateway = gateway(json!({"charge": {"key-from": ["/order_id"]}})).await;
    let connection = gateway.connect(None);
    let keyed = |id, order: &str, amount, key: &str| {
        call(
            id,
            json!({"name": "charge", "idempotencyKey": key,
                        "arguments": {"order_id": order, "amount": amount}}),
        )
    };
    let _ = forwarded(connection.from_client(&keyed(1, "o1", 5, "K")).await);
    let _ = connection.from_server(&answer(1, "ch_o1")).await;

    // The client's key reused for another order: the SEP's conflict, though the order is new.
    let reused = responded(connection.from_client(&keyed(2, "o2", 5, "K")).await);
    assert_eq!(error_type(&reused), "idempotency_key_conflict");
    assert_eq!(reused["error"]["data"]["idempotencyKey"], "K");

    // A retry with the client's key replays byte for byte (no marker) ...
    let retry = responded(connection.from_client(&keyed(3, "o1", 5, "K")).await);
    assert_eq!(text(&retry), "ch_o1");
    assert!(retry["result"].get("_meta").is_none(), "{retry}");
    // ... and a model-style retry with a fresh key replays by the identifier, marked.
    let fresh = responded(connection.from_client(&keyed(4, "o1", 5, "K2")).await);
    assert_eq!(text(&fresh), "ch_o1");
    assert_eq!(fresh["result"]["_meta"][REPLAYED_META], "key-from");
    // A key in `_meta` is the client's too (a key space of its own: not the SEP's "K").
    let meta = |id, order: &str| {
        call(
            id,
            json!({"name": "charge", "_meta": {"idempotencyKey": "K"},
                        "arguments": {"order_id": order, "amount": 5}}),
        )
    };
    let _ = forwarded(connection.from_client(&meta(5, "o3")).await);
    let _ = connection.from_server(&answer(5, "ch_o3")).await;
    assert_eq!(
        error_type(&responded(connection.from_client(&meta(7, "o5")).await)),
        "idempotency_key_conflict"
    );
    // An invalid client key is refused as the SEP says, whatever the identifier.
    let invalid = responded(connection.from_client(&keyed(6, "o4", 5, "")).await);
    assert_eq!(error_type(&invalid), "idempotency_key_invalid");
}

#[tokio::test]
async fn a_call_keyed_before_its_tool_had_a_policy_is_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("records.sqlite3").display());
    let open = |tools: Option<Value>| {
        let store = store.clone();
        async move {
            let mut settings = Settings::new("key-sources");
            settings.set("store", &store).unwrap();
            if let Some(tools) = tools {
                settings.set("tools", &tools.to_string()).unwrap();
            }
            settings.open().await.unwrap()
        }
    };
    let keyed = call(
        1,
        json!({"name": "charge", "idempotencyKey": "before",
                               "arguments": {"order_id": "o", "amount": 5}}),
    );
    let old = open(None).await;
    let connection = old.connect(None);
    let _ = forwarded(connection.from_client(&keyed).await);
    let _ = connection.from_server(&answer(1, "ch_before")).await;

    let new = open(Some(json!({"charge": {"key-from": "/order_id"}}))).await;
    let retry = responded(new.connect(None).from_client(&keyed).await);
    assert_eq!(text(&retry), "ch_before");
}

#[tokio::test]
async fn a_waiting_duplicate_says_so_and_does_not_hold_up_the_messages_after_it() {
    let gateway = gateway(json!({"charge": {"key-from": "/order_id", "wait": "10s"},
                                 "quick": {"key-from": "/order_id", "wait": "0s"}}))
    .await;
    let running = gateway.connect(None);
    let _ = forwarded(running.from_client(&charge(1, json!("o"), 5)).await);

    // A driver that hands every message over in order (one stdio session, say) and decides the
    // ones that may wait beside the others.
    let session = Arc::new(gateway.connect(None));
    let duplicate = session.receive(&charge(7, json!("o"), 5));
    assert!(duplicate.may_wait());
    let deciding = {
        let session = Arc::clone(&session);
        tokio::spawn(async move { session.decide(duplicate).await })
    };
    // The client's answer to the running call's elicitation passes while the duplicate waits.
    let elicited = json!({"jsonrpc": "2.0", "id": "elicit-1",
                          "result": {"action": "accept", "content": {"ok": true}}})
    .to_string();
    let answer_to_server = session.receive(&elicited);
    assert!(!answer_to_server.may_wait());
    assert_eq!(session.decide(answer_to_server).await, FromClient::Forward);
    assert!(!deciding.is_finished());
    let _ = running.from_server(&answer(1, "ch_o")).await;
    let got = responded(deciding.await.unwrap());
    assert_eq!((got["id"].clone(), text(&got)), (json!(7), "ch_o"));

    // A client's key (SEP or `_meta`) is answered in progress at once: it never waits.
    let sep = call(8, json!({"name": "charge", "idempotencyKey": "k"}));
    assert!(!session.receive(&sep).may_wait());
    let meta = call(
        9,
        json!({"name": "other", "_meta": {"idempotencyKey": "k"}}),
    );
    assert!(!session.receive(&meta).may_wait());
    // Nor does a tool whose `wait` is 0s, nor a call no policy names.
    assert!(!session
        .receive(&call(
            10,
            json!({"name": "quick", "arguments": {"order_id": "o"}})
        ))
        .may_wait());
    assert!(!session
        .receive(&call(11, json!({"name": "lookup"})))
        .may_wait());
}

/// A call is let through unparsed only when its params start with `name` and nothing after could
/// name another tool: whichever way the client writes the params, the tool decided on is the one
/// the server reads (the last `name`, escapes resolved).
#[tokio::test]
async fn the_tool_a_policy_applies_to_is_found_however_the_params_are_written() {
    let gateway = gateway(json!({"charge": {"key-from": "/order_id"}})).await;
    let connection = gateway.connect(None);
    let params = [
        r#"{"arguments":{"order_id":"o1"},"name":"charge"}"#,
        r#"{"name":"ch\u0061rge","arguments":{"order_id":"o2"}}"#,
        r#"{"name":"lookup","arguments":{"order_id":"o3"},"name":"charge"}"#,
        r#"{"name":"lookup","arguments":{"order_id":"o4"},"n\u0061me":"charge"}"#,
        r#" { "name" : "charge" , "arguments" : {"order_id":"o5"} }"#,
    ];
    for (id, params) in (1..).zip(params) {
        let message =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#);
        let sent = forwarded(connection.from_client(&message).await);
        let key = sent["params"]["_meta"][META_KEY]
            .as_str()
            .unwrap_or_default();
        assert!(key.starts_with("charge:"), "{params}: {key}");
        let _ = connection.from_server(&answer(id, "ok")).await;
    }
    // Named first, and `name` elsewhere only as an argument: still looked at whole.
    let message = call(9, json!({"name": "lookup", "arguments": {"name": "Ada"}}));
    assert_eq!(connection.from_client(&message).await, FromClient::Forward);
}

#[tokio::test]
async fn a_duplicate_carrying_its_own_key_is_answered_at_once_naming_that_key() {
    let gateway = gateway(json!({"charge": {"key-from": "/order_id", "wait": "10s"}})).await;
    let keyed = |id, key: &str| {
        call(
            id,
            json!({"name": "charge", "idempotencyKey": key,
                        "arguments": {"order_id": "o", "amount": 5}}),
        )
    };
    let first = gateway.connect(None);
    let _ = forwarded(first.from_client(&keyed(1, "K1")).await);
    // The client can retry with its key: no wait, and the error names its key.
    let busy = tokio::time::timeout(
        Duration::from_secs(5),
        gateway.connect(None).from_client(&keyed(2, "K2")),
    )
    .await
    .expect("answered at once");
    let busy = responded(busy);
    assert_eq!(error_type(&busy), "idempotency_key_in_progress");
    assert_eq!(busy["error"]["data"]["idempotencyKey"], "K2");
}
