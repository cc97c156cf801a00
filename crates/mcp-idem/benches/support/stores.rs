//! The store servers of a bench: whether they answer, how many round trips they served, how a
//! cluster's records spread, and cleaning up after the run.

use std::process::Command;

/// How a bench counts the round trips a store server handled.
#[derive(Clone)]
pub(crate) enum StoreCounter {
    /// Nothing to count (the in-process stores).
    None,
    /// The Redis servers (every primary of a cluster) whose scripts are counted.
    Redis(Vec<String>),
    Postgres(String),
}

impl StoreCounter {
    /// Operations the store server has handled so far.
    pub(crate) fn read(&self) -> Option<u64> {
        let output = match self {
            Self::None => return None,
            Self::Redis(urls) => {
                return urls
                    .iter()
                    .map(|url| redis_scripts_run(url))
                    .sum::<Option<u64>>()
            }
            Self::Postgres(url) => Command::new("psql")
                .args([
                    url.as_str(),
                    "-tAc",
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
                ])
                .output(),
        }
        .ok()?;
        String::from_utf8_lossy(&output.stdout).trim().parse().ok()
    }
}

/// Round trips of the store on the Redis server at `url`: its scripts (EVALSHA). Plain reads
/// (HMGET) are not counted: the scripts run HMGET inside Redis too, and the proxy's hot path never
/// reads outside a script.
fn redis_scripts_run(url: &str) -> Option<u64> {
    let output = Command::new("redis-cli")
        .args(["-u", url, "info", "commandstats"])
        .output()
        .ok()?;
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:"))
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum(),
    )
}

/// How many of the bench's records (namespace `namespace`) each primary of a cluster holds.
pub(crate) fn key_distribution(primaries: &[String], namespace: &str) -> Vec<(String, usize)> {
    primaries
        .iter()
        .map(|address| {
            let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
            let keys = Command::new("redis-cli")
                .args(["-h", host, "-p", port, "--scan", "--pattern"])
                .arg(format!("*:r:{namespace}:*"))
                .output()
                .map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().count());
            (address.clone(), keys)
        })
        .collect()
}

/// Drops the bench's PostgreSQL schema at the end of the run.
pub(crate) struct DropSchema(pub(crate) String, pub(crate) String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                self.0.as_str(),
                "-qc",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.1),
            ])
            .output();
    }
}

pub(crate) fn redis_reachable(url: &str) -> bool {
    Command::new("redis-cli")
        .args(["-u", url, "ping"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
}

pub(crate) fn postgres_reachable(url: &str) -> bool {
    Command::new("psql")
        .args([url, "-tAc", "SELECT 1"])
        .output()
        .is_ok_and(|o| o.status.success())
}
