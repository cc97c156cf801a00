//! The span of one decided call, whatever the features: `telemetry`'s with feature `otel`, else
//! one that does nothing (`call_span_off.rs`). The interceptor, the claims and the bridge take
//! it from here.

#[cfg(not(feature = "otel"))]
pub(crate) use crate::call_span_off::{CallSpan, OutgoingSpan, SpanStart};
#[cfg(feature = "otel")]
pub(crate) use crate::telemetry::{CallSpan, OutgoingSpan, SpanStart};
