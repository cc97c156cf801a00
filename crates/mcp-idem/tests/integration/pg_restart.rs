//! The PostgreSQL server restarted mid-run (issue 15): three `mcp-idem proxy` instances share a
//! PostgreSQL store (a server of the test's own, `support::pg_restart::PrivatePostgres`) in front
//! of one `demo-server --http`. Eight client tasks send keyed `charge_payment` calls (each
//! logical call has one key and a unique amount, and takes 0 to 40 ms to run); a quarter of them
//! are sent by two callers at once, to different instances, and every caller retries with the
//! same key, each time at the next instance, until it has a definitive answer. Mid-run the server
//! is restarted: `pg_ctl restart -m fast` (clean) in one test, `-m immediate` (a crash: the start
//! replays the WAL) in the other.
//!
//! Checked, against the demo server's ledger (one line per execution):
//! - no logical call executed twice;
//! - every charge id a caller got is the ledger's one line of that call, and the callers of one
//!   call got the same one;
//! - every call ended with a definitive answer; the only answers retried were
//!   `idempotency_store_unavailable` (fail closed) and `idempotency_key_in_progress`, and the
//!   store errors behind the refusals are all "store unavailable";
//! - no call is answered `idempotency_outcome_unknown`, and no proxy gave up an outcome ("cannot
//!   record the outcome of a call"): a call whose completion met the outage was answered its
//!   charge, and its proxy sent the completion again, keeping the lease (10 s, longer than the
//!   outage), until the server took it; callers got `idempotency_key_in_progress` meanwhile;
//! - after the run, each call is sent once more: every charged call replays its charge id
//!   (calls charged before the restart, and those whose completion met the outage, included).
//!
//! `CHAOS_CALLS` sets the number of logical calls (default 400), `PG_RESTARTS` the number of
//! restarts (default 1), `CHAOS_SEED` the seed. Run with `--nocapture` for the report. What a
//! call in flight at a restart becomes is in `pg_restart_in_flight`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::support::chaos::{classify, executions, size_and_seed, AnswerMeans, Outcome};
use crate::support::common::ledger_lines;
use crate::support::http::{ledger_in, slow_charge, unique_namespace, HttpDemo, Proxy, Raw};
use crate::support::pg_restart::{
    lost_completions, refusals, retried_completions, PrivatePostgres, Shutdown,
};

const INSTANCES: usize = 3;
const CLIENTS: usize = 8;
const DEFAULT_CALLS: u64 = 400;
/// The share of logical calls sent by two callers at once.
const P_DUPLICATE: f64 = 0.25;
/// A charge sleeps up to this long.
const MAX_CHARGE_MS: u64 = 40;
/// The proxies' lease: longer than an outage (a crash's recovery took up to 4.4 s here), so that
/// a record whose completion is being sent again is never taken for a crashed call's.
const LEASE: &str = "10s";
/// A caller gives up after this long without a definitive answer.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);
/// The pause before retrying a refused call.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The retried answers, over all callers.
#[derive(Default)]
struct Tally {
    unavailable: u64,
    in_progress: u64,
    /// When each `idempotency_store_unavailable` came.
    unavailable_at: Vec<Instant>,
    /// Anything else that was not definitive.
    unexpected: Vec<String>,
}

/// How one caller's call ended.
struct Seen {
    outcome: Outcome,
    attempts: u32,
    answered_at: Instant,
}

/// Sends one logical call until a definitive answer, starting at instance `first` and moving to
/// the next instance at each retry.
async fn settle(raws: &[Raw], amount: u64, key: &str, first: usize, tally: &Mutex<Tally>) -> Seen {
    let started = Instant::now();
    let delay_ms = amount % (MAX_CHARGE_MS + 1);
    let mut attempts = 0u32;
    loop {
        let raw = &raws[(first + attempts as usize) % raws.len()];
        attempts += 1;
        let message = slow_charge(u64::from(attempts), amount, delay_ms, Some(key));
        let answer = raw.call(message).await;
        let (pause, why) = if answer.status == http::StatusCode::OK {
            match classify(&answer.json(), &answer.body) {
                AnswerMeans::Final(outcome) => {
                    return Seen {
                        outcome,
                        attempts,
                        answered_at: Instant::now(),
                    }
                }
                AnswerMeans::Retry { pause, why } => (pause, why),
            }
        } else {
            (None, format!("HTTP {}: {}", answer.status, answer.body))
        };
        {
            let mut tally = tally.lock().unwrap();
            match why.as_str() {
                "store unavailable" => {
                    tally.unavailable += 1;
                    tally.unavailable_at.push(Instant::now());
                }
                "in progress" => tally.in_progress += 1,
                _ => tally.unexpected.push(format!("call {amount}: {why}")),
            }
        }
        if started.elapsed() > SETTLE_WITHIN {
            return Seen {
                outcome: Outcome::GaveUp(why),
                attempts,
                answered_at: Instant::now(),
            };
        }
        tokio::time::sleep(pause.unwrap_or(RETRY_PAUSE)).await;
    }
}

/// The key of logical call `amount` in run `tag`.
fn key_of(tag: &str, amount: u64) -> String {
    format!("pgr-{tag}-{amount}")
}

async fn restart_mid_run(how: Shutdown) {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let (calls, seed) = size_and_seed(DEFAULT_CALLS);
    let restarts: u64 = std::env::var("PG_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let name = format!("PostgreSQL restart -m {}", how.arg());
    eprintln!("{name}: {calls} logical calls, {restarts} restarts, CHAOS_SEED={seed}");
    let started = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = pg.url();
    let namespace = unique_namespace(&format!("pg-restart-{}", how.arg()));
    let proxies = Proxy::spawn_many(
        INSTANCES,
        &server.base_url(),
        &[
            "--store",
            &store,
            "--namespace",
            &namespace,
            "--lease",
            LEASE,
            "--after-crash",
            "reject",
            "--max-records-per-scope",
            "10000000",
            "--max-records-total",
            "10000000",
        ],
    );
    let client = Client::builder(TokioExecutor::new()).build_http();
    let raws: Arc<Vec<Raw>> = Arc::new(
        proxies
            .iter()
            .map(|proxy| Raw::with_client(client.clone(), proxy))
            .collect(),
    );
    let tally = Arc::new(Mutex::new(Tally::default()));
    let tag = format!("{seed:x}-{}", std::process::id());

    // Logical calls 1..=calls, taken from a shared counter by the client tasks.
    let next = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for task in 0..CLIENTS {
        let (raws, next, done, tally, tag) = (
            Arc::clone(&raws),
            Arc::clone(&next),
            Arc::clone(&done),
            Arc::clone(&tally),
            tag.clone(),
        );
        let mut rng = StdRng::seed_from_u64(seed ^ (task as u64 + 1).wrapping_mul(0x9e37));
        clients.spawn(async move {
            let mut results: Vec<(u64, Vec<Seen>)> = Vec::new();
            loop {
                let amount = next.fetch_add(1, Ordering::Relaxed);
                if amount > calls {
                    return results;
                }
                let key = key_of(&tag, amount);
                let first = rng.random_range(0..INSTANCES);
                let seen = if rng.random_bool(P_DUPLICATE) {
                    let (a, b) = tokio::join!(
                        settle(&raws, amount, &key, first, &tally),
                        settle(&raws, amount, &key, first + 1, &tally)
                    );
                    vec![a, b]
                } else {
                    vec![settle(&raws, amount, &key, first, &tally).await]
                };
                results.push((amount, seen));
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    // Restart the server each time another 1/(restarts + 1) of the calls are done.
    let mut windows: Vec<(Instant, Duration)> = Vec::new();
    for restart in 0..restarts {
        let due = calls * (restart + 1) / (restarts + 1);
        while done.load(Ordering::Relaxed) < due {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let at = Instant::now();
        let took = tokio::task::block_in_place(|| pg.restart(how));
        eprintln!(
            "{name}: restarted after {} calls; pg_ctl restart -m {} took {took:?}",
            done.load(Ordering::Relaxed),
            how.arg()
        );
        windows.push((at, took));
    }

    let mut results = Vec::new();
    while let Some(joined) = clients.join_next().await {
        results.extend(joined.expect("a client task panicked"));
    }
    results.sort_by_key(|(amount, _)| *amount);
    assert_eq!(results.len() as u64, calls);
    let run_took = started.elapsed();

    // What the proxies logged: the calls whose first completion failed, sent again.
    let logs: String = proxies.iter().map(Proxy::stderr).collect();
    let call_of = |keys: &BTreeSet<String>| -> Vec<u64> {
        keys.iter()
            .filter_map(|key| key.rsplit('-').next()?.parse().ok())
            .collect()
    };
    let retried = call_of(&retried_completions(&logs).0);

    let executions = executions(&ledger, calls);
    let mut problems = Vec::new();
    let (mut charged, mut unknown, mut callers, mut attempts) = (0u64, 0u64, 0u64, 0u64);
    let mut final_of: HashMap<u64, Option<String>> = HashMap::new();
    let first_restart = windows.first().map_or(started, |(at, _)| *at);
    // Calls charged before the last restart began: their records lived through at least one.
    let last_restart = windows.last().map_or(started, |(at, _)| *at);
    let mut charged_before_restart = BTreeSet::new();
    for (amount, seen) in &results {
        if seen.iter().any(|caller| {
            matches!(caller.outcome, Outcome::Charged(_)) && caller.answered_at < last_restart
        }) {
            charged_before_restart.insert(*amount);
        }
        let ids: Vec<&str> = executions
            .get(amount)
            .map(|lines| lines.iter().map(|e| e.charge_id.as_str()).collect())
            .unwrap_or_default();
        if ids.len() > 1 {
            problems.push(format!(
                "call {amount} executed {} times: {ids:?}",
                ids.len()
            ));
        }
        let mut got: Option<String> = None;
        for caller in seen {
            // A proxy answers after its first attempt to record the outcome: one that failed
            // before the first restart began would be a failure the outage does not explain.
            if retried.contains(amount) && caller.answered_at < first_restart {
                problems.push(format!(
                    "call {amount}: a completion failed before the restart"
                ));
            }
            callers += 1;
            attempts += u64::from(caller.attempts);
            match &caller.outcome {
                Outcome::Charged(id) => {
                    if ids != [id.as_str()] {
                        problems.push(format!("call {amount} got {id}; the ledger has {ids:?}"));
                    }
                    if got.as_ref().is_some_and(|other| other != id) {
                        problems.push(format!("call {amount}: callers got {got:?} and {id}"));
                    }
                    got = Some(id.clone());
                }
                other => problems.push(format!("call {amount} ended {other:?}")),
            }
        }
        if got.is_some() {
            charged += 1;
        } else {
            unknown += 1;
        }
        final_of.insert(*amount, got);
    }

    // After the run: each call once more, at an instance of its own; the server has been up
    // for a while. Every charged call replays its charge; nothing runs.
    let mut replayed = 0u64;
    let mut replayed_from_before = 0u64;
    let mut unknown_after = 0u64;
    let replay_tally = Mutex::new(Tally::default());
    for (amount, _) in &results {
        let key = key_of(&tag, *amount);
        let again = settle(&raws, *amount, &key, *amount as usize, &replay_tally).await;
        let expected = &final_of[amount];
        match (&again.outcome, expected) {
            (Outcome::Charged(id), Some(original)) if id == original => {
                replayed += 1;
                if charged_before_restart.contains(amount) {
                    replayed_from_before += 1;
                }
            }
            (other, _) => {
                if matches!(other, Outcome::Unknown) {
                    unknown_after += 1;
                }
                problems.push(format!(
                    "call {amount} (answered {expected:?}) was answered {other:?} after the run"
                ));
            }
        }
    }
    let executions_after: usize = ledger_lines(&ledger).len();
    let executed: usize = executions.values().map(Vec::len).sum();
    if executions_after != executed {
        problems.push(format!(
            "the replays ran {} more charges",
            executions_after - executed
        ));
    }

    // Read again after the replays, by which time every completion sent again has settled.
    let logs: String = proxies.iter().map(Proxy::stderr).collect();
    let recorded_late = call_of(&retried_completions(&logs).1);
    let lost = call_of(&lost_completions(&logs));
    if !lost.is_empty() {
        problems.push(format!("outcomes given up: calls {lost:?}"));
    }
    for amount in &retried {
        if !recorded_late.contains(amount) {
            problems.push(format!(
                "call {amount}: its completion was sent again, never logged as recorded"
            ));
        }
    }
    let tally = tally.lock().unwrap();
    problems.extend(tally.unexpected.iter().cloned());
    problems.extend(replay_tally.lock().unwrap().unexpected.iter().cloned());
    let reasons: BTreeMap<String, u64> = refusals(&logs);
    for reason in reasons.keys() {
        if !reason.starts_with("store unavailable: ") {
            problems.push(format!("a call was refused for {reason}"));
        }
    }
    let outages: Vec<String> = windows
        .iter()
        .enumerate()
        .map(|(n, (at, took))| {
            let until = windows.get(n + 1).map(|(next, _)| *next);
            let refused: Vec<&Instant> = tally
                .unavailable_at
                .iter()
                .filter(|t| **t >= *at && until.is_none_or(|until| **t < until))
                .collect();
            let seen = match (refused.first(), refused.last()) {
                (Some(first), Some(last)) => format!(
                    "{} refusals from {:?} to {:?} after the restart began",
                    refused.len(),
                    first.duration_since(*at),
                    last.duration_since(*at)
                ),
                _ => "no refusals".to_owned(),
            };
            format!("pg_ctl restart took {took:?}; {seen}")
        })
        .collect();
    eprintln!(
        "{name} report (seed {seed}, run {run_took:.1?}):\n  \
         logical calls {calls} ({callers} callers, {attempts} attempts): {charged} charged, \
         {unknown} outcome unknown\n  \
         executions (ledger lines) {executed}, calls executed twice: {}\n  \
         retried answers: {} idempotency_store_unavailable, {} idempotency_key_in_progress\n  \
         restarts: {}\n  \
         completions that met the outage, sent again: {} {retried:?}, recorded late: {}, \
         given up: {} {lost:?}\n  \
         after the run: {replayed} replayed their charge ({replayed_from_before} of the \
         {} charged before the (last) restart), {unknown_after} outcome unknown\n  \
         refusal reasons logged: {reasons:#?}",
        executions.values().filter(|lines| lines.len() > 1).count(),
        tally.unavailable,
        tally.in_progress,
        outages.join("; "),
        retried.len(),
        recorded_late.len(),
        lost.len(),
        charged_before_restart.len(),
    );
    assert!(
        problems.is_empty(),
        "{name} (CHAOS_SEED={seed}):\n{}\nserver log:\n{}",
        problems.join("\n"),
        pg.log()
    );
    assert!(
        charged_before_restart.len() as u64 == replayed_from_before,
        "every call charged before a restart replays after it"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_clean_restart_mid_run_loses_and_duplicates_nothing() {
    restart_mid_run(Shutdown::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_mid_run_loses_and_duplicates_nothing() {
    restart_mid_run(Shutdown::Immediate).await;
}
