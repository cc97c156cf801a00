//! [`RunningClaim`]: the claim of an executed call, from the execute decision to its outcome.
//!
//! This is the one claim lifecycle every transport uses: the handle renews its lease on the
//! engine's schedule ([`Engine::renewal_due`](crate::Engine::renewal_due)) while the call runs,
//! and ends in exactly one of three ways, each logged here:
//!
//! - [`finish`](RunningClaim::finish): the call answered; its outcome is recorded (fenced).
//! - [`abandon`](RunningClaim::abandon): the call may have run but its answer is lost (the server
//!   died, the stream broke off); recorded as [`Outcome::Unknown`].
//! - [`release`](RunningClaim::release): the call certainly did not run (the server could not be
//!   reached); the key is freed for a retry.
//!
//! A handle dropped without any of these (its task was cancelled) is abandoned in the background,
//! so that no claim is left without an owner until its lease runs out.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::deduplicator::Deduplicator;
use crate::engine::Claim;
use crate::record::Outcome;
use crate::store::{Fenced, StoreError};

/// Shortest wait between two renewals (a lease of a few milliseconds in tests).
const MIN_RENEWAL_WAIT: Duration = Duration::from_millis(10);

/// An executed call's claim, renewing its own lease until it is finished, abandoned or released.
/// Returned by [`Deduplicator::begin`] inside [`Decision::Execute`](crate::Decision::Execute).
///
/// Renewal runs on the tokio runtime the claim was started on; a claim started outside a runtime
/// does not renew.
#[derive(Debug)]
#[must_use = "a running claim must be finished, abandoned or released"]
pub struct RunningClaim {
    claim: Claim,
    dedup: Deduplicator,
    renewal: Option<JoinHandle<()>>,
    ended: bool,
}

impl RunningClaim {
    pub(crate) fn start(dedup: Deduplicator, claim: Claim) -> Self {
        let renewal = tokio::runtime::Handle::try_current()
            .ok()
            .map(|runtime| runtime.spawn(renew_until_stopped(dedup.clone(), claim.clone())));
        Self {
            claim,
            dedup,
            renewal,
            ended: false,
        }
    }

    /// The claim as decided: its record and owner (its lease moves on as it is renewed).
    pub fn claim(&self) -> &Claim {
        &self.claim
    }

    fn end(&mut self) {
        self.ended = true;
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
    }

    /// Records the call's outcome. [`Fenced::NotOwner`]: the claim was taken over (its lease ran
    /// out) and the outcome was not written. On an error the record stays in progress until its
    /// lease runs out; both are logged.
    pub async fn finish(mut self, outcome: Outcome) -> Result<Fenced, StoreError> {
        self.end();
        let result = self.dedup.complete(&self.claim, outcome).await;
        if let Err(error) = &result {
            // Once the lease runs out, retries are answered by the after-crash policy rather
            // than with a wrong replay.
            tracing::error!(key = %self.claim.id().key, %error, "cannot record the outcome of a call");
        }
        result
    }

    /// Records the call as [`Outcome::Unknown`]: it may have run, and its answer is lost.
    pub async fn abandon(self, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::warn!(key = %self.claim.id().key, %reason, "recording a call's outcome as unknown");
        let _ = self.finish(Outcome::Unknown { reason }).await;
    }

    /// Gives the key up: the call certainly did not run, so a retry may run it.
    pub async fn release(mut self, reason: &str) {
        self.end();
        match self.dedup.release(&self.claim).await {
            Ok(Fenced::Applied) => {
                tracing::debug!(key = %self.claim.id().key, reason, "released a claim");
            }
            Ok(Fenced::NotOwner) => {
                tracing::warn!(key = %self.claim.id().key, reason, "a released claim was no longer ours");
            }
            Err(error) => {
                // The deduplicator remembers the claim and releases it once the store answers.
                tracing::warn!(key = %self.claim.id().key, %error, "cannot release a claim yet");
            }
        }
    }
}

impl AsRef<Claim> for RunningClaim {
    fn as_ref(&self) -> &Claim {
        &self.claim
    }
}

impl Drop for RunningClaim {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.end();
        let reason = "the gateway stopped handling the call before it ended";
        tracing::warn!(key = %self.claim.id().key, reason, "a running claim was dropped");
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (dedup, claim) = (self.dedup.clone(), self.claim.clone());
            runtime.spawn(async move {
                let outcome = Outcome::Unknown {
                    reason: reason.into(),
                };
                if let Err(error) = dedup.complete(&claim, outcome).await {
                    tracing::error!(key = %claim.id().key, %error, "cannot record the outcome of a call");
                }
            });
        }
    }
}

/// Renews the lease whenever the engine says it is due, until the task is aborted or the claim is
/// lost to another owner.
async fn renew_until_stopped(dedup: Deduplicator, mut claim: Claim) {
    let retry = (dedup.engine().config().lease() / 6).max(MIN_RENEWAL_WAIT);
    loop {
        let due = dedup.engine().renewal_due(&claim);
        let wait = due
            .saturating_since(dedup.clock().now())
            .max(MIN_RENEWAL_WAIT);
        tokio::time::sleep(wait).await;
        match dedup.renew(&mut claim).await {
            Ok(Fenced::Applied) => {}
            Ok(Fenced::NotOwner) => {
                tracing::warn!(key = %claim.id().key, "lost the lease of a running call: it was taken over");
                return;
            }
            Err(error) => {
                tracing::warn!(key = %claim.id().key, %error, "cannot renew a lease");
                tokio::time::sleep(retry).await;
            }
        }
    }
}
