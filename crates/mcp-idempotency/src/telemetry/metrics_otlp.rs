//! Every series of the [`metrics`] facade over OTLP too (`OTEL_METRICS_EXPORTER=otlp`), beside the
//! Prometheus endpoint: [`OtlpRecorder`] maps counters, gauges and histograms to OpenTelemetry
//! instruments of the same names and labels, and [`fan_out`] sends each emission to both.
//!
//! Counters are cumulative sums (an `absolute` value adds what it grew by), gauges synchronous
//! gauges (`increment`/`decrement` move the last value), histograms explicit-bucket histograms:
//! the names ending in `_seconds` on [`SECONDS_BUCKETS`], unless given others.
//!
//! The SDK's periodic reader exports from a thread of its own: each export runs inside the tokio
//! runtime given at start (as the spans', see `export`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use tokio::runtime::Handle;

use super::otlp::{metadata, resource, tls_config, TelemetryError, SCOPE_NAME};
use super::otlp_http::OtlpHttpClient;
use super::settings::{OtelSettings, Protocol};

/// The buckets of a histogram in seconds: those of the MCP semantic conventions'
/// `mcp.server.operation.duration`, below them those of sub-millisecond store operations.
pub const SECONDS_BUCKETS: [f64; 18] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
    30.0, 60.0, 300.0,
];

/// Polls a future with `runtime`'s context entered, so that tonic and hyper find their reactor and
/// timers from a thread that is not the runtime's.
struct InRuntime<'a, T> {
    runtime: Handle,
    future: Pin<Box<dyn Future<Output = T> + Send + 'a>>,
}

impl<T> Future for InRuntime<'_, T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        let _entered = this.runtime.enter();
        this.future.as_mut().poll(cx)
    }
}

/// The OTLP metric exporter, each export within the timeout and inside the runtime.
#[derive(Debug)]
struct MetricsOnRuntime {
    inner: opentelemetry_otlp::MetricExporter,
    runtime: Handle,
    timeout: Duration,
}

impl PushMetricExporter for MetricsOnRuntime {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let timeout = self.timeout;
        let inner = &self.inner;
        InRuntime {
            runtime: self.runtime.clone(),
            future: Box::pin(async move {
                match tokio::time::timeout(timeout, inner.export(metrics)).await {
                    Ok(result) => result,
                    Err(_) => Err(OTelSdkError::Timeout(timeout)),
                }
            }),
        }
        .await
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// Starts the meter provider that exports every `period` (`OTEL_METRIC_EXPORT_INTERVAL`, read by
/// the SDK; 60 s by default), exports running on `runtime`.
pub(crate) fn meter_provider(
    settings: &OtelSettings,
    runtime: Handle,
) -> Result<SdkMeterProvider, TelemetryError> {
    let exporter = {
        let _entered = runtime.enter();
        metric_exporter(settings)?
    };
    let exporter = MetricsOnRuntime {
        inner: exporter,
        runtime,
        timeout: settings.timeout,
    };
    Ok(SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter).build())
        .with_resource(resource(settings))
        .build())
}

fn metric_exporter(
    settings: &OtelSettings,
) -> Result<opentelemetry_otlp::MetricExporter, TelemetryError> {
    let built = match settings.metrics_protocol {
        Protocol::HttpProtobuf => {
            let client = crate::http_client::https_client(settings.certificate.as_deref())
                .map_err(|err| TelemetryError::Certificate(err.to_string()))?;
            let mut builder = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(OtlpHttpClient::new(client, settings.timeout))
                .with_timeout(settings.timeout)
                .with_headers(settings.headers.iter().cloned().collect())
                .with_temporality(Temporality::Cumulative);
            if let Some(endpoint) = &settings.metrics_endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()
        }
        Protocol::Grpc => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                .with_timeout(settings.timeout)
                .with_metadata(metadata(settings))
                .with_temporality(Temporality::Cumulative);
            if let Some(endpoint) = &settings.metrics_endpoint {
                if endpoint.starts_with("https://") {
                    builder = builder.with_tls_config(tls_config(settings)?);
                }
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()
        }
    };
    built.map_err(|err| TelemetryError::Exporter(err.to_string()))
}

/// A [`Recorder`] of the [`metrics`] facade onto an OpenTelemetry meter. Cheap to clone.
#[derive(Clone)]
pub struct OtlpRecorder {
    inner: Arc<RecorderInner>,
}

struct RecorderInner {
    meter: Meter,
    buckets: HashMap<String, Vec<f64>>,
    described: RwLock<HashMap<String, (Option<Unit>, SharedString)>>,
    counters: RwLock<HashMap<Key, Arc<OtelCounter>>>,
    gauges: RwLock<HashMap<Key, Arc<OtelGauge>>>,
    histograms: RwLock<HashMap<Key, Arc<OtelHistogram>>>,
}

impl std::fmt::Debug for OtlpRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpRecorder").finish_non_exhaustive()
    }
}

impl OtlpRecorder {
    /// A recorder onto `provider`'s meter; histograms named in `buckets` get those boundaries.
    pub fn new(provider: &SdkMeterProvider, buckets: &[(&str, &[f64])]) -> OtlpRecorder {
        let scope = InstrumentationScope::builder(SCOPE_NAME)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        OtlpRecorder {
            inner: Arc::new(RecorderInner {
                meter: provider.meter_with_scope(scope),
                buckets: buckets
                    .iter()
                    .map(|(name, bounds)| ((*name).to_owned(), bounds.to_vec()))
                    .collect(),
                described: RwLock::default(),
                counters: RwLock::default(),
                gauges: RwLock::default(),
                histograms: RwLock::default(),
            }),
        }
    }
}

/// `first` (the Prometheus recorder) and `otlp` as one recorder, for `metrics::set_global_recorder`.
pub fn fan_out<R>(first: R, otlp: OtlpRecorder) -> metrics_util::layers::Fanout
where
    R: Recorder + Send + Sync + 'static,
{
    metrics_util::layers::FanoutBuilder::default()
        .add_recorder(first)
        .add_recorder(otlp)
        .build()
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|label| KeyValue::new(label.key().to_owned(), label.value().to_owned()))
        .collect()
}

/// The unit's UCUM code, as OpenTelemetry names units.
fn ucum(unit: Unit) -> &'static str {
    match unit {
        Unit::Count => "1",
        Unit::Percent => "%",
        Unit::Seconds => "s",
        Unit::Milliseconds => "ms",
        Unit::Microseconds => "us",
        Unit::Nanoseconds => "ns",
        Unit::Bytes => "By",
        _ => "",
    }
}

fn cached<T>(map: &RwLock<HashMap<Key, Arc<T>>>, key: &Key, make: impl FnOnce() -> T) -> Arc<T> {
    if let Some(found) = map.read().unwrap_or_else(|e| e.into_inner()).get(key) {
        return Arc::clone(found);
    }
    let mut map = map.write().unwrap_or_else(|e| e.into_inner());
    Arc::clone(map.entry(key.clone()).or_insert_with(|| Arc::new(make())))
}

impl RecorderInner {
    fn describe(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.described
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.as_str().to_owned(), (unit, description));
    }

    fn description(&self, name: &str) -> (Option<&'static str>, String) {
        match self
            .described
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            Some((unit, text)) => (unit.map(ucum), text.to_string()),
            None => (None, String::new()),
        }
    }
}

struct OtelCounter {
    counter: opentelemetry::metrics::Counter<u64>,
    attributes: Vec<KeyValue>,
    total: AtomicU64,
}

impl CounterFn for OtelCounter {
    fn increment(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
        self.counter.add(value, &self.attributes);
    }

    fn absolute(&self, value: u64) {
        let before = self.total.fetch_max(value, Ordering::Relaxed);
        if value > before {
            self.counter.add(value - before, &self.attributes);
        }
    }
}

struct OtelGauge {
    gauge: opentelemetry::metrics::Gauge<f64>,
    attributes: Vec<KeyValue>,
    /// The last value, as `f64` bits.
    value: AtomicU64,
}

impl OtelGauge {
    fn update(&self, change: impl Fn(f64) -> f64) {
        let mut now = self.value.load(Ordering::Relaxed);
        loop {
            let next = change(f64::from_bits(now));
            match self.value.compare_exchange_weak(
                now,
                next.to_bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return self.gauge.record(next, &self.attributes),
                Err(seen) => now = seen,
            }
        }
    }
}

impl GaugeFn for OtelGauge {
    fn increment(&self, value: f64) {
        self.update(|now| now + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|now| now - value);
    }

    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

struct OtelHistogram {
    histogram: opentelemetry::metrics::Histogram<f64>,
    attributes: Vec<KeyValue>,
}

impl HistogramFn for OtelHistogram {
    fn record(&self, value: f64) {
        self.histogram.record(value, &self.attributes);
    }
}

impl Recorder for OtlpRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe(key, unit, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let inner = &self.inner;
        Counter::from_arc(cached(&inner.counters, key, || {
            let name = key.name().to_owned();
            let (unit, description) = inner.description(&name);
            let mut builder = inner.meter.u64_counter(name).with_description(description);
            if let Some(unit) = unit {
                builder = builder.with_unit(unit);
            }
            OtelCounter {
                counter: builder.build(),
                attributes: attributes(key),
                total: AtomicU64::new(0),
            }
        }))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let inner = &self.inner;
        Gauge::from_arc(cached(&inner.gauges, key, || {
            let name = key.name().to_owned();
            let (unit, description) = inner.description(&name);
            let mut builder = inner.meter.f64_gauge(name).with_description(description);
            if let Some(unit) = unit {
                builder = builder.with_unit(unit);
            }
            OtelGauge {
                gauge: builder.build(),
                attributes: attributes(key),
                value: AtomicU64::new(0.0_f64.to_bits()),
            }
        }))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let inner = &self.inner;
        Histogram::from_arc(cached(&inner.histograms, key, || {
            let name = key.name().to_owned();
            let (unit, description) = inner.description(&name);
            let boundaries = match inner.buckets.get(&name) {
                Some(bounds) => Some(bounds.clone()),
                None if name.ends_with("_seconds") => Some(SECONDS_BUCKETS.to_vec()),
                None => None,
            };
            let mut builder = inner
                .meter
                .f64_histogram(name)
                .with_description(description);
            if let Some(unit) = unit {
                builder = builder.with_unit(unit);
            }
            if let Some(boundaries) = boundaries {
                builder = builder.with_boundaries(boundaries);
            }
            OtelHistogram {
                histogram: builder.build(),
                attributes: attributes(key),
            }
        }))
    }
}
