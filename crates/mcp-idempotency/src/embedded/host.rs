//! What the Python and TypeScript bindings share beyond the gateway itself: their options read
//! from JSON in the host language's spelling ([`Settings::from_json`]), a decision as they hand it
//! back ([`Step`]), the one runtime their store I/O runs on ([`runtime`]), and their logs
//! ([`log_to_stderr`]).

use serde_json::Value;

use crate::default_scope::server_namespace;
use crate::policy::parse::kebab_case;
use crate::policy::ToolPolicies;

use super::log_format::{JsonLayer, LogFormat, LOG_FORMAT_ENV};
use super::options::{self, GatewayOption};
use super::{FromClient, FromServer, Settings, SetupError};

impl Settings {
    /// A binding's settings: `options` is a JSON object of option name to value, the names in
    /// `wrap`'s kebab-case or in the host's spelling (`after_crash` in Python, `afterCrash` in
    /// Node), each at most once; a `null` value is an option not given. Values are JSON as the
    /// host has them: `"24h"`, `256`, `true`; `tools` an object of tool name to settings (as the
    /// config file's `[tools.NAME]` tables) or its JSON text; `meta-key` a name or an array of
    /// names; `principal` a string (a binding keeps a principal that is a function of the request
    /// itself and passes none here).
    ///
    /// Records are kept under the `namespace` option, else under `mcp-server:` and
    /// `server_name` (the server's `serverInfo.name`), as under `mcp-idem wrap`. A server with
    /// no name (none, or empty) and no `namespace` is refused ([`SetupError::NoServerName`]):
    /// `wrap` does not decide a call before it knows the server's name either, and a made-up name
    /// would mix unrelated servers' records.
    ///
    /// Every error names the option as it was given (`after_crash`, not `after-crash`) and says
    /// what it accepts, with the value given: `retention: expected a duration such as 24h, 30m or
    /// 500ms, got "forever"`.
    pub fn from_json(server_name: Option<&str>, options: &str) -> Result<Self, SetupError> {
        let options: Value = serde_json::from_str(options).map_err(|err| {
            SetupError::invalid_option("options", None, format!("not JSON: {err}"))
        })?;
        let Value::Object(options) = options else {
            return Err(SetupError::invalid_option(
                "options",
                Some(shown(&options)),
                "expected an object of option name to value",
            ));
        };
        let mut settings = Settings::new(String::new());
        let mut seen: Vec<(&'static str, &str)> = Vec::new();
        for (given, value) in &options {
            let option = options::find(given).ok_or_else(|| SetupError::UnknownOption {
                expected: option_names_like(given),
                name: given.clone(),
            })?;
            if let Some((_, first)) = seen.iter().find(|(name, _)| *name == option.name) {
                return Err(SetupError::DuplicateOption {
                    first: (*first).to_owned(),
                    second: given.clone(),
                });
            }
            seen.push((option.name, given));
            if !value.is_null() {
                settings.set_json(option, given, value)?;
            }
        }
        if settings.namespace.is_empty() {
            match server_name {
                Some(name) if !name.is_empty() => settings.namespace = server_namespace(name),
                _ => return Err(SetupError::NoServerName),
            }
        }
        Ok(settings)
    }

    /// Sets `option`, given as `given`, to the JSON `value`.
    fn set_json(
        &mut self,
        option: &'static GatewayOption,
        given: &str,
        value: &Value,
    ) -> Result<(), SetupError> {
        let refused =
            |reason: String| SetupError::invalid_option(given, Some(shown(value)), reason);
        match (option.name, value) {
            // The policies as the host has them (not their JSON text): errors name the tool and
            // the setting as written.
            (name, value) if name == options::TOOLS.name && !value.is_string() => {
                let meta_keys = self.interceptor.policies().meta_keys().iter();
                let policies = ToolPolicies::from_json(value)
                    .and_then(|policies| policies.with_meta_keys(meta_keys.map(String::as_str)))
                    .map_err(|err| SetupError::invalid_option(given, None, err.to_string()))?;
                self.interceptor = self.interceptor.clone().tool_policies(policies);
                self.remember(option, given, value.to_string());
                Ok(())
            }
            (name, _) if name == options::META_KEY.name => {
                let names = meta_key_names(value).map_err(refused)?;
                let policies = self
                    .interceptor
                    .policies()
                    .clone()
                    .with_meta_keys(names.iter().copied())
                    .map_err(|err| refused(err.to_string()))?;
                self.interceptor = self.interceptor.clone().tool_policies(policies);
                self.remember(option, given, Value::from(names).to_string());
                Ok(())
            }
            (name, _) if name == options::PRINCIPAL.name && !value.is_string() => Err(refused(
                "expected a string, or a function of the request that returns one".into(),
            )),
            (_, Value::String(text)) => self.set_text(option, given, text, shown(value)),
            (_, Value::Bool(flag)) => self.set_text(option, given, &flag.to_string(), shown(value)),
            (_, Value::Number(number)) => {
                self.set_text(option, given, &number.to_string(), shown(value))
            }
            _ => Err(refused(format!("expected {}", accepted(option)))),
        }
    }

    /// Sets `option`, given as `given`, to the text `value` (a JSON string, number or boolean,
    /// `shown` as the user gave it).
    fn set_text(
        &mut self,
        option: &'static GatewayOption,
        given: &str,
        value: &str,
        shown: String,
    ) -> Result<(), SetupError> {
        (option.set)(self, value)
            .map_err(|reason| SetupError::invalid_option(given, Some(shown), reason))?;
        self.remember(option, given, value.to_owned());
        Ok(())
    }
}

/// What `option` takes, when a JSON value of the wrong kind was given for it.
fn accepted(option: &GatewayOption) -> &'static str {
    match option.name {
        "forward-key" => "true or false",
        "max-key-bytes"
        | "max-argument-bytes"
        | "max-outcome-bytes"
        | "max-records-per-scope"
        | "max-records-total" => "a positive whole number",
        "retention" | "lease" => "a duration such as 24h, 30m or 500ms",
        _ => "a string",
    }
}

/// The names of the `meta-key` option's value: one name, or an array of them.
fn meta_key_names(value: &Value) -> Result<Vec<&str>, String> {
    let names = match value {
        Value::String(name) => vec![name.as_str()],
        Value::Array(names) => names
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<_>>>()
            .ok_or("expected a name or an array of names")?,
        _ => return Err("expected a name or an array of names".into()),
    };
    if names.is_empty() || names.iter().any(|name| name.is_empty()) {
        return Err("expected `_meta` member names, none of them empty".into());
    }
    Ok(names)
}

/// A JSON value as an error shows it.
fn shown(value: &Value) -> String {
    value.to_string()
}

/// Every option's name, spelled as `given` is: snake_case for `after_crash`, camelCase for
/// `afterCrash`, else kebab-case.
pub(super) fn option_names_like(given: &str) -> String {
    let names: Vec<String> = options::every()
        .map(|option| spelled_like(given, option.name))
        .collect();
    names.join(", ")
}

/// The kebab-case `name` spelled as `given` is.
fn spelled_like(given: &str, name: &str) -> String {
    if given.contains('_') {
        name.replace('-', "_")
    } else if given.chars().any(|c| c.is_ascii_uppercase()) && kebab_case(given) != given {
        let mut camel = String::with_capacity(name.len());
        let mut upper = false;
        for c in name.chars() {
            match c {
                '-' => upper = true,
                c if upper => {
                    camel.push(c.to_ascii_uppercase());
                    upper = false;
                }
                c => camel.push(c),
            }
        }
        camel
    } else {
        name.to_owned()
    }
}

/// A decision as a binding hands it to its language: the action (`forward`, `rewritten`: send
/// `message` instead, `respond`: send `message` back to the client, nothing reaches the server,
/// or `drop`) and the message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// `forward`, `rewritten`, `respond` or `drop`.
    pub action: &'static str,
    /// The message to send, for `rewritten` and `respond`.
    pub message: Option<String>,
}

impl From<FromClient> for Step {
    fn from(action: FromClient) -> Self {
        let (action, message) = match action {
            FromClient::Forward => ("forward", None),
            FromClient::ForwardRewritten(message) => ("rewritten", Some(message)),
            FromClient::Respond(message) => ("respond", Some(message)),
            FromClient::Drop => ("drop", None),
        };
        Self { action, message }
    }
}

impl From<FromServer> for Step {
    fn from(action: FromServer) -> Self {
        let (action, message) = match action {
            FromServer::Forward => ("forward", None),
            FromServer::ForwardRewritten(message) => ("rewritten", Some(message)),
            FromServer::Drop => ("drop", None),
        };
        Self { action, message }
    }
}

/// The runtime a binding runs every store round trip of its process on: one worker thread,
/// `mcp-idempotency`. A second worker only takes CPU from the host's thread (a task spawned from
/// the host's thread woke one worker, which woke the other to look for more work, and the two
/// took turns running the store's operations: docs/benchmarks.md).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("mcp-idempotency")
        .enable_all()
        .build()
}

/// The OTLP pipeline of a binding's process, when the `OTEL_*` variables ask for one.
#[cfg(feature = "otel")]
static TELEMETRY: std::sync::OnceLock<Option<crate::telemetry::Telemetry>> =
    std::sync::OnceLock::new();

/// Starts OpenTelemetry export as the standard `OTEL_*` variables say, as `mcp-idem` does, with
/// its exports on `runtime` (the binding's [`runtime`]); once per process, as the runtime starts.
/// Settings that cannot be read are logged and export stays off: a binding never fails its host
/// over telemetry. [`Gateways::settle_at_exit`](super::Gateways::settle_at_exit) flushes it.
#[cfg(feature = "otel")]
pub fn export_telemetry(runtime: &tokio::runtime::Handle) {
    use crate::telemetry::{OtelSettings, Telemetry};
    TELEMETRY.get_or_init(|| {
        let settings = match OtelSettings::from_env() {
            Ok(settings) if settings.traces || settings.metrics => settings,
            Ok(_) => return None,
            Err(err) => {
                tracing::warn!(error = %err, "OpenTelemetry export is off");
                return None;
            }
        };
        match Telemetry::install_on(&settings, runtime.clone()) {
            Ok(telemetry) => {
                if let Some(recorder) = telemetry.metrics_recorder(&[(
                    crate::metrics::OPERATION_DURATION_SECONDS,
                    &crate::telemetry::OPERATION_DURATION_BUCKETS,
                )]) {
                    if metrics::set_global_recorder(recorder).is_ok() {
                        crate::metrics::describe();
                        crate::telemetry::record_durations();
                    }
                }
                Some(telemetry)
            }
            Err(err) => {
                tracing::warn!(error = %err, "OpenTelemetry export is off");
                None
            }
        }
    });
}

/// Sends what the binding's OTLP pipeline still buffers, within `grace`.
#[cfg(feature = "otel")]
pub(super) async fn flush_telemetry(grace: std::time::Duration) {
    if let Some(Some(telemetry)) = TELEMETRY.get() {
        if let Err(err) = telemetry.shutdown(grace).await {
            tracing::warn!(error = %err, "OpenTelemetry export did not finish");
        }
    }
}

/// Sends the library's logs to stderr, as `mcp-idem` does, filtered by `MCP_IDEM_LOG`: a level
/// (`debug`) or comma-separated `TARGET=LEVEL` directives
/// (`warn,mcp_idempotency::interceptor=debug`); unset or unreadable, `warn`. On stdio transports
/// stdout carries the protocol. Written in the format `MCP_IDEM_LOG_FORMAT` names, `text` (the
/// default) or `json` ([`LogFormat`]); another value logs as text, after a warning that says so.
/// A binding calls it once, as its runtime starts; `false` when the process already has a
/// `tracing` subscriber (left as it is).
pub fn log_to_stderr() -> bool {
    match LogFormat::from_env() {
        Ok(format) => log_to_stderr_as(format),
        Err(err) => {
            let installed = log_to_stderr_as(LogFormat::Text);
            tracing::warn!("{LOG_FORMAT_ENV}: {err}; logging as text");
            installed
        }
    }
}

/// [`log_to_stderr`] in the format `format`, whatever `MCP_IDEM_LOG_FORMAT` says (`mcp-idem`'s
/// `--log-format` has read it).
pub fn log_to_stderr_as(format: LogFormat) -> bool {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("MCP_IDEM_LOG")
        .ok()
        .and_then(|directives| directives.parse().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing_subscriber::filter::LevelFilter::WARN)
        });
    let output = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => JsonLayer::new(std::io::stderr).boxed(),
    };
    tracing_subscriber::registry()
        .with(output.with_filter(filter))
        .try_init()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::AfterCrash;

    fn refused(options: Value) -> String {
        Settings::from_json(Some("s"), &options.to_string())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn options_are_taken_in_each_hosts_spelling() {
        let python = json!({"after_crash": "reexecute", "max_key_bytes": 16, "forward_key": true,
                            "retention": "2h", "meta_key": ["x-key"], "store": null});
        let settings = Settings::from_json(Some("pay"), &python.to_string()).unwrap();
        assert_eq!(settings.namespace, "mcp-server:pay");
        assert_eq!(settings.engine.after_crash(), AfterCrash::Reexecute);
        assert_eq!(settings.engine.retention(), Duration::from_secs(7200));
        assert_eq!(settings.store, None);
        let node = json!({"afterCrash": "reexecute", "maxKeyBytes": 16, "forwardKey": true,
                          "retention": "2h", "metaKey": "x-key"});
        let same = Settings::from_json(Some("pay"), &node.to_string()).unwrap();
        assert_eq!(settings.identity(), same.identity());
    }

    #[test]
    fn an_unknown_option_is_named_as_given_with_the_options_in_its_spelling() {
        let python = refused(json!({"after_crsh": "reject"}));
        assert!(
            python.starts_with("unknown option \"after_crsh\"; expected one of: store, namespace"),
            "{python}"
        );
        assert!(python.contains(", after_crash, forward_key,"), "{python}");
        let node = refused(json!({"afterCrsh": "reject"}));
        assert!(node.contains(", afterCrash, forwardKey,"), "{node}");
    }

    #[test]
    fn a_bad_value_names_the_option_as_given_and_what_it_accepts() {
        assert_eq!(
            refused(json!({"retention": "forever"})),
            "retention: expected a duration such as 24h, 30m or 500ms, got \"forever\""
        );
        assert_eq!(
            refused(json!({"after_crash": "retry"})),
            "after_crash: expected reject or reexecute, got \"retry\""
        );
        assert_eq!(
            refused(json!({"max_key_bytes": 0})),
            "max_key_bytes: expected a positive whole number, got 0"
        );
        assert_eq!(
            refused(json!({"maxKeyBytes": [1]})),
            "maxKeyBytes: expected a positive whole number, got [1]"
        );
        assert_eq!(
            refused(json!({"principal": 7})),
            "principal: expected a string, or a function of the request that returns one, got 7"
        );
        assert_eq!(
            refused(json!({"max_key_bytes": 1, "maxKeyBytes": 2})),
            "\"maxKeyBytes\" and \"max_key_bytes\" are one option; give it once"
        );
    }

    #[test]
    fn a_policy_error_names_the_setting_as_given() {
        let python = refused(json!({"tools": {"charge": {"key_frm": ["/id"]}}}));
        assert!(
            python.starts_with("tools: tool policy [tools.\"charge\"]: unknown setting `key_frm`"),
            "{python}"
        );
        let node = refused(json!({"tools": {"charge": {"keyFrom": 5}}}));
        assert!(
            node.starts_with("tools: tool policy [tools.\"charge\"]: `keyFrom`: "),
            "{node}"
        );
    }

    #[test]
    fn a_server_without_a_name_needs_a_namespace() {
        for name in [None, Some("")] {
            let err = Settings::from_json(name, "{}").unwrap_err();
            assert!(matches!(err, SetupError::NoServerName), "{err}");
            assert_eq!(err.error_type(), "idempotency_invalid_option");
        }
        let named = Settings::from_json(None, r#"{"namespace":"n"}"#).unwrap();
        assert_eq!(named.namespace, "n");
    }

    #[test]
    fn steps_carry_the_action_and_the_message() {
        let step = Step::from(FromClient::Respond("m".into()));
        assert_eq!(
            (step.action, step.message.as_deref()),
            ("respond", Some("m"))
        );
        assert_eq!(Step::from(FromServer::Drop).action, "drop");
    }
}
