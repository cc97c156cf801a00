//! `mcp-idem proxy` in front of the real demo server over HTTP: proves that a keyed charge runs
//! once and is replayed (new request id, original charge), that a changed call with the same key is
//! a conflict and a duplicate of a running call is refused at once, that discovery results carry
//! `capabilities.tools.idempotency`, that SSE answers are streamed through and recorded, that calls
//! without a key are not deduplicated, that an unreachable upstream (502) leaves the key free, that
//! unusable arguments get -32602, that a call that charged and then failed replays its error, and
//! that a request naming a foreign Host or Origin (DNS rebinding) is refused before anything runs.
//! The demo server's ledger counts the charges that really happened.

use serde_json::{json, Value};

use crate::support::common::ledger_lines;
use crate::support::http::{
    await_ledger, call_until_settled, charge, closed_port_url, discover, initialize, ledger_in,
    slow_charge, sqlite_in, tool_call, Answer, HttpDemo, Proxy, Raw,
};

/// Demo server + one proxy with `--store STORE`, and the ledger.
struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    _server: HttpDemo,
    proxy: Proxy,
    raw: Raw,
}

#[derive(Clone, Copy)]
enum Store {
    Sqlite,
    Memory,
}

fn setup(store: Store, demo_args: &[&str], proxy_args: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, demo_args);
    let store = match store {
        Store::Sqlite => sqlite_in(&dir),
        Store::Memory => "memory".to_owned(),
    };
    let mut args = vec!["--store", store.as_str()];
    args.extend_from_slice(proxy_args);
    let proxy = Proxy::spawn(&server.base_url(), &args);
    let raw = Raw::new(&proxy);
    Setup {
        _dir: dir,
        ledger,
        _server: server,
        proxy,
        raw,
    }
}

async fn keyed_charge_runs_once_then_replays_or_conflicts(store: Store, proxy_args: &[&str]) {
    let s = setup(store, &[], proxy_args);

    let first = s.raw.call(charge(1, 25, Some("order-1"))).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["id"], 1);
    let charge_id = first.charge_id().expect("a charge id");
    let lines = ledger_lines(&s.ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], charge_id.as_str());

    // The retry is a new JSON-RPC request: its own id, the original outcome.
    let retry = s.raw.call(charge(2, 25, Some("order-1"))).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(retry.json()["id"], 2, "{}", retry.body);
    assert_eq!(retry.charge_id().as_deref(), Some(charge_id.as_str()));
    assert_eq!(
        retry.json()["result"],
        first.json()["result"],
        "a replay is the original result"
    );

    // The same key for a different charge is refused, and nothing runs.
    let conflict = s.raw.call(charge(3, 26, Some("order-1"))).await;
    let error = &conflict.json()["error"];
    assert_eq!(conflict.json()["id"], 3);
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(error["data"]["type"], "idempotency_key_conflict", "{error}");
    assert_eq!(error["data"]["idempotencyKey"], "order-1", "{error}");
    assert_eq!(ledger_lines(&s.ledger).len(), 1);

    // A duplicate of a call still running is refused at once: whichever of the two claims the
    // key runs (1.5 s), the other is answered `in progress` first, while it still runs.
    let mut calls = tokio::task::JoinSet::new();
    for id in [4, 5] {
        let raw = s.raw.clone();
        calls.spawn(async move { raw.call(slow_charge(id, 40, 1500, Some("order-2"))).await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let refused = calls.join_next().await.unwrap().unwrap();
    let error = &refused.json()["error"];
    assert_eq!(error["code"], -32602, "{}", refused.body);
    assert_eq!(
        error["data"]["type"], "idempotency_key_in_progress",
        "{error}"
    );
    assert!(error["data"]["retryAfterMs"].is_u64(), "{error}");
    let executed = calls.join_next().await.unwrap().unwrap();
    assert_ne!(executed.json()["id"], refused.json()["id"]);
    let executed_id = executed.charge_id().expect("the executed charge");
    let lines = ledger_lines(&s.ledger);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["chargeId"], executed_id.as_str());
    // Once it is done, a retry replays it.
    let after = s.raw.call(slow_charge(6, 40, 1500, Some("order-2"))).await;
    assert_eq!(after.charge_id().as_deref(), Some(executed_id.as_str()));
    assert_eq!(ledger_lines(&s.ledger).len(), 2, "{}", s.proxy.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keyed_charge_runs_once_then_replays_or_conflicts() {
    keyed_charge_runs_once_then_replays_or_conflicts(Store::Sqlite, &[]).await;
}

/// `--threads 1`: everything on one thread (SQLite's waits for its write lock go to the blocking
/// pool), a running call and its duplicate served side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_thread_a_keyed_charge_runs_once_then_replays_or_conflicts() {
    keyed_charge_runs_once_then_replays_or_conflicts(Store::Sqlite, &["--threads", "1"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_keyed_charge_runs_once_then_replays_or_conflicts() {
    keyed_charge_runs_once_then_replays_or_conflicts(Store::Memory, &[]).await;
}

async fn discovery_advertises_idempotency(demo_args: &[&str]) {
    let s = setup(Store::Memory, demo_args, &[]);
    let found = s.raw.call(discover(1)).await;
    assert_eq!(found.status, 200, "{}", found.body);
    let result = &found.json()["result"];
    assert_eq!(result["resultType"], "complete", "{result}");
    assert!(
        result["capabilities"]["tools"]["idempotency"].is_object(),
        "{result}"
    );

    let init = s.raw.call(initialize(2)).await;
    assert_eq!(init.status, 200, "{}", init.body);
    let result = &init.json()["result"];
    assert_eq!(result["protocolVersion"], "2025-06-18", "{result}");
    assert!(
        result["capabilities"]["tools"]["idempotency"].is_object(),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_and_initialize_results_carry_the_capability() {
    discovery_advertises_idempotency(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_and_initialize_over_sse_carry_the_capability() {
    discovery_advertises_idempotency(&["--http-sse"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answers_are_streamed_through_recorded_and_replayed_as_json() {
    let s = setup(Store::Sqlite, &["--http-sse"], &[]);
    let first = s.raw.call(charge(1, 12, Some("sse-1"))).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(first.is_sse(), "{:?}", first.headers);
    assert_eq!(first.json()["id"], 1);
    let charge_id = first.charge_id().expect("a charge id");
    assert_eq!(ledger_lines(&s.ledger)[0]["chargeId"], charge_id.as_str());

    let retry = s.raw.call(charge(2, 12, Some("sse-1"))).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert!(
        retry.content_type().starts_with("application/json"),
        "{:?}",
        retry.headers
    );
    assert_eq!(retry.json()["id"], 2);
    assert_eq!(retry.charge_id().as_deref(), Some(charge_id.as_str()));
    assert_eq!(ledger_lines(&s.ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_key_are_not_deduplicated() {
    let s = setup(Store::Sqlite, &[], &[]);
    let a = s.raw.call(charge(1, 5, None)).await.charge_id().unwrap();
    let b = s.raw.call(charge(2, 5, None)).await.charge_id().unwrap();
    assert_ne!(a, b);
    assert_eq!(ledger_lines(&s.ledger).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502_and_leaves_the_key_free() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let store = sqlite_in(&dir);
    // Both proxies use the same namespace, as instances in front of one server do.
    let args = ["--store", store.as_str(), "--namespace", "payments"];

    let down = Proxy::spawn(&closed_port_url(), &args);
    let answer = Raw::new(&down).call(charge(1, 30, Some("k-down"))).await;
    assert_eq!(answer.status, 502, "{}", answer.body);
    let json = answer.json();
    assert_eq!(json["id"], 1, "{json}");
    assert!(json["error"].is_object(), "{json}");
    drop(down);

    // The same store behind a proxy to a live server: the key was never recorded, so it runs now.
    let server = HttpDemo::spawn(&ledger, &[]);
    let up = Proxy::spawn(&server.base_url(), &args);
    let raw = Raw::new(&up);
    let ran = raw.call(charge(2, 30, Some("k-down"))).await;
    assert_eq!(ran.status, 200, "{}", ran.body);
    let charge_id = ran
        .charge_id()
        .unwrap_or_else(|| panic!("the call ran: {}", ran.body));
    let replay = raw.call(charge(3, 30, Some("k-down"))).await;
    assert_eq!(replay.charge_id(), Some(charge_id));
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_arguments_of_a_keyed_call_get_invalid_params() {
    let s = setup(Store::Sqlite, &[], &["--max-argument-bytes", "256"]);

    // An exponent the fingerprint refuses to compare (|e| >= 10^18).
    let message = tool_call(1, "charge_payment", json!(null), Some("k-bad"));
    let text = message.to_string().replace(
        "\"arguments\":null",
        r#""arguments":{"amount":1e1000000000000000000,"currency":"EUR"}"#,
    );
    assert!(text.contains("1e1000000000000000000"), "{text}");
    let answer = s
        .raw
        .send_bytes(s.raw.post(&message), bytes::Bytes::from(text))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let error = &answer.json()["error"];
    assert_eq!(answer.json()["id"], 1);
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(
        error["data"]["type"], "idempotency_arguments_invalid",
        "{error}"
    );

    // Arguments over --max-argument-bytes.
    let big = tool_call(
        2,
        "charge_payment",
        json!({"amount": 1, "currency": "EUR", "memo": "x".repeat(300)}),
        Some("k-big"),
    );
    let error = &s.raw.call(big).await.json()["error"];
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(
        error["data"]["type"], "idempotency_arguments_too_large",
        "{error}"
    );
    assert!(ledger_lines(&s.ledger).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_charged_then_failed_replays_its_error() {
    let s = setup(Store::Sqlite, &[], &[]);
    let failing = |id| {
        tool_call(
            id,
            "charge_payment",
            json!({"amount": 8, "currency": "EUR", "fail_after_charge": true}),
            Some("k-fail"),
        )
    };
    let first = s.raw.call(failing(1)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let error = first.json()["error"].clone();
    assert_eq!(error["code"], -32603, "{error}");
    let charge_id = first.charge_id().expect("the failed call's charge id");
    assert_eq!(await_ledger(&s.ledger, 1).await.len(), 1);

    let retry = call_until_settled(&s.raw, &failing(2)).await;
    assert_eq!(retry.json()["id"], 2);
    assert_eq!(
        retry.json()["error"],
        error,
        "the original error is replayed"
    );
    assert_eq!(retry.charge_id(), Some(charge_id));
    assert_eq!(ledger_lines(&s.ledger).len(), 1);
}

/// POSTs `message` with `Host` replaced and the extra `headers`.
async fn call_as_host(
    raw: &Raw,
    message: Value,
    host: &str,
    headers: &[(&'static str, &str)],
) -> Answer {
    let mut request = raw.post(&message);
    let map = request.headers_mut().unwrap();
    map.insert(http::header::HOST, host.parse().unwrap());
    for (name, value) in headers {
        map.insert(*name, value.parse().unwrap());
    }
    raw.send(request, &message).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_or_origin_is_refused_before_anything_runs() {
    let s = setup(Store::Memory, &[], &[]);

    // A page that rebound evil.example.com to 127.0.0.1 sends its own name as Host.
    let rebound = call_as_host(&s.raw, charge(1, 25, Some("k-1")), "evil.example.com", &[]).await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert!(rebound.body.contains("DNS rebinding"), "{}", rebound.body);
    let origin = call_as_host(
        &s.raw,
        charge(2, 25, Some("k-1")),
        "127.0.0.1",
        &[("origin", "http://evil.example.com")],
    )
    .await;
    assert_eq!(origin.status, 403, "{}", origin.body);
    assert!(ledger_lines(&s.ledger).is_empty(), "nothing ran");

    // Loopback names and a loopback Origin pass.
    let local = call_as_host(
        &s.raw,
        charge(3, 25, Some("k-1")),
        "localhost:1234",
        &[("origin", "http://localhost:3000")],
    )
    .await;
    assert_eq!(local.status, 200, "{}", local.body);
    assert_eq!(ledger_lines(&s.ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_extend_the_loopback_names() {
    let s = setup(Store::Memory, &[], &["--allowed-host", "mcp.example.com"]);
    let named = call_as_host(
        &s.raw,
        charge(1, 25, Some("k-1")),
        "MCP.example.com:443",
        &[],
    )
    .await;
    assert_eq!(named.status, 200, "{}", named.body);
    let other = call_as_host(&s.raw, charge(2, 25, Some("k-2")), "other.example.com", &[]).await;
    assert_eq!(other.status, 403, "{}", other.body);

    let any = setup(Store::Memory, &[], &["--allow-any-host"]);
    let anything = call_as_host(
        &any.raw,
        charge(1, 25, Some("k-1")),
        "anything.example",
        &[],
    )
    .await;
    assert_eq!(anything.status, 200, "{}", anything.body);
}
