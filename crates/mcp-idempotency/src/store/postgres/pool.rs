//! The connection pool and what goes wrong on it: timeouts, retries of statements the server
//! aborted, and the mapping of every failure to a [`StoreError`] that names the server, never the
//! password.

use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use tokio_postgres::error::SqlState;

use super::tls::RustlsConnect;
use super::PostgresStore;
use crate::record::CorruptRecord;
use crate::store::StoreError;

/// How long one operation may take once it has a connection, and how long it may wait for a free
/// pooled connection.
pub(super) const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections per store (per process).
const MAX_CONNECTIONS: usize = 16;

/// How often an operation aborted by the server (deadlock, serialization failure) is re-run.
const MAX_TRANSIENT_RETRIES: usize = 3;

/// How often a claim is re-run because a concurrent claim of the same key committed after the
/// claim's snapshot (the `quota` module). Each re-run needs another commit on that key; this bound
/// is never reached in practice.
pub(super) const MAX_CLAIM_ATTEMPTS: usize = 8;

/// A pool of up to [`MAX_CONNECTIONS`] connections to the server `config` names (`target`, for
/// messages), which opens connections lazily, within `connect_timeout` each.
pub(super) fn build(
    config: tokio_postgres::Config,
    tls: RustlsConnect,
    connect_timeout: Duration,
    target: &str,
) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config,
        tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(MAX_CONNECTIONS)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(OPERATION_TIMEOUT))
        .create_timeout(Some(connect_timeout))
        .recycle_timeout(Some(connect_timeout))
        .build()
        .map_err(|err| StoreError::Backend {
            message: format!("cannot set up a connection pool for PostgreSQL at {target}: {err}"),
            source: Some(Box::new(err)),
        })
}

impl PostgresStore {
    /// A pooled connection, or [`StoreError::Unavailable`] within the pool's timeouts.
    pub(super) async fn connection(&self) -> Result<Object, StoreError> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|err| pool_error(&self.inner.target, err))
    }

    /// Decides what to do with the result of one run of an operation on `client`: `None` to run
    /// it again (the server aborted it: deadlock or serialization failure, nothing was written),
    /// otherwise the answer. A connection that failed or timed out is closed instead of going
    /// back to the pool.
    pub(super) fn settle<T>(
        &self,
        what: &'static str,
        client: Object,
        result: Result<T, OpError>,
        retries: &mut usize,
    ) -> Option<Result<T, StoreError>> {
        match result {
            Ok(value) => Some(Ok(value)),
            Err(err) if err.is_transient() && *retries < MAX_TRANSIENT_RETRIES => {
                *retries += 1;
                tracing::debug!(operation = what, error = %err, "PostgreSQL aborted the statement; retrying");
                None
            }
            Err(err) => {
                if err.breaks_connection() {
                    drop(Object::take(client));
                }
                Some(Err(err.into_store_error(&self.inner.target)))
            }
        }
    }
}

/// Runs `$body` (an expression using the connection `$client`) within [`OPERATION_TIMEOUT`] on a
/// pooled connection, through [`PostgresStore::settle`]. A macro rather than a function taking a
/// closure, because a closure borrowing the connection cannot be shown `Send` for every lifetime.
macro_rules! run {
    ($store:expr, $what:literal, |$client:ident| $body:expr) => {{
        let store: &$crate::store::postgres::PostgresStore = $store;
        let mut retries = 0;
        loop {
            #[allow(unused_mut)]
            let mut $client = store.connection().await?;
            let result = match ::tokio::time::timeout(
                $crate::store::postgres::pool::OPERATION_TIMEOUT,
                async { $body },
            )
            .await
            {
                Ok(result) => result,
                Err(_) => Err($crate::store::postgres::pool::OpError::TimedOut($what)),
            };
            if let Some(answer) = store.settle($what, $client, result, &mut retries) {
                break answer;
            }
        }
    }};
}

pub(super) use run;

/// What went wrong inside one operation.
#[derive(Debug, thiserror::Error)]
pub(super) enum OpError {
    #[error("{}", explain(.0))]
    Pg(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("{0} took longer than {OPERATION_TIMEOUT:?}")]
    TimedOut(&'static str),
    #[error("the claim raced concurrent claims of the same key {MAX_CLAIM_ATTEMPTS} times")]
    KeptRacing,
    #[error("{0}")]
    Refused(String),
}

impl OpError {
    /// The server aborted the statement without applying it; running it again is safe.
    pub(super) fn is_transient(&self) -> bool {
        matches!(self, Self::Pg(err) if matches!(
            err.code(),
            Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::T_R_SERIALIZATION_FAILURE
        ))
    }

    /// The connection may be unusable (or stuck behind a statement that timed out).
    pub(super) fn breaks_connection(&self) -> bool {
        match self {
            Self::Pg(err) => is_connection_error(err),
            Self::TimedOut(_) => true,
            _ => false,
        }
    }

    pub(super) fn into_store_error(self, target: &str) -> StoreError {
        match self {
            Self::Pg(err) if is_connection_error(&err) => StoreError::Unavailable {
                message: format!("PostgreSQL at {target} is unavailable: {err}"),
                source: Some(Box::new(err)),
            },
            Self::Pg(err) => StoreError::Backend {
                message: format!("PostgreSQL at {target}: {err}"),
                source: Some(Box::new(err)),
            },
            Self::Corrupt(err) => StoreError::Corrupt(err),
            err @ Self::TimedOut(_) => StoreError::Unavailable {
                message: format!("PostgreSQL at {target} did not answer: {err}"),
                source: None,
            },
            err @ (Self::KeptRacing | Self::Refused(_)) => StoreError::Backend {
                message: format!("PostgreSQL at {target}: {err}"),
                source: None,
            },
        }
    }
}

/// Why getting a pooled connection failed, as [`StoreError::Unavailable`].
pub(super) fn pool_error(target: &str, err: PoolError) -> StoreError {
    let why = match &err {
        PoolError::Backend(err) => format!("cannot connect: {}", explain(err)),
        PoolError::Timeout(TimeoutType::Wait) => format!(
            "all {MAX_CONNECTIONS} connections stayed busy for {}s",
            OPERATION_TIMEOUT.as_secs()
        ),
        PoolError::Timeout(TimeoutType::Create) => "connecting timed out".to_owned(),
        PoolError::Timeout(TimeoutType::Recycle) => {
            "checking a pooled connection timed out".to_owned()
        }
        other => explain(other),
    };
    StoreError::Unavailable {
        message: format!("PostgreSQL at {target} is unavailable: {why}"),
        source: Some(Box::new(err)),
    }
}

/// An error and its causes, `: `-separated (tokio-postgres errors show their cause only as a
/// source, e.g. "error connecting to server" without "Connection refused").
pub(super) fn explain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whether `err` means the server could not be reached or dropped the connection (as opposed to
/// answering a statement with an error).
pub(super) fn is_connection_error(err: &tokio_postgres::Error) -> bool {
    let Some(code) = err.code() else {
        // No SQLSTATE: the client failed to talk to the server (I/O, closed connection, timeout).
        return true;
    };
    let code = code.code();
    // 08: connection exception; 53: insufficient resources (too many connections, disk full);
    // 57P0x: server shutting down or starting up; 57014: statement_timeout or cancel.
    code.starts_with("08") || code.starts_with("53") || code.starts_with("57P") || code == "57014"
}
