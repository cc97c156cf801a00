//! A lost store answer must not poison a key (issue 14), through the real `mcp-idem proxy` and the
//! demo server's ledger, on Redis and on PostgreSQL.
//!
//! Proxy A reaches the shared store through the fault-injecting forwarder
//! (`support::store_faults`), which lets A's claim of a key reach the store and be applied, drops
//! the reply, closes the connection and keeps the store away for a moment. A answers
//! `idempotency_store_unavailable` and the tool does not run; the claim holds the key, as proxy B
//! (the same store, directly) shows: it sees the call in progress. Once the store is back, the
//! client's retry runs the call exactly once and gets its outcome, whether it reaches A (which
//! knows the lost token: the retry releases it and claims again) or B (A releases the key in the
//! background once the store answers); further retries replay it on both.

use std::time::{Duration, Instant};

use crate::ops::{metrics_authority, sample, scrape};
use crate::support::common::ledger_lines;
use crate::support::http::{
    charge, ledger_in, unique_namespace, Answer, HttpDemo, Proxy, Raw, SharedStore,
};
use crate::support::store_faults::{
    assert_unavailable, behind_forwarder, until_available, ReplyEnd,
};

/// The key whose claim's reply is lost (the forwarder recognises the claim by it).
const KEY: &str = "lost-claim-answer-order-7";

/// Which instance the client's retry reaches.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RetryAt {
    /// The proxy whose claim's answer was lost.
    SameInstance,
    /// Another proxy on the same store.
    OtherInstance,
}

/// Calls `message` until the answer is neither `idempotency_key_in_progress` nor
/// `idempotency_store_unavailable`; panics after 30 s.
async fn until_settled(raw: &Raw, message: &serde_json::Value) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = raw.call(message.clone()).await;
        let waiting = matches!(
            answer.error_type().as_deref(),
            Some("idempotency_key_in_progress" | "idempotency_store_unavailable")
        );
        if !waiting {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "the key stayed held: {}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn lost_claim_answer(store: SharedStore, retry_at: RetryAt) {
    let Some(url) = store.url() else {
        return;
    };
    let (forwarder, via_forwarder) = behind_forwarder(&url, store).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace(&format!("lost-claim-{store:?}-{retry_at:?}"));
    // A lease far longer than the test: only a release can free the key in time.
    let common = ["--namespace", &namespace, "--lease", "120s"];
    let a = Proxy::spawn(
        &server.base_url(),
        &[
            &common[..],
            &["--store", &via_forwarder, "--metrics-listen", "127.0.0.1:0"],
        ]
        .concat(),
    );
    let b = Proxy::spawn(
        &server.base_url(),
        &[&common[..], &["--store", &url]].concat(),
    );
    let (raw_a, raw_b) = (Raw::new(&a), Raw::new(&b));

    // A first call in the scope, so that the next claim is the one-statement claim on PostgreSQL
    // (the first claim of a scope takes a transaction, and losing its reply rolls it back).
    let warm_up = raw_a.call(charge(1, 10, Some("warm-up"))).await;
    assert!(warm_up.charge_id().is_some(), "{}", warm_up.body);
    assert_eq!(ledger_lines(&ledger).len(), 1);

    forwarder.lose_next_reply(KEY, ReplyEnd::of(store));
    let lost = raw_a.call(charge(2, 20, Some(KEY))).await;
    assert_unavailable(&lost);
    assert_eq!(forwarder.lost_replies(), 1, "the claim's reply was dropped");
    assert_eq!(ledger_lines(&ledger).len(), 1, "the tool did not run");
    // The claim was applied: the key is held by a token nobody will complete.
    let held = raw_b.call(charge(3, 20, Some(KEY))).await;
    assert_eq!(
        held.error_type().as_deref(),
        Some("idempotency_key_in_progress"),
        "{}",
        held.body
    );

    let forwarder = forwarder.resume().await;
    let started = Instant::now();
    let retry = match retry_at {
        RetryAt::SameInstance => until_available(&raw_a, &charge(4, 20, Some(KEY))).await,
        RetryAt::OtherInstance => until_settled(&raw_b, &charge(4, 20, Some(KEY))).await,
    };
    let ran_after = started.elapsed();
    let charge_id = retry
        .charge_id()
        .unwrap_or_else(|| panic!("the retry runs the call: {}", retry.body));
    let executions = ledger_lines(&ledger);
    assert_eq!(executions.len(), 2, "the call ran exactly once");
    assert_eq!(
        executions[1]["chargeId"],
        charge_id.as_str(),
        "{executions:?}"
    );
    assert_eq!(executions[1]["amount"], 20, "{executions:?}");

    // Every further retry replays the outcome, at either instance.
    for (id, raw) in [(5, &raw_a), (6, &raw_b)] {
        let replay = until_available(raw, &charge(id, 20, Some(KEY))).await;
        assert_eq!(
            replay.charge_id().as_deref(),
            Some(charge_id.as_str()),
            "{}",
            replay.body
        );
    }
    assert_eq!(ledger_lines(&ledger).len(), 2);

    // A counted the claim whose answer was lost, and got rid of it.
    let metrics = metrics_authority(&a.stderr());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scraped = scrape(&metrics);
        let queued = sample(&scraped, "mcp_idem_ambiguous_claims_total{fate=\"queued\"}");
        assert!(queued >= 1.0, "{scraped}");
        if sample(&scraped, "mcp_idem_ambiguous_claims_pending") == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "claims still wait for release: {scraped}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!a.stderr().contains("panicked"), "{}", a.stderr());
    eprintln!(
        "lost_claim_answer/{store:?}/{retry_at:?}: the retry ran the call {ran_after:.2?} after \
         the store came back"
    );
    drop(forwarder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_retry_at_the_same_instance_runs_once() {
    lost_claim_answer(SharedStore::Redis, RetryAt::SameInstance).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_retry_at_another_instance_runs_once() {
    lost_claim_answer(SharedStore::Redis, RetryAt::OtherInstance).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retry_at_the_same_instance_runs_once() {
    lost_claim_answer(SharedStore::Postgres, RetryAt::SameInstance).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retry_at_another_instance_runs_once() {
    lost_claim_answer(SharedStore::Postgres, RetryAt::OtherInstance).await;
}
