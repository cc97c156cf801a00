//! A CI-sized chaos run over stdio. Six client threads each drive their own `mcp-idem wrap
//! --store sqlite:<shared file> -- mcp-idem demo-server --ledger <shared ledger>` process (all
//! wraps share the SQLite file, the namespace and the ledger). Each logical call is a keyed
//! `charge_payment` with a unique amount, retried with the same key until it gets a definitive
//! answer. Faults, from a seeded RNG:
//! - a killer thread SIGKILLs a random client's `wrap` at random moments; the client restarts it
//!   (same arguments) at its next attempt;
//! - the client drops answers: it reads one, ignores it and retries with the same key;
//! - client timeouts: a few calls run longer than the client waits, so it retries while the first
//!   attempt still runs.
//!
//! On Linux the wrapped demo server dies with its `wrap` (parent-death signal); elsewhere it is
//! orphaned, reads EOF on its stdin and exits on its own, possibly after finishing (and writing to
//! the ledger) a call it had already read. Either way the owner may die between execution and
//! recording, the crash being tested: the test notes each server's pid before the kill, counts the
//! ledger lines a server wrote after its `wrap` died, and checks at the end that every one exited.
//!
//! With `--after-crash reject`: no logical call executed twice; every call the client saw charged
//! executed exactly once, with the charge id it got; calls answered `idempotency_outcome_unknown`
//! executed at most once. With `--after-crash reexecute`: a call may execute once more per kill of
//! its owner that it was in flight at (an attempt written to that `wrap` and not answered before
//! the kill), and nothing else; every charged call's id is in the ledger.
//!
//! `CHAOS_CALLS` sets the number of logical calls (default 300), `CHAOS_SEED` the seed (default:
//! from the clock; printed either way). Run with `--nocapture` to see the report.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};

use crate::support::chaos::{
    classify, executions, size_and_seed, unix_ms, verify, AfterCrash, AnswerMeans, CallResult,
    Outcome,
};
use crate::support::common::TIMEOUT;
use crate::support::wrap::{charge, is_running, EXE};

const CLIENTS: usize = 6;
/// How long a client waits for one answer before it retries.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a slow call runs: past the client's timeout.
const SLOW_MS: u64 = 2000;
/// A logical call gives up after this many attempts.
const MAX_ATTEMPTS: u32 = 60;
/// Probability that a logical call is slow.
const P_SLOW: f64 = 0.02;
/// Probability that the client drops an answer it received.
const P_DROP: f64 = 0.08;
/// The killer waits a random time in this range (milliseconds) between two kills.
const KILL_EVERY_MS: std::ops::Range<u64> = 200..800;

/// One client's `wrap` process, as the killer sees it.
struct Slot {
    /// `None` once killed or exited, until the client restarts it.
    child: Option<Child>,
    /// Bumped at every (re)start.
    generation: u32,
    /// Attempts written to this process and not answered yet: JSON-RPC id -> logical call.
    outstanding: HashMap<u64, u64>,
}

/// One SIGKILL of a `wrap`.
struct Kill {
    /// Logical calls with an attempt in flight on the killed process.
    in_flight: Vec<u64>,
    /// Its demo server (orphaned by the kill).
    servers: Vec<u32>,
    unix_ms: u64,
}

#[derive(Default)]
struct Counts {
    starts: AtomicU64,
    dropped: AtomicU64,
    timeouts: AtomicU64,
    broken: AtomicU64,
}

struct Run {
    dir: PathBuf,
    args: Vec<String>,
    slots: Vec<Mutex<Slot>>,
    kills: Mutex<Vec<Kill>>,
    counts: Counts,
    /// Processes that exited without being killed: always a problem.
    unexpected_exits: Mutex<Vec<String>>,
}

/// The client's end of its current `wrap`.
struct Link {
    stdin: ChildStdin,
    messages: Receiver<Value>,
    generation: u32,
}

/// What one attempt got.
enum Got {
    Answer(Value),
    Timeout,
    /// The process is gone (killed, or exited).
    Broken,
}

impl Got {
    /// For a call's history: the answer cut short, or what happened instead.
    fn summary(&self) -> String {
        match self {
            Self::Answer(answer) => answer.to_string().chars().take(200).collect(),
            Self::Timeout => "no answer in time".into(),
            Self::Broken => "the wrap is gone".into(),
        }
    }
}

/// The pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let child: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // `pid (comm) state ppid ...`
            let (_, rest) = stat.rsplit_once(')')?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

impl Run {
    /// Starts slot `index`'s `wrap` (under its lock) and returns the client's end.
    fn start(&self, index: usize) -> Link {
        let mut slot = self.slots[index].lock().unwrap();
        let n = self.counts.starts.fetch_add(1, Ordering::Relaxed);
        let stderr = File::create(self.dir.join(format!("wrap.{n}.stderr"))).unwrap();
        let mut child = Command::new(EXE)
            .arg("wrap")
            .args(&self.args)
            .env("MCP_IDEM_LOG", "warn")
            .env_remove("MCP_IDEM_NAMESPACE")
            .env_remove("MCP_IDEM_PRINCIPAL")
            .env_remove("MCP_IDEM_STORE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn mcp-idem wrap");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let (tx, messages) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let message = serde_json::from_str(&line)
                    .unwrap_or_else(|_| Value::String(format!("not JSON: {line}")));
                if tx.send(message).is_err() {
                    break;
                }
            }
        });
        slot.child = Some(child);
        slot.generation += 1;
        slot.outstanding.clear();
        Link {
            stdin,
            messages,
            generation: slot.generation,
        }
    }

    /// The process behind `link` is gone: reaps it if the killer did not (then it exited on its
    /// own, which no fault explains).
    fn broken(&self, index: usize, link: &Link) {
        let mut slot = self.slots[index].lock().unwrap();
        if slot.generation != link.generation {
            return;
        }
        if let Some(mut child) = slot.child.take() {
            let status = child.wait();
            self.unexpected_exits.lock().unwrap().push(format!(
                "wrap of client {index} (generation {}) exited on its own: {status:?}",
                link.generation
            ));
        }
        slot.outstanding.clear();
    }

    /// Registers attempt `id` of call `amount` as in flight on `link`'s process; `false` if
    /// that process is already gone.
    fn register(&self, index: usize, link: &Link, id: u64, amount: u64) -> bool {
        let mut slot = self.slots[index].lock().unwrap();
        if slot.generation != link.generation || slot.child.is_none() {
            return false;
        }
        slot.outstanding.insert(id, amount);
        true
    }

    fn answered(&self, index: usize, link: &Link, id: u64) {
        let mut slot = self.slots[index].lock().unwrap();
        if slot.generation == link.generation {
            slot.outstanding.remove(&id);
        }
    }

    /// One attempt: writes `message` (id `id`) and waits for its answer. Answers to earlier,
    /// abandoned attempts are taken off the in-flight list and otherwise ignored.
    fn attempt(&self, index: usize, link: &mut Link, id: u64, amount: u64, message: &Value) -> Got {
        if !self.register(index, link, id, amount) {
            return Got::Broken;
        }
        let line = format!("{message}\n");
        if link
            .stdin
            .write_all(line.as_bytes())
            .and_then(|()| link.stdin.flush())
            .is_err()
        {
            return Got::Broken;
        }
        let deadline = Instant::now() + ATTEMPT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match link.messages.recv_timeout(left) {
                Ok(answer) => {
                    let Some(answer_id) = answer["id"].as_u64() else {
                        continue;
                    };
                    self.answered(index, link, answer_id);
                    if answer_id == id {
                        return Got::Answer(answer);
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Got::Timeout,
                Err(RecvTimeoutError::Disconnected) => return Got::Broken,
            }
        }
    }

    /// Retries one logical call with the same key until a definitive answer or [`MAX_ATTEMPTS`].
    fn logical_call(
        &self,
        index: usize,
        link: &mut Option<Link>,
        next_id: &mut u64,
        amount: u64,
        key: &str,
        rng: &mut StdRng,
    ) -> CallResult {
        let delay_ms = if rng.random_bool(P_SLOW) {
            SLOW_MS
        } else {
            rng.random_range(0..=20)
        };
        let arguments = json!({"amount": amount, "currency": "EUR", "delay_ms": delay_ms});
        let mut attempts = 0;
        let mut last = String::from("no attempt");
        let mut history = Vec::new();
        while attempts < MAX_ATTEMPTS {
            attempts += 1;
            let current = link.get_or_insert_with(|| self.start(index));
            *next_id += 1;
            let message = charge(*next_id, arguments.clone(), key);
            let mut pause = Duration::from_millis(20);
            let got = self.attempt(index, current, *next_id, amount, &message);
            history.push(format!(
                "{} wrap {index} generation {} id {}: {}",
                unix_ms(),
                current.generation,
                *next_id,
                got.summary()
            ));
            match got {
                Got::Broken => {
                    self.counts.broken.fetch_add(1, Ordering::Relaxed);
                    self.broken(index, current);
                    *link = None;
                    last = "wrap gone".into();
                }
                Got::Timeout => {
                    self.counts.timeouts.fetch_add(1, Ordering::Relaxed);
                    last = "timeout".into();
                }
                Got::Answer(_) if rng.random_bool(P_DROP) => {
                    if let Some(entry) = history.last_mut() {
                        entry.push_str(" (dropped by the client)");
                    }
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    last = "dropped".into();
                    pause = Duration::ZERO;
                }
                Got::Answer(answer) => match classify(&answer, &answer.to_string()) {
                    AnswerMeans::Final(outcome) => {
                        return CallResult {
                            amount,
                            outcome,
                            attempts,
                            history,
                        }
                    }
                    AnswerMeans::Retry { pause: wait, why } => {
                        if let Some(wait) = wait {
                            pause = wait;
                        }
                        last = why;
                    }
                },
            }
            std::thread::sleep(pause);
        }
        CallResult {
            amount,
            outcome: Outcome::GaveUp(last),
            attempts,
            history,
        }
    }

    /// SIGKILLs slot `index`'s `wrap` if it runs; notes what was in flight and its orphans.
    fn kill(&self, index: usize) {
        let mut slot = self.slots[index].lock().unwrap();
        let Some(pid) = slot.child.as_ref().map(Child::id) else {
            return;
        };
        // A wrap that has not started its server yet has nothing in flight: not a moment worth
        // a kill (and its orphan could not be traced).
        let servers = children_of(pid);
        if servers.is_empty() {
            return;
        }
        let mut child = slot.child.take().expect("checked above");
        let _ = child.kill();
        let _ = child.wait();
        let mut in_flight: Vec<u64> = slot.outstanding.drain().map(|(_, amount)| amount).collect();
        in_flight.sort_unstable();
        in_flight.dedup();
        self.kills.lock().unwrap().push(Kill {
            in_flight,
            servers,
            unix_ms: unix_ms(),
        });
    }

    /// Closes the client's stdin and waits for its `wrap` to exit.
    fn finish(&self, index: usize, link: Option<Link>) {
        let Some(link) = link else { return };
        let generation = link.generation;
        drop(link);
        let mut slot = self.slots[index].lock().unwrap();
        if slot.generation != generation {
            return;
        }
        let Some(mut child) = slot.child.take() else {
            return;
        };
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.unexpected_exits.lock().unwrap().push(format!(
                        "wrap of client {index} did not exit within {TIMEOUT:?} after stdin EOF"
                    ));
                    return;
                }
            }
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(mut child) = slot.lock().map(|mut s| s.child.take()).ok().flatten() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Waits until every orphaned server exited; returns those still running after [`TIMEOUT`]
/// (and SIGKILLs them, if their command line names this run's directory).
fn orphans_left(servers: &[u32], dir: &Path) -> Vec<u32> {
    let deadline = Instant::now() + TIMEOUT;
    while servers.iter().any(|&pid| is_running(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let marker = dir.to_string_lossy().into_owned();
    let left: Vec<u32> = servers
        .iter()
        .copied()
        .filter(|&pid| is_running(pid))
        .collect();
    for &pid in &left {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&marker) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    left
}

fn chaos_run(after_crash: AfterCrash) {
    let (calls, seed) = size_and_seed(300);
    let name = format!("stdio, {}", after_crash.arg());
    eprintln!("chaos ({name}): {calls} logical calls, CHAOS_SEED={seed}");
    let started = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let store = format!("sqlite:{}", dir.path().join("records.sqlite3").display());
    let args: Vec<String> = [
        "--store",
        &store,
        "--namespace",
        "chaos-stdio",
        "--lease",
        "2s",
        "--after-crash",
        after_crash.arg(),
        "--max-records-per-scope",
        "10000000",
        "--max-records-total",
        "10000000",
        "--",
        EXE,
        "demo-server",
        "--ledger",
        &ledger.to_string_lossy(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let run = Arc::new(Run {
        dir: dir.path().to_path_buf(),
        args,
        slots: (0..CLIENTS)
            .map(|_| {
                Mutex::new(Slot {
                    child: None,
                    generation: 0,
                    outstanding: HashMap::new(),
                })
            })
            .collect(),
        kills: Mutex::new(Vec::new()),
        counts: Counts::default(),
        unexpected_exits: Mutex::new(Vec::new()),
    });

    let next = Arc::new(AtomicU64::new(1));
    let tag = format!("{seed:x}-{}", std::process::id());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| {
            let (run, next, tag) = (Arc::clone(&run), Arc::clone(&next), tag.clone());
            let mut rng = StdRng::seed_from_u64(seed ^ (index as u64 + 1).wrapping_mul(0x9e37));
            std::thread::spawn(move || {
                let mut link = Some(run.start(index));
                let mut next_id = 0;
                let mut results = Vec::new();
                loop {
                    let amount = next.fetch_add(1, Ordering::Relaxed);
                    if amount > calls {
                        break;
                    }
                    let key = format!("chaos-stdio-{tag}-{amount}");
                    results.push(run.logical_call(
                        index,
                        &mut link,
                        &mut next_id,
                        amount,
                        &key,
                        &mut rng,
                    ));
                }
                run.finish(index, link);
                results
            })
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (run, stop) = (Arc::clone(&run), Arc::clone(&stop));
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6b69_6c6c);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(rng.random_range(KILL_EVERY_MS)));
                if !stop.load(Ordering::Relaxed) {
                    run.kill(rng.random_range(0..CLIENTS));
                }
            }
        })
    };

    let mut results = Vec::new();
    for client in clients {
        results.extend(client.join().expect("a client thread panicked"));
    }
    stop.store(true, Ordering::Relaxed);
    killer.join().expect("the killer thread panicked");
    assert_eq!(results.len() as u64, calls);

    let kills = std::mem::take(&mut *run.kills.lock().unwrap());
    let orphans: Vec<u32> = kills.iter().flat_map(|k| k.servers.clone()).collect();
    let left = orphans_left(&orphans, dir.path());

    let executions = executions(&ledger, calls);
    let mut in_flight_at_kills: HashMap<u64, u64> = HashMap::new();
    for kill in &kills {
        for &amount in &kill.in_flight {
            *in_flight_at_kills.entry(amount).or_default() += 1;
        }
    }
    let mut verdict = verify(&results, &executions, after_crash, &in_flight_at_kills);
    let killed_at: HashMap<u32, u64> = kills
        .iter()
        .flat_map(|k| k.servers.iter().map(|&pid| (pid, k.unix_ms)))
        .collect();
    let by_orphans_after_kill = executions
        .values()
        .flatten()
        .filter(|e| killed_at.get(&e.pid).is_some_and(|&at| e.unix_ms >= at))
        .count();
    let counts = &run.counts;
    eprintln!(
        "chaos report ({name}, seed {seed}, {:.1} s):\n  {}\n  \
         faults: {} wraps SIGKILLed and restarted ({} calls in flight on them), \
         {} answers dropped, {} client timeouts; {} attempts found their wrap gone\n  \
         orphaned demo servers {}: all exited: {}; {} executions by one after its wrap was killed",
        started.elapsed().as_secs_f64(),
        verdict.summary(calls),
        kills.len(),
        verdict.in_flight_at_kills,
        counts.dropped.load(Ordering::Relaxed),
        counts.timeouts.load(Ordering::Relaxed),
        counts.broken.load(Ordering::Relaxed),
        orphans.len(),
        left.is_empty(),
        by_orphans_after_kill,
    );
    verdict
        .problems
        .extend(run.unexpected_exits.lock().unwrap().iter().cloned());
    if !left.is_empty() {
        verdict.problems.push(format!(
            "orphaned demo servers still running {TIMEOUT:?} after the run: {left:?}"
        ));
    }
    if kills.len() != orphans.len() {
        verdict.problems.push(format!(
            "{} kills but {} orphaned servers found: each wrap runs one",
            kills.len(),
            orphans.len()
        ));
    }
    verdict.assert_ok(&name, seed);
    if after_crash == AfterCrash::Reject {
        assert_eq!(verdict.duplicated_calls, 0);
    }
}

#[test]
fn chaos_stdio_wraps_sharing_sqlite_reject() {
    chaos_run(AfterCrash::Reject);
}

#[test]
fn chaos_stdio_wraps_sharing_sqlite_reexecute() {
    chaos_run(AfterCrash::Reexecute);
}
