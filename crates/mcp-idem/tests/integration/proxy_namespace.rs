//! `mcp-idem proxy`'s default namespace is its upstream's own name (issue 39), asked by the
//! proxy itself at start: proxies that name one server by other URLs share its records, records
//! kept under the previous default (`http:<upstream URL>`) are still found, and a keyed call that
//! comes before the upstream answered waits for the name instead of being decided elsewhere.

use std::time::Duration;

use crate::support::common::ledger_lines;
use serde_json::{json, Value};

use crate::support::http::{
    charge, closed_port_url, discover, initialize, ledger_in, sqlite_in, tool_call, HttpDemo,
    Proxy, Raw,
};

/// The charge id of a successful answer.
fn charged(answer: &crate::support::http::Answer) -> String {
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer
        .charge_id()
        .unwrap_or_else(|| panic!("a charge: {}", answer.body))
}

/// `http://127.0.0.1:P/mcp` and `http://localhost:P/mcp` name one server: a retry through the
/// second proxy replays what the first ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_naming_one_server_by_other_urls_share_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let port = server.authority.rsplit(':').next().unwrap().to_owned();
    let by_ip = Proxy::spawn(
        &format!("http://127.0.0.1:{port}/mcp"),
        &["--store", &store],
    );
    let by_name = Proxy::spawn(
        &format!("http://localhost:{port}/mcp"),
        &["--store", &store],
    );

    let executed = charged(&Raw::new(&by_ip).call(charge(1, 25, Some("k-url"))).await);
    let retry = Raw::new(&by_name).call(charge(1, 25, Some("k-url"))).await;
    assert_eq!(charged(&retry), executed, "{}", retry.body);
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// A record the previous proxy kept under `http:<upstream URL>` answers the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_under_the_upstream_url_are_still_found() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let upstream = server.base_url();
    let previous_default = format!("http:{upstream}");
    let before = Proxy::spawn(
        &upstream,
        &["--store", &store, "--namespace", &previous_default],
    );
    let executed = charged(&Raw::new(&before).call(charge(1, 26, Some("k-old"))).await);
    drop(before);

    let after = Proxy::spawn(&upstream, &["--store", &store]);
    let retry = Raw::new(&after).call(charge(2, 26, Some("k-old"))).await;
    assert_eq!(charged(&retry), executed, "{}", retry.body);
    let conflict = Raw::new(&after).call(charge(3, 27, Some("k-old"))).await;
    assert_eq!(
        conflict.error_type().as_deref(),
        Some("idempotency_key_conflict"),
        "{}",
        conflict.body
    );
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// The upstream starts after the proxy: a keyed call waits until the proxy has its name, then
/// runs once; its retry through a proxy that learned the name at once replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_before_the_upstream_answered_waits_for_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let store = sqlite_in(&dir);
    let upstream = closed_port_url();
    let early = Proxy::spawn(&upstream, &["--store", &store]);
    let raw = Raw::new(&early);
    let call = tokio::spawn(async move { raw.call(charge(1, 28, Some("k-early"))).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listen = upstream.strip_prefix("http://").unwrap();
    let _server = HttpDemo::spawn_on(listen, &ledger, &[]);
    let executed = charged(&call.await.unwrap());

    let late = Proxy::spawn(&upstream, &["--store", &store]);
    let retry = Raw::new(&late).call(charge(2, 28, Some("k-early"))).await;
    assert_eq!(charged(&retry), executed, "{}", retry.body);
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// Every key source, through two proxies that spell the upstream's URL differently, each
/// client sending no handshake, `server/discover` or `initialize` first: the retry through the
/// second proxy replays the call the first ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_source_replays_across_proxies_whatever_the_handshakes() {
    let sources: [(&str, Option<Value>); 5] = [
        ("sep", None),
        ("meta", None),
        (
            "argument",
            Some(json!({"charge_payment": {"key-argument": "order_id"}})),
        ),
        (
            "key-from",
            Some(json!({"charge_payment": {"key-from": ["/order_id"]}})),
        ),
        ("window", Some(json!({"charge_payment": {"window": "10m"}}))),
    ];
    let handshakes = ["none", "discover", "initialize"];
    for (source, tools) in sources {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(&dir);
        let server = HttpDemo::spawn(&ledger, &[]);
        let store = sqlite_in(&dir);
        let port = server.authority.rsplit(':').next().unwrap().to_owned();
        let tools = tools.map(|tools| tools.to_string());
        let mut args = vec!["--store", store.as_str()];
        if let Some(tools) = &tools {
            args.extend(["--tools", tools.as_str()]);
        }
        let by_ip = Proxy::spawn(&format!("http://127.0.0.1:{port}/mcp"), &args);
        let by_name = Proxy::spawn(&format!("http://localhost:{port}/mcp"), &args);
        let (first, second) = (Raw::new(&by_ip), Raw::new(&by_name));
        let mut amount = 40;
        for before in handshakes {
            for after in handshakes {
                amount += 1;
                let scenario = format!("{source}: {before} then {after}");
                let key = format!("k-{amount}");
                let message = keyed_charge(source, amount, &key);
                shake(&first, before).await;
                let executed = charged(&first.call(message.clone()).await);
                shake(&second, after).await;
                let retry = second.call(message).await;
                assert_eq!(charged(&retry), executed, "{scenario}: {}", retry.body);
            }
        }
        assert_eq!(ledger_lines(&ledger).len(), 9, "{source}");
    }
}

/// A `charge_payment` of `amount`, keyed by `key` as `source` keys it.
fn keyed_charge(source: &str, amount: u64, key: &str) -> Value {
    let arguments = json!({"amount": amount, "currency": "EUR", "order_id": key});
    let mut message = tool_call(1, "charge_payment", arguments, None);
    match source {
        "sep" => message["params"]["idempotencyKey"] = json!(key),
        "meta" => message["params"]["_meta"]["idempotencyKey"] = json!(key),
        _ => {}
    }
    message
}

/// Sends `handshake` (`none`, `discover` or `initialize`) through `raw`.
async fn shake(raw: &Raw, handshake: &str) {
    let answer = match handshake {
        "discover" => raw.call(discover(0)).await,
        "initialize" => raw.call(initialize(0)).await,
        _ => return,
    };
    assert_eq!(answer.status, 200, "{handshake}: {}", answer.body);
}
