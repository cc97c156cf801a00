//! [`StdioProxy::run`] between a test playing the client and a scripted fake server, over
//! in-memory pipes. Every read has a timeout, so a bug fails a test instead of hanging it.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_idempotency::interceptor::{CancelPolicy, InterceptorConfig, META_KEY};
use mcp_idempotency::stdio::{ProxyExit, StdioProxy};
use mcp_idempotency::store::{MemoryStore, SqliteStore, Store};
use mcp_idempotency::{
    Deduplicator, EngineConfig, IdempotencyKey, Outcome, RecordId, RecordState, Scope, Timestamp,
};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// How long any single read may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(3);
/// Pipe buffer: small, so that long lines really stream through the proxy.
const PIPE: usize = 64 * 1024;

fn scope() -> Scope {
    Scope::new("stdio-tests", "alice")
}

fn record_id(key: &str) -> RecordId {
    RecordId {
        scope: scope(),
        key: IdempotencyKey::new(key, 255).unwrap(),
    }
}

fn memory_dedup(config: EngineConfig) -> (Deduplicator, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    (Deduplicator::new(config, Arc::clone(&store)), store)
}

// ---------------------------------------------------------------------------------------------
// Pipes
// ---------------------------------------------------------------------------------------------

/// Reads newline-delimited lines, with a timeout.
struct LineReader(BufReader<DuplexStream>);

impl LineReader {
    /// The next line with its newline, or `None` at end of stream.
    async fn raw(&mut self) -> Option<Vec<u8>> {
        let mut line = Vec::new();
        let read = timeout(PATIENCE, self.0.read_until(b'\n', &mut line))
            .await
            .expect("timed out waiting for a line")
            .expect("read");
        (read > 0).then_some(line)
    }

    async fn text(&mut self) -> Option<String> {
        self.raw()
            .await
            .map(|line| String::from_utf8(line).expect("UTF-8 line"))
    }

    async fn json(&mut self) -> Value {
        let line = self
            .text()
            .await
            .expect("a line, not the end of the stream");
        serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line}"))
    }

    async fn expect_eof(&mut self) {
        if let Some(line) = self.raw().await {
            panic!(
                "expected end of stream, got {}",
                String::from_utf8_lossy(&line)
            );
        }
    }
}

/// The test's end of the client's streams.
struct Client {
    to_proxy: DuplexStream,
    from_proxy: LineReader,
}

impl Client {
    async fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").as_bytes()).await;
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        timeout(PATIENCE, self.to_proxy.write_all(bytes))
            .await
            .expect("timed out writing to the proxy")
            .expect("write to the proxy");
    }

    async fn recv(&mut self) -> Value {
        self.from_proxy.json().await
    }

    async fn recv_text(&mut self) -> String {
        self.from_proxy.text().await.expect("a line from the proxy")
    }

    /// Closes the client's output: the proxy sees end of input.
    async fn close(&mut self) {
        self.to_proxy.shutdown().await.expect("shutdown");
    }
}

/// The fake server's ends of its streams.
struct ServerEnds {
    requests: LineReader,
    to_proxy: DuplexStream,
}

impl ServerEnds {
    async fn send(&mut self, line: &str) {
        self.to_proxy
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the proxy");
    }
}

type Run = JoinHandle<io::Result<ProxyExit>>;

fn start(dedup: Deduplicator, config: InterceptorConfig) -> (Client, ServerEnds, Run) {
    start_proxy(StdioProxy::new(dedup, scope()).interceptor_config(config))
}

/// [`start`] with a proxy set up by the test.
fn start_proxy(proxy: StdioProxy) -> (Client, ServerEnds, Run) {
    let (client_to_proxy, proxy_client_in) = tokio::io::duplex(PIPE);
    let (proxy_client_out, proxy_to_client) = tokio::io::duplex(PIPE);
    let (proxy_server_in, server_requests) = tokio::io::duplex(PIPE);
    let (server_to_proxy, proxy_server_out) = tokio::io::duplex(PIPE);
    let run = tokio::spawn(proxy.run(
        proxy_client_in,
        proxy_client_out,
        proxy_server_in,
        proxy_server_out,
    ));
    (
        Client {
            to_proxy: client_to_proxy,
            from_proxy: LineReader(BufReader::new(proxy_to_client)),
        },
        ServerEnds {
            requests: LineReader(BufReader::new(server_requests)),
            to_proxy: server_to_proxy,
        },
        run,
    )
}

/// Asserts that the record of `key` is completed as outcome-unknown.
async fn assert_recorded_unknown(store: &dyn Store, key: &str) {
    let record = store
        .get(&record_id(key), Timestamp::now())
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no record of {key}"));
    assert!(
        matches!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::Unknown { .. },
                ..
            }
        ),
        "{record:?}"
    );
}

async fn finished(run: Run) -> ProxyExit {
    timeout(PATIENCE, run)
        .await
        .expect("the proxy did not stop")
        .expect("the proxy panicked")
        .expect("the proxy failed")
}

// ---------------------------------------------------------------------------------------------
// A fake server
// ---------------------------------------------------------------------------------------------

/// What the echo server saw and did.
#[derive(Clone, Default)]
struct Log {
    executions: Arc<AtomicUsize>,
    lines: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Log {
    fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    fn lines(&self) -> Vec<Vec<u8>> {
        self.lines.lock().unwrap().clone()
    }

    fn tool_calls(&self) -> Vec<Value> {
        self.lines()
            .iter()
            .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
            .filter(|message| message["method"] == "tools/call")
            .collect()
    }
}

/// The result the echo server gives for its `n`th execution of a call with `arguments`.
fn echo_result(n: usize, arguments: &Value) -> String {
    json!({
        "content": [{"type": "text", "text": format!("execution #{n}")}],
        "structuredContent": {"execution": n, "arguments": arguments},
    })
    .to_string()
}

/// Answers `tools/call` at once with [`echo_result`], `initialize` with a `tools` capability, and
/// any other request with `{}`; notifications and responses are only logged. Stops at end of
/// input, closing its output.
fn spawn_echo_server(mut server: ServerEnds) -> (Log, JoinHandle<()>) {
    let log = Log::default();
    let task_log = log.clone();
    let task = tokio::spawn(async move {
        while let Some(line) = server.requests.raw().await {
            task_log.lines.lock().unwrap().push(line.clone());
            let Ok(message) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) else {
                continue;
            };
            let result = match method {
                "tools/call" => {
                    let n = task_log.executions.fetch_add(1, Ordering::SeqCst) + 1;
                    echo_result(n, &message["params"]["arguments"])
                }
                "initialize" => {
                    r#"{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"echo","version":"1"}}"#.into()
                }
                "server/discover" => {
                    r#"{"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"echo","version":"1"}}}"#.into()
                }
                _ => "{}".into(),
            };
            server
                .send(&format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#
                ))
                .await;
        }
    });
    (log, task)
}

fn call(id: impl Into<Value>, key: &str, arguments: Value) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id.into(),
        "method": "tools/call",
        "params": {"name": "charge", "arguments": arguments, "idempotencyKey": key},
    })
    .to_string()
}

/// The raw text of `result` in a response line.
fn raw_result(line: &str) -> String {
    let members: BTreeMap<String, Box<RawValue>> = serde_json::from_str(line).unwrap();
    members["result"].get().to_owned()
}

fn error_type(response: &Value) -> &str {
    response["error"]["data"]["type"]
        .as_str()
        .unwrap_or_else(|| {
            panic!("expected an idempotency error, got {response}");
        })
}

mod in_flight;
mod passthrough;
mod records;
mod stopping;
