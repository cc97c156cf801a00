//! Horizontal scaling: three `mcp-idem proxy` instances on different ports share one Redis (then
//! one Redis Cluster, the same two over TLS, then one PostgreSQL) store in front of one demo
//! server. 200 concurrent requests of the SAME keyed charge, spread round-robin over the three
//! instances, produce exactly one ledger entry; every caller gets either the original outcome
//! (that charge's id) or `idempotency_key_in_progress`, and once the charge is done a retry on
//! each instance replays it.
//!
//! The stores come from `REDIS_URL` (default redis://127.0.0.1:6379), `REDIS_CLUSTER_URL`
//! (default the cluster of scripts/redis-cluster.sh), `REDIS_TLS_URL`, `REDIS_TLS_CLUSTER_URL` and
//! `REDIS_TLS_CA` (defaults those of scripts/tls-redis.sh) and `DATABASE_URL` (default
//! postgres://postgres@127.0.0.1:5432/test); each run uses a namespace of its own. An unreachable
//! store skips the test with a note, or fails it when `CI=true`.

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::common::ledger_lines;
use crate::support::http::{
    call_until_settled, ledger_in, slow_charge, unique_namespace, HttpDemo, Proxy, Raw, SharedStore,
};

const INSTANCES: usize = 3;
const CALLERS: u64 = 200;
/// Long enough for the callers to overlap the running charge.
const CHARGE_MS: u64 = 300;

async fn one_charge_for_concurrent_callers_on_three_instances(store_url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace("multi-instance");
    let proxies = Proxy::spawn_many(
        INSTANCES,
        &server.base_url(),
        &["--store", store_url, "--namespace", &namespace],
    );
    let client = Client::builder(TokioExecutor::new()).build_http();
    let raws: Vec<Raw> = proxies
        .iter()
        .map(|proxy| Raw::with_client(client.clone(), proxy))
        .collect();
    let key = "one-charge-for-all";

    let mut callers = tokio::task::JoinSet::new();
    for id in 1..=CALLERS {
        let raw = raws[(id as usize) % INSTANCES].clone();
        callers.spawn(async move {
            let answer = raw.call(slow_charge(id, 99, CHARGE_MS, Some(key))).await;
            (id, answer)
        });
    }
    let mut charge_ids = Vec::new();
    let mut in_progress = 0;
    while let Some(joined) = callers.join_next().await {
        let (id, answer) = joined.expect("a caller panicked");
        assert_eq!(answer.status, 200, "caller {id}: {}", answer.body);
        assert_eq!(answer.json()["id"], id, "caller {id}: {}", answer.body);
        match (answer.charge_id(), answer.error_type()) {
            (Some(charge_id), None) => charge_ids.push(charge_id),
            (None, Some(kind)) if kind == "idempotency_key_in_progress" => in_progress += 1,
            _ => panic!(
                "caller {id} got neither the outcome nor `in progress`: {}",
                answer.body
            ),
        }
    }

    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "exactly one charge: {lines:?}");
    let charge_id = lines[0]["chargeId"].as_str().unwrap();
    assert!(!charge_ids.is_empty(), "nobody got the outcome");
    assert!(
        charge_ids.iter().all(|id| id == charge_id),
        "every outcome is the one charge {charge_id}: {charge_ids:?}"
    );
    eprintln!(
        "{} callers got the outcome, {in_progress} were told it was in progress",
        charge_ids.len()
    );

    // Done now: every instance replays it.
    for (n, raw) in raws.iter().enumerate() {
        let id = CALLERS + 1 + n as u64;
        let replay = call_until_settled(raw, &slow_charge(id, 99, CHARGE_MS, Some(key))).await;
        assert_eq!(replay.json()["id"], id);
        assert_eq!(
            replay.charge_id().as_deref(),
            Some(charge_id),
            "instance {n}: {}",
            replay.body
        );
    }
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_sharing_redis_charge_once() {
    let Some(url) = SharedStore::Redis.url() else {
        return;
    };
    one_charge_for_concurrent_callers_on_three_instances(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_sharing_a_redis_cluster_charge_once() {
    let Some(url) = SharedStore::RedisCluster.url() else {
        return;
    };
    one_charge_for_concurrent_callers_on_three_instances(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_sharing_tls_redis_charge_once() {
    let Some(url) = SharedStore::RedisTls.url() else {
        return;
    };
    one_charge_for_concurrent_callers_on_three_instances(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_sharing_a_tls_redis_cluster_charge_once() {
    let Some(url) = SharedStore::RedisTlsCluster.url() else {
        return;
    };
    one_charge_for_concurrent_callers_on_three_instances(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_sharing_postgres_charge_once() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    one_charge_for_concurrent_callers_on_three_instances(&url).await;
}
