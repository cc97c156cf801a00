//! A call in flight (claimed, executing) when the PostgreSQL server restarts before its completion
//! is written (issue 15). Two `mcp-idem proxy` instances, A and B, share a PostgreSQL server of
//! the test's own (`support::pg_restart::PrivatePostgres`); the call, a charge that takes a while,
//! goes to A.
//!
//! - The server restarts (`-m fast`, then `-m immediate`) 0.5 s into an 8 s call (lease 10 s) and
//!   is back before it ends: the completion is written on a new connection, a retry at B replays the charge at
//!   once, nothing is logged as lost.
//! - The server crashes (`-m immediate`) 0.5 s into a 1.5 s call (lease 10 s, longer than the
//!   outage) and is still down when it ends: the client gets the charge, and A logs that the
//!   outcome is not recorded yet. A keeps the record's lease and sends the completion again
//!   until the server, back, takes it; retries at A and B get `idempotency_key_in_progress`
//!   meanwhile, then replay the charge. With `--after-crash reexecute`, the policy under which a
//!   lost completion would run the call a second time, the ledger still has one line.

use std::time::{Duration, Instant};

use crate::support::common::ledger_lines;
use crate::support::http::{
    call_until_settled, charge, ledger_in, slow_charge, unique_namespace, HttpDemo, Proxy, Raw,
};
use crate::support::pg_restart::{lost_completions, PrivatePostgres, Shutdown};

/// How long the charge in flight runs: longer than a restart takes, even on a loaded machine
/// (a crash's WAL replay and end-of-recovery checkpoint took up to 4.4 s here).
const CHARGE_MS: u64 = 8000;
/// When the server goes down, after the call started.
const DOWN_AFTER: Duration = Duration::from_millis(500);

/// Two proxies (A, B) on `store` in front of `server`, with a lease of `lease` and
/// `--after-crash after_crash`.
fn two_proxies(
    server: &HttpDemo,
    store: &str,
    lease: &str,
    after_crash: &str,
    test: &str,
) -> (Proxy, Proxy) {
    let namespace = unique_namespace(test);
    let args = [
        "--store",
        store,
        "--namespace",
        &namespace,
        "--lease",
        lease,
        "--after-crash",
        after_crash,
    ];
    let mut proxies = Proxy::spawn_many(2, &server.base_url(), &args).into_iter();
    (proxies.next().unwrap(), proxies.next().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_running_across_a_restart_records_its_outcome() {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let (a, b) = two_proxies(&server, &pg.url(), "10s", "reject", "pg-in-flight-restart");
    let (raw_a, raw_b) = (Raw::new(&a), Raw::new(&b));

    for (n, how) in [Shutdown::Fast, Shutdown::Immediate]
        .into_iter()
        .enumerate()
    {
        let key = format!("in-flight-across-{}", how.arg());
        let amount = 10 + n as u64;
        // A call before, so that the proxies hold pooled connections the restart ends.
        let warm = raw_b.call(charge(1, 1000 + amount, Some(&format!("warm-{key}"))));
        assert!(warm.await.charge_id().is_some());

        let call = tokio::spawn({
            let (raw_a, key) = (raw_a.clone(), key.clone());
            async move {
                raw_a
                    .call(slow_charge(2, amount, CHARGE_MS, Some(&key)))
                    .await
            }
        });
        tokio::time::sleep(DOWN_AFTER).await;
        let took = tokio::task::block_in_place(|| pg.restart(how));
        assert!(
            DOWN_AFTER + took < Duration::from_millis(CHARGE_MS - 500),
            "-m {}: the restart took {took:?}, too long for a {CHARGE_MS} ms call",
            how.arg()
        );
        let answer = call.await.expect("the call's task");
        let charge_id = answer
            .charge_id()
            .unwrap_or_else(|| panic!("-m {}: {}", how.arg(), answer.body));
        eprintln!(
            "restart -m {} took {took:?}, {:?} into a {CHARGE_MS} ms call",
            how.arg(),
            DOWN_AFTER
        );
        assert!(
            !lost_completions(&a.stderr()).contains(&key),
            "-m {}: the completion was not recorded:\n{}",
            how.arg(),
            a.stderr()
        );
        // Recorded: B replays it at once (no `in progress`), and nothing runs again.
        let replay = raw_b
            .call(slow_charge(3, amount, CHARGE_MS, Some(&key)))
            .await;
        assert_eq!(
            replay.charge_id().as_deref(),
            Some(charge_id.as_str()),
            "-m {}: {}",
            how.arg(),
            replay.body
        );
        assert_eq!(ledger_lines(&ledger).len(), 2 * (n + 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_meets_a_crashed_server_is_recorded_once_it_is_back_and_never_rerun() {
    const SHORT_CHARGE_MS: u64 = 1500;
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let (a, b) = two_proxies(&server, &pg.url(), "10s", "reexecute", "pg-in-flight-crash");
    let (raw_a, raw_b) = (Raw::new(&a), Raw::new(&b));
    let key = "completion-meets-a-crash";

    let call = tokio::spawn({
        let raw_a = raw_a.clone();
        async move {
            raw_a
                .call(slow_charge(1, 20, SHORT_CHARGE_MS, Some(key)))
                .await
        }
    });
    tokio::time::sleep(DOWN_AFTER).await;
    tokio::task::block_in_place(|| pg.stop(Shutdown::Immediate));
    // The client still gets the charge; its outcome cannot be written yet.
    let answer = call.await.expect("the call's task");
    let charge_id = answer
        .charge_id()
        .unwrap_or_else(|| panic!("{}", answer.body));
    a.logged("the outcome of a call is not recorded yet").await;
    let took = tokio::task::block_in_place(|| pg.start_again());
    let back = Instant::now();
    eprintln!("the server was down for the call's end; its start (WAL replay) took {took:?}");

    // Retries: refused or in progress until A has written the outcome, then the charge, at B and A.
    for (name, raw) in [("B", &raw_b), ("A", &raw_a)] {
        let retry = slow_charge(2, 20, SHORT_CHARGE_MS, Some(key));
        let deadline = Instant::now() + Duration::from_secs(20);
        let settled = loop {
            let answer = call_until_settled(raw, &retry).await;
            if answer.error_type().as_deref() != Some("idempotency_store_unavailable") {
                break answer;
            }
            assert!(Instant::now() < deadline, "{name}: {}", answer.body);
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            settled.charge_id().as_deref(),
            Some(charge_id.as_str()),
            "{name}: {}",
            settled.body
        );
        eprintln!(
            "retry at {name}: replayed the charge {:?} after the server was back",
            back.elapsed()
        );
    }
    a.logged("recorded the outcome of a call once the store answered again")
        .await;
    assert!(
        lost_completions(&a.stderr()).is_empty(),
        "nothing given up:\n{}",
        a.stderr()
    );
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "run once, never again: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charge_id.as_str());
    // The store serves new keys as before.
    let fresh = call_until_settled(&raw_b, &charge(3, 21, Some("after-the-crash"))).await;
    assert!(fresh.charge_id().is_some(), "{}", fresh.body);
}
