//! The OTLP export pipeline (`telemetry`) against the test receiver (`telemetry::receiver`): spans
//! with a parent and a link arrive decoded over gRPC and over HTTP/protobuf, with the headers and
//! the service name of the variables; the parent-based ratio sampler follows the parent; a
//! collector that cannot be reached costs no call anything, its spans dropped and counted.
//!
//! Every assertion runs after `Telemetry::shutdown`, which returns once the buffered spans were
//! exported: nothing here depends on timing.

use std::collections::HashMap;
use std::time::Duration;

use mcp_idempotency::telemetry::receiver::{Receiver, Transport};
use mcp_idempotency::telemetry::{OtelSettings, Telemetry};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};

const GRACE: Duration = Duration::from_secs(30);

fn read_settings(vars: &[(&str, &str)]) -> OtelSettings {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    OtelSettings::from_lookup(|name| vars.get(name).cloned()).expect("valid OTEL_* variables")
}

fn remote_parent(trace: u128, span: u64, sampled: bool) -> Context {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(trace.to_be_bytes()),
        SpanId::from_bytes(span.to_be_bytes()),
        flags,
        true,
        TraceState::default(),
    ))
}

/// A server span (child of a remote parent) with a child that links to another trace's span.
async fn export_a_parent_a_child_and_a_link(protocol: &str, transport: Transport) {
    let receiver = Receiver::start().await.unwrap();
    let endpoint = match transport {
        Transport::Grpc => receiver.grpc_endpoint(),
        Transport::Http => receiver.http_endpoint(),
    };
    let settings = read_settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-tenant=acme,authorization=Bearer%20t0k",
        ),
        ("OTEL_SERVICE_NAME", "otel-export-test"),
    ]);
    assert!(settings.traces);
    let telemetry = Telemetry::start(&settings, tokio::runtime::Handle::current()).unwrap();
    let tracer = telemetry.tracer().expect("traces are on");

    let caller = remote_parent(0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331, true);
    let mut server = tracer
        .span_builder("tools/call charge")
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("gen_ai.tool.name", "charge"),
            KeyValue::new("jsonrpc.request.id", 7_i64),
        ])
        .start_with_context(tracer, &caller);
    let server_cx = caller.with_remote_span_context(server.span_context().clone());
    let ran = SpanContext::new(
        TraceId::from_bytes(0x11112222333344445555666677778888_u128.to_be_bytes()),
        SpanId::from_bytes(0x1234567890abcdef_u64.to_be_bytes()),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let mut child = tracer
        .span_builder("replay")
        .with_kind(SpanKind::Internal)
        .with_links(vec![Link::new(
            ran,
            vec![KeyValue::new("mcp_idem.link", "execution")],
            0,
        )])
        .start_with_context(tracer, &server_cx);
    child.set_status(Status::error("idempotency_key_conflict"));
    child.end();
    server.end();
    telemetry.shutdown(GRACE).await.unwrap();

    let spans = receiver.spans();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let server = spans
        .iter()
        .find(|s| s.name == "tools/call charge")
        .unwrap();
    let child = spans.iter().find(|s| s.name == "replay").unwrap();
    assert!(spans.iter().all(|s| s.transport == transport));
    assert_eq!(server.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(server.parent_span_id.as_deref(), Some("b7ad6b7169203331"));
    assert_eq!(server.kind, "server");
    assert_eq!(server.str_attribute("mcp.method.name"), Some("tools/call"));
    assert_eq!(server.str_attribute("gen_ai.tool.name"), Some("charge"));
    assert_eq!(
        server.attributes["jsonrpc.request.id"],
        serde_json::json!(7)
    );
    assert_eq!(server.status, "unset");
    assert_eq!(
        server.resource["service.name"],
        serde_json::json!("otel-export-test")
    );
    assert_eq!(server.scope, "mcp-idempotency");
    assert_eq!(child.trace_id, server.trace_id);
    assert_eq!(
        child.parent_span_id.as_deref(),
        Some(server.span_id.as_str())
    );
    assert_eq!(child.kind, "internal");
    assert_eq!(child.status, "error");
    assert_eq!(child.status_message, "idempotency_key_conflict");
    assert_eq!(child.links.len(), 1);
    assert_eq!(child.links[0].trace_id, "11112222333344445555666677778888");
    assert_eq!(child.links[0].span_id, "1234567890abcdef");
    assert_eq!(
        child.links[0].attributes["mcp_idem.link"],
        serde_json::json!("execution")
    );

    let requests = receiver.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert_eq!(
            request.headers.get("x-tenant").map(String::as_str),
            Some("acme")
        );
        assert_eq!(
            request.headers.get("authorization").map(String::as_str),
            Some("Bearer t0k")
        );
        if transport == Transport::Http {
            assert_eq!(request.path, "/v1/traces");
        }
    }
    assert_eq!(telemetry.spans_dropped(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_with_a_parent_and_a_link_arrive_over_grpc() {
    export_a_parent_a_child_and_a_link("grpc", Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_with_a_parent_and_a_link_arrive_over_http_protobuf() {
    export_a_parent_a_child_and_a_link("http/protobuf", Transport::Http).await;
}

/// `wrap` and the CLI's other commands run a current-thread runtime: exports still run, and the
/// shutdown still flushes, on it.
#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_runtime_exports_and_flushes() {
    let receiver = Receiver::start().await.unwrap();
    let settings = read_settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.grpc_endpoint()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ]);
    let telemetry = Telemetry::start(&settings, tokio::runtime::Handle::current()).unwrap();
    let tracer = telemetry.tracer().unwrap();
    for n in 0..3 {
        tracer.start(format!("span {n}")).end();
    }
    telemetry.shutdown(GRACE).await.unwrap();
    let spans = receiver.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert_eq!(
        spans[0].resource["service.name"],
        serde_json::json!("mcp-idem")
    );
}

/// `parentbased_traceidratio` with ratio 0: a root is never sampled, a child follows its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parent_based_ratio_sampler_follows_the_parent() {
    let receiver = Receiver::start().await.unwrap();
    let settings = read_settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.http_endpoint()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ]);
    let telemetry = Telemetry::start(&settings, tokio::runtime::Handle::current()).unwrap();
    let tracer = telemetry.tracer().unwrap();
    tracer.start("root").end();
    tracer
        .start_with_context("child of a sampled parent", &remote_parent(1, 1, true))
        .end();
    tracer
        .start_with_context("child of an unsampled parent", &remote_parent(2, 2, false))
        .end();
    telemetry.shutdown(GRACE).await.unwrap();
    let names: Vec<String> = receiver.spans().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["child of a sampled parent"]);

    // Ratio 1 samples the roots too.
    let receiver = Receiver::start().await.unwrap();
    let ratio_one = read_settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.http_endpoint()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "1"),
    ]);
    let telemetry = Telemetry::start(&ratio_one, tokio::runtime::Handle::current()).unwrap();
    let tracer = telemetry.tracer().unwrap();
    tracer.start("root").end();
    tracer
        .start_with_context("child of an unsampled parent", &remote_parent(2, 2, false))
        .end();
    telemetry.shutdown(GRACE).await.unwrap();
    let names: Vec<String> = receiver.spans().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["root"]);
}

/// A collector at a closed port: ending spans never waits for it, and every span is counted as
/// dropped (the queue's overflow at once, the rest when their export fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_drops_and_counts_spans_without_blocking() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    for protocol in ["grpc", "http/protobuf"] {
        let settings = read_settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{closed}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
        ]);
        let telemetry = Telemetry::start(&settings, tokio::runtime::Handle::current()).unwrap();
        let tracer = telemetry.tracer().unwrap();
        const SPANS: u64 = 5_000;
        for n in 0..SPANS {
            let mut span = tracer.start("call");
            span.set_attribute(KeyValue::new("n", n as i64));
            span.end();
        }
        // More spans ended than the queue holds, while the first exports hang on the closed port.
        assert!(
            telemetry.spans_dropped() > 0,
            "{protocol}: nothing dropped yet"
        );
        let dropped_while_calling = telemetry.spans_dropped();
        let stats = format!("{protocol}: {dropped_while_calling} dropped at once");
        let _ = telemetry.shutdown(GRACE).await;
        assert_eq!(
            telemetry.spans_dropped(),
            SPANS,
            "{stats}; every span counted as dropped in the end"
        );
    }
}

/// `OTEL_METRICS_EXPORTER=otlp`: the `metrics` facade's counters, gauges and histograms reach the
/// collector with their names, labels and values, while Prometheus gets them too (`fan_out`).
async fn metrics_arrive(protocol: &str, transport: Transport) {
    use metrics::{counter, gauge, histogram};
    let receiver = Receiver::start().await.unwrap();
    let endpoint = match transport {
        Transport::Grpc => receiver.grpc_endpoint(),
        Transport::Http => receiver.http_endpoint(),
    };
    let settings = read_settings(&[
        ("OTEL_METRICS_EXPORTER", "otlp"),
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
    ]);
    assert!(settings.metrics && !settings.traces);
    let telemetry = Telemetry::start(&settings, tokio::runtime::Handle::current()).unwrap();
    assert!(telemetry.tracer().is_none());
    let otlp = telemetry.metrics_recorder(&[]).expect("metrics are on");
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let scrape = prometheus.handle();
    let both = mcp_idempotency::telemetry::fan_out(prometheus, otlp);
    metrics::with_local_recorder(&both, || {
        mcp_idempotency::metrics::describe();
        counter!("mcp_idem_replays_total", "outcome" => "result").increment(2);
        counter!("mcp_idem_replays_total", "outcome" => "result").increment(1);
        gauge!("mcp_idem_pending_completions").set(4.0);
        gauge!("mcp_idem_pending_completions").decrement(1.0);
        histogram!("mcp_idem_store_operation_duration_seconds", "operation" => "claim")
            .record(0.003);
    });
    telemetry.shutdown(GRACE).await.unwrap();

    assert!(scrape
        .render()
        .contains("mcp_idem_replays_total{outcome=\"result\"} 3"));
    let metrics = receiver.metrics();
    let find = |name: &str| {
        metrics
            .iter()
            .rev()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} not received: {metrics:#?}"))
    };
    let replays = find("mcp_idem_replays_total");
    assert_eq!((replays.kind, replays.monotonic), ("sum", true));
    let result = replays
        .points
        .iter()
        .find(|p| p.attributes.get("outcome") == Some(&serde_json::json!("result")))
        .unwrap();
    assert_eq!(result.value, 3.0);
    // Described series are created at zero, as on the Prometheus endpoint.
    assert!(replays
        .points
        .iter()
        .any(|p| p.attributes.get("outcome") == Some(&serde_json::json!("error"))));
    let pending = find("mcp_idem_pending_completions");
    assert_eq!(pending.kind, "gauge");
    assert_eq!(pending.points[0].value, 3.0);
    let latency = find("mcp_idem_store_operation_duration_seconds");
    assert_eq!((latency.kind, latency.unit.as_str()), ("histogram", "s"));
    let claim = latency
        .points
        .iter()
        .find(|p| p.attributes.get("operation") == Some(&serde_json::json!("claim")))
        .unwrap();
    assert_eq!((claim.count, claim.value), (1, 0.003));
    assert_eq!(
        replays.resource["service.name"],
        serde_json::json!("mcp-idem")
    );
    assert!(metrics.iter().all(|m| m.transport == transport));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_arrive_over_grpc() {
    metrics_arrive("grpc", Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_arrive_over_http_protobuf() {
    metrics_arrive("http/protobuf", Transport::Http).await;
}

/// The bindings' arrangement: their own one-worker runtime (`embedded::runtime`), spans ended on
/// the host language's threads (no runtime there), and the flush at exit from a thread outside the
/// runtime (`shutdown_blocking`).
#[test]
fn a_bindings_runtime_exports_spans_ended_on_foreign_threads() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for (protocol, transport) in [
        ("grpc", Transport::Grpc),
        ("http/protobuf", Transport::Http),
    ] {
        let receiver = runtime.block_on(Receiver::start()).unwrap();
        let endpoint = match transport {
            Transport::Grpc => receiver.grpc_endpoint(),
            Transport::Http => receiver.http_endpoint(),
        };
        let settings = read_settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ]);
        let telemetry = Telemetry::start(&settings, runtime.handle().clone()).unwrap();
        std::thread::scope(|threads| {
            for thread in 0..2 {
                let tracer = telemetry.tracer().unwrap();
                threads.spawn(move || {
                    for n in 0..5 {
                        tracer.start(format!("host thread {thread} call {n}")).end();
                    }
                });
            }
        });
        telemetry.shutdown_blocking(GRACE).unwrap();
        let spans = receiver.spans();
        assert_eq!(spans.len(), 10, "{protocol}: {spans:#?}");
        assert!(spans.iter().all(|s| s.transport == transport));
    }
}
