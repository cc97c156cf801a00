//! What the engine decides on ([`ToolCall`]) and what it decides ([`Decision`], [`Step`]).

use std::time::Duration;

use serde_json::Value;

use crate::jsonrpc;
use crate::policy::KeyTerms;
use crate::record::{FencingToken, RecordId, TraceLink};
use crate::rejection::Rejection;
use crate::store::{ClaimRequest, TakeOverRequest};
use crate::time::Timestamp;

/// The facts of one `tools/call` request that matter for idempotency.
#[derive(Clone, Copy, Debug)]
pub struct ToolCall<'a> {
    /// `params.name`.
    pub tool_name: &'a str,
    /// The raw JSON text of `params.arguments`, or `None` when absent.
    pub arguments: Option<&'a str>,
    /// The key as the call carries it (its source is [`terms`](Self::terms)'): the raw
    /// `params.idempotencyKey`, `_meta` or argument value, or the business identifier's digest;
    /// `None` when absent (and for a duplicate window, keyed by the call's fingerprint).
    pub idempotency_key: Option<&'a Value>,
    /// Whether the request is an MRTR continuation (`params.requestState` or
    /// `params.inputResponses` present).
    pub mrtr_continuation: bool,
    /// Which source the key comes from, and the terms the call is decided on: the tool policy's
    /// choice, or [`KeyTerms::sep`] for a SEP key with no tool policy (the default).
    pub terms: &'a KeyTerms,
    /// The call's own span, when tracing is on: kept in the record it claims
    /// ([`Record::trace`](crate::Record::trace)), so that a replay can link to it.
    pub trace: Option<TraceLink>,
}

impl Default for ToolCall<'_> {
    fn default() -> Self {
        Self {
            tool_name: "",
            arguments: None,
            idempotency_key: None,
            mrtr_continuation: false,
            terms: KeyTerms::sep(),
            trace: None,
        }
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
    pub(super) id: RecordId,
    pub(super) owner: FencingToken,
    pub(super) lease_expires_at: Timestamp,
    /// How long the outcome is kept once recorded (a window's length for a window's key).
    pub(super) retention: Duration,
    /// Whether an error outcome is forgotten (the record dropped) rather than recorded.
    pub(super) forget_errors: bool,
    /// The record of the client's own key, written beside the business identifier's with the
    /// same outcome.
    pub(super) companion: Option<Companion>,
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
    /// call runs and then record the outcome ([`Engine::completion`](crate::Engine::completion)), or release the claim if the
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

/// The next thing the caller must do, as [`PendingDecision`](crate::PendingDecision) says it.
#[must_use]
#[derive(Clone, Debug)]
pub enum Step {
    /// The decision is made.
    Done(Decision),
    /// Read the record of the client's own key (`store.get(&req.id, req.now)`), then pass the
    /// answer to [`PendingDecision::on_client_key`](crate::PendingDecision::on_client_key). A
    /// call that a business identifier decides and that carries a key of its client's: the SEP's
    /// rules hold for that key, so its record is looked at first.
    ReadClientKey(ClaimRequest),
    /// Read the record of the business identifier (`store.get(&req.id, req.now)`), then pass the
    /// answer to [`PendingDecision::on_identifier`](crate::PendingDecision::on_identifier). The
    /// client's key holds a claim whose owner stopped before recording an outcome; the
    /// identifier's record, if there is one, decides the call.
    ReadIdentifier(ClaimRequest),
    /// Run this claim against the store, then pass the answer to
    /// [`PendingDecision::on_claim`](crate::PendingDecision::on_claim).
    TryClaim(ClaimRequest),
    /// Run this take-over against the store, then pass the answer to
    /// [`PendingDecision::on_take_over`](crate::PendingDecision::on_take_over).
    TakeOver(TakeOverRequest),
}
