//! Shared helpers for end-to-end tests over Streamable HTTP: the demo server (`demo-server --http`)
//! and `mcp-idem proxy` instances as child processes killed on drop, a raw HTTP/1.1 client for
//! MCP POSTs whose answers may be plain JSON or SSE streams, and the Redis/PostgreSQL URLs.
//!
//! It builds on `common`'s helpers.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::support::common::{meta_2026, TIMEOUT};

/// A child process killed on drop; its stderr is drained into [`Spawned::stderr`] (and echoed
/// with a prefix, which the test harness shows for failing tests).
pub(crate) struct Spawned {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Spawned {
    /// Spawns `command` and waits for the stderr line starting with `ready`; returns the process
    /// and the rest of that line.
    pub(crate) fn spawn(mut command: Command, name: &str, ready: &str) -> (Self, String) {
        // Warnings and errors, unless the caller chose what to log.
        if !command.get_envs().any(|(name, _)| name == "MCP_IDEM_LOG") {
            command.env("MCP_IDEM_LOG", "warn");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {name}: {err}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let (prefix, name_owned, sink) = (ready.to_owned(), name.to_owned(), Arc::clone(&log));
        // Keep draining stderr so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix(&prefix) {
                    let _ = tx.send(rest.to_owned());
                } else {
                    eprintln!("{name_owned}: {line}");
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut spawned = Self { child, log };
        match rx.recv_timeout(TIMEOUT) {
            Ok(rest) => (spawned, rest),
            Err(_) => {
                let status = spawned.child.try_wait().ok().flatten();
                panic!(
                    "{name} did not print {ready:?} within {TIMEOUT:?} (exit status {status:?}); stderr:\n{}",
                    spawned.stderr()
                )
            }
        }
    }

    pub(crate) fn stderr(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Kills the process with SIGKILL and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (polling, without blocking the runtime) for the process to exit; panics after
    /// [`TIMEOUT`].
    async fn exited(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the process") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the process did not exit within {TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (without blocking the runtime) until the process logged a line containing `text`;
    /// panics after [`TIMEOUT`].
    async fn logged(&self, text: &str) {
        let deadline = std::time::Instant::now() + TIMEOUT;
        while !self.stderr().contains(text) {
            assert!(
                std::time::Instant::now() < deadline,
                "no {text:?} logged within {TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Something with an MCP endpoint URL that [`Raw`] can POST to.
pub(crate) trait Endpoint {
    /// `http://HOST:PORT/mcp`.
    fn mcp_url(&self) -> &str;
}

impl Endpoint for str {
    fn mcp_url(&self) -> &str {
        self
    }
}

impl Endpoint for String {
    fn mcp_url(&self) -> &str {
        self
    }
}

/// `mcp-idem demo-server --http 127.0.0.1:0 --ledger LEDGER [extra]`, killed on drop.
pub(crate) struct HttpDemo {
    process: Spawned,
    /// `http://127.0.0.1:PORT/mcp`, read from the server's first stderr line.
    pub(crate) url: String,
    /// `127.0.0.1:PORT`.
    pub(crate) authority: String,
}

impl HttpDemo {
    pub(crate) fn spawn(ledger: &Path, extra: &[&str]) -> Self {
        Self::spawn_on("127.0.0.1:0", ledger, extra)
    }

    /// `mcp-idem demo-server --http LISTEN --ledger LEDGER [extra]`: on a port of the test's
    /// choosing, e.g. to restart a server where its clients expect it.
    pub(crate) fn spawn_on(listen: &str, ledger: &Path, extra: &[&str]) -> Self {
        Self::spawn_with_log(listen, ledger, extra, "warn")
    }

    /// [`HttpDemo::spawn_on`] logging with the `MCP_IDEM_LOG` filter `log`: with
    /// `mcp_idem::commands::demo_server=info` it logs "charge_payment started" as each charge
    /// begins ([`HttpDemo::logged`]).
    pub(crate) fn spawn_with_log(listen: &str, ledger: &Path, extra: &[&str], log: &str) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
        command
            .args(["demo-server", "--http", listen, "--ledger"])
            .arg(ledger)
            .args(extra)
            .env("MCP_IDEM_LOG", log);
        let (process, url) = Spawned::spawn(command, "demo-server", "listening on ");
        let authority = url
            .strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/mcp"))
            .unwrap_or_else(|| panic!("unexpected URL {url}"))
            .to_owned();
        assert!(
            authority.starts_with("127.0.0.1:") && !authority.ends_with(":0"),
            "{authority}"
        );
        Self {
            process,
            url,
            authority,
        }
    }

    /// `http://127.0.0.1:PORT`: the value for `proxy --upstream`.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// What the server logged so far (warnings and errors).
    pub(crate) fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// Waits until the server logged a line containing `text`.
    pub(crate) async fn logged(&self, text: &str) {
        self.process.logged(text).await;
    }
}

impl Endpoint for HttpDemo {
    fn mcp_url(&self) -> &str {
        &self.url
    }
}

/// `mcp-idem proxy --listen 127.0.0.1:0 --upstream UPSTREAM [args]`, killed on drop.
pub(crate) struct Proxy {
    process: Spawned,
    /// `http://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
}

impl Proxy {
    /// Spawns a proxy to `upstream` (`http://HOST:PORT`) and waits until it listens.
    pub(crate) fn spawn(upstream: &str, args: &[&str]) -> Self {
        Self::spawn_with_log(upstream, args, "warn")
    }

    /// [`Proxy::spawn`] logging with the `MCP_IDEM_LOG` filter `log`.
    pub(crate) fn spawn_with_log(upstream: &str, args: &[&str], log: &str) -> Self {
        Self::spawn_with_env(upstream, args, &[("MCP_IDEM_LOG", log)])
    }

    /// [`Proxy::spawn`] with these environment variables (`MCP_IDEM_LOG` is `warn` unless one
    /// of them sets it).
    pub(crate) fn spawn_with_env(upstream: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
        command
            .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(args)
            .env("MCP_IDEM_LOG", "warn")
            .envs(env.iter().copied());
        let (process, base) =
            Spawned::spawn(command, "mcp-idem proxy", "mcp-idem proxy: listening on ");
        assert!(
            base.starts_with("http://127.0.0.1:") && !base.ends_with(":0"),
            "{base}"
        );
        Self {
            process,
            url: format!("{base}/mcp"),
        }
    }

    /// `n` proxies with the same arguments, each on a port of its own.
    pub(crate) fn spawn_many(n: usize, upstream: &str, args: &[&str]) -> Vec<Self> {
        (0..n).map(|_| Self::spawn(upstream, args)).collect()
    }

    /// What the proxy logged so far (warnings and errors).
    pub(crate) fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// Waits until the proxy logged a line containing `text`.
    pub(crate) async fn logged(&self, text: &str) {
        self.process.logged(text).await;
    }

    /// The proxy's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// Waits for the proxy to exit; panics after [`TIMEOUT`].
    pub(crate) async fn exited(&mut self) -> std::process::ExitStatus {
        self.process.exited().await
    }
}

impl Endpoint for Proxy {
    fn mcp_url(&self) -> &str {
        &self.url
    }
}

/// `http://127.0.0.1:PORT` where nothing listens (a port just released).
pub(crate) fn closed_port_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// `ledger.jsonl` in `dir`.
pub(crate) fn ledger_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ledger.jsonl")
}

/// `sqlite:DIR/records.sqlite3`.
pub(crate) fn sqlite_in(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", dir.path().join("records.sqlite3").display())
}

/// A namespace no other test run uses, for stores shared between runs.
pub(crate) fn unique_namespace(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("mcp-idem-test:{test}:{}:{nanos:x}", std::process::id())
}

/// The HTTP/1.1 client the tests use: no connection limit, a fresh pool per [`Raw`].
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A plain HTTP/1.1 client for raw MCP POSTs to one endpoint.
#[derive(Clone)]
pub(crate) struct Raw {
    pub(crate) client: HttpClient,
    /// `http://HOST:PORT/mcp`.
    pub(crate) url: String,
    /// `HOST:PORT`.
    pub(crate) authority: String,
}

/// Status, headers and body of one exchange.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: http::StatusCode,
    pub(crate) headers: http::HeaderMap,
    /// The body as received (an SSE stream stays raw).
    pub(crate) body: String,
}

impl Answer {
    /// The JSON-RPC response: the body, or for `text/event-stream` the `data` of the event that
    /// carries a response (a message with an id and a result or error).
    pub(crate) fn json(&self) -> Value {
        if self.is_sse() {
            return sse_messages(&self.body)
                .into_iter()
                .find(|m| {
                    m.get("id").is_some() && (m.get("result").is_some() || m.get("error").is_some())
                })
                .unwrap_or_else(|| {
                    panic!("no JSON-RPC response in the event stream: {}", self.body)
                });
        }
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}), HTTP {}: {}", self.status, self.body))
    }

    /// The `Content-Type`, or "".
    pub(crate) fn content_type(&self) -> &str {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
    }

    pub(crate) fn is_sse(&self) -> bool {
        self.content_type().starts_with("text/event-stream")
    }

    /// `error.data.type` of the response, if it is such an error.
    pub(crate) fn error_type(&self) -> Option<String> {
        self.json()["error"]["data"]["type"]
            .as_str()
            .map(str::to_owned)
    }

    /// `result.structuredContent.chargeId` of a successful charge, or `error.data.chargeId` of a
    /// `fail_after_charge` one.
    pub(crate) fn charge_id(&self) -> Option<String> {
        let json = self.json();
        json["result"]["structuredContent"]["chargeId"]
            .as_str()
            .or_else(|| json["error"]["data"]["chargeId"].as_str())
            .map(str::to_owned)
    }
}

/// The `Content-Type` of `answer`, or "".
pub(crate) fn content_type(answer: &Answer) -> &str {
    answer.content_type()
}

/// The JSON messages of an SSE stream: each event's `data` lines joined with newlines (events
/// without data, such as priming events, are skipped).
pub(crate) fn sse_messages(stream: &str) -> Vec<Value> {
    let normalized = stream.replace("\r\n", "\n").replace('\r', "\n");
    normalized
        .split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            let data = data.join("\n");
            if data.trim().is_empty() {
                return None;
            }
            Some(
                serde_json::from_str(&data)
                    .unwrap_or_else(|err| panic!("SSE data is not JSON ({err}): {data}")),
            )
        })
        .collect()
}

impl Raw {
    /// A client for `endpoint` (a demo server, a proxy, or an `http://HOST:PORT/mcp` URL).
    pub(crate) fn new(endpoint: &(impl Endpoint + ?Sized)) -> Self {
        Self::with_client(Client::builder(TokioExecutor::new()).build_http(), endpoint)
    }

    /// A client for `endpoint` that shares `client`'s connection pool.
    pub(crate) fn with_client(client: HttpClient, endpoint: &(impl Endpoint + ?Sized)) -> Self {
        let url = endpoint.mcp_url().to_owned();
        let authority = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("unexpected URL {url}"))
            .to_owned();
        Self {
            client,
            url,
            authority,
        }
    }

    /// A POST of `message` with the headers of the 2026-07-28 Streamable HTTP transport.
    pub(crate) fn post(&self, message: &Value) -> http::request::Builder {
        let mut request = http::Request::post(&self.url)
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        if let Some(method) = message["method"].as_str() {
            request = request.header("mcp-method", method);
            if method != "initialize" {
                request = request.header("mcp-protocol-version", "2026-07-28");
            }
            if let Some(name) = message["params"]["name"].as_str() {
                request = request.header("mcp-name", name);
            }
        }
        request
    }

    /// Sends `body` (nothing for `null`) and reads the whole answer; panics after [`TIMEOUT`].
    pub(crate) async fn send(&self, request: http::request::Builder, body: &Value) -> Answer {
        let body = match body {
            Value::Null => Bytes::new(),
            body => Bytes::from(body.to_string()),
        };
        self.send_bytes(request, body).await
    }

    /// Sends `body` as is and reads the whole answer; panics after [`TIMEOUT`].
    pub(crate) async fn send_bytes(&self, request: http::request::Builder, body: Bytes) -> Answer {
        let request = request.body(Full::new(body)).unwrap();
        let exchange = async {
            let response = self.client.request(request).await.expect("an HTTP answer");
            let (parts, body) = response.into_parts();
            let body = body.collect().await.expect("the whole body").to_bytes();
            Answer {
                status: parts.status,
                headers: parts.headers,
                body: String::from_utf8(body.to_vec()).expect("UTF-8 body"),
            }
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| panic!("no whole answer from {} within {TIMEOUT:?}", self.url))
    }

    /// POSTs `message`.
    pub(crate) async fn call(&self, message: Value) -> Answer {
        self.send(self.post(&message), &message).await
    }

    /// POSTs `message` with extra `headers`.
    pub(crate) async fn call_with(&self, message: Value, headers: &[(&str, &str)]) -> Answer {
        let mut request = self.post(&message);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request, &message).await
    }

    /// POSTs `message` and hangs up after `after`: drops the request, or the response body if the
    /// head came earlier, which closes the connection. Returns the head's status if it came.
    pub(crate) async fn hang_up_after(
        &self,
        message: &Value,
        after: Duration,
    ) -> Option<http::StatusCode> {
        let request = self
            .post(message)
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        let deadline = tokio::time::Instant::now() + after;
        let response = tokio::time::timeout_at(deadline, self.client.request(request))
            .await
            .ok()?
            .expect("an HTTP answer");
        let status = response.status();
        let mut body = response.into_body();
        // Read whatever comes until the deadline, then drop the body mid-stream.
        while let Ok(Some(frame)) = tokio::time::timeout_at(deadline, body.frame()).await {
            frame.expect("a body frame");
        }
        Some(status)
    }
}

/// A POST to `raw`'s endpoint as a 2025-06-18 client sends it: no per-request protocol metadata,
/// the session id (`Mcp-Session-Id`) once it has one.
pub(crate) fn legacy_post(raw: &Raw, session: Option<&str>) -> http::request::Builder {
    let mut request = http::Request::post(&raw.url)
        .header(http::header::HOST, &raw.authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream");
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-06-18");
    }
    request
}

/// A `tools/call` request; `key` becomes `params.idempotencyKey`.
pub(crate) fn tool_call(id: u64, name: &str, arguments: Value, key: Option<&str>) -> Value {
    let mut params = json!({"_meta": meta_2026(), "name": name, "arguments": arguments});
    if let Some(key) = key {
        params["idempotencyKey"] = json!(key);
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// A `charge_payment` of `amount` EUR.
pub(crate) fn charge(id: u64, amount: u64, key: Option<&str>) -> Value {
    tool_call(
        id,
        "charge_payment",
        json!({"amount": amount, "currency": "EUR"}),
        key,
    )
}

/// A `charge_payment` of `amount` EUR that sleeps `delay_ms` first.
pub(crate) fn slow_charge(id: u64, amount: u64, delay_ms: u64, key: Option<&str>) -> Value {
    tool_call(
        id,
        "charge_payment",
        json!({"amount": amount, "currency": "EUR", "delay_ms": delay_ms}),
        key,
    )
}

/// A `server/discover` request.
pub(crate) fn discover(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"server/discover","params":{"_meta": meta_2026()}})
}

/// A legacy `initialize` request.
pub(crate) fn initialize(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"mcp-idem-tests","version":"0"}}})
}

/// Sends `message` until its answer is no longer `idempotency_key_in_progress` (waiting the
/// advertised `retryAfterMs`, at most 500 ms, between tries); panics after [`TIMEOUT`].
pub(crate) async fn call_until_settled(raw: &Raw, message: &Value) -> Answer {
    call_until_settled_with(raw, message, &[]).await
}

/// [`call_until_settled`] with extra headers.
pub(crate) async fn call_until_settled_with(
    raw: &Raw,
    message: &Value,
    headers: &[(&str, &str)],
) -> Answer {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let answer = raw.call_with(message.clone(), headers).await;
        if answer.status != http::StatusCode::OK
            || answer.error_type().as_deref() != Some("idempotency_key_in_progress")
        {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still in progress after {TIMEOUT:?}: {}",
            answer.body
        );
        let wait = answer.json()["error"]["data"]["retryAfterMs"]
            .as_u64()
            .unwrap_or(100)
            .clamp(10, 500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// Waits (without blocking the runtime) until the ledger has `lines` lines; panics after
/// [`TIMEOUT`].
pub(crate) async fn await_ledger(ledger: &Path, lines: usize) -> Vec<Value> {
    let path = ledger.to_path_buf();
    tokio::task::spawn_blocking(move || crate::support::common::wait_for_ledger(&path, lines))
        .await
        .expect("the ledger wait panicked")
}

/// Which shared store a test needs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SharedStore {
    /// `REDIS_URL`, default `redis://127.0.0.1:6379`.
    Redis,
    /// `DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`.
    Postgres,
    /// `REDIS_CLUSTER_URL`, default the cluster of `scripts/redis-cluster.sh`
    /// (`redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002`).
    RedisCluster,
    /// `REDIS_TLS_URL` (default `rediss://127.0.0.1:6380`) with `sslrootcert=` the CA file
    /// `REDIS_TLS_CA` (default `/tmp/mcp-idem-redis-tls/ca.pem`): scripts/tls-redis.sh.
    RedisTls,
    /// `REDIS_TLS_CLUSTER_URL` (default
    /// `rediss-cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102`) with `sslrootcert=` the CA
    /// file `REDIS_TLS_CA`: scripts/tls-redis.sh.
    RedisTlsCluster,
}

impl SharedStore {
    /// The store's URL if its server accepts TCP connections. If not: panics when `CI=true` (the
    /// CI provides these services), else prints a note and returns `None` (skip the test).
    pub(crate) fn url(self) -> Option<String> {
        let (var, default) = match self {
            Self::Redis => ("REDIS_URL", "redis://127.0.0.1:6379"),
            Self::Postgres => ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
            Self::RedisCluster => (
                "REDIS_CLUSTER_URL",
                "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
            ),
            Self::RedisTls => ("REDIS_TLS_URL", "rediss://127.0.0.1:6380"),
            Self::RedisTlsCluster => (
                "REDIS_TLS_CLUSTER_URL",
                "rediss-cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102",
            ),
        };
        let mut url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
        if matches!(self, Self::RedisTls | Self::RedisTlsCluster) {
            let ca = std::env::var("REDIS_TLS_CA")
                .unwrap_or_else(|_| "/tmp/mcp-idem-redis-tls/ca.pem".to_owned());
            let joiner = if url.contains('?') { '&' } else { '?' };
            url = format!("{url}{joiner}sslrootcert={ca}");
        }
        let address = host_port(&url, self);
        let reachable = std::net::ToSocketAddrs::to_socket_addrs(address.as_str())
            .ok()
            .into_iter()
            .flatten()
            .any(|addr| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
            });
        if reachable {
            return Some(url);
        }
        let message = format!("{self:?} is not reachable at {address} (set {var})");
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{message}: CI=true requires it");
        }
        eprintln!("note: {message}; skipping this test");
        None
    }
}

/// `HOST:PORT` of a `redis://` or `postgres://` URL (userinfo, path and query dropped), or of the
/// first node of a `redis-cluster://` URL.
fn host_port(url: &str, store: SharedStore) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?', ',']).next().unwrap_or("");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let has_port = match host.rsplit_once(':') {
        Some((_, port)) => !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    if has_port && !host.ends_with(']') {
        host.to_owned()
    } else {
        let port = match store {
            SharedStore::Redis => 6379,
            SharedStore::Postgres => 5432,
            SharedStore::RedisCluster => 7000,
            SharedStore::RedisTls => 6380,
            SharedStore::RedisTlsCluster => 7100,
        };
        format!("{host}:{port}")
    }
}
