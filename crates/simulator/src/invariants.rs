//! The invariants every history is checked against, and the documented exceptions they count
//! rather than hide.

use std::time::Duration;

use mcp_idempotency::{AfterCrash, RecordState, REPLAYED_META};
use serde_json::Value;

use crate::faults::FaultKind;
pub use crate::violation::Violation;
use crate::world::calls::{Group, Keying, Reply};
use crate::world::{lock, Execution, TakeOver, World};

/// Second executions the documentation allows, counted by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exceptions {
    /// Calls no key protects (no client key, no policy).
    pub keyless: usize,
    /// Calls of a `store-down = run-unprotected` tool run while the store was down.
    pub run_unprotected: usize,
    /// Repeats after their window ended (clock skew included).
    pub window_expired: usize,
    /// Repeats of a call whose error `on-error = forget` did not keep.
    pub forgotten_errors: usize,
    /// Re-executions after a take-over (`after-crash = reexecute`).
    pub reexecuted: usize,
    /// Re-executions after the store lost acknowledged writes (the opt-in fault).
    pub acknowledged_writes_lost: usize,
    /// Another operation run under a client's key whose record beside the first one's
    /// identifier was never written (the store failed that write).
    pub client_key_not_recorded: usize,
}

impl Exceptions {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Self) {
        self.keyless += other.keyless;
        self.run_unprotected += other.run_unprotected;
        self.window_expired += other.window_expired;
        self.forgotten_errors += other.forgotten_errors;
        self.reexecuted += other.reexecuted;
        self.acknowledged_writes_lost += other.acknowledged_writes_lost;
        self.client_key_not_recorded += other.client_key_not_recorded;
    }
}

/// The rejections a client may get, as documented (docs/errors.md), besides a conflict.
const DOCUMENTED_REJECTIONS: &[&str] = &[
    "idempotency_key_in_progress",
    "idempotency_store_unavailable",
    "idempotency_shutting_down",
    "idempotency_scope_unknown",
    "idempotency_outcome_unknown",
    "idempotency_outcome_not_retained",
    "idempotency_quota_exceeded",
];

/// The rejections that leave a key unresolved: the final attempt must not get one.
const UNRESOLVED: &[&str] = &[
    "idempotency_key_in_progress",
    "idempotency_store_unavailable",
    "idempotency_shutting_down",
    "idempotency_scope_unknown",
];

/// The window of the windowed tools (`notify`, `audit`).
pub const WINDOW: Duration = Duration::from_secs(30);

/// Checks the history of `world`: returns what broke and what was counted.
pub fn check(world: &World, unresolved: &[String]) -> (Vec<Violation>, Exceptions) {
    let mut violations = Vec::new();
    let mut counted = Exceptions::default();
    let groups = lock(&world.groups).clone();
    let executions = lock(&world.executions).clone();
    let answers = lock(&world.answers).clone();
    let reexecute = world.gateway.engine.after_crash() == AfterCrash::Reexecute;
    // Whether the client sent `group`'s key for another operation too.
    let reused = |group: &Group| {
        group.reuses.is_some()
            || groups
                .iter()
                .any(|other| other.reuses.as_deref() == Some(group.name.as_str()))
    };
    for group in &groups {
        let runs: Vec<&Execution> = executions
            .iter()
            .filter(|e| e.group == group.name)
            .collect();
        at_most_once(
            world,
            group,
            &runs,
            reexecute,
            &mut violations,
            &mut counted,
        );
        if group.keying == Keying::KeyFromWithSep {
            for run in &runs {
                if let Some(violation) = client_key_left_out(world, group, run) {
                    violations.push(violation);
                }
            }
        }
        if let (Some(earlier), Some(first)) = (&group.reuses, runs.first()) {
            one_operation_per_client_key(
                world,
                group,
                earlier,
                first,
                &mut violations,
                &mut counted,
            );
        }
        for answer in answers.iter().filter(|a| a.group == group.name) {
            if let Some(violation) =
                answer_is_recorded(group, reused(group), &runs, &executions, &answer.reply)
            {
                violations.push(violation);
            }
            if let (true, Reply::Error { kind, .. }) = (answer.final_attempt, &answer.reply) {
                if kind == "idempotency_outcome_unknown" && runs.is_empty() {
                    if let Some(violation) = unknown_without_cause(world, group) {
                        violations.push(violation);
                    }
                }
                if UNRESOLVED.contains(&kind.as_str()) {
                    violations.push(Violation {
                        invariant: "liveness",
                        detail: format!(
                            "group {} still gets {kind} once the faults healed",
                            group.name
                        ),
                    });
                }
            }
        }
    }
    violations.extend(lock(&world.violations).iter().cloned());
    for name in unresolved {
        violations.push(Violation {
            invariant: "liveness",
            detail: format!("group {name} got no answer once the faults healed"),
        });
    }
    for record in world.store.records() {
        let lease_beyond = matches!(record.state, RecordState::InProgress { lease_expires_at, .. }
            if lease_expires_at > record.expires_at);
        if record.created_at > record.expires_at || lease_beyond {
            violations.push(Violation {
                invariant: "no corrupt record",
                detail: format!("{record:?}"),
            });
        }
    }
    (violations, counted)
}

fn at_most_once(
    world: &World,
    group: &Group,
    runs: &[&Execution],
    reexecute: bool,
    violations: &mut Vec<Violation>,
    counted: &mut Exceptions,
) {
    let protected = group.keying.keyed() && group.keying != Keying::WindowUnprotected;
    for run in runs {
        if protected && run.claimed_key.is_none() {
            violations.push(Violation {
                invariant: "at most once",
                detail: format!(
                    "group {} ({:?}) ran without a claim in process p{}",
                    group.name, group.keying, run.process
                ),
            });
        }
    }
    let spread = world.clock_spread();
    for (index, run) in runs.iter().enumerate().skip(1) {
        let earlier = &runs[..index];
        let reason = if !group.keying.keyed() {
            Some(&mut counted.keyless)
        } else if group.keying == Keying::WindowUnprotected
            && runs[..=index].iter().any(|e| e.claimed_key.is_none())
        {
            // One of them ran without a record: the next one finds none.
            Some(&mut counted.run_unprotected)
        } else if group.keying.windowed()
            && earlier.iter().any(|e| {
                // A window's record may end, by the fastest clock, a window after it was claimed
                // (its owner died, or a clock ahead by more than the window read it): one run's
                // claim reached the store after the other's window ended (runs may start in
                // another order than their claims were made, and a claim may reach the store
                // long after its `now`, once a purge has removed the record).
                let ended = |first: &Execution, then: &Execution| {
                    claim_applied(world, group, then) + spread
                        >= claim_sent(world, group, first) + WINDOW
                };
                ended(e, run) || ended(run, e)
            })
        {
            Some(&mut counted.window_expired)
        } else if group.keying == Keying::Window && earlier.iter().any(|e| e.is_error) {
            Some(&mut counted.forgotten_errors)
        } else if reexecute
            && lock(&world.take_overs).iter().any(|t| {
                // A take-over of a record whose owner lost its lease, before any earlier run's
                // outcome was recorded (a record with an outcome is never taken over).
                t.principal == group.principal
                    && Some(&t.key) == run.claimed_key.as_ref()
                    && t.at <= run.started
                    && owner_lost_its_lease(world, t)
                    && !earlier
                        .iter()
                        .any(|e| outcome_recorded(world, group, e, t.at))
            })
        {
            Some(&mut counted.reexecuted)
        } else if lock(&world.acknowledged_lost_at)
            .iter()
            .any(|&at| earlier[0].started <= at && at <= run.started)
        {
            Some(&mut counted.acknowledged_writes_lost)
        } else {
            None
        };
        match reason {
            Some(count) => *count += 1,
            None => violations.push(Violation {
                invariant: "at most once",
                detail: format!(
                    "group {} ({:?}, {} {}) executed {} times: by p{} at {:?} and by p{} at {:?}",
                    group.name,
                    group.keying,
                    group.principal,
                    group.key.as_deref().unwrap_or("-"),
                    runs.len(),
                    earlier[0].process,
                    earlier[0].started,
                    run.process,
                    run.started
                ),
            }),
        }
    }
}

/// A result without the replay marker of a derived key's replay (`None`: it had none).
fn without_marker(result: &str) -> Option<Value> {
    let mut value: Value = serde_json::from_str(result).ok()?;
    let meta = value.get_mut("_meta")?.as_object_mut()?;
    meta.remove(REPLAYED_META)?;
    if meta.is_empty() {
        value.as_object_mut()?.remove("_meta");
    }
    Some(value)
}

fn same_outcome(result: &str, run: &Execution, derived: bool) -> bool {
    if run.ended.is_none() {
        return false;
    }
    if result == run.result {
        return true;
    }
    derived
        && without_marker(result).is_some_and(|stripped| {
            serde_json::from_str::<Value>(&run.result).is_ok_and(|original| original == stripped)
        })
}

/// Whether an answer is the recorded outcome of its group's key or a documented rejection.
fn answer_is_recorded(
    group: &Group,
    key_reused: bool,
    runs: &[&Execution],
    all: &[Execution],
    reply: &Reply,
) -> Option<Violation> {
    match reply {
        Reply::Result(result) => {
            let derived = !group.keying.client_key();
            if runs.iter().any(|run| same_outcome(result, run, derived)) {
                return None;
            }
            let crossed = all
                .iter()
                .find(|run| run.group != group.name && same_outcome(result, run, true));
            Some(match crossed {
                Some(other) => Violation {
                    invariant: "no answer crosses a scope or a principal",
                    detail: format!(
                        "group {} of {} got the outcome of group {} of {}: {result}",
                        group.name, group.principal, other.group, other.principal
                    ),
                },
                None => Violation {
                    invariant: "answers are recorded outcomes",
                    detail: format!(
                        "group {} ({:?}) got a result no execution of it gave: {result}",
                        group.name, group.keying
                    ),
                },
            })
        }
        Reply::Error { kind, .. } if DOCUMENTED_REJECTIONS.contains(&kind.as_str()) => None,
        // A client's key reused for another operation: the SEP's answer, to either operation
        // (the other one's record may be the one beside the key).
        Reply::Error { kind, .. } if key_reused && kind == "idempotency_key_conflict" => None,
        Reply::Error { code, kind } => Some(Violation {
            invariant: "answers are recorded outcomes",
            detail: format!(
                "group {} ({:?}) got error {code} {kind:?}, which its calls never deserve",
                group.name, group.keying
            ),
        }),
    }
}

/// The `now` of the claim `run` ran under, on the simulation's time: the last claim of its key
/// its process sent before it started.
fn claim_sent(world: &World, group: &Group, run: &Execution) -> Duration {
    let Some(key) = run.claimed_key.as_deref() else {
        return run.started;
    };
    lock(&world.claim_nows)
        .iter()
        .rev()
        .filter(|(process, principal, claimed, at)| {
            *process == run.process
                && *principal == group.principal
                && claimed == key
                && *at <= run.started
        })
        .map(|&(_, _, _, at)| at)
        .next()
        .unwrap_or(run.started)
}

/// When the claim `run` ran under was applied by the store (a claim or a take-over by its
/// process): the last one of its key before it started.
fn claim_applied(world: &World, group: &Group, run: &Execution) -> Duration {
    let Some(key) = run.claimed_key.as_deref() else {
        return run.started;
    };
    lock(&world.claimants)
        .iter()
        .rev()
        .find(|c| {
            c.process == run.process
                && c.principal == group.principal
                && c.key == key
                && c.at <= run.started
        })
        .map_or(run.started, |c| c.at)
}

/// Whether the store took the outcome of `run` (a completion of its record by its process)
/// before `by`: `after-crash = reexecute` runs a call again only when its first run recorded
/// nothing.
fn outcome_recorded(world: &World, group: &Group, run: &Execution, by: Duration) -> bool {
    let Some(key) = run.claimed_key.as_deref() else {
        return false;
    };
    lock(&world.completions)
        .iter()
        .any(|(principal, completed, at, process)| {
            *principal == group.principal
                && completed == key
                && *process == run.process
                && *at >= run.started
                && *at <= by
        })
}

/// Whether the owner a take-over replaced had lost its lease as `after-crash = reexecute`
/// allows: its process had ended, or within the lease before the take-over one of its store
/// operations failed or was held up (a renewal that failed, or a completion in flight that keeps
/// the lease unrenewed for up to a store timeout), or a clock stepped by more than the renewal
/// margin leaves (two thirds of the lease, less the 10 s the hosts' first offsets may differ).
/// That is the stated bound: skew plus pause below the lease minus the renewal margin. Otherwise
/// the take-over replaced a live owner that could renew in time.
fn owner_lost_its_lease(world: &World, take_over: &TakeOver) -> bool {
    let lease = world.gateway.engine.lease();
    let claimants = lock(&world.claimants);
    let Some(owner) = claimants
        .iter()
        .rev()
        .find(|c| c.token == take_over.previous_owner)
    else {
        return false;
    };
    if lock(&world.ended)
        .get(&owner.process)
        .is_some_and(|end| end.at <= take_over.at)
    {
        return true;
    }
    let from = take_over.at.saturating_sub(lease);
    let held_up = lock(&world.troubled).iter().any(|&(process, start, end)| {
        process == owner.process && start <= take_over.at && end >= from
    });
    let margin = (lease * 2 / 3).saturating_sub(Duration::from_secs(10));
    let margin_ms = u64::try_from(margin.as_millis()).unwrap_or(u64::MAX);
    held_up
        || lock(&world.injected).iter().any(|fault| {
            fault.kind == FaultKind::ClockJump
                && fault.at <= take_over.at
                && fault.amount.unsigned_abs() >= margin_ms
        })
}

/// A key the client knows as tools see it (the derived ones hold a digest).
fn known_key(group: &Group) -> Option<String> {
    let key = group.key.as_deref()?;
    match group.keying {
        Keying::Sep | Keying::Meta => Some(key.to_owned()),
        Keying::Argument => Some(format!("{}:{key}", group.keying.tool())),
        _ => None,
    }
}

/// `idempotency_outcome_unknown` for a call that never ran, once the faults healed, is
/// documented only when a process that claimed its key died, or exited before it could release
/// a claim whose answer was lost: else a claim was left in progress that should have been
/// released.
fn unknown_without_cause(world: &World, group: &Group) -> Option<Violation> {
    let key = known_key(group)?;
    let ended = lock(&world.ended);
    let claimants = lock(&world.claimants);
    let mut of_key = claimants
        .iter()
        .filter(|c| c.principal == group.principal && c.key == key)
        .peekable();
    of_key.peek()?;
    let explained = of_key.any(|c| {
        ended
            .get(&c.process)
            .is_some_and(|end| end.killed || end.pending_releases > 0)
    });
    (!explained).then(|| Violation {
        invariant: "liveness",
        detail: format!(
            "group {} ({} {key}) never ran, yet is idempotency_outcome_unknown once the faults \
             healed, and no process that claimed it died or left a release pending",
            group.name, group.principal
        ),
    })
}

/// A client's key names one operation: once it was recorded beside the first operation's
/// identifier, another operation sent with it must not run.
fn one_operation_per_client_key(
    world: &World,
    group: &Group,
    earlier: &str,
    first: &Execution,
    violations: &mut Vec<Violation>,
    counted: &mut Exceptions,
) {
    let Some(key) = group.key.as_deref() else {
        return;
    };
    let recorded_at = lock(&world.completions)
        .iter()
        .find(|(principal, recorded, _, _)| *principal == group.principal && recorded == key)
        .map(|&(_, _, at, _)| at);
    // When the operation's process read the client's key (the engine reads it first): a record
    // beside written after that read was not there to see.
    let read_at = lock(&world.claims_sent)
        .iter()
        .rev()
        .find(|(process, principal, sent, at)| {
            *process == first.process
                && *principal == group.principal
                && sent == key
                && *at <= first.started
        })
        .map_or(first.started, |&(_, _, _, at)| at);
    match recorded_at {
        Some(at) if at <= read_at => {
            let lost = lock(&world.acknowledged_lost_at)
                .iter()
                .any(|&lost| at <= lost && lost <= first.started);
            if lost {
                counted.acknowledged_writes_lost += 1;
            } else {
                violations.push(Violation {
                    invariant: "at most once",
                    detail: format!(
                        "{}'s key {key} was recorded beside group {earlier} at {at:?}, yet group \
                         {} ran another operation under it at {:?}",
                        group.principal, group.name, first.started
                    ),
                });
            }
        }
        _ => counted.client_key_not_recorded += 1,
    }
}

/// A call that ran with the client's own key beside its business identifier must have that key
/// recorded beside once it answered: its process sends the key's claim (or, first, the read of
/// a record an earlier release kept under it; either may fail, and that is logged) unless it was
/// killed first.
fn client_key_left_out(world: &World, group: &Group, run: &Execution) -> Option<Violation> {
    let key = run.client_key.as_deref()?;
    run.ended?;
    if run.claimed_key.as_deref() == Some(key) {
        // The client's key itself was claimed (taken over): its record is the call's.
        return None;
    }
    let taken_over = lock(&world.take_overs).iter().any(|t| {
        t.process == run.process
            && t.principal == group.principal
            && Some(&t.key) == run.claimed_key.as_ref()
            && t.at <= run.started
    });
    if taken_over {
        // A take-over of the identifier's record (the client's key held a stale claim, left as
        // it is: the identifier's record answers the calls that find it).
        return None;
    }
    let claimed = lock(&world.claims_sent)
        .iter()
        .any(|(process, principal, claimed, at)| {
            *process == run.process
                && *principal == group.principal
                && claimed == key
                && *at >= run.started
        });
    let killed = lock(&world.ended)
        .get(&run.process)
        .is_some_and(|end| end.killed);
    (!claimed && !killed).then(|| Violation {
        invariant: "client keys recorded beside",
        detail: format!(
            "group {} ran in p{} with {}'s key {key} beside its identifier, and p{} never \
             claimed that key to record it beside",
            group.name, run.process, group.principal, run.process
        ),
    })
}
