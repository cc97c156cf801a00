//! Calls in flight: a cancellation absorbed (the outcome still recorded) or forwarded (recorded as
//! outcome-unknown), and the lease renewed while a slow call runs.

use super::*;

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
    let (dedup, store) = memory_dedup(EngineConfig::default().with_lease(lease));
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
