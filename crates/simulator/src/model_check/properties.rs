//! The properties every reachable state is checked against. The specification is a write-once
//! register per key: the first outcome the store records is the key's value; every answer a
//! client gets is that value or a documented refusal; a key runs once (under
//! `AfterCrash::Reexecute`, again only after a lease ran out and was taken over). The
//! `sometimes` properties show that the interesting states are reached at all.

use std::sync::atomic::Ordering;

use mcp_idempotency::AfterCrash;

use super::state::{refusal, KeyLog, Slot, SlotState, State};
use super::world::{World, COUNT};
use super::{Config, Expectation};

/// Names of the properties, as the report shows them.
pub(crate) mod names {
    pub(crate) const ONE_RUN: &str = "at most one execution per key";
    pub(crate) const RUN_AGAIN_AFTER_LAPSE: &str =
        "a key runs again only after a lease ran out and was taken over";
    pub(crate) const ANSWERS: &str =
        "every answer is the key's register value or a documented refusal";
    pub(crate) const WRITE_ONCE: &str = "the store keeps the first recorded outcome";
    pub(crate) const REPLAY: &str = "a retry is replayed";
    pub(crate) const CONFLICT: &str = "a call with other arguments is a conflict";
    pub(crate) const IN_PROGRESS: &str = "a duplicate of a running call is in progress";
    pub(crate) const UNAVAILABLE: &str = "a lost store answer is refused as store unavailable";
    pub(crate) const RELEASED: &str = "a claim whose answer was lost is released";
    pub(crate) const UNKNOWN: &str = "a key whose owner stopped is outcome unknown";
    pub(crate) const TAKEN_OVER: &str = "a lease that ran out is taken over";
    pub(crate) const RAN_AGAIN: &str = "a key runs again after a take-over";
    pub(crate) const LOST_RACE: &str =
        "a take-over that finds the record moved on is refused as in progress";
    pub(crate) const FENCED: &str = "a replaced owner's completion is fenced off";
    pub(crate) const SUPERSEDED: &str =
        "a replaced owner's caller got its own run, not the recorded one";
}

/// One property: its name, what it expects, the worlds it applies to, and its condition.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) expectation: Expectation,
    pub(crate) applies: fn(&Config) -> bool,
    condition: fn(&State) -> bool,
    /// Whether evaluating it also keeps the figures of re-executions ([`tally`]).
    tallies: bool,
}

const fn always(
    name: &'static str,
    applies: fn(&Config) -> bool,
    condition: fn(&State) -> bool,
) -> Spec {
    Spec {
        name,
        expectation: Expectation::Always,
        applies,
        condition,
        tallies: false,
    }
}

const fn sometimes(
    name: &'static str,
    applies: fn(&Config) -> bool,
    condition: fn(&State) -> bool,
) -> Spec {
    Spec {
        name,
        expectation: Expectation::Sometimes,
        applies,
        condition,
        tallies: false,
    }
}

/// Every property; [`World::properties`](stateright::Model::properties) keeps those that apply.
pub(crate) const SPECS: [Spec; COUNT] = [
    Spec {
        tallies: true,
        ..always(names::ONE_RUN, reject, one_run)
    },
    Spec {
        tallies: true,
        ..always(names::RUN_AGAIN_AFTER_LAPSE, reexecute, runs_bounded)
    },
    always(names::ANSWERS, every, answers_agree),
    always(names::WRITE_ONCE, every, write_once),
    sometimes(names::REPLAY, every, |s| {
        any(s, |log| log.replayed != [0, 0])
    }),
    sometimes(names::CONFLICT, every, |s| refused(s, refusal::CONFLICT)),
    sometimes(names::IN_PROGRESS, every, |s| {
        refused(s, refusal::IN_PROGRESS)
    }),
    sometimes(names::UNAVAILABLE, losing, |s| {
        refused(s, refusal::STORE_UNAVAILABLE)
    }),
    sometimes(names::RELEASED, losing, |s| any(s, |log| log.released)),
    sometimes(names::UNKNOWN, reject, |s| {
        refused(s, refusal::OUTCOME_UNKNOWN)
    }),
    sometimes(names::TAKEN_OVER, reexecute, |s| {
        any(s, |log| log.lapses > 0)
    }),
    sometimes(names::RAN_AGAIN, reexecute, |s| any(s, |log| log.runs > 1)),
    sometimes(names::LOST_RACE, reexecute, |s| any(s, |log| log.lost_race)),
    sometimes(names::FENCED, reexecute, |s| any(s, |log| log.fenced_out)),
    // Counted apart, never hidden: `answers_agree` allows it only after a take-over.
    sometimes(names::SUPERSEDED, reexecute, |s| {
        any(s, |log| {
            log.register.is_some_and(|run| log.direct & !bit(run) != 0)
        })
    }),
];

/// Each entry of [`SPECS`] as a condition the checker evaluates: [`once`] of its index.
pub(crate) const ONCE: [fn(&World, &State) -> bool; COUNT] = [
    once::<0>, once::<1>, once::<2>, once::<3>, once::<4>, once::<5>, once::<6>, once::<7>,
    once::<8>, once::<9>, once::<10>, once::<11>, once::<12>, once::<13>, once::<14>,
];

/// Property `P`, discovered once: the first state it is discovered in (a counterexample of an
/// `always`, an example of a `sometimes`) is the one reported. stateright 0.31 replaces a
/// property's discovery with each later state that matches, so it would report the deepest
/// path found, not the shortest; after the first discovery this answers "no match". With one
/// thread, breadth first, the first discovery is at the least depth.
fn once<const P: usize>(world: &World, state: &State) -> bool {
    let spec = &SPECS[P];
    if spec.tallies {
        tally(world, state);
    }
    let discovery = spec.expectation == Expectation::Sometimes;
    if world.discovered[P].load(Ordering::Relaxed) {
        return !discovery;
    }
    let holds = (spec.condition)(state);
    if holds == discovery {
        world.discovered[P].store(true, Ordering::Relaxed);
    }
    holds
}

fn every(_: &Config) -> bool {
    true
}

fn reject(config: &Config) -> bool {
    config.after_crash == AfterCrash::Reject
}

fn reexecute(config: &Config) -> bool {
    config.after_crash == AfterCrash::Reexecute
}

fn losing(config: &Config) -> bool {
    config.lost_answers > 0
}

fn bit(run: u8) -> u16 {
    1 << run
}

fn any(state: &State, test: impl Fn(&KeyLog) -> bool) -> bool {
    state.keys.iter().any(test)
}

fn refused(state: &State, refusal: u8) -> bool {
    any(state, |log| log.refusals & refusal != 0)
}

/// `AfterCrash::Reject`: a key runs at most once, whatever happens.
fn one_run(state: &State) -> bool {
    state.keys.iter().all(|log| log.runs <= 1)
}

/// `AfterCrash::Reexecute`: a key runs at most once, plus once per take-over of a lease that had
/// run out by the model's clock.
fn runs_bounded(state: &State) -> bool {
    state
        .keys
        .iter()
        .all(|log| u16::from(log.runs) <= 1 + u16::from(log.lapses))
}

/// Keeps the figures of re-executions for the report: the most runs of one key, and how many
/// states have a key that ran more than once (never hidden: a re-execution is counted even where
/// it is allowed). The checker evaluates each property once per unique state.
fn tally(world: &World, state: &State) {
    let most = state.keys.iter().map(|log| log.runs).max().unwrap_or(0);
    world
        .max_runs
        .fetch_max(usize::from(most), Ordering::Relaxed);
    if most > 1 {
        world.rerun_states.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every answer agrees with the key's write-once register: a replay is the register's value, to
/// a call with the same arguments; a caller whose own call ran got that run's result, which is
/// the register's value once there is one, unless the register holds a run that ran after some
/// lease of the key ran out and was taken over (the documented cost of `Reexecute`); a refusal
/// is one of those documented for this world (conflict, in progress, outcome unknown, store
/// unavailable).
fn answers_agree(state: &State) -> bool {
    state.keys.iter().all(|log| {
        let documented = log.refusals & refusal::UNEXPECTED == 0;
        let replays = (0..2u8).all(|args| {
            let replayed = log.replayed[usize::from(args)];
            replayed == 0
                || log.register.is_some_and(|run| {
                    replayed == bit(run) && u8::from(log.run_args & bit(run) != 0) == args
                })
        });
        let direct = match log.register {
            None => true,
            Some(run) => log.direct & !bit(run) == 0 || log.runs_after_lapse & bit(run) != 0,
        };
        documented && replays && direct
    })
}

/// The store behaves as a write-once register: once an outcome is recorded, the key's record is
/// completed with exactly that outcome, for good.
fn write_once(state: &State) -> bool {
    state
        .records
        .iter()
        .zip(&state.keys)
        .all(|(slot, log)| match (log.register, slot) {
            (None, _) => true,
            (
                Some(first),
                Some(Slot {
                    state: SlotState::Completed { run, .. },
                    ..
                }),
            ) => *run == first,
            (Some(_), _) => false,
        })
}
