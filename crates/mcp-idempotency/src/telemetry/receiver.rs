//! An OTLP receiver for tests (features `otel` and `testsuite`): what a collector would get, decoded
//! from real OTLP protobuf with `opentelemetry-proto`'s generated types, over gRPC
//! (`TraceService/Export`, `MetricsService/Export`) and over HTTP (`POST /v1/traces`,
//! `POST /v1/metrics`, `application/x-protobuf`), both on `127.0.0.1` ports of their own.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::time::Duration;
//! use mcp_idempotency::telemetry::receiver::Receiver;
//!
//! let receiver = Receiver::start().await?;
//! // Point an exporter at receiver.grpc_endpoint() or receiver.http_endpoint(), make spans...
//! let spans = receiver.wait_for_spans(1, Duration::from_secs(30)).await;
//! assert_eq!(spans[0].name, "tools/call charge");
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{span, status};
use prost::Message;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How an export arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with a protobuf body.
    Http,
}

/// One span as the collector got it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    /// The trace id, 32 lowercase hex digits.
    pub trace_id: String,
    /// The span id, 16 lowercase hex digits.
    pub span_id: String,
    /// The parent's span id; `None` for a root span.
    pub parent_span_id: Option<String>,
    /// The W3C trace flags (bit 0: sampled), as exported.
    pub flags: u32,
    /// The span's name.
    pub name: String,
    /// `server`, `client`, `internal`, `producer`, `consumer` or `unspecified`.
    pub kind: &'static str,
    /// The span's attributes (strings, integers, doubles, booleans, arrays).
    pub attributes: BTreeMap<String, Value>,
    /// The span's links.
    pub links: Vec<ReceivedLink>,
    /// `unset`, `ok` or `error`.
    pub status: &'static str,
    /// The status's message.
    pub status_message: String,
    /// The resource's attributes (`service.name`...).
    pub resource: BTreeMap<String, Value>,
    /// The instrumentation scope's name.
    pub scope: String,
    /// How it arrived.
    pub transport: Transport,
}

impl ReceivedSpan {
    /// An attribute's value as a string, if it is one.
    pub fn str_attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }
}

/// A span link as the collector got it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedLink {
    /// The linked span's trace id (hex).
    pub trace_id: String,
    /// The linked span's id (hex).
    pub span_id: String,
    /// The link's attributes.
    pub attributes: BTreeMap<String, Value>,
}

/// One export request: where and with which headers (gRPC metadata) it came.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedRequest {
    /// How it arrived.
    pub transport: Transport,
    /// The HTTP path, or the gRPC service (`traces`, `metrics`).
    pub path: String,
    /// Its headers, names in lowercase (a repeated header keeps its last value).
    pub headers: BTreeMap<String, String>,
}

/// One data point of a metric.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricPoint {
    /// The point's attributes (labels).
    pub attributes: BTreeMap<String, Value>,
    /// A sum's or gauge's value; a histogram's sum.
    pub value: f64,
    /// A histogram's count of observations; 0 for sums and gauges.
    pub count: u64,
}

/// One metric of one export.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedMetric {
    /// Its name.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// `sum` (`monotonic` tells a counter), `gauge`, `histogram`, or `other`.
    pub kind: &'static str,
    /// Whether a sum only grows.
    pub monotonic: bool,
    /// Its points.
    pub points: Vec<MetricPoint>,
    /// The resource's attributes.
    pub resource: BTreeMap<String, Value>,
    /// How it arrived.
    pub transport: Transport,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    metrics: Vec<ReceivedMetric>,
    requests: Vec<ReceivedRequest>,
}

struct Shared {
    received: Mutex<Received>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn record(
        &self,
        request: ReceivedRequest,
        spans: Vec<ReceivedSpan>,
        metrics: Vec<ReceivedMetric>,
    ) {
        {
            let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
            received.requests.push(request);
            received.spans.extend(spans);
            received.metrics.extend(metrics);
        }
        self.changed.send_modify(|version| *version += 1);
    }
}

/// A running receiver; dropped, it stops listening.
pub struct Receiver {
    grpc: SocketAddr,
    http: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("grpc", &self.grpc)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Receiver {
    /// Listens on two free loopback ports, one for gRPC and one for HTTP, on the current runtime.
    pub async fn start() -> std::io::Result<Receiver> {
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            received: Mutex::default(),
            changed,
        });
        let grpc_listener = TcpListener::bind("127.0.0.1:0").await?;
        let http_listener = TcpListener::bind("127.0.0.1:0").await?;
        let grpc = grpc_listener.local_addr()?;
        let http = http_listener.local_addr()?;
        let service = Collector(Arc::clone(&shared));
        let grpc_task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service.clone()))
                .add_service(MetricsServiceServer::new(service))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener))
                .await;
            if let Err(err) = served {
                tracing::warn!(error = %err, "the test OTLP receiver's gRPC server stopped");
            }
        });
        let http_shared = Arc::clone(&shared);
        let http_task = tokio::spawn(async move {
            while let Ok((stream, _)) = http_listener.accept().await {
                let shared = Arc::clone(&http_shared);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move {
                            Ok::<_, std::convert::Infallible>(http_export(&shared, request).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Receiver {
            grpc,
            http,
            shared,
            tasks: vec![grpc_task, http_task],
        })
    }

    /// The OTLP/gRPC endpoint, `http://127.0.0.1:PORT` (an `OTEL_EXPORTER_OTLP_ENDPOINT` with
    /// `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`).
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The OTLP/HTTP base endpoint, `http://127.0.0.1:PORT` (an `OTEL_EXPORTER_OTLP_ENDPOINT`;
    /// spans go to `/v1/traces`, metrics to `/v1/metrics`).
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.lock().spans.clone()
    }

    /// Every metric of every export so far, in arrival order.
    pub fn metrics(&self) -> Vec<ReceivedMetric> {
        self.lock().metrics.clone()
    }

    /// Every export request so far.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.lock().requests.clone()
    }

    /// Waits until `done` holds for the spans received, or `within` passed; returns the spans
    /// then (the caller asserts on them, not on the time).
    pub async fn wait_for(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        self.wait(within, |received| done(&received.spans)).await;
        self.spans()
    }

    /// Waits until at least `count` spans arrived, or `within` passed; returns the spans.
    pub async fn wait_for_spans(&self, count: usize, within: Duration) -> Vec<ReceivedSpan> {
        self.wait_for(within, |spans| spans.len() >= count).await
    }

    /// Waits until a metric named `name` arrived, or `within` passed; returns the last one.
    pub async fn wait_for_metric(&self, name: &str, within: Duration) -> Option<ReceivedMetric> {
        self.wait(within, |received| {
            received.metrics.iter().any(|m| m.name == name)
        })
        .await;
        self.metrics().into_iter().rev().find(|m| m.name == name)
    }

    async fn wait(&self, within: Duration, done: impl Fn(&Received) -> bool) {
        let mut changed = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if done(&self.lock()) {
                return;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
        self.shared
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone)]
struct Collector(Arc<Shared>);

fn metadata_headers(metadata: &tonic::metadata::MetadataMap) -> BTreeMap<String, String> {
    headers(&metadata.clone().into_headers())
}

fn headers(map: &http::HeaderMap) -> BTreeMap<String, String> {
    map.iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let received = ReceivedRequest {
            transport: Transport::Grpc,
            path: "traces".to_owned(),
            headers: metadata_headers(request.metadata()),
        };
        let spans = decode_spans(request.into_inner(), Transport::Grpc);
        self.0.record(received, spans, Vec::new());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let received = ReceivedRequest {
            transport: Transport::Grpc,
            path: "metrics".to_owned(),
            headers: metadata_headers(request.metadata()),
        };
        let metrics = decode_metrics(request.into_inner(), Transport::Grpc);
        self.0.record(received, Vec::new(), metrics);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

async fn http_export(
    shared: &Shared,
    request: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let answer = |status: http::StatusCode, body: Vec<u8>| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()
    };
    let path = request.uri().path().to_owned();
    let protobuf = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes() == b"application/x-protobuf");
    if request.method() != http::Method::POST || !protobuf {
        return answer(http::StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
    }
    let received = ReceivedRequest {
        transport: Transport::Http,
        path: path.clone(),
        headers: headers(request.headers()),
    };
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return answer(http::StatusCode::BAD_REQUEST, Vec::new());
    };
    match path.as_str() {
        "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
            Ok(export) => {
                shared.record(received, decode_spans(export, Transport::Http), Vec::new());
                answer(
                    http::StatusCode::OK,
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
            Err(_) => answer(http::StatusCode::BAD_REQUEST, Vec::new()),
        },
        "/v1/metrics" => match ExportMetricsServiceRequest::decode(body) {
            Ok(export) => {
                shared.record(
                    received,
                    Vec::new(),
                    decode_metrics(export, Transport::Http),
                );
                answer(
                    http::StatusCode::OK,
                    ExportMetricsServiceResponse::default().encode_to_vec(),
                )
            }
            Err(_) => answer(http::StatusCode::BAD_REQUEST, Vec::new()),
        },
        _ => answer(http::StatusCode::NOT_FOUND, Vec::new()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value(any: &AnyValue) -> Value {
    match &any.value {
        Some(any_value::Value::StringValue(s)) => Value::from(s.as_str()),
        Some(any_value::Value::BoolValue(b)) => Value::from(*b),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(any_value::Value::ArrayValue(array)) => {
            Value::Array(array.values.iter().map(value).collect())
        }
        Some(any_value::Value::KvlistValue(list)) => Value::Object(
            list.values
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        kv.value.as_ref().map(value).unwrap_or_default(),
                    )
                })
                .collect(),
        ),
        Some(any_value::Value::BytesValue(bytes)) => Value::from(hex(bytes)),
        Some(_) | None => Value::Null,
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, Value> {
    list.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(value).unwrap_or_default(),
            )
        })
        .collect()
}

fn decode_spans(export: ExportTraceServiceRequest, transport: Transport) -> Vec<ReceivedSpan> {
    let mut spans = Vec::new();
    for resource_spans in export.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
            for span in scope_spans.spans {
                let (status, status_message) = match span.status {
                    Some(s) => (
                        match status::StatusCode::try_from(s.code) {
                            Ok(status::StatusCode::Ok) => "ok",
                            Ok(status::StatusCode::Error) => "error",
                            _ => "unset",
                        },
                        s.message,
                    ),
                    None => ("unset", String::new()),
                };
                spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    flags: span.flags,
                    kind: match span::SpanKind::try_from(span.kind) {
                        Ok(span::SpanKind::Server) => "server",
                        Ok(span::SpanKind::Client) => "client",
                        Ok(span::SpanKind::Internal) => "internal",
                        Ok(span::SpanKind::Producer) => "producer",
                        Ok(span::SpanKind::Consumer) => "consumer",
                        _ => "unspecified",
                    },
                    name: span.name,
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|link| ReceivedLink {
                            trace_id: hex(&link.trace_id),
                            span_id: hex(&link.span_id),
                            attributes: attributes(&link.attributes),
                        })
                        .collect(),
                    status,
                    status_message,
                    resource: resource.clone(),
                    scope: scope.clone(),
                    transport,
                });
            }
        }
    }
    spans
}

fn number(point: &Option<number_data_point::Value>) -> f64 {
    match point {
        Some(number_data_point::Value::AsDouble(d)) => *d,
        #[allow(clippy::cast_precision_loss)]
        Some(number_data_point::Value::AsInt(i)) => *i as f64,
        None => 0.0,
    }
}

fn decode_metrics(
    export: ExportMetricsServiceRequest,
    transport: Transport,
) -> Vec<ReceivedMetric> {
    let mut metrics = Vec::new();
    for resource_metrics in export.resource_metrics {
        let resource = resource_metrics
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for scope_metrics in resource_metrics.scope_metrics {
            for m in scope_metrics.metrics {
                let (kind, monotonic, points) = match &m.data {
                    Some(metric::Data::Sum(sum)) => (
                        "sum",
                        sum.is_monotonic,
                        sum.data_points
                            .iter()
                            .map(|p| MetricPoint {
                                attributes: attributes(&p.attributes),
                                value: number(&p.value),
                                count: 0,
                            })
                            .collect(),
                    ),
                    Some(metric::Data::Gauge(gauge)) => (
                        "gauge",
                        false,
                        gauge
                            .data_points
                            .iter()
                            .map(|p| MetricPoint {
                                attributes: attributes(&p.attributes),
                                value: number(&p.value),
                                count: 0,
                            })
                            .collect(),
                    ),
                    Some(metric::Data::Histogram(histogram)) => (
                        "histogram",
                        false,
                        histogram
                            .data_points
                            .iter()
                            .map(|p| MetricPoint {
                                attributes: attributes(&p.attributes),
                                value: p.sum.unwrap_or_default(),
                                count: p.count,
                            })
                            .collect(),
                    ),
                    _ => ("other", false, Vec::new()),
                };
                metrics.push(ReceivedMetric {
                    name: m.name,
                    unit: m.unit,
                    kind,
                    monotonic,
                    points,
                    resource: resource.clone(),
                    transport,
                });
            }
        }
    }
    metrics
}
