//! Connection limits of `mcp-idem proxy`, against the real binaries on loopback (docs/reliability.md,
//! "Bad input"): a client trickling its request head is disconnected after `--header-timeout`, so
//! is one that sends nothing; a kept-alive connection idle for `--idle-timeout` is closed, while a
//! request that takes longer than both is answered; connections beyond `--max-connections` wait
//! unaccepted until one closes, then are served.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::common::{ledger_lines, TIMEOUT};
use crate::support::http::{
    charge, discover, ledger_in, slow_charge, sqlite_in, HttpDemo, Proxy, Raw,
};

struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    _server: HttpDemo,
    proxy: Proxy,
    raw: Raw,
}

fn setup(args: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let mut all = vec!["--store", &store];
    all.extend_from_slice(args);
    let proxy = Proxy::spawn(&server.base_url(), &all);
    let raw = Raw::new(&proxy);
    Setup {
        _dir: dir,
        ledger,
        _server: server,
        proxy,
        raw,
    }
}

/// One HTTP/1.1 connection of its own to the proxy, kept alive between requests.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// Completes when the connection is closed.
    closed: JoinHandle<()>,
}

impl Connection {
    async fn open(raw: &Raw) -> Self {
        let stream = TcpStream::connect(&raw.authority).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let closed = tokio::spawn(async move {
            let _ = conn.await;
        });
        Self { sender, closed }
    }

    /// POSTs `message` and reads the whole answer: status and JSON-RPC response.
    async fn call(&mut self, raw: &Raw, message: &Value) -> (http::StatusCode, Value) {
        let request = raw
            .post(message)
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        self.sender.ready().await.expect("the connection is open");
        let response = self.sender.send_request(request).await.expect("an answer");
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let json = if text.trim_start().starts_with('{') {
            serde_json::from_str(&text).unwrap()
        } else {
            crate::support::http::sse_messages(&text)
                .into_iter()
                .find(|m| m.get("id").is_some())
                .unwrap_or_else(|| panic!("no response in {text}"))
        };
        (status, json)
    }

    /// Waits until the proxy closes the connection; panics after [`TIMEOUT`].
    async fn wait_closed(self) {
        tokio::time::timeout(TIMEOUT, self.closed)
            .await
            .expect("the proxy closed the connection")
            .unwrap();
    }
}

/// Reads until the proxy closes `stream`; returns what it sent. Panics after [`TIMEOUT`].
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let read = tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut received)).await;
    match read.expect("the proxy closed the connection") {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(err) => panic!("reading: {err}"),
    }
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_request_head_is_disconnected() {
    // The guard of every wait (TIMEOUT, 20 s) is longer than the header timeout but shorter than
    // the idle timeout: only the header timeout can close these connections.
    let s = setup(&["--header-timeout", "1s", "--idle-timeout", "1h"]);
    let address = s.raw.authority.clone();

    // Sends nothing at all.
    let mut silent = TcpStream::connect(&address).await.unwrap();
    // Sends a head one byte every 100 ms, which would take minutes to finish.
    let mut slow = TcpStream::connect(&address).await.unwrap();
    slow.write_all(format!("POST /mcp HTTP/1.1\r\nhost: {address}\r\n").as_bytes())
        .await
        .unwrap();
    let (mut slow_read, mut slow_write) = slow.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..10_000 {
            if slow_write.write_all(b"x").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    assert!(read_until_closed(&mut silent).await.is_empty());
    let mut received = Vec::new();
    let read = tokio::time::timeout(TIMEOUT, slow_read.read_to_end(&mut received)).await;
    assert!(
        matches!(read, Ok(Ok(_)))
            || matches!(&read, Ok(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionReset),
        "the slow client was not disconnected: {read:?}"
    );
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    trickle.abort();

    // Others are served; a whole head sent at once is in time.
    let answer = s.raw.call(charge(1, 5, Some("after-slow-head"))).await;
    assert!(answer.charge_id().is_some(), "{answer:?}");
    assert_eq!(ledger_lines(&s.ledger).len(), 1);
    assert!(
        !s.proxy.stderr().contains("panicked"),
        "{}",
        s.proxy.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_but_a_long_request_is_answered() {
    // The idle timeout is the only one shorter than the wait's guard.
    let s = setup(&["--idle-timeout", "1s", "--header-timeout", "1h"]);
    let mut conn = Connection::open(&s.raw).await;

    // A call that takes 2 s, longer than the idle timeout, on the connection: answered.
    let (status, response) = conn
        .call(&s.raw, &slow_charge(1, 5, 2_000, Some("slow-on-idle")))
        .await;
    assert_eq!(status, 200, "{response}");
    assert!(
        response["result"]["structuredContent"]["chargeId"].is_string(),
        "{response}"
    );
    // The same connection carries a second request (kept alive), then idles and is closed.
    let (status, response) = conn.call(&s.raw, &discover(2)).await;
    assert_eq!(status, 200, "{response}");
    conn.wait_closed().await;

    assert_eq!(ledger_lines(&s.ledger).len(), 1);
    let answer = s.raw.call(charge(3, 5, Some("after-idle"))).await;
    assert!(answer.charge_id().is_some(), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_wait_until_one_closes() {
    let s = setup(&["--max-connections", "1"]);
    let mut first = Connection::open(&s.raw).await;
    let (status, _) = first.call(&s.raw, &charge(1, 5, Some("first"))).await;
    assert_eq!(status, 200);
    // The proxy holds the first connection (kept alive) and accepts no other.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !s.proxy.stderr().contains("connection limit reached") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            s.proxy.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The kernel completes the second connection's handshake, but the proxy does not take it.
    let mut second = Connection::open(&s.raw).await;
    let raw = s.raw.clone();
    let waiting = tokio::spawn(async move {
        let answer = second.call(&raw, &charge(2, 5, Some("second"))).await;
        (answer, second)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "served beyond the limit");
    assert_eq!(ledger_lines(&s.ledger).len(), 1);

    // The first closes: the second is accepted and served.
    drop(first.sender);
    first.closed.await.unwrap();
    let ((status, response), _second) = tokio::time::timeout(TIMEOUT, waiting)
        .await
        .expect("served once the first connection closed")
        .unwrap();
    assert_eq!(status, 200, "{response}");
    assert!(
        response["result"]["structuredContent"]["chargeId"].is_string(),
        "{response}"
    );
    assert_eq!(ledger_lines(&s.ledger).len(), 2);
    assert!(
        !s.proxy.stderr().contains("panicked"),
        "{}",
        s.proxy.stderr()
    );
}
