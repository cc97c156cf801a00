//! JSON-RPC batches (MCP 2025-03-26) through the real gateways: a batch holding a keyed
//! `tools/call` is refused whole by `wrap` and by `proxy`, one `-32600` `mcp_idem_batch_refused`
//! error per request, with nothing forwarded and nothing charged; the same call sent on its own
//! runs once; a batch without a keyed call reaches the server byte for byte. What reached the
//! server is read from a `tee` of the demo server's input (`wrap`) and from a recording upstream
//! (`proxy`; the demo server, on rmcp, runs no batch at all, so its ledger could not tell).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support;
use crate::support::common::{ledger_lines, meta_2026};
use crate::support::http::{Proxy, Raw};
use crate::support::upstream::RecordingUpstream;
use crate::support::wrap::{charge, charge_id, wait_until, Sandbox};

const BATCH_REFUSED: &str = "mcp_idem_batch_refused";

/// Asserts a refused batch: an array of errors answering `ids`, in order.
fn assert_refused(answer: &Value, ids: &[Value]) {
    let responses = answer.as_array().unwrap_or_else(|| panic!("{answer}"));
    let got: Vec<&Value> = responses.iter().map(|r| &r["id"]).collect();
    assert_eq!(got, ids.iter().collect::<Vec<_>>(), "{answer}");
    for response in responses {
        let error = &response["error"];
        assert_eq!(error["code"], -32600, "{response}");
        assert_eq!(error["data"]["type"], BATCH_REFUSED, "{response}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("batch") && message.contains("one per message"),
            "{message}"
        );
    }
}

fn tools_list(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/list","params":{"_meta": meta_2026()}})
}

#[test]
fn wrap_refuses_a_batch_with_a_keyed_call_and_forwards_one_without() {
    let sandbox = Sandbox::new();
    let (ledger, capture) = (sandbox.ledger(), sandbox.path("capture.jsonl"));
    let mut wrap = sandbox.wrap(&[], &sandbox.demo_with_capture(&ledger, &capture));
    let amount = json!({"amount": 12, "currency": "EUR"});

    let refused = json!([charge(1, amount.clone(), "batch-1"), tools_list(2)]);
    wrap.send(&refused);
    let answer = wrap
        .next_message(crate::support::common::TIMEOUT)
        .expect("an answer to the batch");
    assert_refused(&answer, &[json!(1), json!(2)]);

    // The same call on its own runs, once; nothing of the batch reached the server.
    let ran = charge_id(&wrap.request(charge(3, amount.clone(), "batch-1")));
    let replayed = charge_id(&wrap.request(charge(4, amount, "batch-1")));
    assert_eq!(ran, replayed);
    assert_eq!(ledger_lines(&ledger).len(), 1);
    let seen = crate::support::wrap::captured(&capture);
    assert!(seen.iter().all(|line| !line.is_array()), "{seen:?}");

    // A batch without a keyed call goes to the server as sent.
    let plain = format!(r#"[ {} ,{}]"#, tools_list(5), tools_list(6));
    wrap.send_raw(&plain);
    wait_until(
        "the server receives the batch",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(&capture)
                .unwrap_or_default()
                .lines()
                .any(|line| line == plain)
        },
    );
    assert_eq!(ledger_lines(&ledger).len(), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_refuses_a_batch_with_a_keyed_call_and_forwards_one_without() {
    let upstream = RecordingUpstream::start();
    // A namespace of its own: the proxy does not ask the upstream its name, so the upstream
    // sees only what is forwarded.
    let proxy = Proxy::spawn(
        &upstream.origin,
        &["--store", "memory", "--namespace", "batches"],
    );
    let raw = Raw::new(&proxy);

    let keyed = support::http::charge(1, 7, Some("batch-http"));
    let answer = raw.call(json!([keyed, tools_list(2)])).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.content_type().starts_with("application/json"));
    assert_refused(&answer.json(), &[json!(1), json!(2)]);
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());

    // The same call on its own is forwarded once, then replayed.
    let ran = raw
        .call(support::http::charge(3, 7, Some("batch-http")))
        .await;
    assert_eq!(ran.json()["result"]["path"], "/mcp", "{}", ran.body);
    let replayed = raw
        .call(support::http::charge(4, 7, Some("batch-http")))
        .await;
    assert_eq!(replayed.json()["id"], 4);
    assert_eq!(replayed.json()["result"], ran.json()["result"]);
    assert_eq!(upstream.seen().len(), 1, "{:?}", upstream.seen());

    // A batch without a keyed call goes to the upstream byte for byte, and its answer back.
    let plain = format!(r#"[ {} ,{}]"#, tools_list(5), tools_list(6));
    let request = raw.post(&Value::Null);
    let answer = raw.send_bytes(request, plain.clone().into()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answered = answer.json();
    assert_eq!(
        answered.as_array().map(Vec::len),
        Some(2),
        "{}",
        answer.body
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].body, plain);
    assert_eq!(seen[1].path, "/mcp");
}
