//! The sans-IO engine, model-checked: every reachable state of a small world, by breadth-first
//! search ([stateright]), against a write-once-register specification (issue 40).
//!
//! The world: gateways (owners) that decide `tools/call`s with the library's real [`Engine`] and
//! `PendingDecision` (the real types, driven step by step: the point is to check the engine, not
//! a re-implementation of it), one or two idempotency keys, two argument values (so a retry with
//! other arguments is a conflict), an abstract store that holds records as the `Store` trait
//! defines them (in progress with an owner token and a lease deadline, or completed with an
//! outcome), and a discrete clock of a few ticks. Each action applies one store request
//! atomically:
//!
//! - a client sends a call (a first call, a retry, or other arguments) through a gateway, which
//!   begins it and claims its key;
//! - the gateway takes over a record whose lease ran out (`AfterCrash::Reexecute`);
//! - the tool runs (its runs counted per key);
//! - the gateway renews its lease, or records the outcome fenced by its token and answers;
//! - a store answer is lost (the request applied or not; the gateway sees a store error), and
//!   the gateway releases a claim whose answer was lost, fenced by its token;
//! - a gateway crashes (its in-progress records stay); the clock moves (leases run out).
//!
//! The properties: a key runs at most once (under `Reexecute`: again only after a lease ran out
//! and was taken over, and such re-executions are counted in the report, not hidden); every
//! answer a client got is the key's register value (the first recorded outcome) or a documented
//! refusal; the store keeps that first outcome; and `sometimes` properties that show the
//! interesting states are reached (a replay, a conflict, an in-progress refusal, a take-over).
//!
//! [`Engine`]: mcp_idempotency::Engine

mod model;
mod properties;
mod report;
mod state;
mod steps;
mod store;
#[cfg(test)]
mod tests;
mod world;

use std::time::Instant;

use mcp_idempotency::AfterCrash;
use stateright::{Checker, Model};

pub use report::{Expectation, PropertyReport, Report};

/// The size of the world to check. Every field multiplies the state space: see
/// [`Config::default`] for a world that checks in seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// What the engine does with a record whose owner's lease ran out.
    pub after_crash: AfterCrash,
    /// Idempotency keys (1 or 2).
    pub keys: u8,
    /// Gateways sharing the store (1 to 3).
    pub gateways: u8,
    /// Calls clients send per key, retries and conflicting calls included (1 to 6).
    pub sends_per_key: u8,
    /// The clock's last tick (it starts at 0; at most 10).
    pub ticks: u8,
    /// The lease, in ticks (1 to 10).
    pub lease_ticks: u8,
    /// Gateway crashes in one history.
    pub crashes: u8,
    /// Store answers lost in one history.
    pub lost_answers: u8,
    /// Whether running calls renew their leases.
    pub renewals: bool,
    /// A rule the abstract store breaks on purpose, to show the check catches it.
    pub store_flaw: Option<StoreFlaw>,
}

impl Default for Config {
    /// 2 gateways, 1 key, 3 calls, ticks 0 to 3, a lease of 2 ticks, 1 crash, 1 lost answer,
    /// renewals, `AfterCrash::Reject`.
    fn default() -> Self {
        Self {
            after_crash: AfterCrash::Reject,
            keys: 1,
            gateways: 2,
            sends_per_key: 3,
            ticks: 3,
            lease_ticks: 2,
            crashes: 1,
            lost_answers: 1,
            renewals: true,
            store_flaw: None,
        }
    }
}

/// A store rule broken on purpose (the model's store, not the library's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreFlaw {
    /// A completion is applied whoever owns the record, and whatever its state.
    UnfencedCompletion,
    /// A take-over is applied whether or not the lease ran out.
    TakeOverLiveLease,
}

/// A [`Config`] outside the bounds the model supports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("model check: `{field}` must be within {min}..={max}, not {value}")]
pub struct ConfigError {
    /// The field.
    pub field: &'static str,
    /// Its value.
    pub value: u8,
    /// The smallest value supported.
    pub min: u8,
    /// The largest value supported.
    pub max: u8,
}

impl Config {
    /// Checks the bounds of every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bounds = [
            ("keys", self.keys, 1, 2),
            ("gateways", self.gateways, 1, 3),
            // Tokens and run numbers fit in a key's 16 slots.
            ("sends_per_key", self.sends_per_key, 1, 6),
            ("ticks", self.ticks, 0, 10),
            ("lease_ticks", self.lease_ticks, 1, 10),
        ];
        for (field, value, min, max) in bounds {
            if !(min..=max).contains(&value) {
                return Err(ConfigError {
                    field,
                    value,
                    min,
                    max,
                });
            }
        }
        Ok(())
    }
}

/// Checks every reachable state of the world `config` describes, by breadth-first search on one
/// thread, and reports the states, the properties and a path for each discovery (the
/// counterexample of a property that fails, the example of a `sometimes` that holds).
pub fn check(config: Config) -> Result<Report, ConfigError> {
    config.validate()?;
    let started = Instant::now();
    let checker = world::World::new(config).checker().spawn_bfs().join();
    let elapsed = started.elapsed();
    Ok(report::report(&checker, elapsed))
}
