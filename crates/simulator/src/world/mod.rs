//! What a seed simulates: hosts running gateway processes, the store they share, the tools that
//! count their executions. Everything runs on one current-thread tokio runtime whose clock is
//! paused, so the only order of events is the one the seed's draws give.

pub mod calls;
pub mod client;
pub mod clock;
pub mod link;
pub mod process;
pub mod tool;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::EngineConfig;
use rand::rngs::StdRng;
use rand::RngExt;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::faults::FaultState;
use crate::history::History;
use crate::store::ModelStore;
use calls::{ClientAnswer, Group};
use clock::HostClock;

/// The namespace a process is started with, before the server names itself (`wrap`'s default
/// from its command line).
pub const COMMAND_NAMESPACE: &str = "wrap:payments-server";

/// Locks a mutex of the world; a panic elsewhere is reported by the run, not here.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the gateways are configured, the same on every host (as one deployment is).
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The engine's settings (lease, retention, after-crash).
    pub engine: EngineConfig,
    /// The tools' key policies.
    pub policies: ToolPolicies,
    /// `--shutdown-grace`.
    pub shutdown_grace: Duration,
}

/// One execution of a tool, as the tool counted it.
#[derive(Clone, Debug)]
pub struct Execution {
    /// The client's group of calls that should run once (`_meta["sim/group"]`).
    pub group: String,
    /// The process that ran it.
    pub process: u64,
    /// The principal of that process.
    pub principal: String,
    /// The key the gateway passed in `_meta["mcp-idem/idempotencyKey"]`: `None` when the call
    /// was not claimed (unkeyed, or run unprotected).
    pub claimed_key: Option<String>,
    /// The client's own key sent beside a business identifier (`_meta["sim/client-key"]`).
    pub client_key: Option<String>,
    /// When it started.
    pub started: Duration,
    /// When it answered (`None`: cut off by a kill or a stop).
    pub ended: Option<Duration>,
    /// Whether its outcome is an error (`isError`).
    pub is_error: bool,
    /// The `result` it answered, as written.
    pub result: String,
}

/// A take-over the store applied.
#[derive(Clone, Debug)]
pub struct TakeOver {
    /// The principal of the record.
    pub principal: String,
    /// The record's key, as tools see it.
    pub key: String,
    /// The owner whose lease ran out.
    pub previous_owner: mcp_idempotency::FencingToken,
    /// The process that took it over.
    pub process: u64,
    /// When.
    pub at: Duration,
}

/// A process that got a record: its claim applied, or a take-over.
#[derive(Clone, Debug)]
pub struct Claimant {
    /// The record's principal.
    pub principal: String,
    /// The record's key, as tools see it.
    pub key: String,
    /// The process.
    pub process: u64,
    /// Its token.
    pub token: mcp_idempotency::FencingToken,
    /// When.
    pub at: Duration,
}

/// How a process ended.
#[derive(Clone, Copy, Debug)]
pub struct ProcessEnd {
    /// Killed (SIGKILL), rather than exited when its client left.
    pub killed: bool,
    /// Claims whose answer was lost and that it had not released yet.
    pub pending_releases: usize,
    /// When.
    pub at: Duration,
}

/// A host: its clock, whether it is up, its processes.
#[derive(Debug)]
pub struct Host {
    /// Its wall clock.
    pub clock: Arc<HostClock>,
    up: AtomicBool,
    processes: Mutex<Vec<ProcessHandle>>,
}

/// What a kill needs of a process.
#[derive(Debug)]
struct ProcessHandle {
    id: u64,
    cut: Arc<AtomicBool>,
    task: AbortHandle,
}

/// Everything a seed's tasks share.
#[derive(Debug)]
pub struct World {
    /// The gateways' configuration.
    pub gateway: GatewayConfig,
    /// The seed's one source of randomness.
    rng: Mutex<StdRng>,
    /// What happened.
    pub history: History,
    /// The shared store.
    pub store: ModelStore,
    /// Bumped at each store restart: a write applied before a restart and answered after it was
    /// not acknowledged.
    store_epoch: AtomicU64,
    /// The faults in force.
    pub faults: Mutex<FaultState>,
    /// The hosts.
    pub hosts: Vec<Host>,
    /// Every execution of every tool.
    pub executions: Mutex<Vec<Execution>>,
    /// Every take-over the store applied.
    pub take_overs: Mutex<Vec<TakeOver>>,
    /// Every claim and take-over the store applied, by process.
    pub claimants: Mutex<Vec<Claimant>>,
    /// The store operations that failed or were slow: process, from, to.
    pub troubled: Mutex<Vec<(u64, Duration, Duration)>>,
    /// The renewals that failed: the owner's token, when.
    pub renewals_failed: Mutex<Vec<(mcp_idempotency::FencingToken, Duration)>>,
    /// Every claim and read a process sent (whatever became of it): process, principal, key as
    /// tools see it, when.
    pub claims_sent: Mutex<Vec<(u64, String, String, Duration)>>,
    /// Every claim a process sent, with its `now` on the simulation's time: process, principal,
    /// key as tools see it, `now`.
    pub claim_nows: Mutex<Vec<(u64, String, String, Duration)>>,
    /// The completions the store applied: principal, key as tools see it, when, by which process.
    pub completions: Mutex<Vec<(String, String, Duration, u64)>>,
    /// The processes that ended.
    pub ended: Mutex<BTreeMap<u64, ProcessEnd>>,
    /// Each process's host.
    pub process_hosts: Mutex<BTreeMap<u64, usize>>,
    /// The faults injected so far.
    pub injected: Mutex<Vec<crate::faults::FaultEvent>>,
    /// What the store link saw break (a completed record overwritten).
    pub violations: Mutex<Vec<crate::violation::Violation>>,
    /// When acknowledged writes were lost (the opt-in fault).
    pub acknowledged_lost_at: Mutex<Vec<Duration>>,
    /// Every group of calls the clients made.
    pub groups: Mutex<Vec<Group>>,
    /// Every answer the clients got.
    pub answers: Mutex<Vec<ClientAnswer>>,
    numbers: Mutex<BTreeMap<String, u64>>,
    /// The lowest and highest clock offsets any host has had.
    offsets: Mutex<(i64, i64)>,
    start: Instant,
    next_process: AtomicU64,
}

impl World {
    /// A world of `hosts` hosts, whose clocks are skewed by up to `max_skew_ms`, all drawn from
    /// `rng`.
    pub fn new(
        mut rng: StdRng,
        gateway: GatewayConfig,
        hosts: usize,
        max_skew_ms: i64,
    ) -> Arc<Self> {
        let start = Instant::now();
        let history = History::new(start);
        let hosts = (0..hosts)
            .map(|index| {
                let offset = if max_skew_ms > 0 {
                    rng.random_range(-max_skew_ms..=max_skew_ms)
                } else {
                    0
                };
                history.note(format!("h{index}"), format!("clock offset {offset} ms"));
                Host {
                    clock: Arc::new(HostClock::new(start, offset)),
                    up: AtomicBool::new(true),
                    processes: Mutex::new(Vec::new()),
                }
            })
            .collect::<Vec<_>>();
        let faults = FaultState::new(hosts.len());
        let offsets = hosts.iter().map(|host| host.clock.offset_ms());
        let offsets = (
            offsets.clone().min().unwrap_or(0),
            offsets.max().unwrap_or(0),
        );
        Arc::new(Self {
            gateway,
            rng: Mutex::new(rng),
            history,
            store: ModelStore::new(),
            store_epoch: AtomicU64::new(0),
            faults: Mutex::new(faults),
            hosts,
            executions: Mutex::new(Vec::new()),
            take_overs: Mutex::new(Vec::new()),
            acknowledged_lost_at: Mutex::new(Vec::new()),
            claimants: Mutex::new(Vec::new()),
            completions: Mutex::new(Vec::new()),
            claims_sent: Mutex::new(Vec::new()),
            claim_nows: Mutex::new(Vec::new()),
            renewals_failed: Mutex::new(Vec::new()),
            troubled: Mutex::new(Vec::new()),
            ended: Mutex::new(BTreeMap::new()),
            process_hosts: Mutex::new(BTreeMap::new()),
            injected: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
            answers: Mutex::new(Vec::new()),
            numbers: Mutex::new(BTreeMap::new()),
            offsets: Mutex::new(offsets),
            start,
            next_process: AtomicU64::new(1),
        })
    }

    /// A draw from the seed's generator.
    pub fn rng(&self) -> MutexGuard<'_, StdRng> {
        lock(&self.rng)
    }

    /// A duration drawn uniformly in `min_ms..max_ms`.
    pub fn draw_ms(&self, min_ms: u64, max_ms: u64) -> Duration {
        Duration::from_millis(self.rng().random_range(min_ms..max_ms.max(min_ms + 1)))
    }

    /// An index drawn uniformly below `len` (at least one).
    pub fn rng_index(&self, len: usize) -> usize {
        self.rng().random_range(0..len.max(1))
    }

    /// The next number of `principal`'s keys and identifiers.
    pub fn next_number(&self, principal: &str) -> u64 {
        let mut numbers = lock(&self.numbers);
        let number = numbers.entry(principal.to_owned()).or_insert(0);
        *number += 1;
        *number
    }

    /// The next group's name.
    pub fn next_group_name(&self) -> String {
        format!("g{}", lock(&self.groups).len() + 1)
    }

    /// `true` with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.rng().random_bool(p)
    }

    /// The simulation's time.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The store's restart count.
    pub fn store_epoch(&self) -> u64 {
        self.store_epoch.load(Ordering::Relaxed)
    }

    /// Restarts the store: unacknowledged writes are lost, and the last `lose_acknowledged`
    /// acknowledged ones too.
    pub fn restart_store(&self, lose_acknowledged: usize) {
        self.store_epoch.fetch_add(1, Ordering::Relaxed);
        let changed = self.store.restart(lose_acknowledged);
        if lose_acknowledged > 0 {
            lock(&self.acknowledged_lost_at).push(self.elapsed());
        }
        let ids: Vec<String> = changed
            .iter()
            .map(|id| format!("{}/{}", id.scope.principal(), id.key.for_tool()))
            .collect();
        self.history.note(
            "store",
            format!(
                "restarted, losing {lose_acknowledged} acknowledged writes; records changed: [{}]",
                ids.join(", ")
            ),
        );
    }

    /// Steps `host`'s wall clock by `by_ms`.
    pub fn jump_clock(&self, host: usize, by_ms: i64) {
        let clock = &self.hosts[host].clock;
        clock.jump(by_ms);
        let offset = clock.offset_ms();
        let mut offsets = lock(&self.offsets);
        *offsets = (offsets.0.min(offset), offsets.1.max(offset));
        self.history.note(
            format!("h{host}"),
            format!("clock steps by {by_ms} ms to offset {offset} ms"),
        );
    }

    /// How far apart two hosts' clocks have been at most: the slack of a window's end.
    pub fn clock_spread(&self) -> Duration {
        let (low, high) = *lock(&self.offsets);
        Duration::from_millis(u64::try_from(high - low).unwrap_or(0))
    }

    /// Whether host `host` is up.
    pub fn host_up(&self, host: usize) -> bool {
        self.hosts[host].up.load(Ordering::Relaxed)
    }

    /// Kills every process of `host`, as SIGKILL does: each one's store handle is cut first (so
    /// no drop handler writes on its behalf), then its tasks stop at whatever await they are at.
    pub fn kill_host(&self, host: usize) {
        let host_ref = &self.hosts[host];
        host_ref.up.store(false, Ordering::Relaxed);
        let processes = std::mem::take(&mut *lock(&host_ref.processes));
        for process in &processes {
            process.cut.store(true, Ordering::Relaxed);
        }
        let at = self.elapsed();
        for process in &processes {
            process.task.abort();
            lock(&self.ended).entry(process.id).or_insert(ProcessEnd {
                killed: true,
                pending_releases: 0,
                at,
            });
        }
        self.history.note(
            format!("h{host}"),
            format!("killed ({} processes)", processes.len()),
        );
    }

    /// Brings `host` back up: clients may start processes on it again.
    pub fn restart_host(&self, host: usize) {
        self.hosts[host].up.store(true, Ordering::Relaxed);
        self.history.note(format!("h{host}"), "restarted");
    }

    /// A new process number.
    pub fn next_process(&self) -> u64 {
        self.next_process.fetch_add(1, Ordering::Relaxed)
    }

    fn register(&self, host: usize, id: u64, cut: Arc<AtomicBool>, task: AbortHandle) {
        lock(&self.process_hosts).insert(id, host);
        lock(&self.hosts[host].processes).push(ProcessHandle { id, cut, task });
    }

    /// Notes that process `id` exited, with `pending_releases` claims not released.
    pub fn exited(&self, id: u64, pending_releases: usize) {
        let at = self.elapsed();
        lock(&self.ended).entry(id).or_insert(ProcessEnd {
            killed: false,
            pending_releases,
            at,
        });
    }
}
