//! The faults a seed draws, as TigerBeetle's VOPR draws them: which kinds, when, where, for how
//! long. Each [`FaultEvent`] is one fault of the history; [`FaultState`] is what the store links,
//! hosts, tools and clients consult while it lasts.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::RngExt;
use tokio::time::Instant;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// For a while, store requests from one host are lost before the store applies them.
    RequestLost,
    /// For a while, the store's replies to one host are lost after the write applied.
    ReplyLost,
    /// The store is unreachable for a while.
    StoreDown,
    /// The store answers slowly for a while (up to seconds per operation).
    StoreSlow,
    /// One host is partitioned from the store for a while.
    Partition,
    /// The store restarts: its unacknowledged writes are lost.
    StoreRestart,
    /// The store restarts losing acknowledged writes too, as a Redis failover without `WAIT`
    /// does (opt-in: the second executions it allows are counted, not violations).
    LoseAcknowledged,
    /// A host is killed, as by SIGKILL (its store handle cut first), and restarted later.
    Kill,
    /// The next call a host runs is slower than the lease.
    SlowTool,
    /// One host's lease renewals fail for a while.
    RenewalsFail,
    /// A host's wall clock steps forward or back.
    ClockJump,
    /// The next answer a host sends a client is lost on its way.
    AnswerLost,
    /// The next call a client sends is sent twice more, on other connections, while it runs.
    Duplicate,
}

impl FaultKind {
    /// Every kind, in the order of `--list-faults`.
    pub const ALL: &'static [Self] = &[
        Self::RequestLost,
        Self::ReplyLost,
        Self::StoreDown,
        Self::StoreSlow,
        Self::Partition,
        Self::StoreRestart,
        Self::LoseAcknowledged,
        Self::Kill,
        Self::SlowTool,
        Self::RenewalsFail,
        Self::ClockJump,
        Self::AnswerLost,
        Self::Duplicate,
    ];

    /// The kinds a seed draws from unless told otherwise: all but the opt-in one.
    pub fn default_set() -> Vec<Self> {
        Self::ALL
            .iter()
            .copied()
            .filter(|kind| *kind != Self::LoseAcknowledged)
            .collect()
    }

    /// The name `--faults` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::RequestLost => "request-lost",
            Self::ReplyLost => "reply-lost",
            Self::StoreDown => "store-down",
            Self::StoreSlow => "store-slow",
            Self::Partition => "partition",
            Self::StoreRestart => "store-restart",
            Self::LoseAcknowledged => "lose-acknowledged",
            Self::Kill => "kill",
            Self::SlowTool => "slow-tool",
            Self::RenewalsFail => "renewals-fail",
            Self::ClockJump => "clock-jump",
            Self::AnswerLost => "answer-lost",
            Self::Duplicate => "duplicate",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|kind| kind.name()).collect();
                format!("unknown fault {s:?}; expected one of {}", names.join(", "))
            })
    }
}

/// One fault of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// When, from the start of the simulation.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// Which host (for the kinds about one host; else 0).
    pub host: usize,
    /// How long it lasts (for the kinds that last).
    pub lasts: Duration,
    /// A clock jump's size in milliseconds (forward when positive); for a lost-acknowledged
    /// restart, how many acknowledged writes are lost.
    pub amount: i64,
}

impl fmt::Display for FaultEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} host h{}", self.kind, self.host)?;
        match self.kind {
            FaultKind::ClockJump => write!(f, " by {} ms", self.amount),
            FaultKind::LoseAcknowledged => write!(f, ", {} acknowledged writes", self.amount),
            FaultKind::SlowTool | FaultKind::AnswerLost | FaultKind::Duplicate => Ok(()),
            FaultKind::StoreRestart => write!(f, ", down {} ms", self.lasts.as_millis()),
            _ => write!(f, " for {} ms", self.lasts.as_millis()),
        }
    }
}

/// Draws `count` faults of the `kinds` given, within the first `period` of a simulation over
/// `hosts` hosts, in the order they happen.
pub fn draw_plan(
    rng: &mut StdRng,
    kinds: &[FaultKind],
    count: usize,
    hosts: usize,
    period: Duration,
) -> Vec<FaultEvent> {
    if kinds.is_empty() {
        return Vec::new();
    }
    let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut plan: Vec<FaultEvent> = (0..count)
        .map(|_| {
            let kind = kinds[rng.random_range(0..kinds.len())];
            let lasts = match kind {
                FaultKind::Kill => Duration::from_millis(rng.random_range(500..30_000)),
                FaultKind::RenewalsFail => Duration::from_millis(rng.random_range(5_000..60_000)),
                FaultKind::StoreRestart | FaultKind::LoseAcknowledged => {
                    Duration::from_millis(rng.random_range(100..5_000))
                }
                _ => Duration::from_millis(rng.random_range(200..20_000)),
            };
            let amount = match kind {
                FaultKind::ClockJump => rng.random_range(-45_000..45_000),
                FaultKind::LoseAcknowledged => rng.random_range(1..8),
                _ => 0,
            };
            FaultEvent {
                at: Duration::from_millis(rng.random_range(0..period_ms)),
                kind,
                host: rng.random_range(0..hosts),
                lasts,
                amount,
            }
        })
        .collect();
    plan.sort_by_key(|event| event.at);
    plan
}

/// What the faults in force are doing now.
#[derive(Debug)]
pub struct FaultState {
    store_down_until: Option<Instant>,
    slow_until: Option<Instant>,
    partitioned_until: Vec<Option<Instant>>,
    request_lost_until: Vec<Option<Instant>>,
    reply_lost_until: Vec<Option<Instant>>,
    renewals_fail_until: Vec<Option<Instant>>,
    slow_tools: Vec<u32>,
    answers_lost: Vec<u32>,
    duplicates: u32,
    /// Set once the faults have healed: nothing new goes wrong from then on.
    healed: bool,
}

fn active(until: Option<Instant>) -> bool {
    until.is_some_and(|until| Instant::now() < until)
}

fn extend(slot: &mut Option<Instant>, lasts: Duration) {
    let until = Instant::now() + lasts;
    *slot = Some(slot.map_or(until, |old| old.max(until)));
}

impl FaultState {
    /// No fault in force, on `hosts` hosts.
    pub fn new(hosts: usize) -> Self {
        Self {
            store_down_until: None,
            slow_until: None,
            partitioned_until: vec![None; hosts],
            request_lost_until: vec![None; hosts],
            reply_lost_until: vec![None; hosts],
            renewals_fail_until: vec![None; hosts],
            slow_tools: vec![0; hosts],
            answers_lost: vec![0; hosts],
            duplicates: 0,
            healed: false,
        }
    }

    /// Starts the fault `event` (the host-level ones, kills and restarts, are the world's).
    pub fn start(&mut self, event: &FaultEvent) {
        let host = event.host;
        match event.kind {
            FaultKind::RequestLost => extend(&mut self.request_lost_until[host], event.lasts),
            FaultKind::ReplyLost => extend(&mut self.reply_lost_until[host], event.lasts),
            FaultKind::StoreDown | FaultKind::StoreRestart | FaultKind::LoseAcknowledged => {
                extend(&mut self.store_down_until, event.lasts)
            }
            FaultKind::StoreSlow => extend(&mut self.slow_until, event.lasts),
            FaultKind::Partition => extend(&mut self.partitioned_until[host], event.lasts),
            FaultKind::RenewalsFail => extend(&mut self.renewals_fail_until[host], event.lasts),
            FaultKind::SlowTool => self.slow_tools[host] += 1,
            FaultKind::AnswerLost => self.answers_lost[host] += 1,
            FaultKind::Duplicate => self.duplicates += 1,
            FaultKind::Kill | FaultKind::ClockJump => {}
        }
    }

    /// Ends every fault: from now on the store answers every host, promptly.
    pub fn heal(&mut self) {
        let hosts = self.partitioned_until.len();
        *self = Self::new(hosts);
        self.healed = true;
    }

    /// Whether the faults have healed.
    pub fn healed(&self) -> bool {
        self.healed
    }

    /// Whether `host` cannot reach the store now.
    pub fn unreachable(&self, host: usize) -> bool {
        active(self.store_down_until) || active(self.partitioned_until[host])
    }

    /// Whether the store is slow now.
    pub fn slow(&self) -> bool {
        active(self.slow_until)
    }

    /// Whether requests from `host` are being lost now.
    pub fn losing_requests(&self, host: usize) -> bool {
        active(self.request_lost_until[host])
    }

    /// Whether replies to `host` are being lost now.
    pub fn losing_replies(&self, host: usize) -> bool {
        active(self.reply_lost_until[host])
    }

    /// Whether `host`'s renewals fail now.
    pub fn renewals_fail(&self, host: usize) -> bool {
        active(self.renewals_fail_until[host])
    }

    /// Takes one "slower than the lease" for the next call `host` runs.
    pub fn take_slow_tool(&mut self, host: usize) -> bool {
        take(&mut self.slow_tools[host])
    }

    /// Takes one lost answer for the next answer `host` sends.
    pub fn take_answer_lost(&mut self, host: usize) -> bool {
        take(&mut self.answers_lost[host])
    }

    /// Takes one duplicate for the next call a client sends.
    pub fn take_duplicate(&mut self) -> bool {
        take(&mut self.duplicates)
    }
}

fn take(count: &mut u32) -> bool {
    if *count == 0 {
        return false;
    }
    *count -= 1;
    true
}
