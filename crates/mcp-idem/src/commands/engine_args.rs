//! Options shared by the commands that decide calls, `wrap` and `proxy`: every help text here must
//! hold for both (tests/integration/cli_help.rs runs `--help` of each).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::embedded::options::{
    self, AFTER_CRASH, LEASE, MAX_ARGUMENT_BYTES, MAX_KEY_BYTES, MAX_OUTCOME_BYTES,
    MAX_RECORDS_PER_SCOPE, MAX_RECORDS_TOTAL, RETENTION, STORE,
};
use mcp_idempotency::embedded::SetupError;
use mcp_idempotency::store::{self, Store, StoreUrl};
use mcp_idempotency::{AfterCrash, EngineConfig};

/// Where records live and how long, and the limits that protect the store: the library's
/// [`options`] table gives each its name, default, parser and help (the same for the bindings).
#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    #[arg(long = STORE.name, env = "MCP_IDEM_STORE", value_name = "URL", help = STORE.help)]
    pub(crate) store: Option<String>,

    #[arg(long = RETENTION.name, env = "MCP_IDEM_RETENTION", help = RETENTION.help,
          default_value = RETENTION.default, value_parser = options::duration)]
    pub(crate) retention: Duration,

    #[arg(long = LEASE.name, env = "MCP_IDEM_LEASE", help = LEASE.help,
          default_value = LEASE.default, value_parser = options::duration)]
    pub(crate) lease: Duration,

    #[arg(long = AFTER_CRASH.name, env = "MCP_IDEM_AFTER_CRASH", help = AFTER_CRASH.help,
          default_value = AFTER_CRASH.default, value_parser = options::after_crash)]
    pub(crate) after_crash: AfterCrash,

    #[arg(long = MAX_KEY_BYTES.name, env = "MCP_IDEM_MAX_KEY_BYTES", help = MAX_KEY_BYTES.help,
          default_value = MAX_KEY_BYTES.default, value_parser = options::size)]
    pub(crate) max_key_bytes: usize,

    #[arg(long = MAX_ARGUMENT_BYTES.name, env = "MCP_IDEM_MAX_ARGUMENT_BYTES",
          help = MAX_ARGUMENT_BYTES.help, default_value = MAX_ARGUMENT_BYTES.default,
          value_parser = options::size)]
    pub(crate) max_argument_bytes: usize,

    #[arg(long = MAX_OUTCOME_BYTES.name, env = "MCP_IDEM_MAX_OUTCOME_BYTES",
          help = MAX_OUTCOME_BYTES.help, default_value = MAX_OUTCOME_BYTES.default,
          value_parser = options::size)]
    pub(crate) max_outcome_bytes: usize,

    #[arg(long = MAX_RECORDS_PER_SCOPE.name, env = "MCP_IDEM_MAX_RECORDS_PER_SCOPE",
          help = MAX_RECORDS_PER_SCOPE.help, default_value = MAX_RECORDS_PER_SCOPE.default,
          value_parser = options::count)]
    pub(crate) max_records_per_scope: u64,

    #[arg(long = MAX_RECORDS_TOTAL.name, env = "MCP_IDEM_MAX_RECORDS_TOTAL",
          help = MAX_RECORDS_TOTAL.help, default_value = MAX_RECORDS_TOTAL.default,
          value_parser = options::count)]
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
        store_url(self.store.as_deref())
    }

    /// Opens the store; a malformed URL or an unusable store is an error.
    pub(crate) async fn open_store(&self) -> anyhow::Result<Arc<dyn Store>> {
        let url = self.store_url()?;
        store::open(&url)
            .await
            .with_context(|| format!("cannot open the record store {url}"))
    }
}

/// `--store`, or the store `wrap`, `proxy` and `inspect` use without it: the library's
/// [`store_url_or_default`](mcp_idempotency::embedded::store_url_or_default), the same file as
/// the Python and TypeScript bindings'.
pub(crate) fn store_url(url: Option<&str>) -> anyhow::Result<StoreUrl> {
    mcp_idempotency::embedded::store_url_or_default(url).map_err(|err| match err {
        SetupError::NoDataDirectory => {
            anyhow::anyhow!("cannot find the user's data directory; pass --store")
        }
        other => anyhow::Error::from(other),
    })
}
