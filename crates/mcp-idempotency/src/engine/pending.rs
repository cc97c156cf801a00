//! One call's decision in progress ([`PendingDecision`]): the whole sequence of a call, from its
//! first store request to the decision on its own terms.
//!
//! ```text
//!                      ┌─ the client's own key beside a business identifier ─┐
//!   Engine::begin ──► Step::ReadClientKey ──store.get──► on_client_key ──────┤
//!        │                                                                    ▼
//!        └──────────► Step::TryClaim ──store.claim──► on_claim ──► Step::TakeOver ──► on_take_over
//!                                                         │                              │
//!                                                         ▼                              ▼
//!                                     Step::Done(the decision, on the call's terms) ◄────┘
//! ```

use serde_json::Value;

use super::{BypassReason, Claim, Companion, Decision, Engine, Replay, Step, ToolCall};
use crate::policy::{KeySource, KeyTerms};
use crate::raw_object::{json_string, RawObject};
use crate::record::{FencingToken, Record, RecordState, Scope, TraceLink};
use crate::rejection::RejectionKind;
use crate::store::{ClaimOutcome, ClaimRequest, Fenced, StoreError, TakeOverRequest};
use crate::time::Timestamp;

/// The `_meta` member of a replayed result whose key the client did not send (a business
/// identifier, a key argument, a window): its value is the key's source (`"key-from"`,
/// `"argument"`, `"window"`). Replays of a client's key (SEP, `_meta`) stay byte for byte.
pub const REPLAYED_META: &str = "mcp-idem/replayed";

/// The decision of one call in progress: the engine's state machine for it, sans-IO.
///
/// [`Engine::begin`] returns it with the first [`Step`]; the caller does what each step says
/// against its store and passes the answer back, until [`Step::Done`]. The sequence is the
/// engine's: the client's own key read first when a business identifier decides the call, the
/// claims and take-overs, the client's key recorded beside, and the decision settled on the
/// call's terms (its retention and error policy, a conflict named as the client knows the key, a
/// store outage run unprotected if the tool says so, a replay of a key the client did not send
/// marked in `_meta`).
#[derive(Clone, Debug)]
pub struct PendingDecision<'a> {
    engine: &'a Engine,
    scope: &'a Scope,
    call: ToolCall<'a>,
    owner: FencingToken,
    now: Timestamp,
    /// The terms of the client's own key while its record decides the call; `None` once the
    /// call's own key does.
    client_key: Option<KeyTerms>,
    /// The claim of the client's key, found free: recorded beside the call's outcome.
    companion: Option<ClaimRequest>,
    /// The record of the client's key, found in progress with its lease run out, while the
    /// business identifier's record is read ([`Step::ReadIdentifier`]).
    stale_client_key: Option<(ClaimRequest, Record)>,
    /// The trace of the last record found under a key of the call.
    linked: Option<TraceLink>,
}

impl<'a> PendingDecision<'a> {
    /// Starts deciding `call` ([`Engine::begin`]).
    pub(super) fn start(
        engine: &'a Engine,
        scope: &'a Scope,
        call: ToolCall<'a>,
        owner: FencingToken,
        now: Timestamp,
    ) -> (Self, Step) {
        let mut pending = Self {
            engine,
            scope,
            call,
            owner,
            now,
            client_key: None,
            companion: None,
            stale_client_key: None,
            linked: None,
        };
        let client_key = call.terms.of_client_key();
        #[cfg(feature = "simulation")]
        let client_key = client_key.filter(|_| {
            !crate::simulation::is_on(crate::simulation::Mutant::ClaimForgetsClientKey)
        });
        let step = match client_key {
            Some((terms, key)) => {
                let own = ToolCall {
                    idempotency_key: Some(key),
                    terms: &terms,
                    ..call
                };
                match engine.claim_request(scope, &own, owner, now) {
                    Ok(req) => {
                        pending.client_key = Some(terms);
                        Step::ReadClientKey(req)
                    }
                    // An invalid key of the client's is refused as the SEP says.
                    Err(decision) => Step::Done(decision),
                }
            }
            None => pending.begin_own_key(),
        };
        let step = pending.settled(step);
        (pending, step)
    }

    /// The answer to [`Step::ReadClientKey`]: no record lets the call's own key decide (and the
    /// client's key is recorded beside it); a record decides the call as the SEP says, as a
    /// claim that found it would.
    pub fn on_client_key(
        &mut self,
        req: ClaimRequest,
        answer: Result<Option<Record>, StoreError>,
    ) -> Step {
        let step = match answer {
            // The client's key holds a claim whose owner stopped before recording an outcome:
            // most often the record beside this identifier, whose completion never landed (its
            // gateway died after recording the identifier's outcome, or before). Taking it over
            // or answering `idempotency_outcome_unknown` would ignore the identifier's record,
            // which may hold the outcome, or stay in progress to be taken over by the next call:
            // that record is read first and decides (found by the simulator, issue 40).
            Ok(Some(record)) if stale(&record, &req) => {
                match self
                    .engine
                    .claim_request(self.scope, &self.call, self.owner, self.now)
                {
                    Ok(identifier) => {
                        self.stale_client_key = Some((req, record));
                        Step::ReadIdentifier(identifier)
                    }
                    Err(decision) => Step::Done(decision),
                }
            }
            Ok(Some(record)) => {
                self.linked = record.trace;
                self.engine.on_existing(req, record)
            }
            Ok(None) => {
                self.client_key = None;
                self.companion = Some(req);
                self.begin_own_key()
            }
            Err(err) => {
                self.client_key = None;
                self.engine.on_claim(req, Err(err))
            }
        };
        self.settled(step)
    }

    /// The answer to [`Step::ReadIdentifier`]: a record of the business identifier decides the
    /// call (its outcome replayed; a running call in progress; a call whose owner stopped taken
    /// over or refused by `after-crash`, under the identifier, so that a later call by the
    /// identifier finds the outcome); with none, the client's key's record decides, as the SEP
    /// says of a claim whose owner stopped.
    pub fn on_identifier(
        &mut self,
        req: ClaimRequest,
        answer: Result<Option<Record>, StoreError>,
    ) -> Step {
        let step = match (answer, self.stale_client_key.take()) {
            (Ok(Some(record)), _) => {
                self.client_key = None;
                self.linked = record.trace;
                self.engine.on_existing(req, record)
            }
            (_, Some((client_req, client_record))) => {
                self.linked = client_record.trace;
                self.engine.on_existing(client_req, client_record)
            }
            // Never read without a stale record of the client's key: decide by the identifier.
            (_, None) => self.begin_own_key(),
        };
        self.settled(step)
    }

    /// The store's answer to [`Step::TryClaim`].
    pub fn on_claim(
        &mut self,
        req: ClaimRequest,
        answer: Result<ClaimOutcome, StoreError>,
    ) -> Step {
        if let Ok(ClaimOutcome::Existing(record)) = &answer {
            self.linked = record.trace;
        }
        let step = self.engine.on_claim(req, answer);
        self.settled(step)
    }

    /// The store's answer to [`Step::TakeOver`].
    pub fn on_take_over(
        &mut self,
        req: TakeOverRequest,
        answer: Result<Fenced, StoreError>,
    ) -> Step {
        let step = self.engine.on_take_over(req, answer);
        self.settled(step)
    }

    /// The trace of the call whose record decided this one ([`Record::trace`]), when that call
    /// was traced: the execution a replay replays, the running call a duplicate found in
    /// progress, the call a conflict's key belongs to. Telemetry links the call's span to it.
    pub fn linked(&self) -> Option<TraceLink> {
        self.linked
    }

    fn begin_own_key(&self) -> Step {
        match self
            .engine
            .claim_request(self.scope, &self.call, self.owner, self.now)
        {
            Ok(req) => Step::TryClaim(req),
            Err(decision) => Step::Done(decision),
        }
    }

    /// `step`, its decision settled on the terms of the key that decided it.
    fn settled(&mut self, step: Step) -> Step {
        let Step::Done(decision) = step else {
            return step;
        };
        let decision = match (decision, self.companion.take()) {
            (Decision::Execute(mut claim), Some(req)) => {
                claim.companion = Some(Companion(Box::new(req)));
                Decision::Execute(claim)
            }
            (decision, _) => decision,
        };
        Step::Done(self.settle(decision))
    }

    /// Applies the terms of the key that decided the call (its own, or its client's key read
    /// first) to the decision the store's answers led to.
    fn settle(&self, decision: Decision) -> Decision {
        let decided = self.client_key.as_ref().unwrap_or(self.call.terms);
        let source = decided.source;
        // A refusal of a call that carries the client's own key names that key, as the client
        // knows it, not the business identifier's.
        let decision = match (decision, &self.call.terms.client_key) {
            (Decision::Reject(rejection), Some((_, Value::String(own)))) => {
                Decision::Reject(rejection.with_key(own))
            }
            (decision, _) => decision,
        };
        match decision {
            Decision::Execute(claim) => Decision::Execute(Claim {
                retention: decided.retention.unwrap_or(self.engine.config().retention),
                forget_errors: decided.forget_errors,
                ..claim
            }),
            Decision::Reject(rejection)
                if matches!(
                    rejection.kind(),
                    RejectionKind::StoreUnavailable | RejectionKind::QuotaExceeded
                ) && decided.run_unprotected_if_store_down =>
            {
                tracing::warn!(
                    tool = self.call.tool_name,
                    source = source.as_str(),
                    reason = rejection.message(),
                    "running a call unprotected, as its tool's policy says (store-down = \"run-unprotected\")"
                );
                Decision::Bypass(BypassReason::StoreDown)
            }
            Decision::Reject(rejection) if rejection.kind() == RejectionKind::KeyConflict => {
                match &decided.shown_as {
                    None => Decision::Reject(rejection),
                    Some(shown) => Decision::Reject(rejection.with_message(format!(
                        "{shown} was already used for another call of this tool with different \
                         arguments; one {} is one operation, so this call was not run",
                        source.noun()
                    ))),
                }
            }
            Decision::Replay(Replay::Result(raw)) if !source.is_client_key() => {
                Decision::Replay(Replay::Result(mark_replayed(&raw, source)))
            }
            decision => decision,
        }
    }
}

impl Engine {
    /// Starts deciding a call: validates its key, fingerprints its arguments and says what to ask
    /// the store first. `owner` is a fresh token ([`FencingToken::random`]) for the claims this
    /// call makes; `now` is the current time.
    pub fn begin<'a>(
        &'a self,
        scope: &'a Scope,
        call: ToolCall<'a>,
        owner: FencingToken,
        now: Timestamp,
    ) -> (PendingDecision<'a>, Step) {
        PendingDecision::start(self, scope, call, owner, now)
    }
}

/// `result` with `_meta[REPLAYED_META] = source`; as it was if it is not an object.
fn mark_replayed(result: &str, source: KeySource) -> String {
    let Some(object) = RawObject::parse(result) else {
        return result.to_owned();
    };
    let meta = object
        .get("_meta")
        .and_then(|m| RawObject::parse(m.get()))
        .unwrap_or_default()
        .to_string_with(REPLAYED_META, &json_string(source.as_str()));
    object.to_string_with("_meta", &meta)
}

/// Whether `record`, found under the key `req` claims, is a claim whose owner stopped renewing
/// its lease before recording an outcome (with the same call: another call is a conflict).
fn stale(record: &Record, req: &ClaimRequest) -> bool {
    record.fingerprint == req.fingerprint
        && matches!(record.state, RecordState::InProgress { lease_expires_at, .. }
            if lease_expires_at <= req.now)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::EngineConfig;
    use crate::record::{Outcome, RecordState};
    use crate::rejection::RejectionKind;

    const ARGS: &str = r#"{"order_id":"o-1","amount":1}"#;

    /// The terms of a call a business identifier decides, carrying the client's SEP key `k-1`.
    fn identifier_with_client_key() -> KeyTerms {
        KeyTerms {
            shown_as: Some(r#"/order_id = "o-1""#.to_owned()),
            ..KeyTerms::new(KeySource::KeyFrom, None)
        }
        .with_client_key(KeySource::Sep, json!("k-1"))
    }

    fn scope() -> Scope {
        Scope::new("mcp-server:payments", "alice")
    }

    /// A call of `charge` keyed by the identifier's `digest` on `terms`.
    fn charge<'a>(digest: &'a Value, terms: &'a KeyTerms) -> ToolCall<'a> {
        ToolCall {
            tool_name: "charge",
            arguments: Some(ARGS),
            idempotency_key: Some(digest),
            terms,
            ..ToolCall::default()
        }
    }

    fn completed(req: &ClaimRequest, fingerprint_of: &ClaimRequest, result: &str) -> Record {
        Record {
            trace: None,
            id: req.id.clone(),
            fingerprint: fingerprint_of.fingerprint,
            tool_name: "charge".into(),
            state: RecordState::Completed {
                outcome: Outcome::Success(result.into()),
                completed_at: req.now,
            },
            created_at: req.now,
            expires_at: req.expires_at,
        }
    }

    /// Begins the call and expects the engine to ask for the client's key first.
    fn begin<'a>(
        engine: &'a Engine,
        scope: &'a Scope,
        call: ToolCall<'a>,
    ) -> (PendingDecision<'a>, ClaimRequest) {
        let (pending, step) = engine.begin(
            scope,
            call,
            FencingToken::from_u64(7),
            Timestamp::from_millis(1_000),
        );
        let Step::ReadClientKey(req) = step else {
            panic!("the client's key is read first: {step:?}");
        };
        assert_eq!(req.id.key.as_str(), "k-1");
        (pending, req)
    }

    #[test]
    fn the_engine_reads_the_clients_key_then_claims_the_identifier_and_records_beside() {
        let engine = Engine::new(EngineConfig::default());
        let (scope, digest, terms) = (scope(), json!("d1gest"), identifier_with_client_key());
        let call = charge(&digest, &terms);
        let (mut pending, own) = begin(&engine, &scope, call);
        // No record of the client's key: the identifier's key is claimed next.
        let Step::TryClaim(req) = pending.on_client_key(own.clone(), Ok(None)) else {
            panic!("the identifier is claimed next");
        };
        assert_eq!(req.id.key.as_str(), "\u{1F}key-from:charge:d1gest");
        let Step::Done(Decision::Execute(mut claim)) =
            pending.on_claim(req, Ok(ClaimOutcome::Claimed))
        else {
            panic!("the call runs");
        };
        // The client's key is recorded beside it, with the same outcome.
        let beside = engine.beside(claim.take_companion().expect("a companion"), own.now);
        assert_eq!(beside.id, own.id);
        let (_, done) = engine
            .record_beside(
                beside,
                Ok(ClaimOutcome::Claimed),
                Outcome::Success("{}".into()),
            )
            .expect("the client's key is recorded");
        assert_eq!(done.id, own.id);
    }

    #[test]
    fn a_record_of_the_clients_key_decides_as_the_sep_says() {
        let engine = Engine::new(EngineConfig::default());
        let (scope, digest, terms) = (scope(), json!("d1gest"), identifier_with_client_key());
        let call = charge(&digest, &terms);
        // The same call recorded under the client's key: replayed byte for byte (not marked).
        let (mut pending, own) = begin(&engine, &scope, call);
        let record = completed(&own, &own, r#"{"content":[]}"#);
        let Step::Done(Decision::Replay(Replay::Result(raw))) =
            pending.on_client_key(own, Ok(Some(record)))
        else {
            panic!("replayed");
        };
        assert_eq!(raw, r#"{"content":[]}"#);

        // Another call recorded under it: the SEP's conflict, naming the client's key.
        let (mut pending, own) = begin(&engine, &scope, call);
        let other_args = ToolCall {
            arguments: Some(r#"{"order_id":"o-1","amount":2}"#),
            ..call
        };
        let (_, other) = begin(&engine, &scope, other_args);
        let record = completed(&own, &other, "{}");
        let Step::Done(Decision::Reject(conflict)) = pending.on_client_key(own, Ok(Some(record)))
        else {
            panic!("a conflict");
        };
        assert_eq!(conflict.kind(), RejectionKind::KeyConflict);
        assert_eq!(conflict.key(), Some("k-1"));
        assert!(
            conflict
                .message()
                .starts_with("idempotencyKey was already used"),
            "{}",
            conflict.message()
        );

        // The store does not answer: refused, naming the client's key.
        let (mut pending, own) = begin(&engine, &scope, call);
        let down = StoreError::Unavailable {
            message: "connection reset".into(),
            source: None,
        };
        let Step::Done(Decision::Reject(refused)) = pending.on_client_key(own, Err(down)) else {
            panic!("refused");
        };
        assert_eq!(refused.kind(), RejectionKind::StoreUnavailable);
        assert_eq!(refused.key(), Some("k-1"));
    }

    #[test]
    fn an_invalid_client_key_is_refused_before_any_store_request() {
        let engine = Engine::new(EngineConfig::default());
        let (scope, digest) = (scope(), json!("d1gest"));
        let terms =
            KeyTerms::new(KeySource::KeyFrom, None).with_client_key(KeySource::Sep, json!(42));
        let call = charge(&digest, &terms);
        let (_, step) = engine.begin(
            &scope,
            call,
            FencingToken::from_u64(7),
            Timestamp::from_millis(1_000),
        );
        let Step::Done(Decision::Reject(refused)) = step else {
            panic!("refused at once: {step:?}");
        };
        assert_eq!(refused.kind(), RejectionKind::KeyInvalid);
    }
}
