//! What the span and the metric pipelines share: the instrumentation scope, the resource, the
//! gRPC metadata and TLS of the settings, and the error of either.

use opentelemetry_sdk::Resource;

use super::settings::OtelSettings;

/// The instrumentation scope of every span the crate makes.
pub const SCOPE_NAME: &str = "mcp-idempotency";

/// Why the pipeline could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// No tokio runtime to run the exports on.
    #[error("OpenTelemetry export needs a tokio runtime: start it from within one")]
    NoRuntime,
    /// The OTLP exporter refused its configuration.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
    /// The CA file of `OTEL_EXPORTER_OTLP_CERTIFICATE` could not be used.
    #[error("OTEL_EXPORTER_OTLP_CERTIFICATE: {0}")]
    Certificate(String),
    /// [`Telemetry::install`] ran twice in one process.
    #[error("OpenTelemetry export is already installed in this process")]
    AlreadyInstalled,
    /// Shutting down did not finish: buffered data may be lost.
    #[error("OpenTelemetry shutdown: {0}")]
    Shutdown(String),
}

/// The headers of the settings as gRPC metadata.
pub(crate) fn metadata(settings: &OtelSettings) -> tonic::metadata::MetadataMap {
    let mut metadata = tonic::metadata::MetadataMap::new();
    for (name, value) in &settings.headers {
        // Checked by the settings: ASCII names and values.
        if let (Ok(name), Ok(value)) = (
            name.parse::<tonic::metadata::AsciiMetadataKey>(),
            value.parse::<tonic::metadata::AsciiMetadataValue>(),
        ) {
            metadata.insert(name, value);
        }
    }
    metadata
}

/// gRPC over TLS: the system's roots, plus the CA file if one is given.
pub(crate) fn tls_config(
    settings: &OtelSettings,
) -> Result<tonic::transport::ClientTlsConfig, TelemetryError> {
    let mut config = tonic::transport::ClientTlsConfig::new().with_native_roots();
    if let Some(path) = &settings.certificate {
        let pem = std::fs::read(path)
            .map_err(|err| TelemetryError::Certificate(format!("{}: {err}", path.display())))?;
        config = config.ca_certificate(tonic::transport::Certificate::from_pem(pem));
    }
    Ok(config)
}

/// The SDK's resource (`OTEL_RESOURCE_ATTRIBUTES`, the SDK's own attributes) with the service
/// name of the settings.
pub(crate) fn resource(settings: &OtelSettings) -> Resource {
    let builder = Resource::builder();
    match &settings.service_name {
        Some(name) => builder.with_service_name(name.clone()).build(),
        None => builder.build(),
    }
}
