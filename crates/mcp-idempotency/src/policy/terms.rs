//! The terms a call is decided on ([`KeyTerms`]): the policy's one complete choice for it, which
//! the engine follows without reading the policy again.

use std::time::Duration;

use serde_json::Value;

use super::{KeySource, OnError, StoreDown, ToolPolicy};

/// How a call is decided: which source its key comes from, how that key is named to a person,
/// the client's own key beside it, and the tool's terms (wait, retention, errors, store outage).
///
/// [`select`](super::select) makes one per keyed call from the tool's policy; a call with only a
/// SEP key and no tool policy is decided on [`KeyTerms::sep`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct KeyTerms {
    /// Where the key comes from.
    pub source: KeySource,
    /// How the key is named to a person when it is not the SEP's (`/order_id = "ord_1"`, `the
    /// key argument `idempotency_key``): error messages use it in place of `idempotencyKey`.
    pub shown_as: Option<String>,
    /// The client's own key (SEP or `_meta`) of a call that a business identifier decides: the
    /// engine reads it first (the SEP's rules hold for it) and records it beside the identifier's
    /// record.
    pub client_key: Option<(KeySource, Value)>,
    /// How long a duplicate that finds the call still running waits for its outcome rather than
    /// be refused at once (`None`: refused at once, as for every key the client sent).
    pub wait: Option<Duration>,
    /// How long the outcome is kept when not the engine's retention (a window's length).
    pub retention: Option<Duration>,
    /// Whether an error outcome is forgotten (its record dropped), so that a retry runs again.
    pub forget_errors: bool,
    /// Whether the call runs unprotected when the store cannot be reached or a quota is full.
    pub run_unprotected_if_store_down: bool,
}

static SEP: KeyTerms = KeyTerms::of(KeySource::Sep);

impl KeyTerms {
    /// The terms of a SEP key with no tool policy: refused at once while running, kept for the
    /// engine's retention, errors replayed, refused when the store is down.
    pub fn sep() -> &'static Self {
        &SEP
    }

    /// The plain terms of a key of `source`: those of a SEP key, with that source.
    pub const fn of(source: KeySource) -> Self {
        Self {
            source,
            shown_as: None,
            client_key: None,
            wait: None,
            retention: None,
            forget_errors: false,
            run_unprotected_if_store_down: false,
        }
    }

    /// The terms of a key of `source` for a tool with `policy` (`None`: no policy, the plain
    /// terms of [`of`](Self::of)).
    pub fn new(source: KeySource, policy: Option<&ToolPolicy>) -> Self {
        let Some(policy) = policy else {
            return Self::of(source);
        };
        let derived = !source.is_client_key();
        Self {
            // A key-less client cannot retry with a key of its own, so a duplicate is given the
            // outcome of the running call as its own answer.
            wait: (derived && !policy.wait().is_zero()).then(|| policy.wait()),
            retention: policy.window().filter(|_| source == KeySource::Window),
            forget_errors: derived && policy.on_error() == OnError::Forget,
            run_unprotected_if_store_down: source != KeySource::Sep
                && policy.store_down() == StoreDown::RunUnprotected,
            ..Self::of(source)
        }
    }

    /// These terms for a call that also carries its client's own `key` under `source` (a
    /// business identifier decides it): that key is read first and recorded beside, and a
    /// duplicate is answered at once, as the SEP says, since the client can retry with its key.
    pub fn with_client_key(self, source: KeySource, key: Value) -> Self {
        Self {
            client_key: Some((source, key)),
            wait: None,
            ..self
        }
    }

    /// The terms of the client's own key read beside a business identifier: that key's source,
    /// with the tool's retention (not the window's), errors and store outage as the SEP says.
    pub(crate) fn of_client_key(&self) -> Option<(Self, &Value)> {
        let (source, key) = self.client_key.as_ref()?;
        let terms = Self {
            run_unprotected_if_store_down: self.run_unprotected_if_store_down
                && *source != KeySource::Sep,
            ..Self::of(*source)
        };
        Some((terms, key))
    }
}
