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

async fn sqlite_store(path: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path).await.expect("open SQLite store"))
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
    let (client_to_proxy, proxy_client_in) = tokio::io::duplex(PIPE);
    let (proxy_client_out, proxy_to_client) = tokio::io::duplex(PIPE);
    let (proxy_server_in, server_requests) = tokio::io::duplex(PIPE);
    let (server_to_proxy, proxy_server_out) = tokio::io::duplex(PIPE);
    let proxy = StdioProxy::new(dedup, scope()).interceptor_config(config);
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

/// Waits until the store holds a record for `key`.
async fn wait_for_record(store: &Arc<dyn Store>, key: &str) {
    timeout(PATIENCE, async {
        while store
            .get(&record_id(key), Timestamp::now())
            .await
            .unwrap()
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the proxy never claimed the key");
}

fn error_type(response: &Value) -> &str {
    response["error"]["data"]["type"]
        .as_str()
        .unwrap_or_else(|| {
            panic!("expected an idempotency error, got {response}");
        })
}

// ---------------------------------------------------------------------------------------------
// Flows
// ---------------------------------------------------------------------------------------------

async fn executes_once_then_replays(dedup: Deduplicator) {
    let (mut client, server, run) = start(dedup, InterceptorConfig::default());
    let (log, server_task) = spawn_echo_server(server);

    client
        .send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#)
        .await;
    let init = client.recv().await;
    assert_eq!(
        init["result"]["capabilities"]["tools"],
        json!({"listChanged": true, "idempotency": {}})
    );

    client
        .send(&call(1, "order-1", json!({"amount": 4200})))
        .await;
    let first = client.recv_text().await;
    let first_json: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first_json["id"], json!(1));
    assert_eq!(first_json["result"]["structuredContent"]["execution"], 1);

    // The retry, respelled, gets the same bytes under its own id; the server never sees it.
    client
        .send(r#"{"jsonrpc":"2.0","id":"retry","method":"tools/call","params":{"idempotencyKey":"order-1","arguments":{"amount":4200.0},"name":"charge"}}"#)
        .await;
    let replay = client.recv_text().await;
    let replay_json: Value = serde_json::from_str(&replay).unwrap();
    assert_eq!(replay_json["id"], json!("retry"));
    assert_eq!(raw_result(&replay), raw_result(&first));
    assert_eq!(log.executions(), 1);

    // Different arguments, same key: refused, not run.
    client.send(&call(2, "order-1", json!({"amount": 1}))).await;
    let conflict = client.recv().await;
    assert_eq!(conflict["id"], json!(2));
    assert_eq!(error_type(&conflict), "idempotency_key_conflict");

    // A call without a key runs every time.
    for id in [3, 4] {
        client
            .send(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"charge","arguments":{{}}}}}}"#
            ))
            .await;
        assert_eq!(client.recv().await["id"], json!(id));
    }
    assert_eq!(log.executions(), 3);

    // The executed keyed call reached the server without its key, with the key in `_meta`.
    let calls = log.tool_calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0]["params"].get("idempotencyKey"), None);
    assert_eq!(calls[0]["params"]["_meta"][META_KEY], json!("order-1"));
    assert_eq!(calls[0]["params"]["arguments"], json!({"amount": 4200}));

    client.close().await;
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 0 });
    server_task.await.unwrap();
    client.from_proxy.expect_eof().await;
}

#[tokio::test]
async fn keyed_call_executes_once_and_retries_replay_in_memory() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    executes_once_then_replays(dedup).await;
}

#[tokio::test]
async fn keyed_call_executes_once_and_retries_replay_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir.path().join("records.sqlite3")).await;
    executes_once_then_replays(Deduplicator::new(EngineConfig::default(), store)).await;
}

#[tokio::test]
async fn out_of_order_responses_are_recorded_to_their_keys() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());

    client.send(&call(1, "key-a", json!({"who": "a"}))).await;
    client.send(&call(2, "key-b", json!({"who": "b"}))).await;
    // The server takes both, then answers the second first.
    let a: Value = server.requests.json().await;
    let b: Value = server.requests.json().await;
    assert_eq!(a["params"]["arguments"], json!({"who": "a"}));
    assert_eq!(b["params"]["arguments"], json!({"who": "b"}));
    for (request, n) in [(&b, 1), (&a, 2)] {
        let result = echo_result(n, &request["params"]["arguments"]);
        server
            .send(&format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#,
                request["id"]
            ))
            .await;
    }
    let first = client.recv_text().await;
    let second = client.recv_text().await;
    let first_json: Value = serde_json::from_str(&first).unwrap();
    let second_json: Value = serde_json::from_str(&second).unwrap();
    assert_eq!(first_json["id"], json!(2));
    assert_eq!(second_json["id"], json!(1));

    // Retries replay what each key's own call returned.
    client.send(&call(3, "key-a", json!({"who": "a"}))).await;
    let replay_a = client.recv_text().await;
    client.send(&call(4, "key-b", json!({"who": "b"}))).await;
    let replay_b = client.recv_text().await;
    assert_eq!(raw_result(&replay_a), raw_result(&second));
    assert_eq!(raw_result(&replay_b), raw_result(&first));
    let replay_a: Value = serde_json::from_str(&replay_a).unwrap();
    assert_eq!(replay_a["id"], json!(3));
    assert_eq!(
        replay_a["result"]["structuredContent"]["arguments"]["who"],
        "a"
    );

    client.close().await;
    server.requests.expect_eof().await;
    drop(server);
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 0 });
}

async fn orphaned_call_is_not_run_again(
    store: Arc<dyn Store>,
    reopen: impl AsyncFnOnce() -> Arc<dyn Store>,
) {
    let dedup = Deduplicator::new(EngineConfig::default(), store);
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());

    client
        .send(&call(7, "pay-once", json!({"amount": 1})))
        .await;
    let request = server.requests.json().await;
    assert_eq!(request["id"], json!(7));
    // The server dies mid-call; the client keeps its end open.
    drop(server);

    let response = client.recv().await;
    assert_eq!(response["id"], json!(7));
    assert_eq!(response["error"]["code"], json!(-32603));
    assert_eq!(error_type(&response), "idempotency_outcome_unknown");
    assert_eq!(response["error"]["data"]["idempotencyKey"], "pay-once");
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 1 });
    client.from_proxy.expect_eof().await;

    // A new server behind a new proxy over the same records: the retry is refused, not run.
    let store = reopen().await;
    assert!(matches!(
        store
            .get(&record_id("pay-once"), Timestamp::now())
            .await
            .unwrap()
            .unwrap()
            .state,
        RecordState::Completed {
            outcome: Outcome::Unknown { .. },
            ..
        }
    ));
    let dedup = Deduplicator::new(EngineConfig::default(), store);
    let (mut client, server, run) = start(dedup, InterceptorConfig::default());
    let (log, server_task) = spawn_echo_server(server);
    client
        .send(&call("retry", "pay-once", json!({"amount": 1})))
        .await;
    let response = client.recv().await;
    assert_eq!(response["id"], json!("retry"));
    assert_eq!(error_type(&response), "idempotency_outcome_unknown");
    client.close().await;
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 0 });
    server_task.await.unwrap();
    assert_eq!(log.executions(), 0);
    assert!(log.lines().is_empty());
}

#[tokio::test]
async fn server_exit_mid_call_orphans_it_in_memory() {
    let (_, store) = memory_dedup(EngineConfig::default());
    let again = Arc::clone(&store);
    orphaned_call_is_not_run_again(store, async move || again).await;
}

#[tokio::test]
async fn server_exit_mid_call_orphans_it_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.sqlite3");
    let store = sqlite_store(&path).await;
    // The second proxy opens the file afresh, as a restarted gateway would.
    orphaned_call_is_not_run_again(store, async || sqlite_store(&path).await).await;
}

#[tokio::test]
async fn claimed_call_that_cannot_reach_the_server_is_outcome_unknown() {
    let (dedup, store) = memory_dedup(EngineConfig::default());
    let (mut client, server, run) = start(dedup, InterceptorConfig::default());
    // The server closes its input but is still writing.
    let ServerEnds {
        requests,
        mut to_proxy,
    } = server;
    drop(requests);
    client
        .send(&call(1, "undelivered", json!({"amount": 1})))
        .await;
    // Once the proxy has claimed the key, it goes on to deliver the call, and fails.
    wait_for_record(&store, "undelivered").await;
    to_proxy
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n")
        .await
        .unwrap();
    assert_eq!(
        client.recv().await["method"],
        json!("notifications/message")
    );
    drop(to_proxy);

    // The claim is not left in progress: the call is answered and recorded as outcome-unknown.
    let response = client.recv().await;
    assert_eq!(response["id"], json!(1));
    assert_eq!(error_type(&response), "idempotency_outcome_unknown");
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 1 });
    let record = store
        .get(&record_id("undelivered"), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
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

#[tokio::test]
async fn client_eof_closes_the_server_input() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());
    client
        .send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    client.close().await;
    assert_eq!(
        server.requests.text().await.unwrap(),
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
    );
    server.requests.expect_eof().await;
    // The server may still answer before it exits.
    server
        .send(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"bye"}}"#)
        .await;
    drop(server);
    assert_eq!(
        client.recv().await["method"],
        json!("notifications/message")
    );
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 0 });
    client.from_proxy.expect_eof().await;
}

#[tokio::test]
async fn malformed_lines_pass_through_byte_for_byte() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, server, run) = start(dedup, InterceptorConfig::default());
    let (log, server_task) = spawn_echo_server(server);

    let mut long = br#"{"jsonrpc":"2.0","method":"notifications/blob","params":{"data":""#.to_vec();
    long.extend(std::iter::repeat_n(b'x', 2 * 1024 * 1024));
    long.extend_from_slice(b"\"}}\n");
    let mut long_garbage = vec![b'{'; 2 * 1024 * 1024];
    long_garbage.push(b'\n');
    let lines: Vec<Vec<u8>> = vec![
        b"not json\n".to_vec(),
        b"\xff\xfe{\"id\":1,\"method\":\"tools/call\"}\xc3\x28\n".to_vec(),
        b"\n".to_vec(),
        b"   \t \n".to_vec(),
        b"\r\n".to_vec(),
        b"[1,2,3]\n".to_vec(),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"idempotencyKey\":\"k\"}\n".to_vec(),
        b"{\"jsonrpc\" : \"2.0\" , \"method\" : \"notifications/x\" }\r\n".to_vec(),
        long,
        long_garbage,
        b"{}\n".to_vec(),
    ];
    for line in &lines {
        client.send_raw(line).await;
    }
    client.close().await;
    assert_eq!(finished(run).await, ProxyExit { orphaned_calls: 0 });
    server_task.await.unwrap();
    let seen = log.lines();
    assert_eq!(seen.len(), lines.len());
    for (sent, seen) in lines.iter().zip(&seen) {
        assert!(
            sent == seen,
            "sent {:?}, server saw {:?}",
            String::from_utf8_lossy(&sent[..sent.len().min(80)]),
            String::from_utf8_lossy(&seen[..seen.len().min(80)]),
        );
    }
    assert_eq!(log.executions(), 0);
}

#[tokio::test]
async fn malformed_server_lines_reach_the_client_byte_for_byte() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());
    let lines: Vec<&[u8]> = vec![
        b"Server starting...\n",
        b"\xff\xfe binary\n",
        b"\n",
        b"{\"jsonrpc\":\"2.0\",\"id\":\"nobody\",\"result\":{\"a\": 1.000}}\r\n",
    ];
    for line in &lines {
        server.to_proxy.write_all(line).await.unwrap();
    }
    for line in &lines {
        assert_eq!(client.from_proxy.raw().await.unwrap(), line.to_vec());
    }
    client.close().await;
    drop(server);
    finished(run).await;
}

#[tokio::test]
async fn server_messages_pass_through_unchanged_and_in_order() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());

    client.send(&call(1, "k-chatty", json!({}))).await;
    let request = server.requests.json().await;
    assert_eq!(request["id"], json!(1));
    let chatter = [
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":0.50}}"#,
        // A server request reusing the id of the call in flight: a different id space.
        r#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"maxTokens":10}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"\u00e9"}}"#,
        r#"{"jsonrpc":"2.0","id":"elicit-1","method":"elicitation/create","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"n":1.000}}"#,
    ];
    for line in chatter {
        server.send(line).await;
    }
    for line in chatter {
        assert_eq!(client.recv_text().await, format!("{line}\n"));
    }
    // The client's answers to the server's requests reach it unchanged too.
    let answers = [
        r#"{"jsonrpc":"2.0","id":1,"result":{"role":"assistant","content":{"type":"text","text":"hi"}}}"#,
        r#"{"jsonrpc":"2.0","id":"elicit-1","result":{"action":"decline"}}"#,
    ];
    for line in answers {
        client.send(line).await;
    }
    for line in answers {
        assert_eq!(server.requests.text().await.unwrap(), format!("{line}\n"));
    }
    // The call's answer was recorded.
    client.send(&call(2, "k-chatty", json!({}))).await;
    let replay = client.recv_text().await;
    assert_eq!(raw_result(&replay), r#"{"content":[],"n":1.000}"#);

    client.close().await;
    drop(server);
    finished(run).await;
}

#[tokio::test]
async fn absorbed_cancellation_still_records_the_outcome() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());

    client.send(&call(1, "k-cancel", json!({"x": 1}))).await;
    server.requests.json().await;
    client
        .send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"timeout"}}"#)
        .await;
    // The cancellation is not forwarded: the next thing the server sees is the ping.
    client
        .send(r#"{"jsonrpc":"2.0","id":"ping-1","method":"ping"}"#)
        .await;
    assert_eq!(server.requests.json().await["id"], json!("ping-1"));
    server
        .send(r#"{"jsonrpc":"2.0","id":1,"result":{"charged":true}}"#)
        .await;
    server
        .send(r#"{"jsonrpc":"2.0","id":"ping-1","result":{}}"#)
        .await;
    // The cancelled call's response is not sent to the client.
    assert_eq!(client.recv().await["id"], json!("ping-1"));
    client.send(&call(2, "k-cancel", json!({"x": 1}))).await;
    let replay = client.recv().await;
    assert_eq!(
        replay,
        json!({"jsonrpc":"2.0","id":2,"result":{"charged":true}})
    );

    client.close().await;
    drop(server);
    finished(run).await;
}

#[tokio::test]
async fn forwarded_cancellation_records_outcome_unknown() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let config = InterceptorConfig::default().cancel_policy(CancelPolicy::Forward);
    let (mut client, mut server, run) = start(dedup, config);

    client.send(&call(1, "k-cancel", json!({}))).await;
    server.requests.json().await;
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#;
    client.send(cancel).await;
    assert_eq!(server.requests.text().await.unwrap(), format!("{cancel}\n"));
    client.send(&call(2, "k-cancel", json!({}))).await;
    let response = client.recv().await;
    assert_eq!(response["id"], json!(2));
    assert_eq!(error_type(&response), "idempotency_outcome_unknown");

    client.close().await;
    drop(server);
    finished(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_renewed_while_a_slow_call_runs() {
    let lease = Duration::from_millis(60);
    let (dedup, store) = memory_dedup(EngineConfig::default().lease(lease));
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());

    client.send(&call(1, "k-slow", json!({}))).await;
    server.requests.json().await;
    let started = tokio::time::Instant::now();

    // Well past the first lease, the record is still owned and its lease still in the future.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let now = Timestamp::now();
    let record = store
        .get(&record_id("k-slow"), now)
        .await
        .unwrap()
        .expect("the record of the running call");
    match record.state {
        RecordState::InProgress {
            lease_expires_at, ..
        } => assert!(lease_expires_at > now, "lease ran out while the call ran"),
        other => panic!("expected in progress, got {other:?}"),
    }
    // A duplicate now is told to wait, not that the outcome is lost.
    client.send(&call(2, "k-slow", json!({}))).await;
    let duplicate = client.recv().await;
    assert_eq!(duplicate["id"], json!(2));
    assert_eq!(error_type(&duplicate), "idempotency_key_in_progress");

    tokio::time::sleep_until(started + Duration::from_millis(300)).await;
    server
        .send(r#"{"jsonrpc":"2.0","id":1,"result":{"slow":true}}"#)
        .await;
    assert_eq!(client.recv().await["result"], json!({"slow": true}));
    client.send(&call(3, "k-slow", json!({}))).await;
    assert_eq!(client.recv().await["result"], json!({"slow": true}));

    client.close().await;
    drop(server);
    finished(run).await;
}
