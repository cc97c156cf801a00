//! What the PostgreSQL restart tests (`pg_restart`) need: a PostgreSQL server of their own, which
//! they may restart cleanly or crash (`scripts/pg-server.sh`, on a free port, its data in a
//! temporary directory: the shared servers on 5432 and 5433 are never touched), and readers of
//! what the proxies logged about the store.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::common::free_port;

/// The script that starts, restarts and stops the server.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-server.sh");

/// How the server goes down: `pg_ctl -m fast` (a clean shutdown: sessions are ended, a
/// checkpoint is written) or `-m immediate` (a crash: every process is killed, the next start
/// replays the WAL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shutdown {
    Fast,
    Immediate,
}

impl Shutdown {
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Immediate => "immediate",
        }
    }
}

/// A PostgreSQL server of the test's own (trust auth, database `test`), stopped (immediate) and
/// its data directory removed on drop.
pub(crate) struct PrivatePostgres {
    dir: tempfile::TempDir,
    port: u16,
}

impl PrivatePostgres {
    /// Starts one. `None` (with a note) if PostgreSQL's server binaries are not installed; panics
    /// then when `CI=true`, and whenever the script fails.
    pub(crate) fn start() -> Option<Self> {
        let installed = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .any(|version| version.path().join("bin/pg_ctl").exists());
        if !installed {
            let message = "PostgreSQL's server binaries (/usr/lib/postgresql/*/bin) are missing";
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{message}: CI=true requires them"
            );
            eprintln!("note: {message}; skipping this test");
            return None;
        }
        let server = Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
            port: free_port(),
        };
        server.run(&["start"]);
        Some(server)
    }

    /// The store URL (`connect_timeout=2`).
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/test?connect_timeout=2",
            self.port
        )
    }

    /// `pg_ctl restart -m MODE`, waiting until the server accepts connections again; how long
    /// that took. Blocks the thread.
    pub(crate) fn restart(&self, how: Shutdown) -> Duration {
        self.run(&["restart", how.arg()])
    }

    /// `pg_ctl stop -m MODE`; how long it took. Blocks the thread.
    pub(crate) fn stop(&self, how: Shutdown) -> Duration {
        self.run(&["stop", how.arg()])
    }

    /// Starts it again after [`PrivatePostgres::stop`]; how long it took. Blocks the thread.
    pub(crate) fn start_again(&self) -> Duration {
        self.run(&["start"])
    }

    /// The server's log.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(SCRIPT);
        command
            .args(args)
            .env("PG_DIR", self.dir.path())
            .env("PG_PORT", self.port.to_string());
        command
    }

    fn run(&self, args: &[&str]) -> Duration {
        let started = Instant::now();
        let output = self
            .command(args)
            .output()
            .unwrap_or_else(|err| panic!("cannot run {SCRIPT}: {err}"));
        assert!(
            output.status.success(),
            "{SCRIPT} {args:?} failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        started.elapsed()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.command(&["stop", "immediate"]).output();
    }
}

/// What the proxies logged when they gave up recording a call's outcome: the keys.
const LOST_COMPLETION: &str = "cannot record the outcome of a call";
/// What the proxies logged when the first write of a call's outcome failed and they went on
/// sending it in the background.
const RETRIED_COMPLETION: &str = "the outcome of a call is not recorded yet";
/// What the proxies logged when such an outcome was written after all.
const RECORDED_LATE: &str = "recorded the outcome of a call once the store answered again";

/// The keys of the lines of `logs` that contain `text` (`key=…`).
fn keys_logged(logs: &str, text: &str) -> BTreeSet<String> {
    logs.lines()
        .filter(|line| line.contains(text))
        .filter_map(|line| {
            let (_, rest) = line.split_once(" key=")?;
            Some(rest.split_whitespace().next()?.to_owned())
        })
        .collect()
}

/// The keys whose first completion failed and was sent again, and those of them written after
/// all.
pub(crate) fn retried_completions(logs: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    (
        keys_logged(logs, RETRIED_COMPLETION),
        keys_logged(logs, RECORDED_LATE),
    )
}

/// The keys whose outcome a proxy logged it could not record (`key=…` of those lines).
pub(crate) fn lost_completions(logs: &str) -> BTreeSet<String> {
    keys_logged(logs, LOST_COMPLETION)
}

/// The store errors the proxies gave as the reason for refusing a call (`error=…` of their
/// "refusing to execute" lines), digits masked so that they group, with how often each came.
pub(crate) fn refusals(logs: &str) -> BTreeMap<String, u64> {
    let mut reasons = BTreeMap::new();
    for line in logs
        .lines()
        .filter(|line| line.contains("refusing to execute"))
    {
        let reason = line.split_once(" error=").map_or(line, |(_, rest)| rest);
        let masked: String = reason
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        *reasons.entry(masked).or_default() += 1;
    }
    reasons
}
