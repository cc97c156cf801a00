//! A manual `CLUSTER FAILOVER` during a storm of duplicates: 200 concurrent callers send the same
//! keyed (slow) charge, spread over three `mcp-idem proxy` instances sharing a 6-node Redis
//! Cluster of the test's own (`redis_own_cluster`), and keep retrying while it is in progress.
//! While the charge runs, `CLUSTER FAILOVER` is issued on the replica of the primary holding the
//! record; the replica takes over (the primary first hands it every write), the claim and the
//! completion follow the slot to it. Exactly one execution, both without and with `?replicas=1`;
//! every caller gets that charge's id, or `idempotency_outcome_unknown` if the completion could not
//! be recorded in time (on a loaded machine the cluster client may time out during the switch; the
//! record then stays in progress until its 3 s lease runs out, and `--after-crash reject` answers
//! unknown rather than executing again).

use std::time::{Duration, Instant};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::chaos::{attempt, response_of};
use crate::support::common::ledger_lines;
use crate::support::http::{ledger_in, slow_charge, unique_namespace, HttpDemo, Proxy, Raw};
use crate::support::redis_own_cluster::OwnCluster;

const INSTANCES: usize = 3;
const CALLERS: u64 = 200;
/// Long enough for the failover to happen while the charge runs.
const CHARGE_MS: u64 = 2000;
/// The first port of this test's cluster.
const BASE_PORT: u16 = 7320;

/// How a caller's charge ended.
enum Ended {
    Charged(String),
    Unknown,
}

/// Sends the charge until it has a definitive answer (retrying in progress after its
/// `retryAfterMs`, store unavailable and lost answers); the answer, or why it gave up.
async fn until_charged(raw: &Raw, id: u64, key: &str) -> Result<Ended, String> {
    let message = slow_charge(id, 99, CHARGE_MS, Some(key));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        let mut pause = 100;
        if let Some(answer) = attempt(raw, 99, &message).await {
            if let Some(json) = response_of(&answer.body) {
                if let Some(charge) = json["result"]["structuredContent"]["chargeId"].as_str() {
                    return Ok(Ended::Charged(charge.to_owned()));
                }
                if json["error"]["data"]["type"] == "idempotency_outcome_unknown" {
                    return Ok(Ended::Unknown);
                }
                if let Some(wait) = json["error"]["data"]["retryAfterMs"].as_u64() {
                    pause = wait.clamp(100, 500);
                }
            }
            last = answer.body;
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Err(format!("no charge id within 60 s; last: {last}"))
}

/// The primary (port) holding the record of `key` (unique to the run), once it exists.
async fn primary_holding(cluster: &OwnCluster, key: &str) -> u16 {
    let pattern = format!("*:r:*:{key}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for port in cluster.primaries() {
            if cluster
                .cli(port, &["--scan", "--pattern", &pattern])
                .is_ok_and(|keys| !keys.is_empty())
            {
                return port;
            }
        }
        assert!(Instant::now() < deadline, "no record of {key}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issues `CLUSTER FAILOVER` on `replica` until it is a primary. Redis gives a manual failover 5 s
/// to complete and then drops it without a word, which a loaded machine can exceed (the replica
/// must first reach the primary's replication offset): an operator would issue it again.
async fn fail_over_to(cluster: &OwnCluster, replica: u16) {
    const TRIES: u32 = 3;
    const PATIENCE: Duration = Duration::from_secs(7);
    for _ in 0..TRIES {
        let answer = cluster.cli(replica, &["cluster", "failover"]);
        assert_eq!(answer.as_deref(), Ok("OK"), "CLUSTER FAILOVER on {replica}");
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if cluster
                .cli(replica, &["role"])
                .is_ok_and(|role| role.starts_with("master"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!(
        "{replica} did not take over after {TRIES} manual failovers:\n{}",
        cluster.failover_log()
    );
}

async fn storm(cluster: &OwnCluster, options: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace("failover-storm");
    let url = format!("{}{options}", cluster.url());
    let proxies = Proxy::spawn_many(
        INSTANCES,
        &server.base_url(),
        &["--store", &url, "--namespace", &namespace, "--lease", "3s"],
    );
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let raws: Vec<Raw> = proxies
        .iter()
        .map(|proxy| Raw::with_client(client.clone(), proxy))
        .collect();
    let key = format!(
        "one-charge-through-a-failover-{:08x}",
        rand::random::<u32>()
    );

    let mut callers = tokio::task::JoinSet::new();
    for id in 1..=CALLERS {
        let raw = raws[(id as usize) % INSTANCES].clone();
        let key = key.clone();
        callers.spawn(async move { (id, until_charged(&raw, id, &key).await) });
    }

    let primary = primary_holding(cluster, &key).await;
    let replica = cluster.replica_of(primary);
    fail_over_to(cluster, replica).await;
    eprintln!("failover storm{options}: {replica} took over from {primary} during the charge");

    let (mut charge_ids, mut unknown) = (Vec::new(), 0);
    while let Some(joined) = callers.join_next().await {
        let (id, answer) = joined.expect("a caller panicked");
        match answer.unwrap_or_else(|why| {
            panic!(
                "caller {id}: {why}\nthe nodes on failures and failovers:\n{}",
                cluster.failover_log()
            )
        }) {
            Ended::Charged(charge_id) => charge_ids.push(charge_id),
            Ended::Unknown => unknown += 1,
        }
    }
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "exactly one charge{options}: {lines:?}");
    let charge_id = lines[0]["chargeId"].as_str().unwrap();
    assert!(
        charge_ids.iter().all(|id| id == charge_id),
        "every caller told of a charge got the one charge {charge_id}{options}"
    );
    eprintln!(
        "failover storm{options}: 1 execution; {} callers got its charge id, {unknown} outcome \
         unknown",
        charge_ids.len()
    );
    cluster.wait_healthy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_during_a_storm_of_duplicates_executes_once_either_way() {
    let Some(cluster) = OwnCluster::start(BASE_PORT, Duration::from_secs(5)).await else {
        return;
    };
    storm(&cluster, "").await;
    storm(&cluster, "?replicas=1&replica_timeout_ms=500").await;
}
