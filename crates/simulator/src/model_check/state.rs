//! The model's state and actions: plain, hashable data. The engine's own types (`PendingDecision`,
//! `Claim`, `Record`) are neither `Hash` nor `Eq`, so a state keeps the engine's *inputs* (the
//! call, its token, when it began, the store's answers so far) and the world re-derives the
//! engine's pending decision from them at each step (`World::replay`).

use mcp_idempotency::fingerprint::Fingerprint;
use mcp_idempotency::{FencingToken, Timestamp};

/// One state of the world.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    /// The clock, in ticks.
    pub(crate) now: u8,
    /// The abstract store: the record of each key, if any.
    pub(crate) records: Vec<Option<Slot>>,
    /// Calls in flight, in the order they were sent.
    pub(crate) calls: Vec<Call>,
    /// What happened to each key: sends, runs, answers, the write-once register.
    pub(crate) keys: Vec<KeyLog>,
    /// Claims whose store answer was lost, as their gateway remembers them to release them.
    pub(crate) unreleased: Vec<CallId>,
    /// Gateway crashes so far.
    pub(crate) crashes: u8,
    /// Store answers lost so far.
    pub(crate) lost: u8,
}

/// A record as the `Store` trait defines it, its outcome kept as the run that produced it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Slot {
    /// The fingerprint the claiming request carried.
    pub(crate) fingerprint: Fingerprint,
    /// In progress or completed.
    pub(crate) state: SlotState,
    /// When the key was first claimed.
    pub(crate) created_at: Timestamp,
    /// End of the retention window.
    pub(crate) expires_at: Timestamp,
}

/// [`RecordState`](mcp_idempotency::RecordState), hashable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SlotState {
    /// Owned by `owner` until `lease_expires_at`.
    InProgress {
        owner: FencingToken,
        lease_expires_at: Timestamp,
    },
    /// The outcome of run `run` (of a call with arguments `args`) is recorded.
    Completed {
        run: u8,
        args: u8,
        completed_at: Timestamp,
    },
}

/// A call is named by its key and its place among that key's sends; its token derives from both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CallId {
    pub(crate) gateway: u8,
    pub(crate) key: u8,
    pub(crate) send: u8,
}

impl CallId {
    /// The call's fencing token: unique per call (a real gateway draws a random one).
    pub(crate) fn token(self) -> FencingToken {
        FencingToken::from_u64(1 + u64::from(self.key) * 16 + u64::from(self.send))
    }
}

/// A call in flight: the engine's inputs, and where its decision stands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Call {
    pub(crate) id: CallId,
    /// Which of the two argument values it carries.
    pub(crate) args: u8,
    /// The tick it began at: the `now` the engine decided it with.
    pub(crate) began: u8,
    pub(crate) phase: Phase,
}

/// Where a call in flight stands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// The claim found `found`, whose lease ran out; the engine asked to take it over.
    TakingOver { found: Slot },
    /// The key is the call's (claimed, or taken over from `found`). `run`: the tool ran (that
    /// run's number); `completion`: the tick of a completion whose answer was lost, sent again as
    /// it was (the client has its answer already).
    Running {
        found: Option<Slot>,
        run: Option<u8>,
        completion: Option<u8>,
    },
}

/// Refusals, as bits of [`KeyLog::refusals`].
pub(crate) mod refusal {
    pub(crate) const CONFLICT: u8 = 1;
    pub(crate) const IN_PROGRESS: u8 = 1 << 1;
    pub(crate) const OUTCOME_UNKNOWN: u8 = 1 << 2;
    pub(crate) const STORE_UNAVAILABLE: u8 = 1 << 3;
    /// Anything else: a refusal of another kind, a bypass, or a step the engine should not take
    /// here. Never documented for this world, so the answer property fails on it.
    pub(crate) const UNEXPECTED: u8 = 1 << 7;
}

/// What happened to one key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct KeyLog {
    /// Calls sent with this key.
    pub(crate) sends: u8,
    /// Times the tool ran for this key; runs are numbered from 1.
    pub(crate) runs: u8,
    /// Bit `n`: run `n` carried arguments 1 (else 0).
    pub(crate) run_args: u16,
    /// Bit `n`: run `n` ran after some lease of this key had run out and been taken over.
    pub(crate) runs_after_lapse: u16,
    /// Take-overs the store applied to a lease that had run out by the model's clock.
    pub(crate) lapses: u8,
    /// The write-once register: the run whose outcome the store recorded first.
    pub(crate) register: Option<u8>,
    /// Bit `n`: run `n`'s result went to its own caller.
    pub(crate) direct: u16,
    /// `replayed[a]` bit `n`: run `n`'s outcome was replayed to a call with arguments `a`.
    pub(crate) replayed: [u16; 2],
    /// The refusals its calls got ([`refusal`] bits).
    pub(crate) refusals: u8,
    /// A completion of this key was fenced off (`NotOwner`).
    pub(crate) fenced_out: bool,
    /// A claim of this key whose answer was lost was released, fenced by its token.
    pub(crate) released: bool,
    /// A take-over of this key found the record moved on (`NotOwner`: another gateway took it
    /// over, or it was completed, first) and its call was refused as in progress.
    pub(crate) lost_race: bool,
}

/// What the store does with a request, and whether its answer reaches the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Delivery {
    /// Applied (or not) as the store decides; the answer arrives.
    Answered,
    /// Applied; the answer is lost (the gateway sees a store error).
    LostApplied,
    /// Never applied; the gateway sees a store error.
    LostUnapplied,
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Delivery::Answered => "answered",
            Delivery::LostApplied => "applied, its answer lost",
            Delivery::LostUnapplied => "lost before the store",
        })
    }
}

impl Delivery {
    pub(crate) const ALL: [Delivery; 3] = [
        Delivery::Answered,
        Delivery::LostApplied,
        Delivery::LostUnapplied,
    ];

    pub(crate) fn is_lost(self) -> bool {
        self != Delivery::Answered
    }
}

/// One step of the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A client sends a call through `gateway` (a first call, a retry, or the same key with
    /// other arguments); the gateway begins it and sends the engine's claim to the store.
    Send {
        gateway: u8,
        key: u8,
        args: u8,
        delivery: Delivery,
    },
    /// The gateway sends the take-over the engine asked for.
    TakeOver { call: CallId, delivery: Delivery },
    /// The tool runs (its effect happens once per run).
    Execute { call: CallId },
    /// The gateway renews the lease of its running call.
    Renew { call: CallId },
    /// The gateway records the outcome, fenced by its token, and answers the client.
    Complete { call: CallId, delivery: Delivery },
    /// The gateway releases a claim whose answer was lost, fenced by its token.
    Release { call: CallId },
    /// The gateway crashes (and restarts): its calls in flight and its memory are gone, its
    /// records stay.
    Crash { gateway: u8 },
    /// The clock moves one tick.
    Tick,
}
