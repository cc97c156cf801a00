//! The connection: waiting for SQLite's locks, WAL mode and its checkpoints, and what SQLite's
//! errors mean.

use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};

use super::Inner;
use crate::store::StoreError;

/// Whether `err` is SQLite reporting a lock held by another connection.
pub(super) fn is_lock_conflict(err: &StoreError) -> bool {
    let StoreError::Unavailable {
        source: Some(source),
        ..
    } = err
    else {
        return false;
    };
    source
        .downcast_ref::<rusqlite::Error>()
        .and_then(rusqlite::Error::sqlite_error_code)
        .is_some_and(|code| matches!(code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

/// How often the WAL is checkpointed into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Checkpoints the WAL every [`CHECKPOINT_EVERY`] on a connection of its own, until the store is
/// dropped. PASSIVE checkpoints never block writers; a failed one is retried on the next tick.
pub(super) fn spawn_checkpointer(store: std::sync::Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("mcp-idem-sqlite-checkpoint".into())
        .spawn(move || {
            let Some(path) = store.upgrade().map(|inner| inner.path.clone()) else {
                return;
            };
            let conn = match Connection::open(&path) {
                Ok(conn) => conn,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot open a checkpoint connection; the WAL will grow");
                    return;
                }
            };
            // A RESTART checkpoint may wait this long for a transaction to end.
            let _ = conn.busy_timeout(Duration::from_millis(200));
            let _ = conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES);
            while store.strong_count() > 0 {
                std::thread::sleep(CHECKPOINT_EVERY);
                checkpoint(&conn);
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "cannot start the checkpoint thread; the WAL will grow");
    }
}

/// WAL size (in pages, 128 MiB of 4 KiB pages) past which a checkpoint makes the next writer start
/// the log afresh. That RESTART checkpoint holds the write lock through its two fsyncs (about
/// 10 ms here), so its frequency sets the store's tail latency under sustained writes: at 4096
/// pages it ran a dozen times a second at 8,500 calls/s and the proxy's p99 was 13 ms; at 32768
/// it was 5 ms (docs/benchmarks.md).
const WAL_RESTART_PAGES: i64 = 32768;

/// Largest WAL file kept once the log restarts (SQLite truncates it to this).
pub(super) const WAL_SIZE_LIMIT_BYTES: i64 = 16 << 20;

/// Copies the WAL into the database without blocking anyone (PASSIVE). Under sustained writes a
/// PASSIVE checkpoint never sees the log idle, so SQLite never starts it afresh and the file grows
/// with the number of writes; past [`WAL_RESTART_PAGES`] a RESTART checkpoint waits briefly for
/// the current transaction so that the next writer starts the log from the beginning.
fn checkpoint(conn: &Connection) {
    let passive = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match passive {
        Ok((log_pages, _)) if log_pages > WAL_RESTART_PAGES => {
            if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())) {
                tracing::debug!(error = %err, "WAL restart checkpoint failed; retrying later");
            }
        }
        Ok(_) => {}
        Err(err) => tracing::debug!(error = %err, "WAL checkpoint failed; retrying later"),
    }
}

/// How long a statement waits for another connection's lock, at least.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause between two tries for a lock another connection holds, for the first
/// [`SHORT_POLLS`] tries; [`LONG_POLL`] after that. SQLite's own `busy_timeout` sleeps 1, 2, 5, 10,
/// 15, 20, 25… ms between tries, so a lock held for 3 ms (the checkpoint's fsync) cost a waiting
/// claim 8 ms, and one held for 10 ms cost it 18 ms: the proxy's p99 on SQLite was 16 ms.
const SHORT_POLL: Duration = Duration::from_micros(250);
const SHORT_POLLS: u32 = 80;
const LONG_POLL: Duration = Duration::from_millis(1);

/// Makes `conn` wait up to [`BUSY_TIMEOUT`] for a lock held by another connection, trying again
/// every [`SHORT_POLL`] at first.
pub(super) fn wait_for_locks(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_handler(Some(wait_for_lock))
}

/// SQLite's busy handler: `tries` is how many times it was called for this lock already; `false`
/// gives up (the statement fails with SQLITE_BUSY).
fn wait_for_lock(tries: i32) -> bool {
    match pause_before_try(u32::try_from(tries).unwrap_or(0)) {
        Some(pause) => {
            std::thread::sleep(pause);
            true
        }
        None => false,
    }
}

/// How long to pause before the next try for a lock after `tries` tries; `None` once the pauses
/// add up to [`BUSY_TIMEOUT`].
fn pause_before_try(tries: u32) -> Option<Duration> {
    let short = tries.min(SHORT_POLLS);
    let waited = SHORT_POLL * short + LONG_POLL * (tries - short);
    (waited < BUSY_TIMEOUT).then_some(if tries < SHORT_POLLS {
        SHORT_POLL
    } else {
        LONG_POLL
    })
}

/// `PRAGMA journal_mode = WAL`. Switching a new file to WAL takes an exclusive lock, and when
/// several processes create the store at once SQLite answers SQLITE_BUSY at once instead of calling
/// the busy handler (waiting could deadlock), so retry for up to [`BUSY_TIMEOUT`].
pub(super) fn enable_wal(conn: &Connection) -> rusqlite::Result<()> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(err)
                if err.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

pub(super) async fn run_blocking<T: Send + 'static>(
    op: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(op)
            .await
            .map_err(|err| StoreError::Backend {
                message: "SQLite task failed".into(),
                source: Some(Box::new(err)),
            })?,
        Err(_) => op(),
    }
}

/// `err` as [`StoreError::Unavailable`] when the file cannot be written now (locked, full,
/// read-only, unreadable), [`StoreError::Backend`] otherwise.
pub(super) fn sql_error(err: rusqlite::Error) -> StoreError {
    let unavailable = matches!(
        err.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::CannotOpen
                | ErrorCode::SystemIoFailure
                | ErrorCode::PermissionDenied
        )
    );
    if unavailable {
        StoreError::unavailable("SQLite store cannot be written", err)
    } else {
        StoreError::backend("SQLite error", err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_tried_often_at_first_and_given_up_after_the_busy_timeout() {
        assert_eq!(pause_before_try(0), Some(SHORT_POLL));
        assert_eq!(pause_before_try(SHORT_POLLS - 1), Some(SHORT_POLL));
        assert_eq!(pause_before_try(SHORT_POLLS), Some(LONG_POLL));
        let pauses: Vec<Duration> = (0..).map_while(pause_before_try).collect();
        let waited: Duration = pauses.iter().sum();
        assert!(waited >= BUSY_TIMEOUT, "gave up after {waited:?}");
        assert!(waited < BUSY_TIMEOUT + LONG_POLL, "waited {waited:?}");
    }
}
