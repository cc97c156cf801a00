//! [`RunningClaim`]: the claim of an executed call, from the execute decision to its outcome.
//!
//! This is the one claim lifecycle every transport uses: the handle's lease is renewed on the
//! engine's schedule ([`Engine::renewal_due`](crate::engine::Engine::renewal_due)) while the call
//! runs (by the deduplicator's one renewing task, see `renewals.rs`), and ends in exactly one of
//! three ways, each logged here:
//!
//! - [`finish`](RunningClaim::finish): the call answered; its outcome is recorded (fenced). If
//!   the store fails with an error that may pass, the handle goes on in the background: it sends
//!   the same completion again with a backoff, and keeps renewing the lease meanwhile, so that
//!   nobody takes the record over while its true outcome is still being written (see
//!   `completion.rs`, and "Lost completions" on [`Deduplicator`](crate::Deduplicator)).
//! - [`abandon`](RunningClaim::abandon): the call may have run but its answer is lost (the server
//!   died, the stream broke off); recorded as [`Outcome::Unknown`].
//! - [`release`](RunningClaim::release): the call certainly did not run (the server could not be
//!   reached); the key is freed for a retry.
//!
//! A handle dropped without any of these (its task was cancelled) is abandoned in the background,
//! so that no claim is left without an owner until its lease runs out.

use std::sync::Arc;

use super::completion::{CompletionRetry, Next, Settled};
use super::renewals::{self, Registration, Renewals};
use super::writes::{CompletionSlot, StoreWrites};
use crate::call_span::CallSpan;
use crate::engine::{Claim, Companion};
use crate::record::Outcome;
use crate::store::{CompleteRequest, Fenced, StoreError};

/// An executed call's claim, its lease kept alive until it is finished, abandoned or released.
/// Returned by [`Deduplicator::begin`](crate::Deduplicator::begin) inside
/// [`Decision::Execute`](crate::engine::Decision::Execute).
///
/// The deduplicator's renewing task runs on the tokio runtime the first running claim was started
/// on; a claim started outside a runtime is not renewed.
#[derive(Debug)]
#[must_use = "a running claim must be finished, abandoned or released"]
pub struct RunningClaim {
    claim: Claim,
    /// The deduplicator's store, to write the claim's end to.
    writes: StoreWrites,
    /// The deduplicator's renewals, which keep the claim's lease alive until it ends.
    renewals: Arc<Renewals>,
    renewal: Option<Registration>,
    ended: bool,
    /// The call's span: its completion is a child span, and it ends once the outcome is written.
    span: CallSpan,
}

impl RunningClaim {
    /// Starts renewing `claim`'s lease with `renewals`; its end is written through `writes`.
    pub(super) fn start(writes: StoreWrites, renewals: Arc<Renewals>, claim: Claim) -> Self {
        let renewal = renewals.add(&writes, claim.clone());
        Self {
            claim,
            writes,
            renewals,
            renewal,
            ended: false,
            span: CallSpan::none(),
        }
    }

    /// The same claim, its store writes shown in `span`.
    pub(crate) fn in_span(mut self, span: &CallSpan) -> Self {
        self.span = span.clone();
        self
    }

    /// The claim as decided: its record and owner (its lease moves on as it is renewed).
    pub fn claim(&self) -> &Claim {
        &self.claim
    }

    fn end(&mut self) {
        self.ended = true;
        if let Some(renewal) = self.renewal.take() {
            self.renewals.remove(renewal);
        }
    }

    /// Records the call's outcome. [`Fenced::NotOwner`]: the claim was taken over (its lease ran
    /// out) and the outcome was not written; logged.
    ///
    /// An error is the first attempt's. If it may pass (the store could not be reached), the
    /// completion is sent again in the background, with the lease kept alive, until the store
    /// applies it, the record is taken over, or the retention window ends; retries of the call
    /// meanwhile are answered `idempotency_key_in_progress`. Otherwise (or if 1024 completions
    /// are retried already) the record stays in progress until its lease runs out, and that is
    /// logged as an error.
    pub async fn finish(mut self, outcome: Outcome) -> Result<Fenced, StoreError> {
        self.end();
        let companion = self.claim.take_companion();
        if self.claim.forgets_errors() && outcome.is_error() {
            tracing::info!(
                key = %self.claim.id().key.for_tool(),
                "an error outcome is forgotten, as the tool's policy says (on-error = \"forget\"): a retry runs the tool again"
            );
            return self.writes.release(&self.claim).await;
        }
        let req = self
            .writes
            .engine
            .completion(&self.claim, outcome, self.writes.clock.now());
        let started = self.span.operation_start();
        let result = self.writes.send_completion(&req).await;
        self.span
            .store_operation("complete", started, result.as_ref().map(|_| ()));
        if let Some(companion) = companion {
            record_beside(&self.writes, companion, req.outcome.clone()).await;
        }
        if let Err(error) = &result {
            complete_later(self.writes.clone(), self.claim.clone(), req, error);
        }
        result
    }

    /// Records what the call answered, as every driver does with the interceptor's record
    /// actions: [`finish`](Self::finish), whose errors are this handle's business (logged, and
    /// sent again in the background when they may pass), not the driver's.
    pub(crate) async fn record(self, outcome: Outcome) {
        let log_span = self.span.log_span();
        let _ = tracing::Instrument::instrument(self.finish(outcome), log_span).await;
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
        match self.writes.release(&self.claim).await {
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
            let (writes, claim) = (self.writes.clone(), self.claim.clone());
            let outcome = Outcome::Unknown {
                reason: reason.into(),
            };
            let req = writes
                .engine
                .completion(&claim, outcome, writes.clock.now());
            runtime.spawn(async move {
                if let Err(error) = writes.send_completion(&req).await {
                    complete_later(writes, claim, req, &error);
                }
            });
        }
    }
}

/// After the first attempt of `req`, the completion of `claim`, failed with `error`: sends it
/// again in the background if the error may pass and a slot is free; otherwise logs the loss.
fn complete_later(writes: StoreWrites, claim: Claim, req: CompleteRequest, error: &StoreError) {
    let now = writes.clock.now();
    let retry = CompletionRetry::after_first_failure(error, req.expires_at, now);
    let runtime = tokio::runtime::Handle::try_current().ok();
    let (why, detail) = match (retry, runtime) {
        (Some(retry), Some(runtime)) => match writes.reserve_completion() {
            Some(slot) => {
                tracing::warn!(
                    key = %req.id.key, %error,
                    "the outcome of a call is not recorded yet: sending it again until the store takes it"
                );
                runtime.spawn(retry_completion(writes, claim, req, retry, slot));
                return;
            }
            None => ("full", "too many completions are retried already"),
        },
        (Some(_), None) => ("error", "no runtime to retry on"),
        (None, _) => ("error", "the error will not pass"),
    };
    lost(&req, why, &format!("{error} ({detail})"));
}

/// Logs and counts a completion given up: its record stays in progress until its lease runs out.
fn lost(req: &CompleteRequest, why: &'static str, error: &str) {
    // Once the lease runs out, retries are answered by the after-crash policy rather than with a
    // wrong replay.
    tracing::error!(key = %req.id.key, %error, "cannot record the outcome of a call");
    #[cfg(feature = "metrics")]
    crate::metrics::on_completion_lost(why);
    #[cfg(not(feature = "metrics"))]
    let _ = why;
}

/// Sends `req` again on `retry`'s schedule until it settles, then gives the slot back. Between
/// attempts it renews `claim`'s lease when due (after a failed renewal, every sixth of the lease),
/// so that the record is not taken over while the store takes renewals but not the completion.
/// One task does both, one write at a time: a renewal never races the completion.
/// Records the client's own key beside a business identifier's record, with the same outcome
/// (see [`PendingDecision`](crate::PendingDecision)). It serves the SEP's rules
/// for that key; failing to write it is logged, never the call's error. Once the key is claimed,
/// its completion is sent again until the store takes it, as every completion is: a claim left
/// in progress would answer a retry with that key `idempotency_outcome_unknown`, or with
/// `after-crash = reexecute` run the call again, although it has an outcome (found by the
/// simulator, issue 40).
async fn record_beside(writes: &StoreWrites, companion: Companion, outcome: Outcome) {
    let req = writes.engine.beside(companion, writes.clock.now());
    let key = req.id.key.for_tool().to_owned();
    let answer = writes.claim(&req).await;
    match writes.engine.record_beside(req, answer, outcome) {
        Some((claim, done)) => {
            if let Err(error) = writes.send_completion(&done).await {
                tracing::warn!(key, %error, "the client's key is not recorded beside its business identifier yet");
                complete_later(writes.clone(), claim, done, &error);
            }
        }
        None => tracing::debug!(key, "the client's key was recorded already"),
    }
}

async fn retry_completion(
    writes: StoreWrites,
    mut claim: Claim,
    req: CompleteRequest,
    mut retry: CompletionRetry,
    slot: CompletionSlot,
) {
    let renew_retry = renewals::tick(&writes);
    let mut renew_at = writes.engine.renewal_due(&claim);
    let mut attempts = 1u32;
    let settled = loop {
        let now = writes.clock.now();
        let next = retry.due().min(renew_at);
        let wait = next.saturating_since(now);
        if !wait.is_zero() {
            // Biased: when both are ready the store's answer wins, always the same way (no
            // step depends on tokio's random choice), and it is not lost (the end of the sleep is
            // read from the clock again).
            tokio::select! {
                biased;
                () = writes.store_answered_again() => {
                    retry.store_answered(writes.clock.now());
                    continue;
                }
                () = writes.clock.sleep(wait) => {}
            }
        }
        let now = writes.clock.now();
        if retry.due() <= now {
            attempts += 1;
            let answer = writes.send_completion(&req).await;
            #[cfg(feature = "metrics")]
            crate::metrics::on_completion_retry(match &answer {
                Ok(Fenced::Applied) => "recorded",
                Ok(Fenced::NotOwner) => "not_owner",
                Err(_) => "error",
            });
            match retry.on_answer(&answer, writes.clock.now()) {
                Next::Settled(settled) => break (settled, answer.err()),
                Next::RetryAt(_) => {
                    if let Err(error) = &answer {
                        tracing::debug!(key = %req.id.key, %error, attempts, "the outcome of a call is still not recorded");
                    }
                }
            }
        }
        if renew_at <= writes.clock.now() {
            match writes.renew(&mut claim).await {
                Ok(Fenced::Applied) => {
                    // The store is back: the completion is due at once.
                    renew_at = writes.engine.renewal_due(&claim);
                    retry.store_answered(writes.clock.now());
                }
                Ok(Fenced::NotOwner) => break (Settled::TakenOver, None),
                Err(_) => renew_at = writes.clock.now().saturating_add(renew_retry),
            }
        }
    };
    let key = &req.id.key;
    match settled {
        (Settled::Recorded, _) => {
            tracing::warn!(%key, attempts, "recorded the outcome of a call once the store answered again");
        }
        (Settled::TakenOver, _) => {
            tracing::warn!(%key, attempts, "gave up recording the outcome of a call: it was taken over");
        }
        (Settled::Failed, error) => lost(&req, "error", &error_text(error)),
        (Settled::GaveUp, error) => lost(
            &req,
            "deadline",
            &format!("{} (the retention window ended)", error_text(error)),
        ),
    }
    drop(slot);
}

fn error_text(error: Option<StoreError>) -> String {
    error.map(|e| e.to_string()).unwrap_or_default()
}
