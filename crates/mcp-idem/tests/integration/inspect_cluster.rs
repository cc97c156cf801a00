//! `mcp-idem inspect` on a Redis Cluster: records of one namespace in many scopes (so in several
//! shards, on several primaries) are all listed, counted, shown and deleted by one `inspect`.
//!
//! The cluster comes from `REDIS_CLUSTER_URL` (default the cluster of scripts/redis-cluster.sh);
//! the records sit in a namespace of their own under the default key prefix, the one `inspect`
//! reads. An unreachable cluster skips the test with a note, or fails it when `CI=true`.

use std::process::{Command, Stdio};
use std::time::Duration;

use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{ClaimOutcome, ClaimRequest, RecordLimits, RedisStore, Store};
use mcp_idempotency::{FencingToken, IdempotencyKey, RecordId, Scope, Timestamp};
use serde_json::Value;

use crate::support::http::{unique_namespace, SharedStore};
use crate::support::wrap::EXE;

const PRINCIPALS: usize = 24;

fn inspect(url: &str, args: &[&str]) -> Value {
    let output = Command::new(EXE)
        .arg("inspect")
        .arg("--store")
        .arg(url)
        .args(args)
        .arg("--json")
        .env_remove("MCP_IDEM_STORE")
        .env("MCP_IDEM_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run mcp-idem inspect");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_lists_shows_counts_and_deletes_across_the_primaries() {
    let Some(url) = SharedStore::RedisCluster.url() else {
        return;
    };
    let namespace = unique_namespace("inspect-cluster");
    let store = RedisStore::open(&url)
        .await
        .expect("open the cluster store");
    let now = Timestamp::now();
    for n in 0..PRINCIPALS {
        let req = ClaimRequest {
            trace: None,
            id: RecordId {
                scope: Scope::new(namespace.as_str(), format!("principal-{n}")),
                key: IdempotencyKey::new(&format!("order-{n}"), 255).unwrap(),
            },
            fingerprint: fingerprint("charge", Some("{}")).unwrap(),
            tool_name: "charge".into(),
            owner: FencingToken::random(),
            now,
            lease_expires_at: now.saturating_add(Duration::from_secs(60)),
            expires_at: now.saturating_add(Duration::from_secs(600)),
            limits: RecordLimits::UNLIMITED,
        };
        assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    }

    let listed = inspect(&url, &["list", "--namespace", &namespace]);
    let records = listed["records"].as_array().expect("records");
    assert_eq!(records.len(), PRINCIPALS, "{listed}");
    let stats = inspect(&url, &["stats"]);
    assert!(
        stats["in_progress"].as_u64().unwrap() >= PRINCIPALS as u64,
        "{stats}"
    );
    assert!(!stats["store"].as_str().unwrap().is_empty());

    let shown = inspect(&url, &["show", "order-7", "--namespace", &namespace]);
    assert_eq!(
        shown.to_string().matches("principal-7").count(),
        1,
        "{shown}"
    );
    for n in 0..PRINCIPALS {
        let key = format!("order-{n}");
        inspect(&url, &["delete", &key, "--namespace", &namespace, "--yes"]);
    }
    let listed = inspect(&url, &["list", "--namespace", &namespace]);
    assert_eq!(listed["records"].as_array().unwrap().len(), 0, "{listed}");
}
