//! `mcp-idem proxy` stopped with SIGTERM (issue 14), on the shared Redis (a namespace of its
//! own per test), in front of `demo-server --http`:
//!
//! - A keyed call in flight is answered and recorded; the proxy exits 0; a new proxy replays the
//!   call: one execution in the demo server's ledger. Meanwhile new connections are refused.
//! - A call still running when `--shutdown-grace` ends is answered and recorded
//!   `idempotency_outcome_unknown` (plain JSON, and in an SSE stream that has begun), never left
//!   as a claim nobody owns; a new proxy answers the retry the same way.
//! - A keyed call whose request was still arriving when the signal came is refused with
//!   `idempotency_shutting_down`, and not claimed: a new proxy runs it.
//!
//! The tests wait for the log lines that show a call started ("charge_payment started", from the
//! demo server) or that the proxy began stopping, never for a fixed time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use serde_json::Value;

use crate::support::common::ledger_lines;
use crate::support::http::{
    call_until_settled, ledger_in, slow_charge, unique_namespace, HttpDemo, Proxy, Raw, SharedStore,
};
use crate::support::wrap::signal_pid;

const DEMO_LOG: &str = "warn,mcp_idem::commands::demo_server=info";
const PROXY_LOG: &str = "warn,mcp_idem::commands::proxy=info";

/// The demo server (logging its charges as they start) and the arguments of proxies sharing a
/// fresh namespace on Redis; `None` when Redis is not reachable (outside CI).
fn setup(
    dir: &tempfile::TempDir,
    demo_args: &[&str],
    test: &str,
) -> Option<(HttpDemo, Vec<String>)> {
    let redis = SharedStore::Redis.url()?;
    let demo = HttpDemo::spawn_with_log("127.0.0.1:0", &ledger_in(dir), demo_args, DEMO_LOG);
    let args = vec![
        "--store".to_owned(),
        redis,
        "--namespace".to_owned(),
        unique_namespace(test),
    ];
    Some((demo, args))
}

fn proxy(demo: &HttpDemo, args: &[String], extra: &[&str]) -> Proxy {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(extra);
    Proxy::spawn_with_log(&demo.base_url(), &all, PROXY_LOG)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_keyed_call_answers_records_and_a_new_proxy_replays() {
    let dir = tempfile::tempdir().unwrap();
    let Some((demo, args)) = setup(&dir, &[], "sigterm-answers") else {
        return;
    };
    let mut first = proxy(&demo, &args, &[]);
    let key = "proxy-term-1";
    let raw = Raw::new(&first);
    let call = tokio::spawn(async move { raw.call(slow_charge(1, 41, 1500, Some(key))).await });
    demo.logged("charge_payment started").await;
    signal_pid(first.pid(), "TERM");
    first.logged("stopping: no new connections").await;
    // The listener is closed at once: a client turns to another instance.
    let address = first
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp");
    assert!(
        TcpStream::connect(address).is_err(),
        "a stopping proxy accepts no connections"
    );

    let answer = call.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let charged = answer
        .charge_id()
        .unwrap_or_else(|| panic!("the call's answer, not {}", answer.body));
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.stderr());

    let second = proxy(&demo, &args, &[]);
    let replay = Raw::new(&second)
        .call(slow_charge(2, 41, 1500, Some(key)))
        .await;
    assert_eq!(
        replay.charge_id().as_deref(),
        Some(charged.as_str()),
        "{}",
        replay.body
    );
    let lines = ledger_lines(&ledger_in(&dir));
    assert_eq!(lines.len(), 1, "one execution: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
}

/// A charge that runs for a minute, SIGTERM, `--shutdown-grace 300ms`: the answer is
/// `idempotency_outcome_unknown`, recorded, so a new proxy gives the retry the same answer.
async fn cut_off_at_the_end_of_the_grace(demo_args: &[&str], test: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some((demo, args)) = setup(&dir, demo_args, test) else {
        return;
    };
    let mut first = proxy(&demo, &args, &["--shutdown-grace", "300ms"]);
    let key = "proxy-cut-off";
    let raw = Raw::new(&first);
    let call = tokio::spawn(async move { raw.call(slow_charge(1, 42, 60_000, Some(key))).await });
    demo.logged("charge_payment started").await;
    signal_pid(first.pid(), "TERM");

    let answer = call.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let response = answer.json();
    assert_eq!(response["id"], 1, "{}", answer.body);
    assert_eq!(
        response["error"]["data"]["type"], "idempotency_outcome_unknown",
        "{}",
        answer.body
    );
    assert_eq!(response["error"]["data"]["idempotencyKey"], key);
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.stderr());

    let second = proxy(&demo, &args, &[]);
    let retry =
        call_until_settled(&Raw::new(&second), &slow_charge(2, 42, 60_000, Some(key))).await;
    assert_eq!(
        retry.error_type().as_deref(),
        Some("idempotency_outcome_unknown"),
        "{}",
        retry.body
    );
    // Not run again; the first run is still sleeping in the demo server.
    assert!(ledger_lines(&ledger_in(&dir)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_running_past_the_grace_is_recorded_outcome_unknown() {
    cut_off_at_the_end_of_the_grace(&[], "cut-off-json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_running_past_the_grace_is_recorded_outcome_unknown_in_its_sse_stream() {
    cut_off_at_the_end_of_the_grace(&["--http-sse"], "cut-off-sse").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_still_arriving_at_sigterm_is_refused_and_not_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let Some((demo, args)) = setup(&dir, &[], "refused") else {
        return;
    };
    let mut first = proxy(&demo, &args, &[]);
    let key = "proxy-refused";
    let body = slow_charge(1, 43, 0, Some(key)).to_string();
    let (head_part, rest) = body.split_at(body.len() / 2);
    let address = first
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut stream = TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: tools/call\r\nmcp-name: charge_payment\r\nexpect: 100-continue\r\n\
         content-length: {}\r\n\r\n{head_part}",
        body.len()
    )
    .unwrap();
    stream.flush().unwrap();
    // `100 Continue` comes once the layer reads the body: the request is open in the proxy.
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut interim = String::new();
    while !interim.ends_with("\r\n\r\n") {
        assert_ne!(reader.read_line(&mut interim).unwrap(), 0, "{interim}");
    }
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");

    signal_pid(first.pid(), "TERM");
    first.logged("stopping: no new connections").await;
    stream.write_all(rest.as_bytes()).unwrap();
    let mut answer = String::new();
    reader.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{answer}");
    let response: Value =
        serde_json::from_str(body.trim()).unwrap_or_else(|_| panic!("a JSON body: {answer}"));
    assert_eq!(response["id"], 1, "{answer}");
    assert_eq!(response["error"]["code"], -32603, "{answer}");
    assert_eq!(
        response["error"]["data"]["type"], "idempotency_shutting_down",
        "{answer}"
    );
    assert_eq!(response["error"]["data"]["idempotencyKey"], key);
    assert_eq!(response["error"]["data"]["retryAfterMs"], 1000);
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.stderr());
    assert!(ledger_lines(&ledger_in(&dir)).is_empty());

    // Nothing was claimed: a new proxy runs the call.
    let second = proxy(&demo, &args, &[]);
    let ran = Raw::new(&second)
        .call(slow_charge(2, 43, 0, Some(key)))
        .await;
    assert!(ran.charge_id().is_some(), "{}", ran.body);
    assert_eq!(ledger_lines(&ledger_in(&dir)).len(), 1);
}
