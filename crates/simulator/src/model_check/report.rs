//! What a check found ([`Report`]), with each discovery's path rendered as readable lines.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use stateright::{Checker, Model, Path};

use super::state::{refusal, Action, KeyLog, Slot, SlotState, State};
use super::world::{args_name, tick_of, token_name, Narration, World};
use super::Config;

/// What a property expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// True in every reachable state: a discovery is a counterexample.
    Always,
    /// True in some reachable state: a discovery is an example.
    Sometimes,
}

/// One property and whether it held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropertyReport {
    /// The property, in words.
    pub name: &'static str,
    /// `always` or `sometimes`.
    pub expectation: Expectation,
    /// Whether it held: no counterexample of an `always`, an example of a `sometimes`.
    pub holds: bool,
    /// The path the checker discovered, one step a line, then the last state: the counterexample
    /// of an `always` that failed, the example of a `sometimes` that held; empty otherwise.
    pub path: Vec<String>,
}

/// The outcome of [`check`](super::check).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The world checked.
    pub config: Config,
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states visited.
    pub unique_states: usize,
    /// The longest path from the initial state.
    pub max_depth: usize,
    /// How long the search took.
    pub elapsed: Duration,
    /// The most runs of one key in any state (1 unless calls run again after a take-over).
    pub max_runs_per_key: usize,
    /// States in which some key ran more than once.
    pub rerun_states: usize,
    /// Each property, in the order the model declares them.
    pub properties: Vec<PropertyReport>,
}

impl Report {
    /// Whether every property held.
    pub fn holds(&self) -> bool {
        self.properties.iter().all(|property| property.holds)
    }

    /// The property named `name`, if the model declares it.
    pub fn property(&self, name: &str) -> Option<&PropertyReport> {
        self.properties
            .iter()
            .find(|property| property.name == name)
    }
}

pub(super) fn report(checker: &impl Checker<World>, elapsed: Duration) -> Report {
    let world = checker.model();
    let discoveries = checker.discoveries();
    let properties = world
        .properties()
        .into_iter()
        .map(|property| {
            let expectation = match property.expectation {
                stateright::Expectation::Sometimes => Expectation::Sometimes,
                // The model declares no `eventually` property.
                _ => Expectation::Always,
            };
            let found = discoveries.get(property.name);
            PropertyReport {
                name: property.name,
                expectation,
                holds: found.is_some() == (expectation == Expectation::Sometimes),
                path: found.map_or_else(Vec::new, |path| render(world, path)),
            }
        })
        .collect();
    Report {
        config: world.config.clone(),
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        max_runs_per_key: world.max_runs.load(Ordering::Relaxed),
        rerun_states: world.rerun_states.load(Ordering::Relaxed),
        properties,
    }
}

/// A path as lines: each step with what happened, then the last state.
fn render(world: &World, path: &Path<State, Action>) -> Vec<String> {
    let steps = path.clone().into_vec();
    let mut lines = Vec::with_capacity(steps.len() + 1);
    for (number, (state, action)) in (1..).zip(&steps) {
        match action {
            Some(action) => {
                let mut narration = Narration::recording();
                // Re-applied to narrate it: the checker found this step, so it applies.
                let _ = world.apply(state, *action, &mut narration);
                lines.push(format!(
                    "{number:>2}. t={} {}",
                    state.now,
                    narration.into_text()
                ));
            }
            None => lines.push(format!("    then: {}", describe(state))),
        }
    }
    lines
}

/// A state in one line: each key's record, runs, register and answers.
fn describe(state: &State) -> String {
    let keys: Vec<String> = (0..)
        .zip(state.records.iter().zip(&state.keys))
        .map(|(key, (slot, log))| format!("key {key}: {}; {}", record(slot), answers(log)))
        .collect();
    format!("t={}; {}", state.now, keys.join(" | "))
}

fn record(slot: &Option<Slot>) -> String {
    match slot.as_ref().map(|slot| &slot.state) {
        None => "no record".into(),
        Some(SlotState::InProgress {
            owner,
            lease_expires_at,
        }) => format!(
            "in progress under {} to t={}",
            token_name(*owner),
            tick_of(*lease_expires_at)
        ),
        Some(SlotState::Completed { run, args, .. }) => {
            format!("completed with run {run} (args {})", args_name(*args))
        }
    }
}

fn answers(log: &KeyLog) -> String {
    let runs = |bits: u16| -> String {
        let runs: Vec<String> = (1..16u8)
            .filter(|run| bits & (1 << run) != 0)
            .map(|run| run.to_string())
            .collect();
        format!("[{}]", runs.join(","))
    };
    let register = log
        .register
        .map_or("empty".to_owned(), |run| format!("run {run}"));
    let refusals: Vec<&str> = [
        (refusal::CONFLICT, "conflict"),
        (refusal::IN_PROGRESS, "in progress"),
        (refusal::OUTCOME_UNKNOWN, "outcome unknown"),
        (refusal::STORE_UNAVAILABLE, "store unavailable"),
        (refusal::UNEXPECTED, "UNEXPECTED"),
    ]
    .into_iter()
    .filter(|(bit, _)| log.refusals & bit != 0)
    .map(|(_, name)| name)
    .collect();
    format!(
        "runs {}, take-overs of a lapsed lease {}; register {register}; own results {}, replays to A {} to B {}; refusals [{}]",
        log.runs,
        log.lapses,
        runs(log.direct),
        runs(log.replayed[0]),
        runs(log.replayed[1]),
        refusals.join(", ")
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        writeln!(
            f,
            "model check ({}, {} key(s), {} gateways, {} calls per key, ticks 0..={}, lease {} ticks, {} crash(es), {} lost answer(s){}{}): \
             {} states, {} unique, depth {}, {:.1} s; most runs of one key {}, {} states with a re-run",
            config.after_crash,
            config.keys,
            config.gateways,
            config.sends_per_key,
            config.ticks,
            config.lease_ticks,
            config.crashes,
            config.lost_answers,
            if config.renewals { ", renewals" } else { "" },
            config
                .store_flaw
                .map_or(String::new(), |flaw| format!(", store flaw {flaw:?}")),
            self.states,
            self.unique_states,
            self.max_depth,
            self.elapsed.as_secs_f64(),
            self.max_runs_per_key,
            self.rerun_states,
        )?;
        for property in &self.properties {
            let (verdict, kind) = match property.expectation {
                Expectation::Always => (if property.holds { "ok  " } else { "FAIL" }, "always   "),
                Expectation::Sometimes => {
                    (if property.holds { "ok  " } else { "MISS" }, "sometimes")
                }
            };
            writeln!(f, "  {verdict} {kind} {}", property.name)?;
            if property.expectation == Expectation::Always && !property.holds {
                for line in &property.path {
                    writeln!(f, "         {line}")?;
                }
            }
        }
        Ok(())
    }
}
