//! The lost-response case SEP-3182 exists for, end to end: a client hangs up in the middle of a
//! keyed charge sent through one `mcp-idem proxy`, then retries through ANOTHER proxy instance that
//! shares the record store. The first proxy still runs the call to the end and records it, so the
//! retry gets the original outcome (after `in progress` answers while it runs), and the demo
//! server's ledger shows exactly one charge. Proven for a SQLite file shared by two proxies (with
//! plain JSON and SSE answers), and for Redis and PostgreSQL when they are reachable.

use std::time::Duration;

use crate::support::common::ledger_lines;
use crate::support::http::{
    call_until_settled, ledger_in, slow_charge, sqlite_in, unique_namespace, HttpDemo, Proxy, Raw,
    SharedStore,
};

/// How long the charge takes, and when the client hangs up.
const CHARGE_MS: u64 = 1500;
const HANG_UP_AFTER: Duration = Duration::from_millis(200);

/// Charges through a first proxy, hangs up, retries through a second one; `store_args` are
/// given to both.
async fn retry_elsewhere_after_hanging_up(store_args: &[&str], demo_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, demo_args);
    let first = Proxy::spawn(&server.base_url(), store_args);
    let second = Proxy::spawn(&server.base_url(), store_args);
    let key = "pay-after-hang-up";

    let status = Raw::new(&first)
        .hang_up_after(&slow_charge(1, 77, CHARGE_MS, Some(key)), HANG_UP_AFTER)
        .await;
    // A plain JSON answer comes only at the end; an SSE stream may have started.
    if demo_args.is_empty() {
        assert_eq!(status, None, "the charge takes {CHARGE_MS} ms");
    }

    // The retry, with a new request id, through the other instance.
    let retry = Raw::new(&second);
    let answer = call_until_settled(&retry, &slow_charge(2, 77, CHARGE_MS, Some(key))).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["id"], 2, "{}", answer.body);
    let charge_id = answer.charge_id().unwrap_or_else(|| {
        panic!(
            "the original outcome, not {}\nfirst proxy:\n{}\nsecond proxy:\n{}",
            answer.body,
            first.stderr(),
            second.stderr()
        )
    });
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "exactly one charge: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charge_id.as_str());
    assert_eq!(lines[0]["amount"], 77);

    // Both instances replay it from now on.
    for (id, proxy) in [(3, &first), (4, &second)] {
        let replay = Raw::new(proxy)
            .call(slow_charge(id, 77, CHARGE_MS, Some(key)))
            .await;
        assert_eq!(replay.charge_id().as_deref(), Some(charge_id.as_str()));
    }
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_shared_by_two_proxies() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(&dir);
    retry_elsewhere_after_hanging_up(&["--store", &store], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_shared_by_two_proxies_with_sse_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(&dir);
    retry_elsewhere_after_hanging_up(&["--store", &store], &["--http-sse"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_shared_by_two_proxies() {
    let Some(url) = SharedStore::Redis.url() else {
        return;
    };
    let namespace = unique_namespace("disconnect");
    retry_elsewhere_after_hanging_up(&["--store", &url, "--namespace", &namespace], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shared_by_two_proxies() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    let namespace = unique_namespace("disconnect");
    retry_elsewhere_after_hanging_up(&["--store", &url, "--namespace", &namespace], &[]).await;
}
