//! [`StdioProxy::run_until`] and [`StdioProxy::shutdown_grace`]: a stopping run refuses new keyed
//! calls without claiming them, waits for the call in flight, and cuts off (outcome-unknown) what is
//! still running when the grace ends, even if the server exits meanwhile.

use mcp_idempotency::policy::ToolPolicies;
use tokio::sync::oneshot;

use crate::deduplicator::failing_store::FlakyStore;

use super::*;

/// [`start`] with `run_until`: the run stops when `stop` fires; `stopped` fires from inside the
/// proxy's task, in the poll that starts the drain (the tests run on one thread, so by the time the
/// test sees it the drain has begun).
fn start_until(
    dedup: Deduplicator,
    grace: Duration,
) -> (
    Client,
    ServerEnds,
    Run,
    oneshot::Sender<()>,
    oneshot::Receiver<()>,
) {
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (stopped_tx, stopped_rx) = oneshot::channel::<()>();
    let (client_to_proxy, proxy_client_in) = tokio::io::duplex(PIPE);
    let (proxy_client_out, proxy_to_client) = tokio::io::duplex(PIPE);
    let (proxy_server_in, server_requests) = tokio::io::duplex(PIPE);
    let (server_to_proxy, proxy_server_out) = tokio::io::duplex(PIPE);
    let proxy = StdioProxy::new(dedup, scope()).shutdown_grace(grace);
    let stop = async move {
        let _ = stop_rx.await;
        let _ = stopped_tx.send(());
    };
    let run = tokio::spawn(proxy.run_until(
        proxy_client_in,
        proxy_client_out,
        proxy_server_in,
        proxy_server_out,
        stop,
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
        stop_tx,
        stopped_rx,
    )
}

#[tokio::test]
async fn a_stop_refuses_new_keyed_calls_and_lets_the_call_in_flight_finish() {
    let (dedup, store) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run, stop, stopped) =
        start_until(dedup, Duration::from_secs(3600));
    client
        .send(&call(1, "in-flight", json!({"amount": 1})))
        .await;
    let request = server.requests.json().await;
    assert_eq!(request["id"], 1);
    stop.send(()).unwrap();
    stopped.await.unwrap();

    client
        .send(&call(2, "too-late", json!({"amount": 2})))
        .await;
    let refused = client.recv().await;
    assert_eq!(refused["id"], 2, "{refused}");
    assert_eq!(error_type(&refused), "idempotency_shutting_down");
    assert_eq!(refused["error"]["code"], -32603);
    assert_eq!(refused["error"]["data"]["retryAfterMs"], 1000);
    assert!(store
        .get(&record_id("too-late"), Timestamp::now())
        .await
        .unwrap()
        .is_none());

    // The call in flight is answered and recorded; only then is the server's input closed.
    server
        .send(r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#)
        .await;
    assert_eq!(client.recv().await["result"], json!({"content": []}));
    server.requests.expect_eof().await;
    drop(server);
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 0
        }
    );
    assert!(matches!(
        store
            .get(&record_id("in-flight"), Timestamp::now())
            .await
            .unwrap()
            .unwrap()
            .state,
        RecordState::Completed {
            outcome: Outcome::Success(_),
            ..
        }
    ));
}

#[tokio::test]
async fn a_call_still_running_when_the_grace_ends_is_cut_off() {
    let (dedup, store) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run, _stop, _stopped) =
        start_until(dedup, Duration::from_millis(50));
    client.send(&call(1, "slow", json!({"amount": 1}))).await;
    server.requests.json().await;
    // The client's EOF starts the drain as a stop does.
    client.close().await;

    let response = client.recv().await;
    assert_eq!(response["id"], 1);
    assert_eq!(error_type(&response), "idempotency_outcome_unknown");
    assert_eq!(response["error"]["data"]["idempotencyKey"], "slow");
    server.requests.expect_eof().await;
    drop(server);
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 1
        }
    );
    assert_recorded_unknown(&*store, "slow").await;
}

#[tokio::test]
async fn a_server_exit_while_the_grace_cuts_calls_off_still_lets_them_be_recorded_and_answered() {
    let held = Arc::new(FlakyStore::default());
    let store: Arc<dyn Store> = held.clone();
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::clone(&store));
    let (mut client, mut server, run, _stop, _stopped) =
        start_until(dedup, Duration::from_millis(50));
    client.send(&call(1, "slow", json!({"amount": 1}))).await;
    server.requests.json().await;
    held.hold_completions.store(true, Ordering::SeqCst);
    client.close().await;

    // The grace ends: the cut-off call is being recorded when the server's output ends.
    timeout(PATIENCE, held.completion_waiting.notified())
        .await
        .expect("the cut-off call was not recorded");
    let ServerEnds { requests, to_proxy } = server;
    drop(to_proxy);
    // Time for the run to see the server's output end while the record is still being written
    // (nothing shows that it has; without the wait the test could pass on a run that aborts the
    // drain there, never fail on one that does not).
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.completion_go.notify_one();

    let response = client.recv().await;
    assert_eq!(response["id"], 1);
    assert_eq!(error_type(&response), "idempotency_outcome_unknown");
    client.from_proxy.expect_eof().await;
    drop(requests);
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 1
        }
    );
    assert_recorded_unknown(&*store, "slow").await;
}

/// Found by the simulator (issue 40, seeds 1290 and 1516 of its first version): a call whose
/// key its client did not send (here a key argument) is decided beside the client's reads. When
/// the client closed its input while that call's claim was on its way, the run stopped waiting
/// for the decision, and the drain ended with it dropped: the claim, applied by the store, was
/// never released, so the key stayed in progress with no call behind it
/// (`idempotency_outcome_unknown` for a call that never ran, once the lease ran out). The
/// decisions still under way are now seen through the drain, and a claim that comes back after
/// it ended is released.
#[tokio::test]
async fn a_claim_on_its_way_when_the_client_leaves_is_released_not_left_in_progress() {
    let held = Arc::new(FlakyStore::default());
    held.hold_claim_answers.store(true, Ordering::SeqCst);
    let store: Arc<dyn Store> = held.clone();
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::clone(&store));
    let policies =
        ToolPolicies::from_json(&json!({"transfer": {"key-argument": "request_id"}})).unwrap();
    let proxy = StdioProxy::new(dedup, scope())
        .interceptor_config(InterceptorConfig::default().tool_policies(policies))
        .shutdown_grace(Duration::from_millis(50));
    let (mut client, server, run) = start_proxy(proxy);
    let transfer = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "transfer", "arguments": {"request_id": "r-1", "amount": 5}}});
    client.send(&transfer.to_string()).await;
    timeout(PATIENCE, held.claim_applied.notified())
        .await
        .expect("the claim was not sent");
    // The client leaves while the claim's answer is on its way; the grace ends meanwhile.
    client.close().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.claim_answer_go.notify_one();
    let ServerEnds { requests, to_proxy } = server;
    drop(to_proxy);
    drop(requests);
    finished(run).await;

    let stats = store.stats(Timestamp::now()).await.unwrap();
    assert_eq!(
        stats.in_progress, 0,
        "a claim was left in progress: {stats:?}"
    );
}
