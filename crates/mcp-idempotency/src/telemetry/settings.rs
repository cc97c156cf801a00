//! The export settings, read from the standard `OTEL_*` variables ([`OtelSettings::from_env`]) or
//! filled by the caller (a binary's flags). A value that cannot be understood is an error at start,
//! never a silent fallback.
//!
//! Read here: whether traces are on, the protocol, the endpoints, the headers, the service name,
//! the sampler, the span queue's size, whether metrics go over OTLP, a CA file and the timeout. Left
//! to the OpenTelemetry crates, which read them themselves: `OTEL_RESOURCE_ATTRIBUTES` (besides its
//! `service.name`), `OTEL_EXPORTER_OTLP_COMPRESSION`, the other `OTEL_BSP_*` variables
//! (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`) and the span limits
//! (`OTEL_SPAN_*_COUNT_LIMIT`).

use std::path::PathBuf;
use std::time::Duration;

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES` says one.
pub const DEFAULT_SERVICE_NAME: &str = "mcp-idem";
/// The span queue's size when `OTEL_BSP_MAX_QUEUE_SIZE` is unset (the specification's default).
pub const DEFAULT_SPAN_QUEUE_SIZE: usize = 2048;
/// How long one export may take when `OTEL_EXPORTER_OTLP_TIMEOUT` is unset (the specification's
/// default).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How spans and metrics reach the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    /// OTLP over gRPC (`grpc`; tonic, TLS by ring), usually port 4317.
    Grpc,
    /// OTLP over HTTP with protobuf bodies (`http/protobuf`, the specification's default), usually
    /// port 4318, on the crate's HTTP client.
    #[default]
    HttpProtobuf,
}

impl Protocol {
    /// The value of `OTEL_EXPORTER_OTLP_PROTOCOL` that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Which spans are recorded and exported (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum SamplerSetting {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio`: this fraction of the traces, by trace id.
    TraceIdRatio(f64),
    /// `parentbased_always_on` (the default): as the parent says; a root span is sampled.
    #[default]
    ParentBasedAlwaysOn,
    /// `parentbased_always_off`: as the parent says; a root span is not sampled.
    ParentBasedAlwaysOff,
    /// `parentbased_traceidratio`: as the parent says; a root span by the ratio.
    ParentBasedTraceIdRatio(f64),
}

/// What to export and where. Built by [`OtelSettings::from_env`], or by hand.
#[derive(Clone, Debug, PartialEq)]
pub struct OtelSettings {
    /// Whether spans are exported. Off, no span is made and nothing else changes.
    pub traces: bool,
    /// Whether the `metrics` facade's series are exported over OTLP too
    /// (`OTEL_METRICS_EXPORTER=otlp`).
    pub metrics: bool,
    /// The traces' protocol (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub traces_protocol: Protocol,
    /// The metrics' protocol (`OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub metrics_protocol: Protocol,
    /// The full URL spans are sent to; `None`: the protocol's local default
    /// (`http://localhost:4317`, `http://localhost:4318/v1/traces`).
    pub traces_endpoint: Option<String>,
    /// The full URL metrics are sent to; `None`: the protocol's local default.
    pub metrics_endpoint: Option<String>,
    /// Headers (gRPC metadata) sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`:
    /// `key=value,key2=value2`, values percent-decoded).
    pub headers: Vec<(String, String)>,
    /// `service.name`; `None` leaves it to `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: Option<String>,
    /// The sampler.
    pub sampler: SamplerSetting,
    /// How many ended spans may wait for export; more are dropped and counted
    /// (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub span_queue_size: usize,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`, milliseconds).
    pub timeout: Duration,
    /// A PEM file of CA certificates trusted besides the system's roots
    /// (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
    pub certificate: Option<PathBuf>,
}

impl Default for OtelSettings {
    /// Everything off, the specification's defaults otherwise.
    fn default() -> Self {
        OtelSettings {
            traces: false,
            metrics: false,
            traces_protocol: Protocol::default(),
            metrics_protocol: Protocol::default(),
            traces_endpoint: None,
            metrics_endpoint: None,
            headers: Vec::new(),
            service_name: Some(DEFAULT_SERVICE_NAME.to_owned()),
            sampler: SamplerSetting::default(),
            span_queue_size: DEFAULT_SPAN_QUEUE_SIZE,
            timeout: DEFAULT_EXPORT_TIMEOUT,
            certificate: None,
        }
    }
}

/// A variable whose value cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}={value:?}: {reason}")]
pub struct SettingsError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

fn invalid(variable: &'static str, value: &str, reason: impl Into<String>) -> SettingsError {
    SettingsError {
        variable,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

impl OtelSettings {
    /// Reads the process's environment.
    pub fn from_env() -> Result<OtelSettings, SettingsError> {
        OtelSettings::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (a name to its value; empty counts as unset).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<OtelSettings, SettingsError> {
        let get = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        let mut settings = OtelSettings::default();

        let disabled = match get("OTEL_SDK_DISABLED") {
            None => false,
            Some(value) => parse_bool("OTEL_SDK_DISABLED", &value)?,
        };
        let traces_exporter = match get("OTEL_TRACES_EXPORTER") {
            None => None,
            Some(value) => Some(parse_exporter("OTEL_TRACES_EXPORTER", &value)?),
        };
        let traces_endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let endpoint = get("OTEL_EXPORTER_OTLP_ENDPOINT");
        settings.traces = !disabled
            && match traces_exporter {
                Some(on) => on,
                None => traces_endpoint.is_some() || endpoint.is_some(),
            };
        settings.metrics = !disabled
            && match get("OTEL_METRICS_EXPORTER") {
                None => false,
                Some(value) => parse_exporter("OTEL_METRICS_EXPORTER", &value)?,
            };

        let protocol = match get("OTEL_EXPORTER_OTLP_PROTOCOL") {
            None => Protocol::default(),
            Some(value) => parse_protocol("OTEL_EXPORTER_OTLP_PROTOCOL", &value)?,
        };
        settings.traces_protocol = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            None => protocol,
            Some(value) => parse_protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", &value)?,
        };
        settings.metrics_protocol = match get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") {
            None => protocol,
            Some(value) => parse_protocol("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", &value)?,
        };
        settings.traces_endpoint = signal_endpoint(
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_endpoint),
            endpoint.as_deref(),
            settings.traces_protocol,
            "/v1/traces",
        )?;
        settings.metrics_endpoint = signal_endpoint(
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
            ),
            endpoint.as_deref(),
            settings.metrics_protocol,
            "/v1/metrics",
        )?;
        if let Some(value) = get("OTEL_EXPORTER_OTLP_HEADERS") {
            settings.headers = parse_headers("OTEL_EXPORTER_OTLP_HEADERS", &value)?;
        }
        if let Some(name) = get("OTEL_SERVICE_NAME") {
            settings.service_name = Some(name.trim().to_owned());
        } else if let Some(attributes) = get("OTEL_RESOURCE_ATTRIBUTES") {
            let names_service = attributes
                .split(',')
                .any(|pair| pair.split_once('=').map(|(k, _)| k.trim()) == Some("service.name"));
            if names_service {
                settings.service_name = None;
            }
        }
        settings.sampler = parse_sampler(
            get("OTEL_TRACES_SAMPLER").as_deref(),
            get("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        )?;
        if let Some(value) = get("OTEL_BSP_MAX_QUEUE_SIZE") {
            settings.span_queue_size = match value.trim().parse::<usize>() {
                Ok(size) if size > 0 => size,
                _ => {
                    return Err(invalid(
                        "OTEL_BSP_MAX_QUEUE_SIZE",
                        &value,
                        "not a count above 0",
                    ))
                }
            };
        }
        for variable in [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ] {
            if let Some(value) = get(variable) {
                settings.timeout = match value.trim().parse::<u64>() {
                    Ok(ms) if ms > 0 => Duration::from_millis(ms),
                    _ => return Err(invalid(variable, &value, "not milliseconds above 0")),
                };
                break;
            }
        }
        settings.certificate = get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
            .or_else(|| get("OTEL_EXPORTER_OTLP_CERTIFICATE"))
            .map(PathBuf::from);
        Ok(settings)
    }
}

fn parse_bool(variable: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(variable, value, "neither true nor false")),
    }
}

/// `otlp` is on, `none` off; the other exporters of the specification are not built in.
fn parse_exporter(variable: &'static str, value: &str) -> Result<bool, SettingsError> {
    let mut on = false;
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "otlp" => on = true,
            "none" => return Ok(false),
            _ => {
                return Err(invalid(
                    variable,
                    value,
                    "only `otlp` and `none` are supported",
                ))
            }
        }
    }
    Ok(on)
}

fn parse_protocol(variable: &'static str, value: &str) -> Result<Protocol, SettingsError> {
    match value.trim() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "http/json" => Err(invalid(
            variable,
            value,
            "http/json is not supported: use grpc or http/protobuf",
        )),
        _ => Err(invalid(variable, value, "not grpc or http/protobuf")),
    }
}

/// The signal's own variable is the whole URL; the shared one is a base to which OTLP/HTTP adds
/// the signal's path (the specification's rule).
fn signal_endpoint(
    (variable, own): (&'static str, Option<String>),
    shared: Option<&str>,
    protocol: Protocol,
    path: &str,
) -> Result<Option<String>, SettingsError> {
    let (variable, url) = match (own, shared) {
        (Some(own), _) => (variable, own.trim().to_owned()),
        (None, Some(base)) => {
            let base = base.trim();
            let url = match protocol {
                Protocol::Grpc => base.to_owned(),
                Protocol::HttpProtobuf => format!("{}{path}", base.trim_end_matches('/')),
            };
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        }
        (None, None) => return Ok(None),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|err| invalid(variable, &url, format!("not a URL: {err}")))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(Some(url)),
        _ => Err(invalid(variable, &url, "not an http:// or https:// URL")),
    }
}

fn parse_headers(
    variable: &'static str,
    value: &str,
) -> Result<Vec<(String, String)>, SettingsError> {
    let mut headers = Vec::new();
    for pair in value.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((name, raw)) = pair.split_once('=') else {
            return Err(invalid(
                variable,
                value,
                format!("`{pair}` is not key=value"),
            ));
        };
        let name = name.trim().to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(invalid(
                variable,
                value,
                format!("`{name}` is not a header name"),
            ));
        }
        let decoded = percent_decode(raw.trim())
            .ok_or_else(|| invalid(variable, value, format!("`{raw}` has a bad %-escape")))?;
        if http::HeaderValue::from_str(&decoded).is_err() {
            return Err(invalid(
                variable,
                value,
                format!("`{name}`'s value is not a header value"),
            ));
        }
        headers.push((name, decoded));
    }
    Ok(headers)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = text.get(at + 1..at + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn parse_sampler(name: Option<&str>, arg: Option<&str>) -> Result<SamplerSetting, SettingsError> {
    let ratio = || -> Result<f64, SettingsError> {
        match arg {
            None => Ok(1.0),
            Some(text) => match text.trim().parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
                _ => Err(invalid(
                    "OTEL_TRACES_SAMPLER_ARG",
                    text,
                    "not a ratio from 0 to 1",
                )),
            },
        }
    };
    Ok(match name.map(str::trim) {
        None | Some("parentbased_always_on") => SamplerSetting::ParentBasedAlwaysOn,
        Some("always_on") => SamplerSetting::AlwaysOn,
        Some("always_off") => SamplerSetting::AlwaysOff,
        Some("traceidratio") => SamplerSetting::TraceIdRatio(ratio()?),
        Some("parentbased_always_off") => SamplerSetting::ParentBasedAlwaysOff,
        Some("parentbased_traceidratio") => SamplerSetting::ParentBasedTraceIdRatio(ratio()?),
        Some(other) => {
            return Err(invalid(
                "OTEL_TRACES_SAMPLER",
                other,
                "not always_on, always_off, traceidratio, parentbased_always_on, \
                 parentbased_always_off or parentbased_traceidratio",
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<OtelSettings, SettingsError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OtelSettings::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn off_without_an_endpoint_or_exporter() {
        let settings = read(&[]).unwrap();
        assert!(!settings.traces && !settings.metrics);
        assert_eq!(settings.service_name.as_deref(), Some("mcp-idem"));
        assert_eq!(settings.sampler, SamplerSetting::ParentBasedAlwaysOn);
        assert_eq!(settings.traces_protocol, Protocol::HttpProtobuf);
    }

    #[test]
    fn an_endpoint_turns_traces_on_and_none_forces_them_off() {
        let on = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).unwrap();
        assert!(on.traces);
        assert_eq!(
            on.traces_endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            on.metrics_endpoint.as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        let own = read(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:1/x")]).unwrap();
        assert!(own.traces);
        assert_eq!(own.traces_endpoint.as_deref(), Some("http://c:1/x"));
        let grpc = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap();
        assert_eq!(grpc.traces_endpoint.as_deref(), Some("http://c:4317"));
        assert!(read(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap().traces);
        let forced_off = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])
        .unwrap();
        assert!(!forced_off.traces);
        let disabled = read(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_SDK_DISABLED", "true"),
        ])
        .unwrap();
        assert!(!disabled.traces);
    }

    #[test]
    fn bad_values_are_errors_that_name_the_variable() {
        for (vars, variable) in [
            (
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                vec![
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_HEADERS", "novalue")],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![("OTEL_BSP_MAX_QUEUE_SIZE", "-1")],
                "OTEL_BSP_MAX_QUEUE_SIZE",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
        ] {
            let error = read(&vars).unwrap_err();
            assert_eq!(error.variable, variable, "{error}");
        }
    }

    #[test]
    fn headers_samplers_and_service_names() {
        let settings = read(&[
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Bearer%20x, x-tenant=a",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_SERVICE_NAME", "gateway"),
        ])
        .unwrap();
        assert_eq!(
            settings.headers,
            vec![
                ("authorization".to_owned(), "Bearer x".to_owned()),
                ("x-tenant".to_owned(), "a".to_owned())
            ]
        );
        assert_eq!(
            settings.sampler,
            SamplerSetting::ParentBasedTraceIdRatio(0.25)
        );
        assert_eq!(settings.service_name.as_deref(), Some("gateway"));
        let from_resource = read(&[("OTEL_RESOURCE_ATTRIBUTES", "service.name=svc,a=b")]).unwrap();
        assert_eq!(from_resource.service_name, None);
        let ratio_default = read(&[("OTEL_TRACES_SAMPLER", "traceidratio")]).unwrap();
        assert_eq!(ratio_default.sampler, SamplerSetting::TraceIdRatio(1.0));
    }
}
