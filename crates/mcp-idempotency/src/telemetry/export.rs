//! The trace export pipeline: a tracer provider whose batch span processor hands its batches to
//! the OTLP exporter (gRPC or HTTP/protobuf), and the [`Telemetry`] guard that flushes it.
//!
//! # Where exports run
//!
//! The SDK's [`BatchSpanProcessor`] exports from a thread of its own, with a blocking executor,
//! while tonic's channel and the crate's HTTP client need a tokio runtime (reactor and timers).
//! Every export is therefore spawned on the runtime given at start ([`OnRuntime`]) and the
//! processor's thread only waits for it. That holds whatever runtime the caller has: `proxy`'s
//! multi-thread one, `wrap`'s current-thread one (while it is driven), the bindings' one-worker
//! runtime. [`Telemetry::shutdown`] waits for the processor from tokio's blocking pool, so that a
//! current-thread runtime goes on driving the last exports meanwhile.
//!
//! # Never in a call's way
//!
//! Ending a span only queues it ([`DropCounting`] in front of the processor's bounded queue): a
//! full queue drops the span, a failed or timed-out export drops its batch, and both are counted
//! in [`SPANS_DROPPED_TOTAL`](crate::metrics::SPANS_DROPPED_TOTAL) and
//! [`Telemetry::spans_dropped`]. No call waits for the collector.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData,
    SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tokio::runtime::Handle;

use super::metrics_otlp::OtlpRecorder;
use super::otlp::{metadata, resource, tls_config, TelemetryError, SCOPE_NAME};
use super::otlp_http::OtlpHttpClient;
use super::settings::{OtelSettings, Protocol, SamplerSetting};

/// The tracer of the process, once [`Telemetry::install`] has run with traces on.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The process's tracer: `None` while tracing is off (one atomic load), so that span code can
/// skip all its work.
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// Spans lost on the way, shared by the processor in front and the exporter behind.
#[derive(Debug)]
struct Losses {
    /// Spans accepted and not yet handed to the exporter.
    queued: AtomicUsize,
    /// The most that may wait.
    capacity: usize,
    /// Spans dropped, for [`Telemetry::spans_dropped`].
    dropped: AtomicU64,
}

impl Losses {
    fn drop_spans(&self, count: usize, reason: &'static str) {
        self.dropped.fetch_add(count as u64, Ordering::Relaxed);
        metrics::counter!(crate::metrics::SPANS_DROPPED_TOTAL, "reason" => reason)
            .increment(count as u64);
    }
}

/// In front of the [`BatchSpanProcessor`]: admits a span only while fewer than its queue's size
/// wait, else drops and counts it (the SDK counts its own drops but does not say).
#[derive(Debug)]
struct DropCounting {
    inner: BatchSpanProcessor,
    losses: Arc<Losses>,
}

impl SpanProcessor for DropCounting {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.losses.queued.fetch_add(1, Ordering::AcqRel) >= self.losses.capacity {
            self.losses.queued.fetch_sub(1, Ordering::AcqRel);
            self.losses.drop_spans(1, "queue_full");
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Runs each export of `inner` on a tokio runtime, within the export timeout, and counts the
/// spans of a batch that failed.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: Handle,
    timeout: Duration,
    losses: Arc<Losses>,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let count = batch.len();
        self.losses.queued.fetch_sub(count, Ordering::AcqRel);
        let inner = Arc::clone(&self.inner);
        let timeout = self.timeout;
        let result = match self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, inner.export(batch)).await })
            .await
        {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(OTelSdkError::Timeout(timeout)),
            Err(err) => Err(OTelSdkError::InternalFailure(format!(
                "the runtime did not run the export: {err}"
            ))),
        };
        if let Err(err) = &result {
            tracing::debug!(spans = count, error = %err, "span export failed; spans dropped");
            self.losses.drop_spans(count, "export_failed");
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called while the provider is built, before any export holds a clone.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

/// The export pipeline of a process: hold it while the process runs, and call
/// [`shutdown`](Telemetry::shutdown) on a graceful stop to send what is buffered. Dropping it
/// without shutting down loses the buffered spans.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    tracer: Option<SdkTracer>,
    meter_provider: Option<SdkMeterProvider>,
    losses: Arc<Losses>,
}

impl Telemetry {
    /// Starts the pipeline the settings describe and makes its tracer the process's
    /// ([`tracer`]). Exports run on the current tokio runtime. With traces off it starts nothing.
    pub fn install(settings: &OtelSettings) -> Result<Telemetry, TelemetryError> {
        let runtime = Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
        Telemetry::install_on(settings, runtime)
    }

    /// [`install`](Telemetry::install), exporting on `runtime`.
    pub fn install_on(
        settings: &OtelSettings,
        runtime: Handle,
    ) -> Result<Telemetry, TelemetryError> {
        if settings.traces && TRACER.get().is_some() {
            return Err(TelemetryError::AlreadyInstalled);
        }
        let telemetry = Telemetry::start(settings, runtime)?;
        if let Some(tracer) = &telemetry.tracer {
            TRACER
                .set(tracer.clone())
                .map_err(|_| TelemetryError::AlreadyInstalled)?;
        }
        Ok(telemetry)
    }

    /// Starts a pipeline of its own, not the process's: its spans are made through
    /// [`Telemetry::tracer`] only (tests, or a second destination).
    pub fn start(settings: &OtelSettings, runtime: Handle) -> Result<Telemetry, TelemetryError> {
        let losses = Arc::new(Losses {
            queued: AtomicUsize::new(0),
            capacity: settings.span_queue_size,
            dropped: AtomicU64::new(0),
        });
        let meter_provider = match settings.metrics {
            true => Some(super::metrics_otlp::meter_provider(
                settings,
                runtime.clone(),
            )?),
            false => None,
        };
        if !settings.traces {
            return Ok(Telemetry {
                provider: None,
                tracer: None,
                meter_provider,
                losses,
            });
        }
        // tonic's lazy channel spawns its worker at once: on the export runtime.
        let exporter = {
            let _entered = runtime.enter();
            span_exporter(settings)?
        };
        let exporter = OnRuntime {
            inner: Arc::new(exporter),
            runtime,
            timeout: settings.timeout,
            losses: Arc::clone(&losses),
        };
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(settings.span_queue_size)
            .build();
        let processor = DropCounting {
            inner: BatchSpanProcessor::builder(exporter)
                .with_batch_config(batch)
                .build(),
            losses: Arc::clone(&losses),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler(settings.sampler))
            .with_resource(resource(settings))
            .build();
        let scope = InstrumentationScope::builder(SCOPE_NAME)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(Telemetry {
            provider: Some(provider),
            tracer: Some(tracer),
            meter_provider,
            losses,
        })
    }

    /// This pipeline's tracer; `None` when traces are off.
    pub fn tracer(&self) -> Option<&SdkTracer> {
        self.tracer.as_ref()
    }

    /// With OTLP metrics on, a recorder of the `metrics` facade that exports every series through
    /// this pipeline; histograms named in `buckets` get those boundaries. Install it beside the
    /// Prometheus recorder with [`fan_out`](super::fan_out).
    pub fn metrics_recorder(&self, buckets: &[(&str, &[f64])]) -> Option<OtlpRecorder> {
        self.meter_provider
            .as_ref()
            .map(|provider| OtlpRecorder::new(provider, buckets))
    }

    /// Spans dropped so far: queue full, or their export failed.
    pub fn spans_dropped(&self) -> u64 {
        self.losses.dropped.load(Ordering::Relaxed)
    }

    /// Sends every buffered span now and waits for it, up to `within`.
    pub async fn flush(&self, within: Duration) -> Result<(), TelemetryError> {
        let (provider, meters) = (self.provider.clone(), self.meter_provider.clone());
        let flush = tokio::task::spawn_blocking(move || {
            if let Some(meters) = meters {
                meters.force_flush()?;
            }
            provider.map_or(Ok(()), |provider| provider.force_flush())
        });
        match tokio::time::timeout(within, flush).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => Err(TelemetryError::Shutdown(err.to_string())),
            Ok(Err(err)) => Err(TelemetryError::Shutdown(err.to_string())),
            Err(_) => Err(TelemetryError::Shutdown(format!(
                "not flushed within {within:?}"
            ))),
        }
    }

    /// Stops the pipeline, sending the spans still buffered within `grace`; what is left then is
    /// lost, and spans ended afterwards are not exported. Call it on the runtime the exports run
    /// on, before that runtime ends. The counters stay readable.
    pub async fn shutdown(&self, grace: Duration) -> Result<(), TelemetryError> {
        let (provider, meters) = (self.provider.clone(), self.meter_provider.clone());
        let stop =
            tokio::task::spawn_blocking(move || stop(provider.as_ref(), meters.as_ref(), grace));
        match tokio::time::timeout(grace + Duration::from_millis(100), stop).await {
            Ok(Ok(result)) => result,
            Ok(Err(err)) => Err(TelemetryError::Shutdown(err.to_string())),
            Err(_) => Err(TelemetryError::Shutdown(format!(
                "not done within {grace:?}"
            ))),
        }
    }

    /// [`shutdown`](Telemetry::shutdown) from a thread that is not driving the export runtime
    /// (a binding's exit hook): blocks up to `grace`.
    pub fn shutdown_blocking(&self, grace: Duration) -> Result<(), TelemetryError> {
        stop(self.provider.as_ref(), self.meter_provider.as_ref(), grace)
    }
}

/// Stops the span and the metric pipelines side by side, each within `grace`.
fn stop(
    spans: Option<&SdkTracerProvider>,
    meters: Option<&SdkMeterProvider>,
    grace: Duration,
) -> Result<(), TelemetryError> {
    let failed = |err: OTelSdkError| TelemetryError::Shutdown(err.to_string());
    std::thread::scope(|scope| {
        let metrics = meters.map(|meters| scope.spawn(move || meters.shutdown_with_timeout(grace)));
        if let Some(spans) = spans {
            spans.shutdown_with_timeout(grace).map_err(failed)?;
        }
        match metrics.map(|stopping| stopping.join()) {
            Some(Ok(Err(err))) => Err(failed(err)),
            Some(Err(_)) => Err(TelemetryError::Shutdown(
                "the metrics shutdown panicked".into(),
            )),
            _ => Ok(()),
        }
    })
}

fn span_exporter(
    settings: &OtelSettings,
) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let built = match settings.traces_protocol {
        Protocol::HttpProtobuf => {
            let client = crate::http_client::https_client(settings.certificate.as_deref())
                .map_err(|err| TelemetryError::Certificate(err.to_string()))?;
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(OtlpHttpClient::new(client, settings.timeout))
                .with_timeout(settings.timeout)
                .with_headers(settings.headers.iter().cloned().collect::<HashMap<_, _>>());
            if let Some(endpoint) = &settings.traces_endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder.build()
        }
        Protocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_protocol(opentelemetry_otlp::Protocol::Grpc)
                .with_timeout(settings.timeout)
                .with_metadata(metadata(settings));
            if let Some(endpoint) = &settings.traces_endpoint {
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

fn sampler(setting: SamplerSetting) -> Sampler {
    match setting {
        SamplerSetting::AlwaysOn => Sampler::AlwaysOn,
        SamplerSetting::AlwaysOff => Sampler::AlwaysOff,
        SamplerSetting::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
        SamplerSetting::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        SamplerSetting::ParentBasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        SamplerSetting::ParentBasedTraceIdRatio(ratio) => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_spans_are_counted_by_reason_on_the_metrics_facade() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let scrape = recorder.handle();
        let losses = Losses {
            queued: AtomicUsize::new(0),
            capacity: 1,
            dropped: AtomicU64::new(0),
        };
        metrics::with_local_recorder(&recorder, || {
            crate::metrics::describe();
            losses.drop_spans(3, "queue_full");
            losses.drop_spans(2, "export_failed");
        });
        let text = scrape.render();
        assert!(
            text.contains("mcp_idem_spans_dropped_total{reason=\"queue_full\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("mcp_idem_spans_dropped_total{reason=\"export_failed\"} 2"),
            "{text}"
        );
        assert_eq!(losses.dropped.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn off_starts_nothing_and_needs_no_collector() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let telemetry =
            Telemetry::start(&OtelSettings::default(), runtime.handle().clone()).unwrap();
        assert!(telemetry.tracer().is_none());
        assert!(telemetry.metrics_recorder(&[]).is_none());
        assert!(telemetry.shutdown_blocking(Duration::from_secs(1)).is_ok());
        assert!(matches!(
            Telemetry::install(&OtelSettings::default()),
            Err(TelemetryError::NoRuntime)
        ));
    }
}
