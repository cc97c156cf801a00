//! The sans-IO decision engine.
//!
//! The engine decides what happens to a `tools/call`; it never touches a socket, a clock or a store.
//! The caller feeds it the request and the store's answers, and it says what to do next:
//!
//! ```text
//!   begin(scope, call, token, now) ──► Step::TryClaim(req) ──store.claim──► on_claim(req, answer)
//!        │                                                                    │
//!        ▼                                                                    ▼
//!   Step::Done(Decision)  ◄── on_take_over(req, answer) ◄──store.take_over── Step::TakeOver(req)
//! ```
//!
//! [`Deduplicator`](crate::Deduplicator) is the ready-made async driver of this loop.

use std::time::Duration;

use serde_json::Value;

use crate::config::{AfterCrash, EngineConfig};
use crate::fingerprint::{fingerprint, ArgumentsError};
use crate::jsonrpc;
use crate::key::{IdempotencyKey, KeySource};
use crate::policy::{OnError, StoreDown, ToolPolicy};
use crate::protocol::IDEMPOTENCY_KEY;
use crate::raw_object::{json_string, RawObject};
use crate::record::{FencingToken, Outcome, Record, RecordId, RecordState, Scope};
use crate::rejection::{Rejection, RejectionKind};
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, QuotaExceeded, StoreError, TakeOverRequest,
};
use crate::time::Timestamp;

/// The facts of one `tools/call` request that matter for idempotency.
#[derive(Clone, Copy, Debug, Default)]
pub struct ToolCall<'a> {
    /// `params.name`.
    pub tool_name: &'a str,
    /// The raw JSON text of `params.arguments`, or `None` when absent.
    pub arguments: Option<&'a str>,
    /// The key as the call carries it (see [`key_source`](Self::key_source)): the raw
    /// `params.idempotencyKey`, `_meta` or argument value, or the business identifier's digest;
    /// `None` when absent (and for a duplicate window, keyed by the call's fingerprint).
    pub idempotency_key: Option<&'a Value>,
    /// Whether the request is an MRTR continuation (`params.requestState` or
    /// `params.inputResponses` present).
    pub mrtr_continuation: bool,
    /// Where the key came from ([`KeySource::Sep`] unless a tool policy chose another).
    pub key_source: KeySource,
    /// How the key is named to a person, when it is not the SEP's (`/order_id = "ord_1"`,
    /// `_meta.idempotencyKey`, `argument idempotency_key`): error messages use it.
    pub identifier: Option<&'a str>,
    /// The tool's policy, when it has one: retention of a window, what an error outcome leaves,
    /// what a store outage does.
    pub policy: Option<&'a ToolPolicy>,
    /// The client's own key (SEP or `_meta`) when a business identifier decides a call that also
    /// carries one: the SEP's rules still hold for it (see [`Engine::client_key_claim`]).
    pub client_key: Option<(KeySource, &'a Value)>,
}

impl ToolCall<'_> {
    /// How long a duplicate of this call that finds it still running waits for its outcome rather
    /// than be refused at once (`None`: refused at once). Only a key the client did not send
    /// waits: a client with its own key can retry with it, as the SEP says.
    pub fn duplicate_wait(&self) -> Option<std::time::Duration> {
        self.policy
            .filter(|policy| policy.waits(self.key_source, self.client_key.is_some()))
            .map(ToolPolicy::wait)
    }
}

/// Why a call is forwarded without deduplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BypassReason {
    /// The request carries no `idempotencyKey`.
    NoKey,
    /// The request is an MRTR continuation, which the SEP leaves out of scope. Clients (the
    /// TypeScript SDK among them) re-send the original key on continuations, so these must neither
    /// replay nor conflict.
    MrtrContinuation,
    /// The store could not be reached (or a quota was full), and the tool's policy says to run
    /// it unprotected (`store-down = "run-unprotected"`).
    StoreDown,
}

/// Ownership of a claimed key: proof that the caller may run the tool and must record its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    id: RecordId,
    owner: FencingToken,
    lease_expires_at: Timestamp,
    /// How long the outcome is kept once recorded (a window's length for a window's key).
    retention: Duration,
    /// Whether an error outcome is forgotten (the record dropped) rather than recorded.
    forget_errors: bool,
    /// The record of the client's own key, written beside the business identifier's with the
    /// same outcome.
    companion: Option<Companion>,
}

/// The claim of a client's key recorded beside a business identifier's record. Two are equal
/// when they name the same record.
#[derive(Clone, Debug)]
pub(crate) struct Companion(pub(crate) Box<ClaimRequest>);

impl PartialEq for Companion {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Companion {}

impl Claim {
    /// Scope and key of the claimed record.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The fencing token that proves ownership.
    pub fn owner(&self) -> FencingToken {
        self.owner
    }

    /// When the lease runs out unless renewed.
    pub fn lease_expires_at(&self) -> Timestamp {
        self.lease_expires_at
    }

    /// Whether an error outcome of this call is forgotten rather than recorded
    /// ([`OnError::Forget`] under a key that is not the client's).
    pub fn forgets_errors(&self) -> bool {
        self.forget_errors
    }

    pub(crate) fn take_companion(&mut self) -> Option<Companion> {
        self.companion.take()
    }
}

/// A recorded outcome to send back instead of running the tool again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Send a JSON-RPC response whose `result` is this raw JSON text, byte for byte.
    Result(String),
    /// Send a JSON-RPC response whose `error` is this raw JSON text, byte for byte.
    Error(String),
}

impl Replay {
    /// The complete JSON-RPC response for a request with the given `id`.
    pub fn to_response(&self, id: &Value) -> String {
        self.to_response_raw(&id.to_string())
    }

    /// [`Replay::to_response`] for an id given as JSON text.
    pub fn to_response_raw(&self, id_json: &str) -> String {
        match self {
            Self::Result(raw) => jsonrpc::raw_result_response(id_json, raw),
            Self::Error(raw) => jsonrpc::raw_error_response(id_json, raw),
        }
    }
}

impl AsRef<Claim> for Claim {
    fn as_ref(&self) -> &Claim {
        self
    }
}

/// What to do with a `tools/call`.
///
/// The engine decides with a plain [`Claim`] (`Decision<Claim>`); the
/// [`Deduplicator::begin`](crate::Deduplicator::begin) hands the caller a
/// [`RunningClaim`](crate::RunningClaim) instead, which renews its own lease.
#[must_use]
#[derive(Clone, Debug, PartialEq)]
pub enum Decision<C = Claim> {
    /// Forward the request as it is; record nothing.
    Bypass(BypassReason),
    /// Forward the request: the key is now owned by the caller, who must renew the lease while the
    /// call runs and then record the outcome ([`Engine::completion`]), or release the claim if the
    /// call certainly did not run.
    Execute(C),
    /// Do not forward: answer with the recorded outcome under the new request's id.
    Replay(Replay),
    /// Do not forward: answer with this error.
    Reject(Rejection),
}

impl<C> Decision<C> {
    /// The same decision, with the claim of an [`Execute`](Self::Execute) turned into `f(claim)`.
    pub fn map_claim<D>(self, f: impl FnOnce(C) -> D) -> Decision<D> {
        match self {
            Self::Bypass(reason) => Decision::Bypass(reason),
            Self::Execute(claim) => Decision::Execute(f(claim)),
            Self::Replay(replay) => Decision::Replay(replay),
            Self::Reject(rejection) => Decision::Reject(rejection),
        }
    }
}

/// The next thing the caller must do.
#[must_use]
#[derive(Clone, Debug)]
pub enum Step {
    /// The decision is made.
    Done(Decision),
    /// Run this claim against the store, then pass the answer to [`Engine::on_claim`].
    TryClaim(ClaimRequest),
    /// Run this take-over against the store, then pass the answer to [`Engine::on_take_over`].
    TakeOver(TakeOverRequest),
}

/// The SEP-3182 decision logic. Cheap to clone; holds only its configuration.
#[derive(Clone, Debug, Default)]
pub struct Engine {
    config: EngineConfig,
}

impl Engine {
    /// An engine with the given settings.
    pub fn new(config: EngineConfig) -> Self {
        Self { config }
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Starts deciding a call: validates the key, fingerprints the arguments and prepares the claim.
    /// `owner` is a fresh token ([`FencingToken::random`]); `now` is the current time.
    pub fn begin(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        owner: FencingToken,
        now: Timestamp,
    ) -> Step {
        if call.mrtr_continuation {
            return Step::Done(Decision::Bypass(BypassReason::MrtrContinuation));
        }
        let source = call.key_source;
        let raw_key = match call.idempotency_key {
            Some(raw_key) => raw_key,
            None if source == KeySource::Window => &Value::Null,
            None => return Step::Done(Decision::Bypass(BypassReason::NoKey)),
        };
        let max_key = self.config.max_key_bytes;
        let client_key = match source {
            KeySource::Sep | KeySource::Meta | KeySource::Argument => {
                match IdempotencyKey::from_json(raw_key, max_key) {
                    Ok(key) => Some(key),
                    Err(err) => {
                        let mut message = err.to_string();
                        if let Some(name) = call.identifier.filter(|_| source != KeySource::Sep) {
                            message = message.replacen(IDEMPOTENCY_KEY, name, 1);
                        }
                        let mut rejection = Rejection::new(RejectionKind::KeyInvalid, message);
                        if let Value::String(key) = raw_key {
                            if key.len() <= max_key {
                                rejection = rejection.with_key(key);
                            }
                        }
                        return reject(rejection);
                    }
                }
            }
            KeySource::KeyFrom | KeySource::Window => None,
        };
        // Errors before the fingerprint name this key; a window's is its fingerprint, set below.
        let value = match (&client_key, raw_key) {
            (Some(key), _) => key.as_str(),
            (None, Value::String(digest)) => digest.as_str(),
            (None, _) => "",
        };
        let key = IdempotencyKey::derived(source, call.tool_name, value, max_key);
        let arguments_len = call.arguments.map_or(0, str::len);
        if arguments_len > self.config.max_argument_bytes {
            return reject(
                Rejection::new(
                    RejectionKind::ArgumentsTooLarge,
                    format!(
                        "arguments are {arguments_len} bytes, more than the limit of {} bytes",
                        self.config.max_argument_bytes
                    ),
                )
                .with_key(key.for_tool())
                .with_detail("limit", self.config.max_argument_bytes),
            );
        }
        let fingerprint = match fingerprint(call.tool_name, call.arguments) {
            Ok(fingerprint) => fingerprint,
            Err(err) => return reject(arguments_invalid(&err, &key)),
        };
        let key = match source {
            KeySource::Window => {
                IdempotencyKey::derived(source, call.tool_name, &fingerprint.to_hex(), max_key)
            }
            _ => key,
        };
        let retention = self.retention_of(call);
        Step::TryClaim(ClaimRequest {
            id: RecordId {
                scope: scope.clone(),
                key,
            },
            fingerprint,
            tool_name: call.tool_name.into(),
            owner,
            now,
            lease_expires_at: now.saturating_add(self.config.lease),
            // Retention runs from completion; until then the record must at least outlive its
            // lease, or a retention shorter than the lease would let a duplicate of a running call
            // claim the key again and execute a second time.
            expires_at: now.saturating_add(retention.max(self.config.lease)),
            limits: self.config.limits,
        })
    }

    /// The claim of the client's own key of a call a business identifier decides, to check
    /// before it decides: `None` when there is none; an invalid key is refused as the SEP says.
    ///
    /// Both keys are checked: the client's key is read first (a record of it with other
    /// arguments is `idempotency_key_conflict`; one with these arguments decides, as the SEP
    /// says), and when the business identifier executes the call, the client's key is recorded
    /// beside it with the same outcome ([`Engine::with_companion`]).
    pub fn client_key_claim(
        &self,
        scope: &Scope,
        call: &ToolCall<'_>,
        owner: FencingToken,
        now: Timestamp,
    ) -> Option<Result<ClaimRequest, Rejection>> {
        let (source, key) = call
            .client_key
            .filter(|_| call.key_source == KeySource::KeyFrom)?;
        let own = ToolCall {
            key_source: source,
            idempotency_key: Some(key),
            identifier: None,
            client_key: None,
            ..*call
        };
        match self.begin(scope, &own, owner, now) {
            Step::TryClaim(req) => Some(Ok(req)),
            Step::Done(Decision::Reject(rejection)) => Some(Err(rejection)),
            Step::Done(_) | Step::TakeOver(_) => None,
        }
    }

    /// The call decided by its client's key (found in the store with `record`): the same steps
    /// as a claim that found it.
    pub fn on_client_key_record(&self, req: ClaimRequest, record: Record) -> Step {
        self.on_existing(req, record)
    }

    /// `decision` with the client's key `req` to record beside an executed call.
    pub fn with_companion(&self, decision: Decision, req: ClaimRequest) -> Decision {
        match decision {
            Decision::Execute(mut claim) => {
                claim.companion = Some(Companion(Box::new(req)));
                Decision::Execute(claim)
            }
            other => other,
        }
    }

    /// How long the outcome of `call` is kept: a window's length for a window's key, the
    /// configured retention otherwise.
    fn retention_of(&self, call: &ToolCall<'_>) -> Duration {
        match (call.key_source, call.policy.and_then(ToolPolicy::window)) {
            (KeySource::Window, Some(window)) => window,
            _ => self.config.retention,
        }
    }

    /// Applies the call's own terms to the decision the store's answers led to: the claim keeps
    /// the call's retention and error policy; a conflict names the business identifier; a store
    /// outage runs the call unprotected if its tool says so; a replay of a key the client did not
    /// send is marked in the result's `_meta` ([`REPLAYED_META`]).
    pub fn settle(&self, call: &ToolCall<'_>, decision: Decision) -> Decision {
        let source = call.key_source;
        // A refusal of a call that carries the client's own key names that key, as the client
        // knows it, not the business identifier's.
        let decision = match (decision, call.client_key) {
            (Decision::Reject(rejection), Some((_, Value::String(own)))) => {
                Decision::Reject(rejection.with_key(own))
            }
            (decision, _) => decision,
        };
        match decision {
            Decision::Execute(mut claim) => {
                claim.retention = self.retention_of(call);
                claim.forget_errors = !source.is_client_key()
                    && call.policy.is_some_and(|p| p.on_error() == OnError::Forget);
                Decision::Execute(claim)
            }
            Decision::Reject(rejection)
                if matches!(
                    rejection.kind(),
                    RejectionKind::StoreUnavailable | RejectionKind::QuotaExceeded
                ) && call
                    .policy
                    .is_some_and(|p| p.store_down() == StoreDown::RunUnprotected)
                    && source != KeySource::Sep =>
            {
                tracing::warn!(
                    tool = call.tool_name,
                    source = source.as_str(),
                    reason = rejection.message(),
                    "running a call unprotected, as its tool's policy says (store-down = \"run-unprotected\")"
                );
                Decision::Bypass(BypassReason::StoreDown)
            }
            Decision::Reject(rejection) if rejection.kind() == RejectionKind::KeyConflict => {
                match (source, call.identifier) {
                    (KeySource::Sep, _) | (_, None) => Decision::Reject(rejection),
                    (_, Some(identifier)) => Decision::Reject(rejection.with_message(format!(
                        "{identifier} was already used for another call of this tool with \
                         different arguments; one {} is one operation, so this call was not run",
                        if source == KeySource::KeyFrom {
                            "identifier"
                        } else {
                            "key"
                        }
                    ))),
                }
            }
            Decision::Replay(Replay::Result(raw)) if !source.is_client_key() => {
                Decision::Replay(Replay::Result(mark_replayed(&raw, source)))
            }
            decision => decision,
        }
    }

    /// Turns the store's answer to a claim into the next step.
    pub fn on_claim(&self, req: ClaimRequest, answer: Result<ClaimOutcome, StoreError>) -> Step {
        let key = req.id.key.for_tool();
        match answer {
            Ok(ClaimOutcome::Claimed) => Step::Done(Decision::Execute(Claim {
                lease_expires_at: req.lease_expires_at,
                owner: req.owner,
                id: req.id,
                retention: self.config.retention,
                forget_errors: false,
                companion: None,
            })),
            Ok(ClaimOutcome::Existing(record)) => self.on_existing(req, record),
            Ok(ClaimOutcome::QuotaExceeded(quota)) => {
                let (whose, limit) = match quota {
                    QuotaExceeded::Scope { limit } => ("this caller", limit),
                    QuotaExceeded::Total { limit } => ("the server", limit),
                };
                reject(
                    Rejection::new(
                        RejectionKind::QuotaExceeded,
                        format!(
                            "{whose} already holds {limit} idempotency records; retry when older ones expire"
                        ),
                    )
                    .with_key(key)
                    .with_detail("limit", limit),
                )
            }
            Err(err) => reject(store_unavailable(&err, key)),
        }
    }

    fn on_existing(&self, req: ClaimRequest, record: Record) -> Step {
        let key = req.id.key.for_tool();
        if record.fingerprint != req.fingerprint {
            return reject(
                Rejection::new(
                    RejectionKind::KeyConflict,
                    "idempotencyKey was already used with a different tool name or arguments",
                )
                .with_key(key),
            );
        }
        match record.state {
            RecordState::Completed { outcome, .. } => Step::Done(replay(outcome, key)),
            RecordState::InProgress {
                lease_expires_at, ..
            } if lease_expires_at > req.now => reject(
                self.in_progress(key, Some(lease_expires_at.saturating_since(req.now))),
            ),
            RecordState::InProgress { owner, .. } => match self.config.after_crash {
                AfterCrash::Reject => reject(
                    Rejection::new(
                        RejectionKind::OutcomeUnknown,
                        "the request holding this idempotencyKey stopped before recording its outcome; it may or may not have taken effect",
                    )
                    .with_key(key),
                ),
                AfterCrash::Reexecute => Step::TakeOver(TakeOverRequest {
                    previous_owner: owner,
                    new_owner: req.owner,
                    now: req.now,
                    lease_expires_at: req.lease_expires_at,
                    expires_at: req.expires_at,
                    id: req.id,
                }),
            },
        }
    }

    /// `idempotency_key_in_progress` for `key`, whose running call's lease has `lease_left` (when
    /// known). The retry hint is the configured one, shortened to the lease left when that ends
    /// sooner (by then the call has renewed its lease or its owner is gone, and the retry gets
    /// another answer), and never below [`EngineConfig::MIN_IN_PROGRESS_RETRY_AFTER`].
    fn in_progress(&self, key: &str, lease_left: Option<Duration>) -> Rejection {
        let configured = self.config.in_progress_retry_after;
        let after = lease_left
            .map_or(configured, |left| configured.min(left))
            .max(EngineConfig::MIN_IN_PROGRESS_RETRY_AFTER);
        Rejection::new(
            RejectionKind::KeyInProgress,
            format!(
                "a request with this idempotencyKey is still in progress; retry with the same key \
                 and arguments in {} ms to get its outcome",
                after.as_millis()
            ),
        )
        .with_key(key)
        .with_retry_after(after)
    }

    /// Turns the store's answer to a take-over into the decision.
    pub fn on_take_over(&self, req: TakeOverRequest, answer: Result<Fenced, StoreError>) -> Step {
        match answer {
            Ok(Fenced::Applied) => Step::Done(Decision::Execute(Claim {
                lease_expires_at: req.lease_expires_at,
                owner: req.new_owner,
                id: req.id,
                retention: self.config.retention,
                forget_errors: false,
                companion: None,
            })),
            // Someone else took the record over or completed it first: the key is busy or done, and
            // the client's next retry will see which.
            Ok(Fenced::NotOwner) => reject(self.in_progress(req.id.key.for_tool(), None)),
            Err(err) => reject(store_unavailable(&err, req.id.key.for_tool())),
        }
    }

    /// The store request that records `outcome` for a claimed call. An outcome larger than the
    /// configured limit is recorded as [`Outcome::NotRetained`].
    pub fn completion(&self, claim: &Claim, outcome: Outcome, now: Timestamp) -> CompleteRequest {
        let outcome = match outcome {
            Outcome::Success(raw) | Outcome::Error(raw)
                if raw.len() > self.config.max_outcome_bytes =>
            {
                Outcome::NotRetained {
                    size: raw.len() as u64,
                }
            }
            other => other,
        };
        CompleteRequest {
            id: claim.id.clone(),
            owner: claim.owner,
            outcome,
            completed_at: now,
            expires_at: now.saturating_add(claim.retention),
        }
    }

    /// When the owner should renew its lease: once a third of it has passed.
    pub fn renewal_due(&self, claim: &Claim) -> Timestamp {
        let early = self.config.lease - self.config.lease / 3;
        Timestamp::from_millis(
            claim
                .lease_expires_at
                .as_millis()
                .saturating_sub(u64::try_from(early.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Extends the claim's lease from `now`; returns the new deadline to pass to
    /// [`Store::renew`](crate::store::Store::renew).
    pub fn renew(&self, claim: &mut Claim, now: Timestamp) -> Timestamp {
        claim.lease_expires_at = now.saturating_add(self.config.lease);
        claim.lease_expires_at
    }
}

/// The `_meta` member of a replayed result whose key the client did not send (a business
/// identifier, a key argument, a window): its value is the key's source (`"key-from"`,
/// `"argument"`, `"window"`). Replays of a client's key (SEP, `_meta`) stay byte for byte.
pub const REPLAYED_META: &str = "mcp-idem/replayed";

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

fn reject(rejection: Rejection) -> Step {
    Step::Done(Decision::Reject(rejection))
}

fn replay(outcome: Outcome, key: &str) -> Decision {
    match outcome {
        Outcome::Success(raw) => Decision::Replay(Replay::Result(raw)),
        Outcome::Error(raw) => Decision::Replay(Replay::Error(raw)),
        Outcome::NotRetained { size } => Decision::Reject(
            Rejection::new(
                RejectionKind::OutcomeNotRetained,
                format!(
                    "the request with this idempotencyKey completed, but its {size}-byte outcome was too large to keep"
                ),
            )
            .with_key(key),
        ),
        Outcome::Unknown { reason } => Decision::Reject(
            Rejection::new(
                RejectionKind::OutcomeUnknown,
                format!(
                    "the outcome of the request with this idempotencyKey is unknown: {reason}; it may or may not have taken effect"
                ),
            )
            .with_key(key),
        ),
    }
}

fn arguments_invalid(err: &ArgumentsError, key: &IdempotencyKey) -> Rejection {
    Rejection::new(RejectionKind::ArgumentsInvalid, err.to_string()).with_key(key.for_tool())
}

fn store_unavailable(err: &StoreError, key: &str) -> Rejection {
    tracing::warn!(error = %err, "idempotency store unavailable; refusing to execute");
    Rejection::new(
        RejectionKind::StoreUnavailable,
        "the idempotency store is unavailable, so the request was not executed; retry later",
    )
    .with_key(key)
    .with_retry_after(Duration::from_secs(1))
}
