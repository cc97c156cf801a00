//! Known-bad variants of the claim path (mutants), for `crates/simulator` to show that its
//! invariants catch them. Each is off until a thread switches it on, and only for that thread
//! (the simulator runs a seed on one thread, and tests run seeds on several at once). Only the
//! simulator enables the `simulation` feature: no shipped artifact has this module.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

/// A known-bad variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// A completion skips the owner fence: a store completes a record whoever holds it (the
    /// simulator's model store, standing for a store script without its `owner = ?`).
    CompleteUnfenced,
    /// A lease is renewed only after it ran out (the renewal falls due half a lease past the
    /// deadline instead of a third of a lease after the last renewal).
    RenewalAfterExpiry,
    /// Records are found across principals: a claim's record id leaves the principal out.
    ReplayAcrossPrincipals,
    /// A claim forgets the client's own key beside a business identifier: it is never read
    /// first, never recorded beside.
    ClaimForgetsClientKey,
    /// A claim whose answer was lost is never released: the release reports success without
    /// reaching the store.
    SettleNeverReleases,
}

impl Mutant {
    /// Every mutant, in the order `simulate --list-mutants` prints them.
    pub const ALL: &'static [Self] = &[
        Self::CompleteUnfenced,
        Self::RenewalAfterExpiry,
        Self::ReplayAcrossPrincipals,
        Self::ClaimForgetsClientKey,
        Self::SettleNeverReleases,
    ];

    /// The name `simulate --mutant` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::CompleteUnfenced => "complete-unfenced",
            Self::RenewalAfterExpiry => "renewal-after-expiry",
            Self::ReplayAcrossPrincipals => "replay-across-principals",
            Self::ClaimForgetsClientKey => "claim-forgets-client-key",
            Self::SettleNeverReleases => "settle-never-releases",
        }
    }

    /// What it breaks, one line.
    pub fn description(self) -> &'static str {
        match self {
            Self::CompleteUnfenced => "a completion that skips the owner fence",
            Self::RenewalAfterExpiry => "a lease renewed only after it ran out",
            Self::ReplayAcrossPrincipals => "records found (and replayed) across principals",
            Self::ClaimForgetsClientKey => {
                "a claim that forgets the client's own key beside a business identifier"
            }
            Self::SettleNeverReleases => {
                "a claim whose answer was lost is never released (the release never reaches the store)"
            }
        }
    }

    /// Switches this mutant on for the current thread until the guard is dropped.
    pub fn switch_on(self) -> MutantGuard {
        let previous = ON.with(|on| on.replace(Some(self)));
        MutantGuard { previous }
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mutant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|mutant| mutant.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|m| m.name()).collect();
                format!("unknown mutant {s:?}; expected one of {}", names.join(", "))
            })
    }
}

thread_local! {
    static ON: Cell<Option<Mutant>> = const { Cell::new(None) };
}

/// Whether `mutant` is switched on for the current thread.
pub fn is_on(mutant: Mutant) -> bool {
    ON.with(|on| on.get() == Some(mutant))
}

/// Switches the mutant off again when dropped.
#[derive(Debug)]
pub struct MutantGuard {
    previous: Option<Mutant>,
}

impl Drop for MutantGuard {
    fn drop(&mut self) {
        ON.with(|on| on.set(self.previous));
    }
}
