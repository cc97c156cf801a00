//! A record completed by one process is replayed by another process on the same SQLite file.
//!
//! The test re-runs its own test binary as the writer process (the `#[ignore]`d `writer_process`
//! test of this module, which does nothing unless the parent sets `MCP_IDEM_WRITER_DB`).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use mcp_idempotency::store::{SqliteStore, Store};
use mcp_idempotency::{Decision, Deduplicator, EngineConfig, Outcome, Replay, Scope, ToolCall};
use serde_json::json;

const WRITER_DB: &str = "MCP_IDEM_WRITER_DB";

/// The writer's test name as the harness knows it (`sqlite_across_processes::writer_process`):
/// this module's path without the crate name.
fn writer_test_name() -> String {
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, path)| path);
    format!("{module}::writer_process")
}

fn call<'a>(key: &'a serde_json::Value) -> ToolCall<'a> {
    ToolCall {
        tool_name: "charge_payment",
        arguments: Some(r#"{"amount": 4200, "currency": "usd"}"#),
        idempotency_key: Some(key),
        mrtr_continuation: false,
        ..Default::default()
    }
}

async fn dedup(path: &Path) -> Deduplicator {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path).await.expect("open store"));
    Deduplicator::new(EngineConfig::default(), store)
}

#[tokio::test]
#[ignore = "the writer half of record_completed_by_one_process_is_replayed_by_another"]
async fn writer_process() {
    let Some(path) = std::env::var_os(WRITER_DB) else {
        return;
    };
    let dedup = dedup(Path::new(&path)).await;
    let key = json!("order-1");
    let Decision::Execute(claim) = dedup.decide(&Scope::new("ns", "user"), &call(&key)).await
    else {
        panic!("the writer must execute");
    };
    let outcome = json!({"content": [], "structuredContent": {"pid": std::process::id()}});
    dedup
        .complete(&claim, Outcome::Success(outcome.to_string()))
        .await
        .expect("complete");
}

#[tokio::test]
async fn record_completed_by_one_process_is_replayed_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.sqlite3");
    let writer = Command::new(std::env::current_exe().unwrap())
        .arg(writer_test_name())
        .args(["--exact", "--ignored", "--nocapture"])
        .env(WRITER_DB, &path)
        .output()
        .expect("spawn the writer process");
    let stdout = String::from_utf8_lossy(&writer.stdout);
    assert!(writer.status.success(), "writer failed: {stdout}");
    assert!(stdout.contains("1 passed"), "writer did not run: {stdout}");

    let dedup = dedup(&path).await;
    let key = json!("order-1");
    let Decision::Replay(Replay::Result(raw)) =
        dedup.decide(&Scope::new("ns", "user"), &call(&key)).await
    else {
        panic!("the reader must replay the writer's outcome");
    };
    let result: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let writer_pid = result["structuredContent"]["pid"].as_u64().unwrap();
    assert_ne!(writer_pid, u64::from(std::process::id()));

    // The record is scoped: another principal on the same file executes anew.
    assert!(matches!(
        dedup
            .decide(&Scope::new("ns", "someone-else"), &call(&key))
            .await,
        Decision::Execute(_)
    ));
}
