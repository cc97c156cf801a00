//! The JSON-RPC errors the engine answers with, and the stable `error.data.type` contract.
//!
//! Every rejection is a JSON-RPC error object
//! `{"code": …, "message": "…", "data": {"type": "…", "idempotencyKey": "…", …}}`. Client mistakes use
//! `-32602` (invalid params), as the SEP's prototype does; failures on the server's side use `-32603`
//! (internal error). No code in the range the MCP specification reserves (-32020..-32099) is used.
//! Clients should branch on `data.type`; its values below never change meaning.

use std::str::FromStr;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use crate::protocol::IDEMPOTENCY_KEY;

/// What went wrong, as `error.data.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// `idempotency_key_invalid`: the key is not a non-empty string within the length limit, free of
    /// control characters. Fix the client; the tool did not run.
    KeyInvalid,
    /// `idempotency_arguments_invalid`: the arguments cannot be fingerprinted (malformed JSON,
    /// nested too deeply, a number with an absurd exponent). The tool did not run.
    ArgumentsInvalid,
    /// `idempotency_arguments_too_large`: the arguments exceed the configured size limit. The tool
    /// did not run.
    ArgumentsTooLarge,
    /// `idempotency_key_conflict`: the key was already used with a different tool name or different
    /// arguments. The tool did not run; use a new key for a new operation.
    KeyConflict,
    /// `idempotency_key_in_progress`: a call with this key is still running. Retry with the same key
    /// after `data.retryAfterMs`.
    KeyInProgress,
    /// `idempotency_quota_exceeded`: the caller (or the store) holds as many records as allowed.
    /// The tool did not run; retry later, when older records have expired.
    QuotaExceeded,
    /// `idempotency_store_unavailable`: the record could not be read or written, so the tool was not
    /// run (fail closed). Retry with the same key later.
    StoreUnavailable,
    /// `idempotency_outcome_unknown`: the original call may or may not have taken effect and its
    /// outcome was lost (the server exited mid-call, or its lease ran out). The tool is not run again
    /// for this key; check the effect out of band and use a new key to try again.
    OutcomeUnknown,
    /// `idempotency_outcome_not_retained`: the original call completed, but its outcome was too large
    /// to keep. The tool is not run again for this key.
    OutcomeNotRetained,
    /// `idempotency_shutting_down`: the gateway is stopping and takes no new keyed calls. The call
    /// was neither run nor claimed, so it is safe to retry with the same key, here after
    /// `data.retryAfterMs` (once the gateway is back) or at once through another instance.
    ShuttingDown,
    /// `idempotency_scope_unknown`: the gateway decides under the server's own name and could not
    /// learn it (the server answered `server/discover` without it, and no `initialize` was sent
    /// first), so it cannot tell where the call's record is. The call was neither run nor
    /// claimed: send `initialize` first, or give the gateway a namespace of its own.
    ScopeUnknown,
}

impl RejectionKind {
    /// The stable `error.data.type` string.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::KeyInvalid => "idempotency_key_invalid",
            Self::ArgumentsInvalid => "idempotency_arguments_invalid",
            Self::ArgumentsTooLarge => "idempotency_arguments_too_large",
            Self::KeyConflict => "idempotency_key_conflict",
            Self::KeyInProgress => "idempotency_key_in_progress",
            Self::QuotaExceeded => "idempotency_quota_exceeded",
            Self::StoreUnavailable => "idempotency_store_unavailable",
            Self::OutcomeUnknown => "idempotency_outcome_unknown",
            Self::OutcomeNotRetained => "idempotency_outcome_not_retained",
            Self::ShuttingDown => "idempotency_shutting_down",
            Self::ScopeUnknown => "idempotency_scope_unknown",
        }
    }

    /// The JSON-RPC error code used for this kind.
    pub const fn code(self) -> i64 {
        match self {
            Self::KeyInvalid
            | Self::ArgumentsInvalid
            | Self::ArgumentsTooLarge
            | Self::KeyConflict
            | Self::KeyInProgress
            | Self::QuotaExceeded => INVALID_PARAMS,
            Self::StoreUnavailable
            | Self::OutcomeUnknown
            | Self::OutcomeNotRetained
            | Self::ShuttingDown
            | Self::ScopeUnknown => INTERNAL_ERROR,
        }
    }

    /// Every kind, for documentation and tests.
    pub const ALL: [Self; 11] = [
        Self::KeyInvalid,
        Self::ArgumentsInvalid,
        Self::ArgumentsTooLarge,
        Self::KeyConflict,
        Self::KeyInProgress,
        Self::QuotaExceeded,
        Self::StoreUnavailable,
        Self::OutcomeUnknown,
        Self::OutcomeNotRetained,
        Self::ShuttingDown,
        Self::ScopeUnknown,
    ];
}

/// An `error.data.type` that names no [`RejectionKind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{type_name:?} is not an idempotency error type")]
pub struct UnknownRejectionKind {
    type_name: String,
}

impl UnknownRejectionKind {
    /// The type that was read.
    pub fn type_name(&self) -> &str {
        &self.type_name
    }
}

impl FromStr for RejectionKind {
    type Err = UnknownRejectionKind;

    /// The kind whose [`as_str`](Self::as_str) is `type_name`.
    fn from_str(type_name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == type_name)
            .ok_or_else(|| UnknownRejectionKind {
                type_name: type_name.to_owned(),
            })
    }
}

/// The `retryAfterMs` of [`RejectionKind::ShuttingDown`]: about the time a client takes to start a
/// new gateway (a stdio client restarting its server) or a load balancer to notice that an
/// instance has gone.
pub const SHUTTING_DOWN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A refusal to run or replay a call, ready to be sent as a JSON-RPC error.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    kind: RejectionKind,
    message: String,
    key: Option<String>,
    retry_after: Option<Duration>,
    detail: Map<String, Value>,
}

impl Rejection {
    pub(crate) fn new(kind: RejectionKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            key: None,
            retry_after: None,
            detail: Map::new(),
        }
    }

    /// The refusal of a keyed call that arrived while the gateway was stopping: nothing ran and
    /// nothing was claimed. `key` is the call's `idempotencyKey`, named in `data` when it is a
    /// string.
    pub(crate) fn shutting_down(key: Option<&Value>) -> Self {
        let rejection = Self::new(
            RejectionKind::ShuttingDown,
            "the gateway is shutting down and takes no new keyed calls; nothing was run, so \
             retrying with the same idempotencyKey is safe",
        )
        .with_retry_after(SHUTTING_DOWN_RETRY_AFTER);
        match key.and_then(Value::as_str) {
            Some(key) => rejection.with_key(key),
            None => rejection,
        }
    }

    /// The refusal of a keyed call that a gateway deciding under the server's own name could not
    /// place: the server did not name itself ([`RejectionKind::ScopeUnknown`]). Nothing ran and
    /// nothing was claimed.
    pub(crate) fn scope_unknown(key: Option<&Value>) -> Self {
        let rejection = Self::new(
            RejectionKind::ScopeUnknown,
            "the MCP server did not give its name (it answered server/discover without it), so \
             the gateway cannot tell where this call's record is; nothing was run. Send \
             `initialize` before the call, or give the gateway a namespace (--namespace)",
        );
        match key.and_then(Value::as_str) {
            Some(key) => rejection.with_key(key),
            None => rejection,
        }
    }

    pub(crate) fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    pub(crate) fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub(crate) fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn with_detail(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.detail.insert(name.to_owned(), value.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The human-readable `error.message`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The key concerned, when it was a valid string.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// How long to wait before retrying, for kinds where a retry may succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The JSON-RPC `error` object:
    /// `{"code", "message", "data": {"type", "idempotencyKey"?, "retryAfterMs"?, …}}`.
    pub fn to_error_object(&self) -> Value {
        let mut data = Map::new();
        data.insert("type".into(), self.kind.as_str().into());
        if let Some(key) = &self.key {
            data.insert(IDEMPOTENCY_KEY.into(), key.as_str().into());
        }
        if let Some(after) = self.retry_after {
            let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            data.insert("retryAfterMs".into(), millis.into());
        }
        for (name, value) in &self.detail {
            data.insert(name.clone(), value.clone());
        }
        json!({
            "code": self.kind.code(),
            "message": self.message,
            "data": data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_stable_and_codes_stay_out_of_the_reserved_range() {
        let names: Vec<_> = RejectionKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "idempotency_key_invalid",
                "idempotency_arguments_invalid",
                "idempotency_arguments_too_large",
                "idempotency_key_conflict",
                "idempotency_key_in_progress",
                "idempotency_quota_exceeded",
                "idempotency_store_unavailable",
                "idempotency_outcome_unknown",
                "idempotency_outcome_not_retained",
                "idempotency_shutting_down",
                "idempotency_scope_unknown",
            ]
        );
        for kind in RejectionKind::ALL {
            assert!(!(-32099..=-32020).contains(&kind.code()), "{kind:?}");
        }
    }

    #[test]
    fn type_names_parse_back_to_their_kind() {
        for kind in RejectionKind::ALL {
            assert_eq!(kind.as_str().parse::<RejectionKind>(), Ok(kind));
        }
        let unknown = "idempotency_something_new".parse::<RejectionKind>();
        assert_eq!(
            unknown.as_ref().map_err(UnknownRejectionKind::type_name),
            Err("idempotency_something_new")
        );
        assert!("tool_failed".parse::<RejectionKind>().is_err());
    }

    #[test]
    fn error_object_carries_type_key_and_retry_hint() {
        let rejection = Rejection::new(RejectionKind::KeyInProgress, "still running")
            .with_key("k-1")
            .with_retry_after(Duration::from_millis(250))
            .with_detail("toolName", "charge");
        assert_eq!(
            rejection.to_error_object(),
            json!({
                "code": -32602,
                "message": "still running",
                "data": {
                    "type": "idempotency_key_in_progress",
                    "idempotencyKey": "k-1",
                    "retryAfterMs": 250,
                    "toolName": "charge",
                }
            })
        );
    }
}
