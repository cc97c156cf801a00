//! Keyed calls through the proxy: executed once and replayed (memory and SQLite), out-of-order
//! responses recorded to their keys, a call orphaned by a dying server never run again, and a claimed
//! call that cannot reach the server recorded as outcome-unknown.

use super::*;

async fn sqlite_store(path: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path).await.expect("open SQLite store"))
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
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 0
        }
    );
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
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 0
        }
    );
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
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 1,
            calls_cut_off: 0
        }
    );
    client.from_proxy.expect_eof().await;

    // A new server behind a new proxy over the same records: the retry is refused, not run.
    let store = reopen().await;
    assert_recorded_unknown(&*store, "pay-once").await;
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
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 0
        }
    );
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
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 1,
            calls_cut_off: 0
        }
    );
    assert_recorded_unknown(&*store, "undelivered").await;
}

/// With `namespace_from_server`, every call is recorded under `mcp-server:<the server's name>`
/// with the principal given: a call before any handshake waits while the proxy asks the server
/// itself (its own `server/discover`, whose answer the client never sees).
#[tokio::test]
async fn calls_are_recorded_under_the_servers_own_name_asked_for_before_a_handshake() {
    let (dedup, store) = memory_dedup(EngineConfig::default());
    let proxy = StdioProxy::new(dedup, scope()).namespace_from_server(true);
    let (mut client, server, run) = start_proxy(proxy);
    let (log, server_task) = spawn_echo_server(server);

    client.send(&call(1, "before", json!({"n": 1}))).await;
    assert_eq!(client.recv().await["id"], json!(1));
    client
        .send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#)
        .await;
    assert_eq!(client.recv().await["id"], json!(0));
    client.send(&call(2, "after", json!({"n": 2}))).await;
    assert_eq!(client.recv().await["id"], json!(2));
    assert_eq!(log.executions(), 2);
    let asked: Vec<String> = log
        .lines
        .lock()
        .unwrap()
        .iter()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .filter(|line| line.contains("server/discover"))
        .collect();
    assert_eq!(asked.len(), 1, "{asked:?}");

    let named = |key: &str| RecordId {
        scope: Scope::new("mcp-server:echo", "alice"),
        key: IdempotencyKey::new(key, 255).unwrap(),
    };
    let now = Timestamp::now();
    assert!(store
        .get(&record_id("before"), now)
        .await
        .unwrap()
        .is_none());
    assert!(store.get(&named("before"), now).await.unwrap().is_some());
    assert!(store.get(&named("after"), now).await.unwrap().is_some());
    assert!(store.get(&record_id("after"), now).await.unwrap().is_none());

    client.close().await;
    finished(run).await;
    server_task.await.unwrap();
}
