//! [`Renewals`]: the leases of a deduplicator's running claims, renewed by one task.
//!
//! A `RunningClaim` registers its claim when its call starts and takes it out when the call
//! ends. One task per deduplicator wakes every sixth of the lease (on the deduplicator's clock)
//! and renews the claims that are
//! due ([`Engine::renewal_due`](crate::engine::Engine::renewal_due): a third of the lease after
//! the last renewal), so a lease is renewed at most half a lease after it was taken.
//!
//! Registering is a map insert: a call that ends before its first renewal (almost every call)
//! spawns no task and wakes no runtime thread. That matters most to the Python and TypeScript
//! bindings, whose calls arrive on the host language's thread: a task spawned from there wakes a
//! worker of the runtime, twice per call (spawn and abort). The task ends at the first tick that
//! finds no claim, and the next registration starts it again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::writes::StoreWrites;
use crate::engine::Claim;
use crate::store::Fenced;

/// Shortest wait between two ticks (a lease of a few milliseconds in tests).
const MIN_TICK: Duration = Duration::from_millis(10);

/// The running claims of one deduplicator (shared by its clones).
#[derive(Debug, Default)]
pub(super) struct Renewals {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    claims: BTreeMap<u64, Entry>,
    next_id: u64,
    /// Whether the renewing task runs.
    task: bool,
}

#[derive(Debug)]
struct Entry {
    claim: Claim,
    /// A renewal of it is under way (not sent again at the next tick).
    renewing: bool,
}

/// A registered claim, to take out with [`Renewals::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Registration(u64);

impl Renewals {
    /// Keeps `claim`'s lease alive until it is removed, renewing it through `writes`; starts the
    /// task on the current tokio runtime if none runs. Outside a runtime the claim is not renewed
    /// (`None`).
    pub(super) fn add(
        self: &Arc<Self>,
        writes: &StoreWrites,
        claim: Claim,
    ) -> Option<Registration> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.claims.insert(
            id,
            Entry {
                claim,
                renewing: false,
            },
        );
        if !state.task {
            state.task = true;
            runtime.spawn(renew_while_claimed(Arc::clone(self), writes.clone()));
        }
        Some(Registration(id))
    }

    /// Stops renewing a claim (its call ended).
    pub(super) fn remove(&self, registration: Registration) {
        self.lock().claims.remove(&registration.0);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every sixth of the lease, starts the renewals that are due; ends at a tick with no claim.
/// Each renewal runs in a task of its own, so that a slow store answer delays no other lease
/// (only calls that outlive a third of their lease ever get one).
async fn renew_while_claimed(renewals: Arc<Renewals>, writes: StoreWrites) {
    // Dropped with the task (also when its runtime shuts down): the next claim starts another.
    let _running = Running(Arc::clone(&renewals));
    let tick = tick(&writes);
    loop {
        writes.clock.sleep(tick).await;
        let now = writes.clock.now();
        let due: Vec<(u64, Claim)> = {
            let mut state = renewals.lock();
            if state.claims.is_empty() {
                return;
            }
            state
                .claims
                .iter_mut()
                .filter(|(_, entry)| {
                    !entry.renewing && writes.engine.renewal_due(&entry.claim) <= now
                })
                .map(|(&id, entry)| {
                    entry.renewing = true;
                    (id, entry.claim.clone())
                })
                .collect()
        };
        for (id, claim) in due {
            tokio::spawn(renew(Arc::clone(&renewals), writes.clone(), id, claim));
        }
    }
}

/// Renews one registered claim once; a failed renewal is sent again at a later tick, a sixth of
/// the lease later.
async fn renew(renewals: Arc<Renewals>, writes: StoreWrites, id: u64, mut claim: Claim) {
    let renewed = writes.renew(&mut claim).await;
    let mut state = renewals.lock();
    // A call that ended meanwhile is not renewed any more, whatever the store said.
    let Some(entry) = state.claims.get_mut(&id) else {
        return;
    };
    entry.renewing = false;
    match renewed {
        Ok(Fenced::Applied) => entry.claim = claim,
        Ok(Fenced::NotOwner) => {
            state.claims.remove(&id);
            tracing::warn!(key = %claim.id().key, "lost the lease of a running call: it was taken over");
        }
        Err(error) => {
            tracing::warn!(key = %claim.id().key, %error, "cannot renew a lease");
        }
    }
}

struct Running(Arc<Renewals>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().task = false;
    }
}

/// A sixth of the lease, at least [`MIN_TICK`] (also the wait after a failed renewal).
pub(super) fn tick(writes: &StoreWrites) -> Duration {
    (writes.engine.config().lease() / 6).max(MIN_TICK)
}
