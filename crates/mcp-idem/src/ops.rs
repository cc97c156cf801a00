//! Running `wrap` and `proxy` in production: `--config`, and `--metrics-listen` for Prometheus
//! metrics (`/metrics`), liveness (`/healthz`) and readiness (`/readyz`).
//!
//! See docs/metrics.md for the metric names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use clap::Args;
use mcp_idempotency::metrics::{
    MeteredStore, OPERATION_DURATION_SECONDS, STORE_OPERATION_DURATION_SECONDS,
};
use mcp_idempotency::store::Store;
use mcp_idempotency::telemetry::{fan_out, OtelSettings, Telemetry, OPERATION_DURATION_BUCKETS};
use mcp_idempotency::{IdempotencyKey, RecordId, Scope, Timestamp};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Longest `/readyz` waits for the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);
/// The record counts are read from the store at most this often, when `/metrics` is scraped.
const RECORD_COUNTS_EVERY: Duration = Duration::from_secs(10);
/// How often the exporter's histograms are maintained.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);
/// Buckets of the store latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Options of `wrap` and `proxy` for operating them.
#[derive(Debug, Args)]
pub(crate) struct OpsArgs {
    /// TOML file of option values (keys are long option names); command-line options and
    /// environment variables override it. `mcp-idem config-check` shows the result.
    #[arg(long, env = "MCP_IDEM_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on ADDR (e.g.
    /// 127.0.0.1:9464; port 0 picks a free port, printed on stderr).
    #[arg(long, env = "MCP_IDEM_METRICS_LISTEN", value_name = "ADDR")]
    pub(crate) metrics_listen: Option<SocketAddr>,
}

impl OpsArgs {
    /// With `--metrics-listen`: installs the Prometheus recorder (beside the OTLP one when
    /// `telemetry` exports metrics), starts the metrics listener on the current runtime, and
    /// returns `store` wrapped so that its operations are measured. With OTLP metrics alone,
    /// installs that recorder. Without either, returns `store` as it is.
    pub(crate) async fn start(
        &self,
        store: Arc<dyn Store>,
        telemetry: Option<&Telemetry>,
    ) -> anyhow::Result<Arc<dyn Store>> {
        let buckets: [(&str, &[f64]); 2] = [
            (STORE_OPERATION_DURATION_SECONDS, &LATENCY_BUCKETS),
            (OPERATION_DURATION_SECONDS, &OPERATION_DURATION_BUCKETS),
        ];
        let otlp = telemetry.and_then(|telemetry| telemetry.metrics_recorder(&buckets));
        let Some(addr) = self.metrics_listen else {
            let Some(otlp) = otlp else {
                return Ok(store);
            };
            metrics::set_global_recorder(otlp)
                .map_err(|_| anyhow::anyhow!("cannot install the metrics recorder"))?;
            mcp_idempotency::metrics::describe();
            mcp_idempotency::telemetry::record_durations();
            return Ok(Arc::new(MeteredStore::new(store)));
        };
        let mut builder = PrometheusBuilder::new();
        for (name, buckets) in buckets {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
                .context("invalid histogram buckets")?;
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let installed = match otlp {
            Some(otlp) => metrics::set_global_recorder(fan_out(recorder, otlp)).is_ok(),
            None => metrics::set_global_recorder(recorder).is_ok(),
        };
        anyhow::ensure!(installed, "cannot install the metrics recorder");
        mcp_idempotency::metrics::describe();
        mcp_idempotency::telemetry::record_durations();
        let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store));

        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for metrics"))?;
        let local = listener
            .local_addr()
            .context("cannot read the bound metrics address")?;
        eprintln!("mcp-idem: metrics on http://{local}/metrics");

        let exporter = Exporter {
            handle: handle.clone(),
            store: Arc::clone(&store),
            counted_at: Arc::new(tokio::sync::Mutex::new(None)),
        };
        let router = Router::new()
            .route("/metrics", get(metrics))
            .with_state(exporter)
            .merge(health_routes(Arc::clone(&store)));
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, router).await {
                tracing::error!(error = %err, "the metrics listener failed");
            }
        });
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(UPKEEP_EVERY);
            loop {
                ticks.tick().await;
                handle.run_upkeep();
            }
        });
        Ok(store)
    }
}

/// Starts OpenTelemetry export as the standard `OTEL_*` variables say (docs/observability.md):
/// `None` when they ask for neither traces nor metrics. Exports run on the current runtime.
pub(crate) fn start_telemetry() -> anyhow::Result<Option<Telemetry>> {
    let settings = OtelSettings::from_env().context("cannot read the OTEL_* variables")?;
    if !settings.traces && !settings.metrics {
        return Ok(None);
    }
    let telemetry = Telemetry::install(&settings).context("cannot start OpenTelemetry export")?;
    tracing::info!(
        traces = settings.traces,
        metrics = settings.metrics,
        "exporting OpenTelemetry over OTLP"
    );
    Ok(Some(telemetry))
}

/// Sends what `telemetry` still buffers, within `grace` (the graceful stop's last step).
pub(crate) async fn stop_telemetry(telemetry: Option<Telemetry>, grace: Duration) {
    let Some(telemetry) = telemetry else {
        return;
    };
    if let Err(err) = telemetry.shutdown(grace).await {
        tracing::warn!(error = %err, dropped = telemetry.spans_dropped(), "OpenTelemetry export did not finish");
    }
}

/// The path of the liveness probe.
pub(crate) const HEALTHZ: &str = "/healthz";
/// The path of the readiness probe.
pub(crate) const READYZ: &str = "/readyz";

/// `GET /healthz` (200 while the process runs) and `GET /readyz` (200 when `store` answers a
/// read within [`READY_TIMEOUT`], else 503).
pub(crate) fn health_routes<S: Clone + Send + Sync + 'static>(store: Arc<dyn Store>) -> Router<S> {
    Router::new()
        .route(HEALTHZ, get(|| async { "ok\n" }))
        .route(READYZ, get(readyz))
        .with_state(store)
}

async fn readyz(State(store): State<Arc<dyn Store>>) -> impl IntoResponse {
    match store_ready(store.as_ref()).await {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(reason) => {
            tracing::warn!(%reason, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            )
        }
    }
}

/// Whether the store answers a point read (of a key no call uses) in time.
async fn store_ready(store: &dyn Store) -> Result<(), String> {
    let key = IdempotencyKey::new("readyz", 64).map_err(|err| err.to_string())?;
    let probe = RecordId {
        scope: Scope::new("mcp-idem:readyz", "mcp-idem"),
        key,
    };
    match tokio::time::timeout(READY_TIMEOUT, store.get(&probe, Timestamp::now())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!(
            "the store did not answer within {}",
            humantime::format_duration(READY_TIMEOUT)
        )),
    }
}

#[derive(Clone)]
struct Exporter {
    handle: PrometheusHandle,
    store: Arc<dyn Store>,
    /// When the record counts were last read.
    counted_at: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

async fn metrics(State(exporter): State<Exporter>) -> impl IntoResponse {
    exporter.refresh_record_counts().await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        exporter.handle.render(),
    )
}

impl Exporter {
    /// Reads [`Store::stats`] into the records gauge, unless that was done less than
    /// [`RECORD_COUNTS_EVERY`] ago: counting may scan the store, scrapes should not.
    async fn refresh_record_counts(&self) {
        let mut counted_at = self.counted_at.lock().await;
        if counted_at.is_some_and(|at| at.elapsed() < RECORD_COUNTS_EVERY) {
            return;
        }
        match tokio::time::timeout(READY_TIMEOUT, self.store.stats(Timestamp::now())).await {
            Ok(Ok(stats)) => mcp_idempotency::metrics::set_record_counts(&stats),
            Ok(Err(err)) => tracing::warn!(error = %err, "cannot count records"),
            Err(_) => tracing::warn!("counting records timed out"),
        }
        *counted_at = Some(Instant::now());
    }
}
