//! Bad input to `mcp-idem proxy` (Streamable HTTP), against the real binaries: the proxy in front
//! of `demo-server --http`, or of a tiny fake upstream speaking HTTP/1.1 by hand
//! (docs/reliability.md, "Bad input"). For each input it proves what the proxy answers (HTTP
//! status, JSON-RPC code, `error.data.type`), that nothing runs that must not (the demo server's
//! ledger, or the fake upstream's request count), and that the proxy keeps serving afterwards:
//! a 100 MB body (413), unreadable bodies (passed through), invalid keys, over-large, too deep and
//! unreadable arguments, duplicate member names, one id used by two concurrent POSTs, a truncated
//! SSE stream from the upstream (outcome-unknown, also for the retry) with a response nobody asked
//! for in it (passed through), and a slowloris body (other clients are served meanwhile).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::common::{ledger_lines, meta_2026, TIMEOUT};
use crate::support::http::{charge, ledger_in, slow_charge, sqlite_in, HttpDemo, Proxy, Raw};

/// Demo server + proxy (sqlite store) and the ledger.
struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    _server: HttpDemo,
    proxy: Proxy,
    raw: Raw,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let proxy = Proxy::spawn(&server.base_url(), &["--store", &store]);
    let raw = Raw::new(&proxy);
    Setup {
        _dir: dir,
        ledger,
        _server: server,
        proxy,
        raw,
    }
}

/// A keyed charge executes once and replays: the proxy still serves.
async fn assert_still_serving(raw: &Raw, id: u64, key: &str) {
    let first = raw.call(charge(id, 1, Some(key))).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let again = raw.call(charge(id + 1, 1, Some(key))).await;
    assert_eq!(
        first.charge_id().expect("a charge"),
        again.charge_id().unwrap()
    );
}

fn assert_no_panic(proxy: &Proxy) {
    assert!(!proxy.stderr().contains("panicked"), "{}", proxy.stderr());
}

/// `(error.code, error.data.type)` of a JSON answer.
fn error_of(answer: &crate::support::http::Answer) -> (i64, String) {
    let json = answer.json();
    (
        json["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{json}")),
        json["error"]["data"]["type"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
    )
}

/// A keyed `charge_payment` body whose `arguments` are the raw JSON text `arguments`.
fn raw_keyed_charge(id: u64, key: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{},"name":"charge_payment","idempotencyKey":"{key}","arguments":{arguments}}}}}"#,
        meta_2026()
    )
}

/// POSTs `body` as is, with the headers of a `charge_payment` call.
async fn post_raw(raw: &Raw, body: impl Into<Bytes>) -> crate::support::http::Answer {
    let request = raw.post(&charge(0, 0, None));
    raw.send_bytes(request, body.into()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_body_gets_413_and_the_proxy_keeps_serving() {
    let s = setup();
    let address = s.raw.authority.clone();
    let mut stream = TcpStream::connect(&address).await.unwrap();
    let total: usize = 100 << 20;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\ncontent-length: {total}\r\n\r\n"
    );
    let (mut reader, mut writer) = stream.split();
    let write = async {
        writer.write_all(head.as_bytes()).await?;
        let prefix = raw_keyed_charge(1, "huge-body", r#"{"amount":1,"currency":"EUR","pad":""#);
        writer.write_all(prefix.as_bytes()).await?;
        let chunk = vec![b'x'; 1 << 20];
        let mut sent = prefix.len();
        while sent < total {
            let n = chunk.len().min(total - sent);
            writer.write_all(&chunk[..n]).await?;
            sent += n;
        }
        std::io::Result::Ok(())
    };
    let read = async {
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                break;
            }
        }
        String::from_utf8_lossy(&answer).into_owned()
    };
    // The proxy may stop reading (and close) before all 100 MB are sent: write errors are fine.
    let (_, answer) = tokio::time::timeout(TIMEOUT, async { tokio::join!(write, read) })
        .await
        .expect("an answer to the 100 MB body");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("-32600"), "{answer}");
    assert!(answer.contains("request body larger than"), "{answer}");
    drop(stream);

    assert!(ledger_lines(&s.ledger).is_empty());
    assert_still_serving(&s.raw, 10, "after-huge-body").await;
    assert_no_panic(&s.proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_bodies_pass_through_and_bad_keys_and_arguments_are_refused() {
    let s = setup();

    // Not JSON, invalid UTF-8: the proxy cannot read them and passes them to the server, which
    // refuses them; nothing runs.
    let malformed = post_raw(&s.raw, raw_keyed_charge(1, "m", "{")).await;
    let utf8 = post_raw(
        &s.raw,
        b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"charge_payment\",\"idempotencyKey\":\"\xff\",\"arguments\":{\"amount\":1,\"currency\":\"EUR\"}}}".to_vec(),
    )
    .await;
    // (The demo server's rmcp service answers 415 "fail to deserialize request body".)
    for answer in [&malformed, &utf8] {
        assert!(answer.status.is_client_error(), "{answer:?}");
    }

    // Keys that are not strings of 1..=255 printable characters.
    let one_megabyte = "k".repeat(1 << 20);
    let keys = [
        json!(42),
        json!(null),
        json!({"key":"k"}),
        json!(""),
        json!(one_megabyte),
        json!("tab\there"),
        json!("nul\u{0}byte"),
    ];
    for (id, key) in keys.iter().enumerate() {
        let mut message = charge(10 + id as u64, 1, None);
        message["params"]["idempotencyKey"] = key.clone();
        let answer = s.raw.call(message).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            error_of(&answer),
            (-32602, "idempotency_key_invalid".into()),
            "{key:.40}"
        );
        assert!(answer.body.len() < 4096, "the key is not echoed back");
    }

    // Arguments: 2 MB (over the 1 MB argument limit, under the 4 MiB body limit), nested 100k
    // levels, an exponent of 10^20.
    let big = format!(
        r#"{{"amount":1,"currency":"EUR","pad":"{}"}}"#,
        "x".repeat(2 << 20)
    );
    let deep = format!(
        r#"{{"amount":1,"currency":"EUR","deep":{}0{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let exponent = r#"{"amount":1,"currency":"EUR","note":1e99999999999999999999}"#.to_owned();
    for (id, arguments, kind) in [
        (30, big, "idempotency_arguments_too_large"),
        (31, deep, "idempotency_arguments_invalid"),
        (32, exponent, "idempotency_arguments_invalid"),
    ] {
        let answer = post_raw(
            &s.raw,
            raw_keyed_charge(id, &format!("args-{id}"), &arguments),
        )
        .await;
        assert_eq!(answer.status, 200, "{:.300}", answer.body);
        assert_eq!(
            error_of(&answer),
            (-32602, kind.into()),
            "{:.300}",
            answer.body
        );
    }
    assert!(ledger_lines(&s.ledger).is_empty());

    // Duplicate member names: the last one wins, in the fingerprint as in serde_json.
    let dup = post_raw(
        &s.raw,
        raw_keyed_charge(40, "dup", r#"{"amount":1,"currency":"EUR","amount":2}"#),
    )
    .await;
    let same = s.raw.call(charge(41, 2, Some("dup"))).await;
    assert_eq!(same.json()["result"], dup.json()["result"], "{}", same.body);
    assert_eq!(same.json()["error"], dup.json()["error"], "{}", same.body);
    let other = s.raw.call(charge(42, 1, Some("dup"))).await;
    assert_eq!(
        error_of(&other),
        (-32602, "idempotency_key_conflict".into())
    );
    // The demo server (serde_json) reads the last member too: it charged 2.
    let lines = ledger_lines(&s.ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["amount"], 2, "{lines:?}");

    assert_still_serving(&s.raw, 50, "after-bad-input").await;
    assert_no_panic(&s.proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_on_two_concurrent_posts_is_two_separate_exchanges() {
    // Over HTTP each POST carries its own response, so ids need not be unique across POSTs: two
    // keyed calls with the same id in flight at once both run, each under its own key.
    let s = setup();
    let (a, b) = tokio::join!(
        s.raw.call(slow_charge(7, 3, 500, Some("same-id-a"))),
        s.raw.call(slow_charge(7, 4, 500, Some("same-id-b"))),
    );
    let (a, b) = (a.charge_id().expect("a"), b.charge_id().expect("b"));
    assert_ne!(a, b);
    assert_eq!(ledger_lines(&s.ledger).len(), 2);
    assert_no_panic(&s.proxy);
}

/// A fake MCP upstream: answers every POST with `200 text/event-stream`, chunked, sending a
/// response to an id nobody asked for and then half an event, and closes the connection without
/// the last chunk. Counts the `tools/call` requests it got.
async fn truncating_upstream() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let Some(body) = read_request(&mut socket).await else {
                    return;
                };
                if body.contains("\"tools/call\"") {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                let stray = "data: {\"jsonrpc\":\"2.0\",\"id\":\"nobody-asked\",\"result\":{}}\n\n";
                let half = "data: {\"jsonrpc\":\"2.0\",\"id\":";
                let mut out = String::from(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                );
                for part in [stray, half] {
                    out.push_str(&format!("{:x}\r\n{part}\r\n", part.len()));
                }
                let _ = socket.write_all(out.as_bytes()).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Dropping the socket ends the stream without the terminating chunk.
            });
        }
    });
    (url, calls)
}

/// Reads one HTTP/1.1 request with a `content-length` body; returns the body.
async fn read_request(socket: &mut TcpStream) -> Option<String> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if data.len() >= end + 4 + len {
                return Some(String::from_utf8_lossy(&data[end + 4..end + 4 + len]).into_owned());
            }
        }
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    }
}

/// POSTs `message` and reads the body until it ends or breaks: (status, body text).
async fn call_tolerant(raw: &Raw, message: &Value) -> (http::StatusCode, String) {
    let request = raw
        .post(message)
        .body(http_body_util::Full::new(Bytes::from(message.to_string())))
        .unwrap();
    let exchange = async {
        let response = raw.client.request(request).await.expect("an HTTP answer");
        let status = response.status();
        let mut body = response.into_body();
        let mut text = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                text.extend_from_slice(&data);
            }
        }
        (status, String::from_utf8_lossy(&text).into_owned())
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .expect("an answer within the timeout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_sse_stream_is_recorded_outcome_unknown_and_a_stray_response_passes() {
    let (upstream, calls) = truncating_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(&dir);
    // A namespace of its own: the proxy does not ask this upstream its name, so every request
    // it counts is a call.
    let proxy = Proxy::spawn(&upstream, &["--store", &store, "--namespace", "truncated"]);
    let raw = Raw::new(&proxy);

    let message = charge(1, 9, Some("truncated-1"));
    let (status, body) = call_tolerant(&raw, &message).await;
    eprintln!("the client got HTTP {status}: {body:?}");
    assert_eq!(status, 200);
    assert!(
        body.contains("nobody-asked"),
        "the stray response passes: {body}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The retry is told the outcome is unknown; it does not reach the upstream.
    let retry = raw.call(charge(2, 9, Some("truncated-1"))).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(
        error_of(&retry),
        (-32603, "idempotency_outcome_unknown".into()),
        "{}",
        retry.body
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_no_panic(&proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_body_does_not_block_other_clients() {
    let s = setup();
    let address = s.raw.authority.clone();
    let body = raw_keyed_charge(1, "slowloris", r#"{"amount":1,"currency":"EUR"}"#);
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(
        format!(
            "POST /mcp HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-method: tools/call\r\nmcp-name: charge_payment\r\nmcp-protocol-version: 2026-07-28\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();

    // One byte a second for 3 seconds; meanwhile other clients are served.
    let trickle = async {
        for byte in body.as_bytes().iter().take(3) {
            slow.write_all(&[*byte]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let others = async {
        for i in 0..3 {
            assert_still_serving(&s.raw, 10 + 10 * i, &format!("while-slow-{i}")).await;
        }
    };
    tokio::time::timeout(TIMEOUT, async { tokio::join!(trickle, others) })
        .await
        .expect("other clients are served while one body trickles in");
    assert_eq!(ledger_lines(&s.ledger).len(), 3);

    // The slow body, finished, is then handled normally (no read timeout cut it off).
    slow.write_all(&body.as_bytes()[3..]).await.unwrap();
    let mut answer = vec![0u8; 16 << 10];
    let n = tokio::time::timeout(TIMEOUT, slow.read(&mut answer))
        .await
        .expect("an answer to the slow body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(ledger_lines(&s.ledger).len(), 4);
    assert_no_panic(&s.proxy);
}
