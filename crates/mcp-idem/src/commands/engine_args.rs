//! Options shared by the commands that decide calls, `wrap` and `proxy`: every help text here must
//! hold for both (tests/integration/cli_help.rs runs `--help` of each).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::store::{self, Store, StoreUrl};
use mcp_idempotency::{AfterCrash, Deduplicator, EngineConfig};

/// How often expired records are purged.
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// Where records live and how long, and the limits that protect the store.
#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    /// Record store: `sqlite:PATH`, `memory` (this process only), `redis://…`,
    /// `redis-cluster://HOST:PORT,…` or `postgres://…` (shared by many instances; over TLS:
    /// `rediss://…`, `rediss-cluster://…`, `postgres://…?sslmode=verify-full`, each taking
    /// `sslrootcert=CA.pem`) [default: sqlite: in the user's data directory, e.g.
    /// ~/.local/share/mcp-idem/records.sqlite3, so records survive restarts].
    /// On Redis, `?replicas=N[&replica_timeout_ms=T]` makes each write wait for N replicas (T ms,
    /// default 1000) and fail closed without them.
    #[arg(long, env = "MCP_IDEM_STORE", value_name = "URL")]
    pub(crate) store: Option<String>,

    /// How long a completed call's outcome is kept for replay.
    #[arg(long, env = "MCP_IDEM_RETENTION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub(crate) retention: Duration,

    /// How long a running call's claim lives without renewal (renewed every third of it).
    #[arg(long, env = "MCP_IDEM_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) lease: Duration,

    /// What a retry gets when the original call's owner died before recording an outcome:
    /// `reject` (idempotency_outcome_unknown, never a second execution) or `reexecute`.
    #[arg(long, env = "MCP_IDEM_AFTER_CRASH", default_value = "reject", value_parser = str::parse::<AfterCrash>)]
    pub(crate) after_crash: AfterCrash,

    /// Longest accepted idempotencyKey, in bytes.
    #[arg(long, env = "MCP_IDEM_MAX_KEY_BYTES", default_value_t = mcp_idempotency::EngineConfig::DEFAULT_MAX_KEY_BYTES)]
    pub(crate) max_key_bytes: usize,

    /// Largest accepted `arguments` of a keyed call, in bytes.
    #[arg(long, env = "MCP_IDEM_MAX_ARGUMENT_BYTES", default_value_t = EngineConfig::DEFAULT_MAX_ARGUMENT_BYTES)]
    pub(crate) max_argument_bytes: usize,

    /// Largest outcome kept for replay, in bytes; larger ones are recorded as not retained.
    #[arg(long, env = "MCP_IDEM_MAX_OUTCOME_BYTES", default_value_t = EngineConfig::DEFAULT_MAX_OUTCOME_BYTES)]
    pub(crate) max_outcome_bytes: usize,

    /// Most live records per principal.
    #[arg(long, env = "MCP_IDEM_MAX_RECORDS_PER_SCOPE", default_value_t = EngineConfig::DEFAULT_MAX_RECORDS_PER_SCOPE)]
    pub(crate) max_records_per_scope: u64,

    /// Most live records in the store.
    #[arg(long, env = "MCP_IDEM_MAX_RECORDS_TOTAL", default_value_t = EngineConfig::DEFAULT_MAX_RECORDS_TOTAL)]
    pub(crate) max_records_total: u64,
}

impl EngineArgs {
    pub(crate) fn engine_config(&self) -> EngineConfig {
        EngineConfig::default()
            .with_retention(self.retention)
            .with_lease(self.lease)
            .with_after_crash(self.after_crash)
            .with_max_key_bytes(self.max_key_bytes)
            .with_max_argument_bytes(self.max_argument_bytes)
            .with_max_outcome_bytes(self.max_outcome_bytes)
            .with_max_records_per_scope(self.max_records_per_scope)
            .with_max_records_total(self.max_records_total)
    }

    /// The store URL, with the default SQLite file when none was given.
    pub(crate) fn store_url(&self) -> anyhow::Result<StoreUrl> {
        match &self.store {
            Some(url) => url.parse().map_err(anyhow::Error::from),
            None => Ok(StoreUrl::Sqlite(default_sqlite_path()?)),
        }
    }

    /// Opens the store; a malformed URL or an unusable store is an error.
    pub(crate) async fn open_store(&self) -> anyhow::Result<Arc<dyn Store>> {
        let url = self.store_url()?;
        store::open(&url)
            .await
            .with_context(|| format!("cannot open the record store {url}"))
    }
}

/// The store `wrap` and `inspect` use without `--store`: the library's
/// [`default_sqlite_path`](mcp_idempotency::embedded::default_sqlite_path), the same file as the
/// Python and TypeScript bindings'.
pub(crate) fn default_sqlite_path() -> anyhow::Result<PathBuf> {
    mcp_idempotency::embedded::default_sqlite_path()
        .map_err(|_| anyhow::anyhow!("cannot find the user's data directory; pass --store"))
}

/// Purges expired records every [`PURGE_EVERY`], forever.
pub(crate) async fn purge_periodically(dedup: Deduplicator) -> std::convert::Infallible {
    dedup.purge_periodically(PURGE_EVERY).await
}
