//! [`CallSpan`] without feature `otel`: the same calls, doing nothing, so that the interceptor
//! and the deduplicator feed one interface whatever the features (`telemetry/spans.rs` is the
//! real one).

use crate::engine::Decision;
use crate::protocol::TransportTrace;
use crate::raw_object::RawObject;
use crate::record::TraceLink;
use crate::rejection::Rejection;
use crate::store::StoreError;

/// No span: feature `otel` is off.
#[derive(Debug)]
#[cfg_attr(not(feature = "bridge"), allow(dead_code))]
pub(crate) struct OutgoingSpan;

#[cfg_attr(not(feature = "bridge"), allow(dead_code))]
impl OutgoingSpan {
    pub(crate) fn start(_: &str) -> Option<(Self, String)> {
        None
    }

    pub(crate) fn answered(&mut self, _: &str) {}
}

/// No span: feature `otel` is off.
#[derive(Clone, Debug, Default)]
pub(crate) struct CallSpan;

// Built as with feature `otel`; nothing reads it.
#[allow(dead_code)]
pub(crate) struct SpanStart<'a> {
    pub(crate) tool: &'a str,
    pub(crate) listed: bool,
    pub(crate) request_id: &'a str,
    pub(crate) meta: Option<&'a RawObject<'a>>,
    pub(crate) transport: &'a TransportTrace,
    pub(crate) negotiated_version: Option<&'a str>,
}

#[allow(clippy::unused_self)]
impl CallSpan {
    pub(crate) fn start(_: SpanStart<'_>) -> Self {
        Self
    }

    pub(crate) fn none() -> Self {
        Self
    }

    pub(crate) fn wanted() -> bool {
        false
    }

    pub(crate) fn tracing() -> bool {
        false
    }

    pub(crate) fn is_live(&self) -> bool {
        false
    }

    /// Always `None`.
    pub(crate) fn link(&self) -> Option<TraceLink> {
        None
    }

    pub(crate) fn log_span(&self) -> tracing::Span {
        tracing::Span::none()
    }

    pub(crate) fn store_system(&self, _: Option<&'static str>) {}

    pub(crate) fn operation_start(&self) -> Option<std::time::SystemTime> {
        None
    }

    pub(crate) fn store_operation(
        &self,
        _: &'static str,
        _: Option<std::time::SystemTime>,
        _: Result<(), &StoreError>,
    ) {
    }

    pub(crate) fn decided<C>(
        &self,
        _: &Decision<C>,
        _: &str,
        _: Option<&crate::key::IdempotencyKey>,
        _: Option<TraceLink>,
        _: u32,
    ) {
    }

    pub(crate) fn refused(&self, _: &Rejection) {}

    pub(crate) fn forwarded(&self) -> Option<(String, Option<String>)> {
        None
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn forwarded_traceparent(&self) -> Option<String> {
        None
    }

    pub(crate) fn answered(&self, _: &RawObject<'_>) {}

    pub(crate) fn unanswered(&self) {}
}
