//! Key sources for calls without a SEP key (issue 34), end to end: the real `mcp-idem wrap` and
//! `mcp-idem proxy` (and `mcp-idem bridge` in front of the proxy) with `--tools` / `[tools.NAME]`
//! policies, the demo server behind them, real clients (the official Python SDK, raw stdio and
//! HTTP peers), and the demo server's ledger counting what really ran.
//!
//! - `_meta.idempotencyKey` from the Python SDK's `session.call_tool(..., meta=...)`: replayed,
//!   conflicting and in progress as a SEP key is, in `wrap` and in `proxy`;
//! - `key-from = ["/order_id"]` through the bridge: a model-style retry (a new request with a
//!   fresh SEP key) replays, marked `mcp-idem/replayed = "key-from"`; the order id with another
//!   amount is a conflict naming `/order_id`;
//! - a 1 s window merges identical calls and lets them run again after it;
//! - `required = true` refuses a call without its identifier (absent, `null` or `""`), and
//!   nothing runs;
//! - a key-less duplicate of a running call waits for it and gets its outcome, and the wait does
//!   not hold up an elicitation answer the running call needs (stdio and HTTP);
//! - bad input: a `_meta` key that is not a string, a pointer that names an object or an array.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use crate::interop_clients::{assert_dedup, stdio_args};
use crate::support::bridge::{Fault, Forwarder, Plan};
use crate::support::bridge_sessions::{self, initialize, initialized, legacy_call, server_request};
use crate::support::common::{ledger_lines, StdioPeer, TIMEOUT};
use crate::support::http::{ledger_in, legacy_post, sse_messages, Answer, HttpDemo, Proxy, Raw};
use crate::support::interop::{run_report, script, Toolchain};
use crate::support::wrap::{call, charge_id, Sandbox};

/// The marker a replay of a derived key carries in its result's `_meta`.
const REPLAYED: &str = "mcp-idem/replayed";

/// A key-less `charge_payment` (2026-07-28, per-request `_meta`).
fn charge(id: u64, arguments: Value) -> Value {
    call(id, "charge_payment", arguments, None)
}

/// `result._meta["mcp-idem/replayed"]` of a response, if any.
fn replayed(response: &Value) -> Option<&str> {
    response["result"]["_meta"][REPLAYED].as_str()
}

/// Asserts a JSON-RPC error with `code` whose message contains every one of `words`.
fn assert_error(response: &Value, code: i64, words: &[&str]) {
    assert_eq!(response["error"]["code"], code, "{response}");
    let message = response["error"]["message"].as_str().unwrap_or_default();
    for word in words {
        assert!(message.contains(word), "{word:?} not in {response}");
    }
}

/// A gateway in front of the demo server, driven request by request: `wrap` on stdio, or `proxy`
/// over Streamable HTTP (through a runtime of its own, so the scenarios stay plain functions).
enum Front {
    Wrap { sandbox: Sandbox, peer: StdioPeer },
    Proxy(Box<ProxyFront>),
}

/// `proxy` in front of `demo-server --http`, and a client for it.
struct ProxyFront {
    dir: tempfile::TempDir,
    _demo: HttpDemo,
    _proxy: Proxy,
    raw: Raw,
    runtime: tokio::runtime::Runtime,
}

impl Front {
    /// `mcp-idem wrap --store sqlite:… --tools TOOLS -- mcp-idem demo-server --ledger …`.
    fn wrap(tools: &Value) -> Self {
        let sandbox = Sandbox::new();
        let peer = sandbox.wrap_demo(&["--tools", &tools.to_string()]);
        Self::Wrap { sandbox, peer }
    }

    /// `mcp-idem proxy --store memory --tools TOOLS` in front of `demo-server --http`.
    fn proxy(tools: &Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let demo = HttpDemo::spawn(&ledger_in(&dir), &[]);
        let proxy = Proxy::spawn(
            &demo.base_url(),
            &["--store", "memory", "--tools", &tools.to_string()],
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let raw = {
            let _inside = runtime.enter();
            Raw::new(&proxy)
        };
        Self::Proxy(Box::new(ProxyFront {
            dir,
            _demo: demo,
            _proxy: proxy,
            raw,
            runtime,
        }))
    }

    /// Sends `message` and returns its response.
    fn request(&mut self, message: Value) -> Value {
        match self {
            Self::Wrap { peer, .. } => peer.request(message),
            Self::Proxy(front) => front.runtime.block_on(front.raw.call(message)).json(),
        }
    }

    /// The demo server's ledger lines.
    fn ledger(&self) -> Vec<Value> {
        let path = match self {
            Self::Wrap { sandbox, .. } => sandbox.ledger(),
            Self::Proxy(front) => ledger_in(&front.dir),
        };
        ledger_lines(&path)
    }
}

// 1. The official Python client's `meta=`.

/// The `dedup` scenario of `interop/py_client.py` with the key in `_meta` (`dedup-meta`):
/// replay, conflict and in progress as for a SEP key; the replay byte for byte (no marker), the
/// duplicate refused while the first call still runs.
fn assert_meta_dedup(report: &Value, ledger: &Path) {
    assert_dedup(report, ledger);
    let steps = &report["steps"];
    assert_eq!(
        steps["retry"]["result"], steps["first"]["result"],
        "a `_meta` key's replay is the recorded result as it was: {report}"
    );
    assert!(steps["retry"]["result"].get("_meta").is_none(), "{report}");
    let conflict = steps["conflict"]["error"]["message"].as_str().unwrap();
    assert!(conflict.contains("_meta"), "names the carrier: {conflict}");
    // The refused duplicate was answered first, while the other call still ran (3 s).
    let first_answered = steps["concurrentOrder"][0].as_str().unwrap();
    assert_eq!(
        steps[first_answered]["error"]["data"]["type"], "idempotency_key_in_progress",
        "{report}"
    );
}

#[test]
fn python_sdk_meta_key_in_wrap() {
    if !Toolchain::Python.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let args = stdio_args("py_client.py", "dedup-meta", &sandbox);
    let report = run_report("python3", &args, &sandbox.path("client.stderr"));
    assert_meta_dedup(&report, &sandbox.ledger());
}

#[test]
fn python_sdk_meta_key_in_proxy() {
    if !Toolchain::Python.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let demo = HttpDemo::spawn(&sandbox.ledger(), &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", &sandbox.store()]);
    let args: Vec<OsString> = vec![
        script("py_client.py").into(),
        "dedup-meta".into(),
        "http".into(),
        proxy.url.clone().into(),
    ];
    let report = run_report("python3", &args, &sandbox.path("client.stderr"));
    assert_meta_dedup(&report, &sandbox.ledger());
}

// 2. key-from through the bridge.

/// client → `mcp-idem bridge` → (a recording forwarder) → `mcp-idem proxy --config FILE` with
/// `[tools.charge_payment] key-from = ["/order_id"]` → `demo-server --http`.
#[test]
fn a_model_style_retry_through_the_bridge_replays_by_order_id() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let config = dir.path().join("mcp-idem.toml");
    std::fs::write(
        &config,
        "store = \"memory\"\n\n[tools.charge_payment]\nkey-from = [\"/order_id\"]\n",
    )
    .unwrap();
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--config", config.to_str().unwrap()]);
    let forwarder = Forwarder::start(
        &proxy.url,
        None,
        Plan::new(|_| Fault::Forward),
        Duration::ZERO,
    );
    let mut bridge = bridge_sessions::bridge(&forwarder.url, &[], dir.path());

    let order = json!({"order_id": "ord-2", "amount": 42, "currency": "EUR"});
    let first = bridge.request(charge(1, order.clone()));
    let charged = charge_id(&first);
    assert_eq!(replayed(&first), None, "{first}");

    // The model calls the tool again: a new request, the same arguments.
    let retry = bridge.request(charge(2, order));
    assert_eq!(retry["id"], 2);
    assert_eq!(charge_id(&retry), charged, "{retry}");
    assert_eq!(replayed(&retry), Some("key-from"), "{retry}");

    // The same order with another amount: a conflict a model can read.
    let other = json!({"order_id": "ord-2", "amount": 43, "currency": "EUR"});
    let conflict = bridge.request(charge(3, other));
    assert_eq!(
        conflict["error"]["data"]["type"], "idempotency_key_conflict",
        "{conflict}"
    );
    assert_error(&conflict, -32602, &["/order_id", "ord-2"]);

    // The bridge gave every call a fresh SEP key: the order id decided.
    let keys: Vec<_> = forwarder
        .exchanges()
        .iter()
        .map(|exchange| exchange.key.clone().expect("a key from the bridge"))
        .collect();
    assert_eq!(keys.len(), 3, "{}", forwarder.summary());
    assert!(keys[0] != keys[1] && keys[1] != keys[2], "{keys:?}");

    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
    assert_eq!(lines[0]["orderId"], "ord-2");
    assert_eq!(bridge.finish().code(), Some(0));
}

// 3. A duplicate window.

fn a_window_merges_identical_calls_then_lets_them_run_again(mut front: Front) {
    let payment = json!({"amount": 3, "currency": "EUR"});
    let first = front.request(charge(1, payment.clone()));
    let charged = charge_id(&first);
    let merged = front.request(charge(2, payment.clone()));
    assert_eq!(charge_id(&merged), charged, "{merged}");
    assert_eq!(replayed(&merged), Some("window"), "{merged}");
    assert_eq!(front.ledger().len(), 1);

    // Past the window the record has expired: the same call runs again.
    std::thread::sleep(Duration::from_millis(1200));
    let again = front.request(charge(3, payment));
    assert_ne!(charge_id(&again), charged, "{again}");
    assert_eq!(replayed(&again), None, "{again}");
    assert_eq!(front.ledger().len(), 2, "{:?}", front.ledger());
}

const WINDOW_1S: &str = r#"{"charge_payment": {"window": "1s"}}"#;

#[test]
fn a_one_second_window_in_wrap() {
    let tools: Value = serde_json::from_str(WINDOW_1S).unwrap();
    a_window_merges_identical_calls_then_lets_them_run_again(Front::wrap(&tools));
}

#[test]
fn a_one_second_window_in_proxy() {
    let tools: Value = serde_json::from_str(WINDOW_1S).unwrap();
    a_window_merges_identical_calls_then_lets_them_run_again(Front::proxy(&tools));
}

// 4. `required`.

fn a_call_without_its_required_identifier_runs_nothing(mut front: Front) {
    let refused = front.request(charge(1, json!({"amount": 4, "currency": "EUR"})));
    assert_error(&refused, -32602, &["/order_id"]);
    let null = json!({"amount": 4, "currency": "EUR", "order_id": null});
    assert_error(&front.request(charge(2, null)), -32602, &["/order_id"]);
    assert!(front.ledger().is_empty(), "{:?}", front.ledger());

    let named = json!({"amount": 4, "currency": "EUR", "order_id": "ord-4"});
    let charged = charge_id(&front.request(charge(3, named)));
    let lines = front.ledger();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
}

fn required_order_id() -> Value {
    json!({"charge_payment": {"key-from": ["/order_id"], "required": true}})
}

#[test]
fn a_required_identifier_in_wrap() {
    a_call_without_its_required_identifier_runs_nothing(Front::wrap(&required_order_id()));
}

#[test]
fn a_required_identifier_in_proxy() {
    a_call_without_its_required_identifier_runs_nothing(Front::proxy(&required_order_id()));
}

/// An identifier or a key argument that is `""` is missing, as `null` is: two charges with
/// `memo: ""` and different amounts are refused (`required`), not taken as one operation, and
/// nothing runs.
#[test]
fn an_empty_identifier_or_key_argument_is_missing_in_wrap() {
    for (policy, wanted) in [
        (
            json!({"key-from": ["/memo"], "required": true}),
            "identifier `/memo`",
        ),
        (
            json!({"key-argument": "memo", "required": true}),
            "argument `memo`",
        ),
    ] {
        let mut front = Front::wrap(&json!({"charge_payment": policy}));
        for (id, amount) in [(1, 10), (2, 11)] {
            let arguments = json!({"amount": amount, "currency": "EUR", "memo": ""});
            let refused = front.request(charge(id, arguments));
            assert_error(&refused, -32602, &[wanted, "nothing ran"]);
            assert!(refused["error"]["data"]["type"].is_null(), "{refused}");
        }
        assert!(front.ledger().is_empty(), "{:?}", front.ledger());
        let named = json!({"amount": 12, "currency": "EUR", "memo": "m-12"});
        charge_id(&front.request(charge(3, named)));
        assert_eq!(front.ledger().len(), 1, "{:?}", front.ledger());
    }
}

// 5. A key-less duplicate waits for the running call.

fn by_order_id() -> String {
    json!({"charge_payment": {"key-from": ["/order_id"]}}).to_string()
}

/// Two requests on one stdio session: the second waits for the first (1.5 s) and gets its
/// outcome; a third request sent after them is answered before either.
#[test]
fn a_keyless_duplicate_waits_for_the_running_call_in_wrap() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&["--tools", &by_order_id()]);
    let slow = json!({"order_id": "ord-5", "amount": 5, "currency": "EUR", "delay_ms": 1500});
    wrap.send(&charge(1, slow.clone()));
    wrap.send(&charge(2, slow));
    wrap.send(&call(3, "noop", json!({}), None));
    let noop = wrap.response(&json!(3));
    assert!(noop.get("result").is_some(), "{noop}");
    assert!(
        wrap.pending().iter().all(|m| m.get("id").is_none()),
        "the wait held up the noop: {:?}",
        wrap.pending()
    );
    let first = wrap.response(&json!(1));
    let duplicate = wrap.response(&json!(2));
    assert_eq!(charge_id(&duplicate), charge_id(&first), "{duplicate}");
    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(wrap.finish().code(), Some(0));
}

/// Two HTTP requests at once: one runs (1.5 s), the other waits and gets its outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_duplicate_waits_for_the_running_call_in_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(
        &demo.base_url(),
        &["--store", "memory", "--tools", &by_order_id()],
    );
    let raw = Raw::new(&proxy);
    let slow = json!({"order_id": "ord-5", "amount": 5, "currency": "EUR", "delay_ms": 1500});
    let (a, b) = tokio::join!(raw.call(charge(1, slow.clone())), raw.call(charge(2, slow)));
    let (a, b) = (a.json(), b.json());
    assert_eq!(charge_id(&a), charge_id(&b), "{a}\n{b}");
    assert_eq!(
        ledger_lines(&ledger).len(),
        1,
        "{:?}",
        ledger_lines(&ledger)
    );
}

// 6. A waiting duplicate does not hold up an elicitation answer.

/// The answer accepting the server's question `question`.
fn accept(question: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept", "content": {}}})
}

/// stdio: `wrap` around `demo-server --confirm` with a window on `confirm_charge`. The client
/// sends the call, reads the question, sends a duplicate (which waits in `wrap`), THEN the answer:
/// the answer gets through, the call charges once and the duplicate gets its outcome.
#[test]
fn a_waiting_duplicate_does_not_hold_up_an_elicitation_answer_in_wrap() {
    let sandbox = Sandbox::new();
    let mut upstream = sandbox.demo(&sandbox.ledger());
    upstream.push("--confirm".into());
    let tools = json!({"confirm_charge": {"window": "1m"}}).to_string();
    let mut wrap = sandbox.wrap(&["--tools", &tools], &upstream);
    let init = wrap.request(initialize(1, "2025-06-18", json!({"elicitation": {}})));
    assert!(init.get("result").is_some(), "{init}");
    wrap.send(&initialized());

    let confirm = json!({"amount": 6, "currency": "EUR", "order_id": "ord-6"});
    let call = legacy_call(2, "confirm_charge", confirm.clone());
    wrap.send(&call);
    let question = server_request(&mut wrap, "elicitation/create", &call["id"]);
    wrap.send(&legacy_call(3, "confirm_charge", confirm));
    wrap.send(&accept(&question));

    let first = wrap.response(&json!(2));
    let duplicate = wrap.response(&json!(3));
    let charged = charge_id(&first);
    assert_eq!(charge_id(&duplicate), charged, "{duplicate}");
    assert!(
        !wrap
            .pending()
            .iter()
            .any(|m| m["method"] == "elicitation/create"),
        "the duplicate ran: {:?}",
        wrap.pending()
    );
    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
    assert_eq!(wrap.finish().code(), Some(0));
}

/// An SSE answer read event by event.
struct EventStream {
    body: hyper::body::Incoming,
    text: String,
}

impl EventStream {
    /// POSTs `message` in `session` and waits for the answer's head.
    async fn open(raw: &Raw, session: &str, message: &Value) -> Self {
        let request = legacy_post(raw, Some(session))
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        let response = tokio::time::timeout(TIMEOUT, raw.client.request(request))
            .await
            .expect("the answer's head in time")
            .expect("an answer");
        assert_eq!(response.status(), http::StatusCode::OK);
        Self {
            body: response.into_body(),
            text: String::new(),
        }
    }

    /// Reads until a message `wanted` accepts arrives; returns it.
    async fn until(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        loop {
            if let Some(found) = sse_messages(&self.text).into_iter().find(&wanted) {
                return found;
            }
            let frame = tokio::time::timeout(TIMEOUT, self.body.frame())
                .await
                .unwrap_or_else(|_| panic!("the stream stalled: {}", self.text))
                .unwrap_or_else(|| panic!("the stream ended: {}", self.text))
                .expect("a body frame");
            if let Ok(data) = frame.into_data() {
                self.text.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }
}

/// HTTP: `proxy` (key-from `/order_id` on `confirm_charge`) in front of `demo-server
/// --http-stateful`, one session. The call's stream brings the question; a duplicate POST waits
/// in the proxy; THEN the answer is POSTed: the call charges once, the duplicate gets its outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_does_not_hold_up_an_elicitation_answer_in_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &["--http-stateful"]);
    let tools = json!({"confirm_charge": {"key-from": ["/order_id"]}}).to_string();
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", "memory", "--tools", &tools]);
    let raw = Raw::new(&proxy);
    let hello = initialize(1, "2025-06-18", json!({"elicitation": {}}));
    let init = raw.send(legacy_post(&raw, None), &hello).await;
    let session = init.headers["mcp-session-id"]
        .to_str()
        .unwrap_or_else(|_| panic!("no session: {init:?}"))
        .to_owned();
    raw.send(legacy_post(&raw, Some(&session)), &initialized())
        .await;

    let confirm = json!({"amount": 7, "currency": "EUR", "order_id": "ord-7"});
    let mut call = EventStream::open(
        &raw,
        &session,
        &legacy_call(10, "confirm_charge", confirm.clone()),
    )
    .await;
    let question = call.until(|m| m["method"] == "elicitation/create").await;

    let (twin, twin_session) = (raw.clone(), session.clone());
    let duplicate = legacy_call(11, "confirm_charge", confirm);
    let waiting: tokio::task::JoinHandle<Answer> = tokio::spawn(async move {
        twin.send(legacy_post(&twin, Some(&twin_session)), &duplicate)
            .await
    });
    // It waits for the running call, which waits for the answer below.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the duplicate did not wait");

    let posted = raw
        .send(legacy_post(&raw, Some(&session)), &accept(&question))
        .await;
    assert_eq!(posted.status, http::StatusCode::ACCEPTED, "{posted:?}");
    let first = call.until(|m| m["id"] == 10).await;
    let charged = charge_id(&first);
    let duplicate = waiting.await.unwrap().json();
    assert_eq!(charge_id(&duplicate), charged, "{duplicate}");
    assert_eq!(replayed(&duplicate), Some("key-from"), "{duplicate}");
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["orderId"], "ord-7");
}

// 7. Bad input.

/// A `_meta.idempotencyKey` that is a number: refused as an invalid key, nothing runs.
#[test]
fn a_meta_key_that_is_not_a_string_is_refused_and_nothing_runs() {
    let mut front = Front::wrap(&json!({}));
    let mut message = charge(1, json!({"amount": 8, "currency": "EUR"}));
    message["params"]["_meta"]["idempotencyKey"] = json!(42);
    let refused = front.request(message);
    assert_eq!(
        refused["error"]["data"]["type"], "idempotency_key_invalid",
        "{refused}"
    );
    assert_error(&refused, -32602, &["_meta"]);
    assert!(front.ledger().is_empty(), "{:?}", front.ledger());
}

/// `key-from` naming an object or an array: -32602, nothing runs (the demo server would accept
/// and charge the call, as it ignores arguments it does not know).
#[test]
fn a_pointer_that_names_an_object_or_an_array_is_refused_and_nothing_runs() {
    let mut front = Front::proxy(&json!({"charge_payment": {"key-from": ["/order"]}}));
    for (id, order, kind) in [
        (1, json!({"id": "o-9"}), "object"),
        (2, json!(["o-9"]), "array"),
    ] {
        let arguments = json!({"order": order, "amount": 9, "currency": "EUR"});
        let refused = front.request(charge(id, arguments));
        assert_error(&refused, -32602, &["/order", kind]);
    }
    assert!(front.ledger().is_empty(), "{:?}", front.ledger());
}
