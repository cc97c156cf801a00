//! Replacing a cluster connection that keeps failing.
//!
//! After a manual failover on a loaded machine, the `redis` crate's cluster client has been seen
//! timing out on every command for over a minute while the cluster itself served other clients:
//! its slot refresh did not converge (docs/reliability.md, "What a failover does to a claim"). A
//! store whose cluster connection has failed every exchange for [`REPLACE_AFTER`] therefore opens a
//! new one from the seed nodes, which maps the slots afresh, and uses it from then on: one opening
//! at a time, and not again before [`REPLACE_AFTER`] has passed. Every operation is fenced or safe
//! to send twice, so which connection carries it does not matter. A connection to one server
//! (`ConnectionManager`) reconnects by itself and is never replaced.
//!
//! [`Health`] decides (sans-IO, the time passed in); [`SharedConn`] holds the connection and does
//! the opening.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::connect::Target;
use super::server::Conn;

/// How long every exchange on a cluster connection must have failed before it is replaced.
pub(super) const REPLACE_AFTER: Duration = Duration::from_secs(10);

/// The failures of one connection, and whether a replacement is being opened.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// When the current run of failed exchanges began; `None` after a success.
    failing_since: Option<Instant>,
    /// A replacement is being opened.
    replacing: bool,
}

impl Health {
    /// An exchange succeeded: the connection works.
    pub(super) fn on_success(&mut self) {
        self.failing_since = None;
    }

    /// An exchange failed at `now` (the server unreachable or silent); whether to open a
    /// replacement now.
    pub(super) fn on_failure(&mut self, now: Instant) -> bool {
        let since = *self.failing_since.get_or_insert(now);
        if self.replacing || now.saturating_duration_since(since) < REPLACE_AFTER {
            return false;
        }
        self.replacing = true;
        true
    }

    /// The replacement opened at `now` (or failed to): the next one waits for another
    /// [`REPLACE_AFTER`] of failures.
    pub(super) fn on_replaced(&mut self, now: Instant, opened: bool) {
        self.replacing = false;
        self.failing_since = (!opened).then_some(now);
    }
}

/// A store's connection, replaced when it keeps failing (cluster only).
pub(super) struct SharedConn {
    current: Mutex<Conn>,
    health: Mutex<Health>,
    /// What to open a replacement to; `None` for one server.
    cluster: Option<Target>,
    /// The URL without its password, for logs.
    shown: String,
}

impl SharedConn {
    /// `conn`, opened to `target`.
    pub(super) fn new(conn: Conn, target: Target, shown: &str) -> Arc<Self> {
        let cluster = matches!(target, Target::Cluster { .. }).then_some(target);
        Arc::new(Self {
            current: Mutex::new(conn),
            health: Mutex::default(),
            cluster,
            shown: shown.to_owned(),
        })
    }

    /// The connection to send the next exchange on.
    pub(super) fn get(&self) -> Conn {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Notes how an exchange ended (`failed`: the server was unreachable or silent), and opens a
    /// replacement in the background when [`Health`] says so.
    pub(super) fn note(self: &Arc<Self>, failed: bool) {
        let Some(target) = &self.cluster else {
            return;
        };
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        if !failed {
            health.on_success();
            return;
        }
        if !health.on_failure(Instant::now()) {
            return;
        }
        drop(health);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.replaced(false);
            return;
        };
        tracing::warn!(
            store = %self.shown,
            "every exchange with the Redis Cluster failed for {REPLACE_AFTER:?}: opening a new connection"
        );
        let shared = Arc::clone(self);
        let target = target.clone();
        runtime.spawn(async move {
            match target.connect(&shared.shown).await {
                Ok(conn) => {
                    *shared.current.lock().unwrap_or_else(PoisonError::into_inner) = conn;
                    tracing::warn!(store = %shared.shown, "replaced the Redis Cluster connection");
                    shared.replaced(true);
                }
                Err(error) => {
                    tracing::warn!(store = %shared.shown, %error, "cannot open a new Redis Cluster connection yet");
                    shared.replaced(false);
                }
            }
        });
    }

    fn replaced(&self, opened: bool) {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .on_replaced(Instant::now(), opened);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_replaced_after_failing_for_the_whole_delay_and_once_at_a_time() {
        let start = Instant::now();
        let mut health = Health::default();
        assert!(!health.on_failure(start));
        assert!(!health.on_failure(start + REPLACE_AFTER / 2));
        assert!(health.on_failure(start + REPLACE_AFTER));
        // Being replaced: no second opening.
        assert!(!health.on_failure(start + REPLACE_AFTER * 2));
        health.on_replaced(start + REPLACE_AFTER * 2, false);
        // The opening failed: the next one after another full delay of failures.
        assert!(!health.on_failure(start + REPLACE_AFTER * 2 + REPLACE_AFTER / 2));
        assert!(health.on_failure(start + REPLACE_AFTER * 3));
        health.on_replaced(start + REPLACE_AFTER * 3, true);
        // A new connection starts with a clean slate.
        assert!(!health.on_failure(start + REPLACE_AFTER * 4));
        assert!(health.on_failure(start + REPLACE_AFTER * 5));
    }

    #[test]
    fn one_success_ends_a_run_of_failures() {
        let start = Instant::now();
        let mut health = Health::default();
        assert!(!health.on_failure(start));
        health.on_success();
        assert!(!health.on_failure(start + REPLACE_AFTER));
        assert!(!health.on_failure(start + REPLACE_AFTER + REPLACE_AFTER / 2));
        assert!(health.on_failure(start + REPLACE_AFTER * 2));
    }
}
