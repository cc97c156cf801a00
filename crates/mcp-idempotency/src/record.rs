//! What a store keeps for one `(scope, idempotencyKey)`.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::time::Timestamp;

/// The authorization boundary a record belongs to, plus a namespace for the server it protects.
///
/// The SEP requires records to be scoped to the boundary that governs the tool call itself: a key
/// sent by one principal is never matched against another principal's records. The namespace keeps
/// the records of two servers sharing one store apart. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    namespace: Arc<str>,
    principal: Arc<str>,
}

impl Scope {
    /// A scope for `principal` (for example a hash of a bearer token, or the local user over stdio)
    /// within `namespace` (the protected server).
    pub fn new(namespace: impl Into<Arc<str>>, principal: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            principal: principal.into(),
        }
    }

    /// The protected server's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The principal within the namespace.
    pub fn principal(&self) -> &str {
        &self.principal
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?}, {:?})", self.namespace, self.principal)
    }
}

/// Identifies one record: a key within a scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordId {
    /// The authorization boundary and namespace.
    pub scope: Scope,
    /// The client's key.
    pub key: IdempotencyKey,
}

/// Proof of ownership of an in-progress record.
///
/// Each claim (and each take-over of a dead lease) gets a fresh random token; only the holder of the
/// current token may complete, renew or release the record, so an owner whose lease was taken over
/// cannot overwrite the new owner's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A token with the given value, as read back from a store.
    pub const fn from_u64(value: u64) -> Self {
        Self(value)
    }

    /// A fresh random, non-zero token.
    pub fn random() -> Self {
        Self(rand::random::<u64>().max(1))
    }

    /// The token's value, for writing to a store.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

/// Where a [`Deduplicator`](crate::Deduplicator) draws the fencing tokens of its claims from:
/// [`FencingToken::random`] by default, or a generator seeded with a number, so that a
/// simulation driven by a seed makes the same tokens every time it runs. Clones share the
/// generator.
///
/// ```
/// use mcp_idempotency::FencingTokens;
///
/// let (a, b) = (FencingTokens::seeded(7), FencingTokens::seeded(7));
/// assert_eq!([a.mint(), a.mint()], [b.mint(), b.mint()]);
/// ```
#[derive(Clone, Default)]
pub struct FencingTokens(Option<Arc<Mutex<StdRng>>>);

impl FencingTokens {
    /// Fresh random tokens ([`FencingToken::random`]): the default.
    pub fn random() -> Self {
        Self(None)
    }

    /// Tokens from a generator seeded with `seed`: the same seed, the same tokens, in the same
    /// order (for one version of the library).
    pub fn seeded(seed: u64) -> Self {
        Self(Some(Arc::new(Mutex::new(StdRng::seed_from_u64(seed)))))
    }

    /// The next token (never zero).
    pub fn mint(&self) -> FencingToken {
        match &self.0 {
            None => FencingToken::random(),
            Some(rng) => {
                // A draw cannot leave the generator half-updated: a poisoned lock is still usable.
                let mut rng = rng.lock().unwrap_or_else(PoisonError::into_inner);
                FencingToken(rng.next_u64().max(1))
            }
        }
    }
}

impl fmt::Debug for FencingTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("FencingTokens::random()"),
            Some(_) => f.write_str("FencingTokens::seeded(..)"),
        }
    }
}

/// The recorded outcome of an executed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The JSON-RPC `result` member, as the raw JSON text the server sent. Results with
    /// `isError: true` are successes at this level and replay like any other result.
    Success(String),
    /// The JSON-RPC `error` member, as the raw JSON text the server sent.
    Error(String),
    /// The call completed but its outcome was larger than the configured limit and was not kept.
    NotRetained {
        /// Size of the outcome that was dropped, in bytes.
        size: u64,
    },
    /// The call may or may not have run to completion, and nobody knows how it ended (the upstream
    /// exited mid-call, or the owner forwarded a cancellation).
    Unknown {
        /// Why the outcome is unknown.
        reason: String,
    },
}

impl Outcome {
    /// Whether the call failed: a JSON-RPC error, or a result with `isError: true`.
    pub fn is_error(&self) -> bool {
        match self {
            Self::Error(_) => true,
            Self::Success(result) => crate::raw_object::RawObject::parse(result)
                .and_then(|result| result.get("isError").map(|flag| flag.get() == "true"))
                .unwrap_or(false),
            Self::NotRetained { .. } | Self::Unknown { .. } => false,
        }
    }
}

/// The kind of an [`Outcome`], as stored in the `outcome_kind` column or field of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// [`Outcome::Success`]
    Success,
    /// [`Outcome::Error`]
    Error,
    /// [`Outcome::NotRetained`]
    NotRetained,
    /// [`Outcome::Unknown`]
    Unknown,
}

impl OutcomeKind {
    /// The stable name used in stores and in `inspect` output.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::NotRetained => "not_retained",
            Self::Unknown => "unknown",
        }
    }
}

impl FromStr for OutcomeKind {
    type Err = CorruptRecord;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "success" => Ok(Self::Success),
            "error" => Ok(Self::Error),
            "not_retained" => Ok(Self::NotRetained),
            "unknown" => Ok(Self::Unknown),
            _ => Err(CorruptRecord(format!("unknown outcome kind {s:?}"))),
        }
    }
}

/// A stored record that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt record: {0}")]
pub struct CorruptRecord(pub String);

impl Outcome {
    /// The kind of this outcome.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Success(_) => OutcomeKind::Success,
            Self::Error(_) => OutcomeKind::Error,
            Self::NotRetained { .. } => OutcomeKind::NotRetained,
            Self::Unknown { .. } => OutcomeKind::Unknown,
        }
    }

    /// The body a store keeps beside the kind: the raw JSON, the dropped size, or the reason.
    pub fn body(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Success(raw) | Self::Error(raw) => raw.as_str().into(),
            Self::NotRetained { size } => size.to_string().into(),
            Self::Unknown { reason } => reason.as_str().into(),
        }
    }

    /// Rebuilds an outcome from what [`Outcome::kind`] and [`Outcome::body`] stored.
    pub fn from_parts(kind: OutcomeKind, body: String) -> Result<Self, CorruptRecord> {
        Ok(match kind {
            OutcomeKind::Success => Self::Success(body),
            OutcomeKind::Error => Self::Error(body),
            OutcomeKind::NotRetained => Self::NotRetained {
                size: body
                    .parse()
                    .map_err(|_| CorruptRecord(format!("not_retained size {body:?}")))?,
            },
            OutcomeKind::Unknown => Self::Unknown { reason: body },
        })
    }
}

/// Where a record is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// The call is running (or its owner died) under a lease.
    InProgress {
        /// The current owner's token.
        owner: FencingToken,
        /// When the lease runs out unless renewed. After that the owner is presumed dead.
        lease_expires_at: Timestamp,
    },
    /// The call finished and its outcome is recorded.
    Completed {
        /// What happened.
        outcome: Outcome,
        /// When the outcome was recorded.
        completed_at: Timestamp,
    },
}

/// One idempotency record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Scope and key.
    pub id: RecordId,
    /// Fingerprint of the tool name and arguments of the call that claimed the key.
    pub fingerprint: Fingerprint,
    /// The tool that was called, kept for inspection and error messages.
    pub tool_name: String,
    /// In progress or completed.
    pub state: RecordState,
    /// When the key was first claimed.
    pub created_at: Timestamp,
    /// End of the retention window: from then on the record counts as absent.
    pub expires_at: Timestamp,
    /// The trace of the call that claimed the key (the one that ran, or runs), when tracing was on
    /// ([`TraceLink`]); a replay links to it.
    pub trace: Option<TraceLink>,
}

impl Record {
    /// Whether the retention window has ended at `now`.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }
}

/// Where the call that claimed a key is in its trace: the W3C Trace Context ids and flags of its
/// span, never `tracestate` or `baggage`. A record keeps it so that a replay, a waiting duplicate
/// or an `idempotency_key_in_progress` rejection can link to the execution, across instances
/// sharing a store and across restarts.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceLink {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

impl TraceLink {
    /// A link to the span `span_id` of trace `trace_id`; `None` if either id is all zeros (the
    /// W3C invalid ids).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span id.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The trace id as 32 lowercase hex digits, as `inspect` shows it and trace back-ends search
    /// by it.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The link as a W3C `traceparent` value (`00-{trace id}-{span id}-{flags}`).
    pub fn to_traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }

    /// Reads a version-`00` W3C `traceparent` value; `None` if it is malformed (a malformed
    /// `traceparent` is ignored, never an error).
    pub fn from_traceparent(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has four parts; a later version may append more, and its first four are read
        // as 00's (W3C Trace Context, "Versioning of traceparent").
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        unhex::<1>(version)?;
        Self::new(unhex(trace_id)?, unhex(span_id)?, unhex::<1>(flags)?[0])
    }

    /// What a store keeps: the `traceparent` value and, after a space, the record's creation time
    /// in milliseconds, so that a link left behind by a release that does not know this field (it
    /// rewrote the record's other fields for a new claim) is not taken for the new call's.
    pub fn stored(&self, created_at: Timestamp) -> String {
        format!("{} {}", self.to_traceparent(), created_at.as_millis())
    }

    /// Reads what [`stored`](Self::stored) wrote for a record created at `created_at`; `None` when
    /// it is absent, malformed or another record's: telemetry never makes a record unreadable.
    pub fn from_stored(stored: Option<&str>, created_at: Timestamp) -> Option<Self> {
        let (traceparent, created) = stored?.split_once(' ')?;
        (created.parse::<u64>().ok()? == created_at.as_millis())
            .then(|| Self::from_traceparent(traceparent))
            .flatten()
    }
}

impl fmt::Debug for TraceLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceLink({})", self.to_traceparent())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from `2 * N` lowercase hex digits (W3C Trace Context allows no uppercase).
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0; N];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_links_round_trip_and_malformed_ones_are_ignored() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let link = TraceLink::from_traceparent(text).unwrap();
        assert_eq!(link.to_traceparent(), text);
        assert_eq!(link.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(link.flags(), 1);
        let created = Timestamp::from_millis(1_700_000_000_123);
        let stored = link.stored(created);
        assert_eq!(TraceLink::from_stored(Some(&stored), created), Some(link));
        // Another record's link (same key, claimed again by a release that kept the field).
        let later = Timestamp::from_millis(1_700_000_000_124);
        assert_eq!(TraceLink::from_stored(Some(&stored), later), None);
        assert_eq!(TraceLink::from_stored(None, created), None);
        assert_eq!(TraceLink::from_stored(Some("garbage"), created), None);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceLink::from_traceparent(bad), None, "{bad:?}");
        }
        // A later version's extra parts are ignored.
        assert_eq!(
            TraceLink::from_traceparent(
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what"
            ),
            Some(link)
        );
    }

    #[test]
    fn outcome_round_trips_through_parts() {
        let outcomes = [
            Outcome::Success(r#"{"content":[]}"#.into()),
            Outcome::Error(r#"{"code":-32603,"message":"boom"}"#.into()),
            Outcome::NotRetained { size: 123_456 },
            Outcome::Unknown {
                reason: "upstream exited".into(),
            },
        ];
        for outcome in outcomes {
            let kind: OutcomeKind = outcome.kind().as_str().parse().unwrap();
            let back = Outcome::from_parts(kind, outcome.body().into_owned()).unwrap();
            assert_eq!(back, outcome);
        }
    }

    #[test]
    fn corrupt_parts_are_errors() {
        assert!("bogus".parse::<OutcomeKind>().is_err());
        assert!(Outcome::from_parts(OutcomeKind::NotRetained, "x".into()).is_err());
    }

    #[test]
    fn tokens_are_random_and_non_zero() {
        let a = FencingToken::random();
        let b = FencingToken::random();
        assert_ne!(a, b);
        assert_ne!(a.as_u64(), 0);
    }

    #[test]
    fn seeded_tokens_repeat_with_their_seed() {
        let draw = |tokens: &FencingTokens| (0..64).map(|_| tokens.mint()).collect::<Vec<_>>();
        let first = draw(&FencingTokens::seeded(42));
        assert_eq!(first, draw(&FencingTokens::seeded(42)));
        assert_ne!(first, draw(&FencingTokens::seeded(43)));
        assert!(first.iter().all(|token| token.as_u64() != 0));
        // Clones share the generator: they do not hand out the same tokens again.
        let shared = FencingTokens::seeded(42);
        let clone = shared.clone();
        assert_eq!([shared.mint(), clone.mint()], [first[0], first[1]]);
        assert_ne!(
            FencingTokens::random().mint(),
            FencingTokens::random().mint()
        );
    }
}
