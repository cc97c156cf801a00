//! The one place that turns what mcp-idem decides into spans and into the call-duration metric.
//!
//! Every `tools/call` the [`Interceptor`](crate::interceptor::Interceptor) decides gets a
//! [`CallSpan`]; the interceptor, the deduplicator and the claim feed it facts (the decision, the
//! key's source and digest, the store's operations, the record a replay replays, the answer), and
//! the span is ended, and the call's duration recorded, when the last holder lets it go (after the
//! outcome is recorded and the answer sent). No driver knows a tracing rule.
//!
//! - A server span `tools/call {tool}` on the MCP semantic conventions, whose parent is the
//!   context in `params._meta.traceparent` / `tracestate`, else the transport's `traceparent`
//!   header (which, when `_meta` has one too, is a link instead).
//! - Child spans: each store operation of the decision and the completion (client spans with
//!   `db.system.name`), and the request forwarded to the server, whose context is what the server
//!   gets in `_meta.traceparent` and the HTTP `traceparent` header.
//! - A replay, a waiting duplicate and an `idempotency_key_in_progress` rejection link to the span
//!   of the call whose record decided them ([`Record::trace`](crate::Record::trace)), and carry its
//!   trace id in [`LINKED_TRACE_ID`].
//! - `mcp.server.operation.duration` ([`OPERATION_DURATION`]) for every decided call, when a
//!   metrics recorder is installed ([`record_durations`]).
//!
//! With tracing off and no recorder, a [`CallSpan`] is empty and every method returns at once.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _,
    TraceFlags, TraceId, TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::Span as SdkSpan;

use crate::engine::{BypassReason, Decision, Replay};
use crate::key::IdempotencyKey;
use crate::protocol::{TransportTrace, META_PROTOCOL_VERSION};
use crate::raw_object::RawObject;
use crate::record::TraceLink;
use crate::rejection::{Rejection, RejectionKind};
use crate::store::StoreError;

/// The call-duration histogram of the MCP semantic conventions, in seconds
/// (`mcp_server_operation_duration_seconds` in Prometheus), by `mcp_method_name`,
/// `gen_ai_tool_name` (a tool the server listed, else `_OTHER`), `error_type` (empty when none)
/// and `mcp_idem_decision`.
pub const OPERATION_DURATION: &str = "mcp.server.operation.duration";
/// The buckets of [`OPERATION_DURATION`], the conventions' (seconds).
pub const OPERATION_DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// The decision: `execute`, `replay`, `conflict`, `in_progress`, `waited`, `bypass` or `reject`.
pub const DECISION: &str = "mcp_idem.decision";
/// Why: a bypass's reason (`no_key`, `mrtr_continuation`, `store_down`) or a rejection's type.
pub const DECISION_REASON: &str = "mcp_idem.decision.reason";
/// Where the key came from (`sep`, `meta`, `key-from`, `argument`, `window`; `none` when no key
/// protects the call).
pub const KEY_SOURCE: &str = "mcp_idem.key.source";
/// The key's digest ([`IdempotencyKey::digest`](crate::IdempotencyKey::digest)), never the key.
pub const KEY_DIGEST: &str = "mcp_idem.key.digest";
/// The trace id of the call a replay replays (or a duplicate found running).
pub const LINKED_TRACE_ID: &str = "mcp_idem.linked.trace_id";
/// How many times a duplicate looked at the store again while the call it found ran.
pub const WAIT_LOOKS: &str = "mcp_idem.wait.looks";

/// The `gen_ai.tool.name` label of a tool the server did not list.
const OTHER_TOOL: &str = "_OTHER";

static DURATIONS: AtomicBool = AtomicBool::new(false);

/// Records [`OPERATION_DURATION`] from now on: a process calls it when it installs a metrics
/// recorder (`mcp-idem` with `--metrics-listen` or OTLP metrics, a binding with OTLP metrics).
pub fn record_durations() {
    DURATIONS.store(true, Ordering::Relaxed);
}

/// The span and the clock of one decided `tools/call`; clones share it, and the last one dropped
/// ends it. Empty (and free) when tracing is off and no recorder is installed.
#[derive(Clone, Debug, Default)]
pub struct CallSpan(Option<Arc<Live>>);

#[derive(Debug)]
struct Live {
    started: Instant,
    tool_label: Cow<'static, str>,
    /// The server span and its parent context; `None` when only the duration is recorded.
    traced: Option<Traced>,
    facts: Mutex<Facts>,
}

#[derive(Debug)]
struct Traced {
    name: String,
    span: Mutex<SdkSpan>,
    context: Context,
    store: Mutex<Option<&'static str>>,
    /// Whether the sampler kept the call: if not, no child span and no attribute is made.
    recording: bool,
}

#[derive(Debug, Default)]
struct Facts {
    decision: &'static str,
    error_type: Option<String>,
    forwarded: Option<SdkSpan>,
    /// The `traceparent` the forwarded request carries.
    outgoing: Option<String>,
}

/// What a span starts from: the call, and where its parent context is.
pub(crate) struct SpanStart<'a> {
    pub(crate) tool: &'a str,
    pub(crate) listed: bool,
    pub(crate) request_id: &'a str,
    pub(crate) meta: Option<&'a RawObject<'a>>,
    pub(crate) transport: &'a TransportTrace,
    /// The revision the server chose in the session's `initialize` result (stdio), if any.
    pub(crate) negotiated_version: Option<&'a str>,
}

impl CallSpan {
    /// Starts the span of a call, when tracing is on or durations are recorded.
    pub(crate) fn start(start: SpanStart<'_>) -> Self {
        let tracer = super::tracer();
        if tracer.is_none() && !DURATIONS.load(Ordering::Relaxed) {
            return Self(None);
        }
        let tool_label = match start.listed {
            true => Cow::Owned(start.tool.to_owned()),
            false => Cow::Borrowed(OTHER_TOOL),
        };
        let traced = tracer.map(|tracer| {
            let (parent, link) = parent_context(start.meta, start.transport);
            let name = format!("tools/call {}", start.tool);
            let builder = SpanBuilder::from_name(name.clone())
                .with_kind(SpanKind::Server)
                .with_links(link.into_iter().map(Link::with_context).collect());
            let mut span = tracer.build_with_context(builder, &parent);
            let context = Context::new().with_remote_span_context(span.span_context().clone());
            // A call the sampler left out keeps its context (propagated, kept in its record) and
            // costs nothing more.
            let recording = span.is_recording();
            if !recording {
                return Traced {
                    name,
                    span: Mutex::new(span),
                    context,
                    store: Mutex::new(None),
                    recording,
                };
            }
            let mut attributes = vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", start.tool.to_owned()),
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("jsonrpc.request.id", start.request_id.to_owned()),
            ];
            if let Some(session) = &start.transport.session_id {
                attributes.push(KeyValue::new("mcp.session.id", hashed(session)));
            }
            if let Some(version) = protocol_version(&start) {
                attributes.push(KeyValue::new("mcp.protocol.version", version));
            }
            span.set_attributes(attributes);
            Traced {
                name,
                span: Mutex::new(span),
                context,
                store: Mutex::new(None),
                recording,
            }
        });
        Self(Some(Arc::new(Live {
            started: Instant::now(),
            tool_label,
            traced,
            facts: Mutex::new(Facts::default()),
        })))
    }

    /// No span: a call nobody traces or times.
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// Whether a call's span would be live: tracing is on, or durations are recorded.
    pub(crate) fn wanted() -> bool {
        super::tracer().is_some() || DURATIONS.load(Ordering::Relaxed)
    }

    /// Whether tracing is on.
    pub(crate) fn tracing() -> bool {
        super::tracer().is_some()
    }

    /// Whether the call is traced or timed (a recorder is installed).
    pub(crate) fn is_live(&self) -> bool {
        self.0.is_some()
    }

    /// The span as a record keeps it ([`Record::trace`](crate::Record::trace)); `None` when the
    /// call is not traced.
    pub fn link(&self) -> Option<TraceLink> {
        let context = self.traced()?.context.span().span_context().clone();
        TraceLink::new(
            context.trace_id().to_bytes(),
            context.span_id().to_bytes(),
            context.trace_flags().to_u8(),
        )
    }

    fn traced(&self) -> Option<&Traced> {
        self.0.as_ref()?.traced.as_ref()
    }

    /// The span, when the sampler kept it.
    fn recorded(&self) -> Option<&Traced> {
        self.traced().filter(|traced| traced.recording)
    }

    fn facts(&self) -> Option<std::sync::MutexGuard<'_, Facts>> {
        let live = self.0.as_ref()?;
        Some(live.facts.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A `tracing` span carrying the call's `trace_id` and `span_id`, which the JSON log lines
    /// written inside it show (`--log-format json`); a disabled span when the call is not traced.
    pub(crate) fn log_span(&self) -> tracing::Span {
        let Some(traced) = self.traced() else {
            return tracing::Span::none();
        };
        let context = traced.context.span().span_context().clone();
        tracing::info_span!(
            "mcp.call",
            trace_id = %context.trace_id(),
            span_id = %context.span_id()
        )
    }

    /// The store behind the decision, as `db.system.name` (`redis`, `postgresql`, `sqlite`).
    pub(crate) fn store_system(&self, system: Option<&'static str>) {
        if let Some(traced) = self.recorded() {
            *lock(&traced.store) = system;
        }
    }

    /// When a store operation starts, for [`store_operation`](Self::store_operation); `None` (and
    /// no clock read) when the call is not traced.
    pub(crate) fn operation_start(&self) -> Option<SystemTime> {
        self.recorded().map(|_| SystemTime::now())
    }

    /// A store operation (`claim`, `get`, `take_over`, `complete`, …) that started at `started`
    /// ([`operation_start`](Self::operation_start)) and has just ended with `result`: a child span.
    pub(crate) fn store_operation(
        &self,
        operation: &'static str,
        started: Option<SystemTime>,
        result: Result<(), &StoreError>,
    ) {
        let (Some(traced), Some(started)) = (self.recorded(), started) else {
            return;
        };
        let Some(tracer) = super::tracer() else {
            return;
        };
        let mut attributes = vec![KeyValue::new("db.operation.name", operation)];
        if let Some(system) = *lock(&traced.store) {
            attributes.push(KeyValue::new("db.system.name", system));
        }
        let builder = SpanBuilder::from_name(operation)
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_attributes(attributes);
        let mut span = tracer.build_with_context(builder, &traced.context);
        if let Err(error) = result {
            span.set_attribute(KeyValue::new("error.type", store_error_type(error)));
            span.set_status(Status::error(error.to_string()));
        }
        span.end();
    }

    /// The decision, once made: the attributes, the link to the record's call, the error type
    /// of an answer given here (a replayed error is an error).
    pub(crate) fn decided<C>(
        &self,
        decision: &Decision<C>,
        source: &str,
        key: Option<&IdempotencyKey>,
        linked: Option<TraceLink>,
        looks: u32,
    ) {
        let Some(mut facts) = self.facts() else {
            return;
        };
        let (name, reason, error_type): (&'static str, Option<&str>, Option<String>) =
            match decision {
                Decision::Execute(_) => ("execute", None, None),
                Decision::Bypass(reason) => ("bypass", Some(bypass_reason(*reason)), None),
                Decision::Replay(replay) if looks > 0 => {
                    ("waited", Some("replayed"), replay_error(replay))
                }
                Decision::Replay(replay) => ("replay", None, replay_error(replay)),
                Decision::Reject(rejection) => (
                    rejection_name(rejection, looks),
                    Some(rejection.kind().as_str()),
                    Some(rejection.kind().as_str().to_owned()),
                ),
            };
        facts.decision = name;
        facts.error_type = error_type;
        drop(facts);
        let Some(traced) = self.recorded() else {
            return;
        };
        let mut span = lock(&traced.span);
        span.set_attribute(KeyValue::new(DECISION, name));
        if let Some(reason) = reason {
            span.set_attribute(KeyValue::new(DECISION_REASON, reason.to_owned()));
        }
        span.set_attribute(KeyValue::new(KEY_SOURCE, source.to_owned()));
        if let Some(key) = key {
            span.set_attribute(KeyValue::new(KEY_DIGEST, key.digest()));
        }
        if looks > 0 {
            span.set_attribute(KeyValue::new(WAIT_LOOKS, i64::from(looks)));
        }
        if let Some(system) = *lock(&traced.store) {
            span.set_attribute(KeyValue::new("mcp_idem.store", system));
        }
        // The record's call: for a replay the execution, for a duplicate the call still running.
        let links = matches!(decision, Decision::Replay(_))
            || matches!(decision, Decision::Reject(r) if r.kind() == RejectionKind::KeyInProgress);
        if let Some(linked) = linked.filter(|_| links) {
            span.set_attribute(KeyValue::new(LINKED_TRACE_ID, linked.trace_id_hex()));
            span.add_link(span_context(&linked), Vec::new());
        }
    }

    /// The decision of a call that reached no engine (refused before it: an id in use, a call
    /// the server's name could not be learned for): a rejection.
    pub(crate) fn refused(&self, rejection: &Rejection) {
        self.decided(
            &Decision::<()>::Reject(rejection.clone()),
            "sep",
            None,
            None,
            0,
        );
    }

    /// Starts the span of the request forwarded to the server; returns the `traceparent` (and
    /// `tracestate`) the server gets, so that its span is a child of this one.
    pub(crate) fn forwarded(&self) -> Option<(String, Option<String>)> {
        let traced = self.traced()?;
        let context = match traced.recording {
            true => {
                let builder =
                    SpanBuilder::from_name(traced.name.clone()).with_kind(SpanKind::Client);
                let span = super::tracer()?.build_with_context(builder, &traced.context);
                let context = span.span_context().clone();
                if let Some(mut facts) = self.facts() {
                    facts.forwarded = Some(span);
                }
                context
            }
            // Left out by the sampler: the server gets the call's own context, not sampled.
            false => traced.context.span().span_context().clone(),
        };
        let (traceparent, tracestate) = injected(context)?;
        if let Some(mut facts) = self.facts() {
            facts.outgoing = Some(traceparent.clone());
        }
        Some((traceparent, tracestate))
    }

    /// The `traceparent` the forwarded request carries, once [`forwarded`](Self::forwarded).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn forwarded_traceparent(&self) -> Option<String> {
        self.facts()?.outgoing.clone()
    }

    /// The server's answer to the forwarded request (`result` or `error` of its envelope).
    pub(crate) fn answered(&self, envelope: &RawObject<'_>) {
        let Some(mut facts) = self.facts() else {
            return;
        };
        facts.error_type = answer_error(envelope);
        if let Some(mut forwarded) = facts.forwarded.take() {
            if let Some(error_type) = &facts.error_type {
                forwarded.set_attribute(KeyValue::new("error.type", error_type.clone()));
                forwarded.set_status(Status::error(error_type.clone()));
            }
            forwarded.end();
        }
    }

    /// The server went away before answering.
    pub(crate) fn unanswered(&self) {
        if let Some(mut facts) = self.facts() {
            facts.error_type = Some(RejectionKind::OutcomeUnknown.as_str().to_owned());
            if let Some(mut forwarded) = facts.forwarded.take() {
                forwarded.set_status(Status::error("the server went away"));
                forwarded.end();
            }
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let facts = self.facts.get_mut().unwrap_or_else(PoisonError::into_inner);
        let decision = match facts.decision {
            "" => "bypass",
            decision => decision,
        };
        if let Some(traced) = &mut self.traced {
            let span = traced
                .span
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(error_type) = &facts.error_type {
                span.set_attribute(KeyValue::new("error.type", error_type.clone()));
                span.set_status(Status::error(error_type.clone()));
            }
            if let Some(mut forwarded) = facts.forwarded.take() {
                forwarded.end();
            }
            span.end();
        }
        if DURATIONS.load(Ordering::Relaxed) {
            metrics::histogram!(
                crate::metrics::OPERATION_DURATION_SECONDS,
                "mcp_method_name" => "tools/call",
                "gen_ai_tool_name" => self.tool_label.clone(),
                "error_type" => facts.error_type.clone().unwrap_or_default(),
                "mcp_idem_decision" => decision,
            )
            .record(self.started.elapsed().as_secs_f64());
        }
    }
}

/// The client span the bridge starts for a `tools/call` its client sent without a trace context
/// (tracing on), over all its attempts; ended when dropped.
#[derive(Debug)]
pub(crate) struct OutgoingSpan(SdkSpan);

impl OutgoingSpan {
    /// With tracing on, a root client span `tools/call {tool}` and the `traceparent` that carries
    /// it; `None` with tracing off.
    pub(crate) fn start(tool: &str) -> Option<(Self, String)> {
        let tracer = super::tracer()?;
        let builder = SpanBuilder::from_name(format!("tools/call {tool}"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
            ]);
        let span = tracer.build_with_context(builder, &Context::new());
        let (traceparent, _) = injected(span.span_context().clone())?;
        Some((Self(span), traceparent))
    }

    /// The call's answer: `error.type` and an error status when it is an error (or lost).
    pub(crate) fn answered(&mut self, response: &str) {
        let Some(envelope) = RawObject::parse(response) else {
            return;
        };
        if let Some(error_type) = answer_error(&envelope) {
            self.0
                .set_attribute(KeyValue::new("error.type", error_type.clone()));
            self.0.set_status(Status::error(error_type));
        }
    }
}

impl Drop for OutgoingSpan {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The call's revision of MCP: what its `_meta` says (2026-07-28 clients send it with every
/// request), else the `MCP-Protocol-Version` header, else the session's `initialize` result.
fn protocol_version(start: &SpanStart<'_>) -> Option<String> {
    start
        .meta
        .and_then(|meta| meta.get_str(META_PROTOCOL_VERSION))
        .or_else(|| start.transport.protocol_version.clone())
        .or_else(|| start.negotiated_version.map(str::to_owned))
}

/// The parent context of a call (from `_meta`, else the transport), and a link to the
/// transport's context when `_meta` gave the parent. A malformed `traceparent` is ignored.
fn parent_context(
    meta: Option<&RawObject<'_>>,
    transport: &TransportTrace,
) -> (Context, Option<SpanContext>) {
    let propagator = TraceContextPropagator::new();
    let from = |traceparent: Option<String>, tracestate: Option<String>| {
        let carrier = Carrier {
            traceparent,
            tracestate,
        };
        let context = propagator.extract(&carrier);
        context.span().span_context().is_valid().then_some(context)
    };
    let meta_field = |name: &str| meta.and_then(|meta| meta.get_str(name));
    let in_meta = from(meta_field("traceparent"), meta_field("tracestate"));
    let in_transport = from(transport.traceparent.clone(), transport.tracestate.clone());
    match (in_meta, in_transport) {
        (Some(parent), transport) => (
            parent,
            transport.map(|context| context.span().span_context().clone()),
        ),
        (None, Some(parent)) => (parent, None),
        (None, None) => (Context::new(), None),
    }
}

struct Carrier {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

fn span_context(link: &TraceLink) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(link.trace_id()),
        SpanId::from_bytes(link.span_id()),
        TraceFlags::new(link.flags()),
        true,
        TraceState::NONE,
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A session id as a span shows it: its SHA-256, first 16 bytes in hex.
fn hashed(secret: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn bypass_reason(reason: BypassReason) -> &'static str {
    match reason {
        BypassReason::NoKey => "no_key",
        BypassReason::MrtrContinuation => "mrtr_continuation",
        BypassReason::StoreDown => "store_down",
    }
}

fn rejection_name(rejection: &Rejection, looks: u32) -> &'static str {
    match rejection.kind() {
        RejectionKind::KeyConflict => "conflict",
        RejectionKind::KeyInProgress if looks > 0 => "waited",
        RejectionKind::KeyInProgress => "in_progress",
        _ => "reject",
    }
}

fn replay_error(replay: &Replay) -> Option<String> {
    match replay {
        Replay::Result(result) => result_error(result),
        Replay::Error(error) => Some(error_code(error)),
    }
}

/// The `traceparent` (and `tracestate`) that carry `context`, as W3C Trace Context writes them.
fn injected(context: SpanContext) -> Option<(String, Option<String>)> {
    let mut headers = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(
        &Context::new().with_remote_span_context(context),
        &mut headers,
    );
    Some((headers.remove("traceparent")?, headers.remove("tracestate")))
}

/// The `error.type` of a JSON-RPC response's envelope: its error's, or `tool_error` for a result
/// with `isError: true`; `None` for a success.
fn answer_error(envelope: &RawObject<'_>) -> Option<String> {
    match (envelope.get("result"), envelope.get("error")) {
        (_, Some(error)) if error.get() != "null" => Some(error_code(error.get())),
        (Some(result), _) => result_error(result.get()),
        _ => None,
    }
}

/// `tool_error` for a result with `isError: true`.
fn result_error(result: &str) -> Option<String> {
    let result = RawObject::parse(result)?;
    (result.get("isError")?.get() == "true").then(|| "tool_error".to_owned())
}

/// A JSON-RPC error's type: our rejection's `data.type` (`idempotency_…`), else its code.
fn error_code(error: &str) -> String {
    let Some(error) = RawObject::parse(error) else {
        return "_OTHER".to_owned();
    };
    let data_type = error
        .get("data")
        .and_then(|data| RawObject::parse(data.get()))
        .and_then(|data| data.get_str("type"))
        .filter(|kind| kind.starts_with("idempotency_"));
    data_type.unwrap_or_else(|| {
        error
            .get("code")
            .map_or_else(|| "_OTHER".to_owned(), |code| code.get().to_owned())
    })
}

fn store_error_type(error: &StoreError) -> &'static str {
    match error {
        StoreError::Unavailable { .. } => "unavailable",
        StoreError::Corrupt(_) => "corrupt",
        _ => "backend",
    }
}
