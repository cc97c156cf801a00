//! OpenTelemetry (feature `otel`): OTLP export of traces, over gRPC or HTTP/protobuf, configured by
//! the standard `OTEL_*` variables ([`OtelSettings::from_env`]).
//!
//! - [`Telemetry`]: the export pipeline of a process (a batch span processor on the OTLP
//!   exporter), installed once; [`tracer`] is `None` while it is off.
//! - [`OtelSettings`]: what to export where, from the environment or filled by hand.
//! - [`OtlpRecorder`]: every series of the `metrics` facade over OTLP too
//!   (`OTEL_METRICS_EXPORTER=otlp`), beside Prometheus through [`fan_out`].
//! - [`CallSpan`]: the span of one decided `tools/call`, and its duration metric: the one place
//!   that turns decisions into spans (`spans.rs`).
//! - `receiver` (feature `testsuite`): an OTLP receiver (gRPC and HTTP) for tests.

mod export;
mod metrics_otlp;
mod otlp;
mod otlp_http;
#[cfg(feature = "testsuite")]
pub mod receiver;
mod settings;
mod spans;

pub use export::{tracer, Telemetry};
pub use metrics_otlp::{fan_out, OtlpRecorder, SECONDS_BUCKETS};
pub use otlp::{TelemetryError, SCOPE_NAME};
pub use settings::{
    OtelSettings, Protocol, SamplerSetting, SettingsError, DEFAULT_EXPORT_TIMEOUT,
    DEFAULT_SERVICE_NAME, DEFAULT_SPAN_QUEUE_SIZE,
};
pub use spans::{
    record_durations, CallSpan, DECISION, DECISION_REASON, KEY_DIGEST, KEY_SOURCE, LINKED_TRACE_ID,
    OPERATION_DURATION, OPERATION_DURATION_BUCKETS, WAIT_LOOKS,
};
pub(crate) use spans::{OutgoingSpan, SpanStart};
