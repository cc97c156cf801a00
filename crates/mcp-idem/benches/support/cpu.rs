//! CPU time of processes, read from `/proc` (Linux): user and system time of a process and all its
//! threads, in seconds, so a bench can report CPU per request of each process involved, and how
//! much of it the kernel spent.

use std::path::Path;
use std::process::Command;

/// Which processes a CPU reading sums.
#[derive(Clone, Debug)]
pub(crate) enum Processes {
    /// No process (the row has nothing to measure here).
    None,
    /// One process.
    Pid(u32),
    /// A process and its direct children (nginx's master and worker, PostgreSQL's postmaster and
    /// its backends).
    Tree(u32),
    /// Several processes (the nodes of a Redis Cluster).
    Pids(Vec<u32>),
}

impl Processes {
    /// CPU seconds used so far (`None` when nothing is measured or `/proc` can't be read).
    pub(crate) fn cpu_seconds(&self) -> Option<Cpu> {
        let pids = match self {
            Self::None => return None,
            Self::Pid(pid) => vec![*pid],
            Self::Tree(pid) => {
                let mut pids = vec![*pid];
                pids.extend(children(*pid));
                pids
            }
            Self::Pids(pids) => pids.clone(),
        };
        let (user, system) = pids
            .iter()
            .filter_map(|&pid| stat(pid))
            .fold((0, 0), |(user, system), s| {
                (user + s.user, system + s.system)
            });
        let tick = 1.0 / clock_ticks_per_second();
        Some(Cpu {
            user: user as f64 * tick,
            system: system as f64 * tick,
        })
    }
}

/// CPU seconds, in user space and in the kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cpu {
    pub(crate) user: f64,
    pub(crate) system: f64,
}

impl Cpu {
    pub(crate) fn total(self) -> f64 {
        self.user + self.system
    }
}

struct Stat {
    parent: u32,
    user: u64,
    system: u64,
}

/// `/proc/PID/stat`: the parent's pid and utime + stime (fields 4, 14 and 15; the name in field 2
/// may hold spaces, so fields are counted after its closing parenthesis).
fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is field 3 (state).
    let parent = fields.get(1)?.parse().ok()?;
    Some(Stat {
        parent,
        user: fields.get(11)?.parse().ok()?,
        system: fields.get(12)?.parse().ok()?,
    })
}

fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|s| s.parent == parent))
        .collect()
}

/// The kernel's USER_HZ (`getconf CLK_TCK`; 100 on every mainstream Linux).
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The pid of the Redis server at `url` (`INFO server`'s `process_id`).
pub(crate) fn redis_pid(url: &str) -> Option<u32> {
    let output = Command::new("redis-cli")
        .args(["-u", url, "info", "server"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("process_id:")?.trim().parse().ok())
}

/// The `host:port` of every node of the Redis Cluster that `seed` (`host:port`) belongs to, with
/// whether it is a primary (`CLUSTER NODES`).
pub(crate) fn cluster_nodes(seed: &str) -> Vec<(String, bool)> {
    let (host, port) = seed.rsplit_once(':').unwrap_or((seed, "6379"));
    let Ok(output) = Command::new("redis-cli")
        .args(["-h", host, "-p", port, "cluster", "nodes"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = fields.get(1)?.split('@').next()?.to_owned();
            let primary = fields.get(2)?.contains("master");
            Some((address, primary))
        })
        .collect()
}

/// The pid of the postmaster of the PostgreSQL server at `url`: the first line of
/// `postmaster.pid` in its data directory (readable by the server's owner or root).
pub(crate) fn postmaster_pid(url: &str) -> Option<u32> {
    let output = Command::new("psql")
        .args([url, "-tAc", "SHOW data_directory"])
        .output()
        .ok()?;
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let text = std::fs::read_to_string(Path::new(&dir).join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}
