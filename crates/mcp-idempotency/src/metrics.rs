//! Counters, a latency histogram and gauges through the [`metrics`] facade (feature `metrics`).
//!
//! The library only emits; the application picks the exporter (`mcp-idem` serves Prometheus text
//! on `--metrics-listen`). Without an installed recorder every emission is a no-op.
//!
//! - [`Deduplicator::decide`](crate::Deduplicator::decide) counts every [`Decision`] and
//!   [`Deduplicator::complete`](crate::Deduplicator::complete) every recorded outcome; the
//!   [`interceptor`](crate::interceptor) counts the `tools/call`s without a key, which it forwards
//!   without asking for a decision.
//! - [`MeteredStore`] wraps any [`Store`] and times each operation, so every backend is measured
//!   without code of its own.
//! - [`set_record_counts`] publishes what [`Store::stats`] counted.
//! - The deduplicator counts claims whose store answer was lost ([`AMBIGUOUS_CLAIMS_TOTAL`]) and
//!   how they were dealt with ([`AMBIGUOUS_CLAIMS_RESOLVED_TOTAL`], [`AMBIGUOUS_CLAIMS_PENDING`]),
//!   and completions that failed and are sent again ([`PENDING_COMPLETIONS`],
//!   [`COMPLETION_RETRIES_TOTAL`], [`COMPLETIONS_LOST_TOTAL`]).
//!
//! The names below are stable. Counters end in `_total`, durations are in seconds.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use mcp_idempotency::metrics::MeteredStore;
//! use mcp_idempotency::store::MemoryStore;
//! use mcp_idempotency::{Deduplicator, EngineConfig};
//!
//! mcp_idempotency::metrics::describe();
//! let store = Arc::new(MeteredStore::new(Arc::new(MemoryStore::new())));
//! let dedup = Deduplicator::new(EngineConfig::default(), store);
//! # drop(dedup);
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, SharedString,
};

use crate::config::RecordLimits;
use crate::engine::{BypassReason, Decision, Replay};
use crate::policy::KeySource;
use crate::record::{FencingToken, OutcomeKind, Record, RecordId};
use crate::rejection::RejectionKind;
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, Store, StoreError,
    StoreFuture, StoreStats, TakeOverRequest,
};
use crate::time::Timestamp;

/// Keyed calls claimed and handed to the server to run. Counter.
pub const EXECUTIONS_TOTAL: &str = "mcp_idem_executions_total";
/// Retries answered with a recorded outcome, by `outcome` (`result`, `error`). Counter.
pub const REPLAYS_TOTAL: &str = "mcp_idem_replays_total";
/// Calls refused, by `type`: the `error.data.type` sent (`idempotency_key_conflict`,
/// `idempotency_key_in_progress`, ...). Counter.
pub const REJECTIONS_TOTAL: &str = "mcp_idem_rejections_total";
/// Calls passed through untouched, by `reason`: `no_key`, `mrtr_continuation`,
/// `missing_identifier` (a tool policy's identifier or key argument was absent and not
/// `required`), `store_down` (the store failed and the tool's policy runs it unprotected).
/// Counter.
pub const BYPASSES_TOTAL: &str = "mcp_idem_bypasses_total";
/// Decisions about keyed calls by the key's `source` (`sep`, `meta`, `key-from`, `argument`,
/// `window`) and `decision` (`execute`, `replay`, `reject`, `bypass`). Counter.
pub const DECISIONS_BY_KEY_SOURCE_TOTAL: &str = "mcp_idem_decisions_by_key_source_total";
/// Outcomes written to the store, by `outcome` (`success`, `error`, `not_retained`, `unknown`).
/// Counter.
pub const OUTCOMES_RECORDED_TOTAL: &str = "mcp_idem_outcomes_recorded_total";
/// Store operations that failed, by `operation` and `error` (`unavailable`, `backend`, `corrupt`).
/// Counter.
pub const STORE_ERRORS_TOTAL: &str = "mcp_idem_store_errors_total";
/// Fenced writes refused because the caller no longer owned the record, by `operation`. Counter.
pub const STORE_NOT_OWNER_TOTAL: &str = "mcp_idem_store_not_owner_total";
/// Time each store operation took, errors included, by `operation`. Histogram, seconds.
pub const STORE_OPERATION_DURATION_SECONDS: &str = "mcp_idem_store_operation_duration_seconds";
/// Records in the store, by `state` (`in_progress`, `completed`, `expired`), as of the last
/// [`set_record_counts`]. Gauge.
pub const RECORDS: &str = "mcp_idem_records";
/// Claims, take-overs and releases whose store answer was lost, so that they may hold their key,
/// by `fate`: `queued` (to be released), `dropped` (the queue was full: left to the lease).
/// Counter.
pub const AMBIGUOUS_CLAIMS_TOTAL: &str = "mcp_idem_ambiguous_claims_total";
/// Queued ambiguous claims that were dealt with, by `how`: `released` (a fenced release deleted
/// the record), `absent` (it held nothing: the claim had not been applied, or was gone), `expired`
/// (given up when its retention window ended). Counter.
pub const AMBIGUOUS_CLAIMS_RESOLVED_TOTAL: &str = "mcp_idem_ambiguous_claims_resolved_total";
/// Ambiguous claims waiting to be released. Gauge.
pub const AMBIGUOUS_CLAIMS_PENDING: &str = "mcp_idem_ambiguous_claims_pending";
/// Completions that failed and are being sent again in the background. Gauge.
pub const PENDING_COMPLETIONS: &str = "mcp_idem_pending_completions";
/// Completions sent again in the background, by `result`: `recorded` (applied), `not_owner` (the
/// record had been taken over), `error` (failed again). Counter.
pub const COMPLETION_RETRIES_TOTAL: &str = "mcp_idem_completion_retries_total";
/// Completions given up, their records left in progress until the lease runs out, by `why`:
/// `error` (an error that will not pass), `full` (1024 were retried already), `deadline` (the
/// retention window ended first). Counter.
pub const COMPLETIONS_LOST_TOTAL: &str = "mcp_idem_completions_lost_total";
/// `tools/call`s that carried no key and that no tool policy protected, to a tool that is not
/// read-only or idempotent by its annotations, by `tool`: a name the server listed in `tools/list`,
/// or `(unlisted)` (a tool not listed yet, or a name the server never listed). Counter.
pub const UNPROTECTED_CALLS_TOTAL: &str = "mcp_idem_unprotected_calls_total";
/// Time from a decided `tools/call`'s arrival to its answer (its outcome recorded), the MCP
/// semantic conventions' `mcp.server.operation.duration`, by `mcp_method_name` (`tools/call`),
/// `gen_ai_tool_name` (a tool the server listed, else `_OTHER`: a client cannot grow the series),
/// `error_type` (empty, a JSON-RPC code, `tool_error`, or an `idempotency_*` type) and
/// `mcp_idem_decision` (`execute`, `replay`, `conflict`, `in_progress`, `waited`, `bypass`,
/// `reject`). Histogram, seconds, on the conventions' buckets (0.01 s to 300 s). Recorded with
/// feature `otel`.
pub const OPERATION_DURATION_SECONDS: &str = "mcp_server_operation_duration_seconds";
/// Spans that never reached the collector, by `reason`: `queue_full` (more spans ended than the
/// export queue holds), `export_failed` (the collector could not be reached, refused the batch or
/// did not answer within the export timeout). Counter; only with feature `otel` and traces on.
pub const SPANS_DROPPED_TOTAL: &str = "mcp_idem_spans_dropped_total";

/// The record limits in force, by `limit`: `per_scope` (`--max-records-per-scope`), `total`
/// (`--max-records-total`); `u64::MAX` when unlimited. Set by
/// [`Deduplicator::new`](crate::Deduplicator::new) (see [`set_record_limits`]). Gauge.
pub const RECORD_LIMIT: &str = "mcp_idem_record_limit";

/// The store operations [`MeteredStore`] measures, as their `operation` label.
pub const STORE_OPERATIONS: [&str; 10] = [
    "claim",
    "complete",
    "take_over",
    "renew",
    "release",
    "get",
    "purge_expired",
    "stats",
    "list",
    "delete",
];

const REPLAY_OUTCOMES: [&str; 2] = ["result", "error"];
const BYPASS_REASONS: [&str; 4] = [
    "no_key",
    "mrtr_continuation",
    "missing_identifier",
    "store_down",
];
const KEY_SOURCE_DECISIONS: [&str; 4] = ["execute", "replay", "reject", "bypass"];
const OUTCOME_KINDS: [OutcomeKind; 4] = [
    OutcomeKind::Success,
    OutcomeKind::Error,
    OutcomeKind::NotRetained,
    OutcomeKind::Unknown,
];
const STORE_ERROR_KINDS: [&str; 3] = ["unavailable", "backend", "corrupt"];
const AMBIGUOUS_FATES: [&str; 2] = ["queued", "dropped"];
const AMBIGUOUS_RESOLUTIONS: [&str; 3] = ["released", "absent", "expired"];
const COMPLETION_RETRY_RESULTS: [&str; 3] = ["recorded", "not_owner", "error"];
const COMPLETION_LOSSES: [&str; 3] = ["error", "full", "deadline"];
#[cfg(feature = "otel")]
const SPAN_DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// Describes every metric to the installed recorder and creates each counter series at zero, so
/// that a scrape shows them (and rates work) before the first event.
pub fn describe() {
    describe_histogram!(
        OPERATION_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Time from a decided tools/call's arrival to its answer (mcp.server.operation.duration)"
    );
    describe_counter!(
        EXECUTIONS_TOTAL,
        "Keyed calls claimed and handed to the server to run"
    );
    describe_counter!(REPLAYS_TOTAL, "Retries answered with a recorded outcome");
    describe_counter!(REJECTIONS_TOTAL, "Calls refused, by error.data.type");
    describe_counter!(BYPASSES_TOTAL, "Calls passed through without idempotency");
    describe_counter!(
        DECISIONS_BY_KEY_SOURCE_TOTAL,
        "Decisions about keyed calls, by where the key came from"
    );
    describe_counter!(OUTCOMES_RECORDED_TOTAL, "Outcomes written to the store");
    describe_counter!(STORE_ERRORS_TOTAL, "Store operations that failed");
    describe_counter!(
        STORE_NOT_OWNER_TOTAL,
        "Fenced store writes refused because the caller no longer owned the record"
    );
    describe_histogram!(
        STORE_OPERATION_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Time each store operation took"
    );
    describe_gauge!(RECORDS, "Records in the store, by state");
    describe_gauge!(RECORD_LIMIT, "Record limits in force, by limit");
    describe_counter!(
        AMBIGUOUS_CLAIMS_TOTAL,
        "Claims whose store answer was lost, so that they may hold their key"
    );
    describe_counter!(
        AMBIGUOUS_CLAIMS_RESOLVED_TOTAL,
        "Claims whose store answer was lost, released or found to hold nothing"
    );
    describe_gauge!(
        AMBIGUOUS_CLAIMS_PENDING,
        "Claims whose store answer was lost, waiting to be released"
    );
    describe_gauge!(
        PENDING_COMPLETIONS,
        "Completions that failed, being sent again in the background"
    );
    describe_counter!(
        COMPLETION_RETRIES_TOTAL,
        "Completions sent again in the background, by result"
    );
    describe_counter!(
        UNPROTECTED_CALLS_TOTAL,
        "Key-less calls no tool policy protected, to tools that may change things, by tool"
    );
    describe_counter!(
        COMPLETIONS_LOST_TOTAL,
        "Completions given up, their records left to their leases"
    );
    #[cfg(feature = "otel")]
    describe_counter!(
        SPANS_DROPPED_TOTAL,
        "Spans that never reached the OpenTelemetry collector, by reason"
    );

    counter!(EXECUTIONS_TOTAL).increment(0);
    for outcome in REPLAY_OUTCOMES {
        counter!(REPLAYS_TOTAL, "outcome" => outcome).increment(0);
    }
    for kind in RejectionKind::ALL {
        counter!(REJECTIONS_TOTAL, "type" => kind.as_str()).increment(0);
    }
    for reason in BYPASS_REASONS {
        counter!(BYPASSES_TOTAL, "reason" => reason).increment(0);
    }
    for kind in OUTCOME_KINDS {
        counter!(OUTCOMES_RECORDED_TOTAL, "outcome" => kind.as_str()).increment(0);
    }
    for source in KeySource::ALL {
        for decision in KEY_SOURCE_DECISIONS {
            counter!(DECISIONS_BY_KEY_SOURCE_TOTAL, "source" => source.as_str(), "decision" => decision)
                .increment(0);
        }
    }
    for operation in STORE_OPERATIONS {
        for error in STORE_ERROR_KINDS {
            counter!(STORE_ERRORS_TOTAL, "operation" => operation, "error" => error).increment(0);
        }
    }
    for operation in ["complete", "take_over", "renew", "release"] {
        counter!(STORE_NOT_OWNER_TOTAL, "operation" => operation).increment(0);
    }
    for fate in AMBIGUOUS_FATES {
        counter!(AMBIGUOUS_CLAIMS_TOTAL, "fate" => fate).increment(0);
    }
    for how in AMBIGUOUS_RESOLUTIONS {
        counter!(AMBIGUOUS_CLAIMS_RESOLVED_TOTAL, "how" => how).increment(0);
    }
    gauge!(AMBIGUOUS_CLAIMS_PENDING).set(0.0);
    for result in COMPLETION_RETRY_RESULTS {
        counter!(COMPLETION_RETRIES_TOTAL, "result" => result).increment(0);
    }
    for why in COMPLETION_LOSSES {
        counter!(COMPLETIONS_LOST_TOTAL, "why" => why).increment(0);
    }
    gauge!(PENDING_COMPLETIONS).set(0.0);
    #[cfg(feature = "otel")]
    for reason in SPAN_DROP_REASONS {
        counter!(SPANS_DROPPED_TOTAL, "reason" => reason).increment(0);
    }
}

/// Publishes the counts of [`Store::stats`] as the [`RECORDS`] gauge.
pub fn set_record_counts(stats: &StoreStats) {
    gauge!(RECORDS, "state" => "in_progress").set(stats.in_progress as f64);
    gauge!(RECORDS, "state" => "completed").set(stats.completed as f64);
    gauge!(RECORDS, "state" => "expired").set(stats.expired as f64);
}

/// Publishes `limits` as the [`RECORD_LIMIT`] gauge, so that alerts can compare [`RECORDS`] with
/// them.
pub fn set_record_limits(limits: &RecordLimits) {
    gauge!(RECORD_LIMIT, "limit" => "per_scope").set(limits.max_records_per_scope as f64);
    gauge!(RECORD_LIMIT, "limit" => "total").set(limits.max_records_total as f64);
}

/// Counts a keyed call's decision by its key's source, then as [`on_decision`].
pub(crate) fn on_keyed_decision<C>(decision: &Decision<C>, source: KeySource) {
    let what = match decision {
        Decision::Execute(_) => "execute",
        Decision::Replay(_) => "replay",
        Decision::Reject(_) => "reject",
        Decision::Bypass(_) => "bypass",
    };
    counter!(DECISIONS_BY_KEY_SOURCE_TOTAL, "source" => source.as_str(), "decision" => what)
        .increment(1);
    on_decision(decision);
}

/// The counter of key-less `tools/call`s that no policy protected, for `tool` (a listed name, or
/// `(unlisted)`): made once per label by the listing, then only incremented.
pub(crate) fn unprotected_calls(tool: SharedString) -> metrics::Counter {
    counter!(UNPROTECTED_CALLS_TOTAL, "tool" => tool)
}

/// Counts a `tools/call` its tool's policy wanted an identifier for and that had none.
pub(crate) fn on_missing_identifier() {
    counter!(BYPASSES_TOTAL, "reason" => "missing_identifier").increment(1);
}

pub(crate) fn on_decision<C>(decision: &Decision<C>) {
    // Label values written out per arm: a literal label is a static key, one from a variable
    // allocates its key for every call (and every call without a key passes here).
    match decision {
        Decision::Execute(_) => counter!(EXECUTIONS_TOTAL).increment(1),
        Decision::Replay(Replay::Result(_)) => {
            counter!(REPLAYS_TOTAL, "outcome" => "result").increment(1);
        }
        Decision::Replay(Replay::Error(_)) => {
            counter!(REPLAYS_TOTAL, "outcome" => "error").increment(1);
        }
        Decision::Reject(rejection) => {
            counter!(REJECTIONS_TOTAL, "type" => rejection.kind().as_str()).increment(1);
        }
        Decision::Bypass(BypassReason::NoKey) => {
            counter!(BYPASSES_TOTAL, "reason" => "no_key").increment(1);
        }
        Decision::Bypass(BypassReason::MrtrContinuation) => {
            counter!(BYPASSES_TOTAL, "reason" => "mrtr_continuation").increment(1);
        }
        Decision::Bypass(BypassReason::StoreDown) => {
            counter!(BYPASSES_TOTAL, "reason" => "store_down").increment(1);
        }
    }
}

pub(crate) fn on_outcome_recorded(kind: OutcomeKind) {
    counter!(OUTCOMES_RECORDED_TOTAL, "outcome" => kind.as_str()).increment(1);
}

pub(crate) fn on_ambiguous(queued: bool) {
    let fate = if queued { "queued" } else { "dropped" };
    counter!(AMBIGUOUS_CLAIMS_TOTAL, "fate" => fate).increment(1);
}

pub(crate) fn on_ambiguous_resolved(how: &'static str, n: usize) {
    counter!(AMBIGUOUS_CLAIMS_RESOLVED_TOTAL, "how" => how).increment(n as u64);
}

pub(crate) fn set_ambiguous_pending(n: usize) {
    gauge!(AMBIGUOUS_CLAIMS_PENDING).set(n as f64);
}

pub(crate) fn set_pending_completions(n: usize) {
    gauge!(PENDING_COMPLETIONS).set(n as f64);
}

pub(crate) fn on_completion_retry(result: &'static str) {
    counter!(COMPLETION_RETRIES_TOTAL, "result" => result).increment(1);
}

pub(crate) fn on_completion_lost(why: &'static str) {
    counter!(COMPLETIONS_LOST_TOTAL, "why" => why).increment(1);
}

/// A [`Store`] that times every operation of the store it wraps and counts its failures.
///
/// Emits [`STORE_OPERATION_DURATION_SECONDS`], [`STORE_ERRORS_TOTAL`] and
/// [`STORE_NOT_OWNER_TOTAL`]; answers are passed through unchanged. Install the recorder before
/// creating it: the latency histograms are registered once, here.
#[derive(Debug)]
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    /// One histogram per entry of [`STORE_OPERATIONS`], in that order.
    latency: Vec<metrics::Histogram>,
}

impl MeteredStore {
    /// Measures `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        let latency = STORE_OPERATIONS
            .iter()
            .map(
                |&operation| histogram!(STORE_OPERATION_DURATION_SECONDS, "operation" => operation),
            )
            .collect();
        Self { inner, latency }
    }

    fn latency(&self, operation: &'static str) -> &metrics::Histogram {
        let index = STORE_OPERATIONS
            .iter()
            .position(|&known| known == operation)
            .unwrap_or(0);
        &self.latency[index]
    }

    /// The measured store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }
}

async fn timed<T>(
    latency: &metrics::Histogram,
    operation: &'static str,
    future: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = future.await;
    latency.record(started.elapsed().as_secs_f64());
    if let Err(err) = &result {
        let error = match err {
            StoreError::Unavailable { .. } | StoreError::InvalidUrl { .. } => "unavailable",
            StoreError::Backend { .. } => "backend",
            StoreError::Corrupt(_) => "corrupt",
        };
        counter!(STORE_ERRORS_TOTAL, "operation" => operation, "error" => error).increment(1);
    }
    result
}

async fn fenced(
    latency: &metrics::Histogram,
    operation: &'static str,
    future: impl Future<Output = Result<Fenced, StoreError>>,
) -> Result<Fenced, StoreError> {
    let result = timed(latency, operation, future).await;
    if let Ok(Fenced::NotOwner) = result {
        counter!(STORE_NOT_OWNER_TOTAL, "operation" => operation).increment(1);
    }
    result
}

impl Store for MeteredStore {
    fn system(&self) -> Option<&'static str> {
        self.inner.system()
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(timed(self.latency("claim"), "claim", self.inner.claim(req)))
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        Box::pin(fenced(
            self.latency("complete"),
            "complete",
            self.inner.complete(req),
        ))
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(fenced(
            self.latency("take_over"),
            "take_over",
            self.inner.take_over(req),
        ))
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(fenced(
            self.latency("renew"),
            "renew",
            self.inner.renew(id, owner, lease_expires_at),
        ))
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        Box::pin(fenced(
            self.latency("release"),
            "release",
            self.inner.release(id, owner),
        ))
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        Box::pin(timed(self.latency("get"), "get", self.inner.get(id, now)))
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        Box::pin(timed(
            self.latency("purge_expired"),
            "purge_expired",
            self.inner.purge_expired(now),
        ))
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        Box::pin(timed(self.latency("stats"), "stats", self.inner.stats(now)))
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        Box::pin(timed(
            self.latency("list"),
            "list",
            self.inner.list(filter, now, limit),
        ))
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        Box::pin(timed(
            self.latency("delete"),
            "delete",
            self.inner.delete(id),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    crate::store_test_suite!(|| async {
        Arc::new(MeteredStore::new(Arc::new(MemoryStore::new()))) as Arc<dyn Store>
    });
}
