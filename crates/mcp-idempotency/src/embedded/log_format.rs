//! The format of the logs on stderr ([`LogFormat`]): text (the default, `tracing-subscriber`'s
//! own) or one JSON object per line, for log pipelines that parse what a container prints.
//!
//! A JSON line holds `timestamp` (RFC 3339, UTC, microseconds), `level` (`ERROR` .. `TRACE`),
//! `target` (the module that logged), `message`, then the event's own fields, flattened (a number
//! or a boolean stays one; anything else is its text), and `trace_id` and `span_id` when the event
//! happens inside a span that carries them:
//!
//! ```text
//! {"timestamp":"2026-08-01T09:30:00.123456Z","level":"WARN","target":"mcp_idem::commands::proxy","message":"store unavailable","attempt":3,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}
//! ```
//!
//! The keys come in that order, the event's fields in the order it names them. A record of the
//! `log` crate (a dependency's, through `tracing-log`) has its own target, as in the text format.
//!
//! The trace context comes from the innermost enclosing span with a `trace_id` field (recorded as
//! a string, when the span starts or later with `Span::record`), with that span's `span_id`: the
//! tracing code enters such a span around each call it handles. Each must be hexadecimal of the
//! W3C length (32 and 16 digits); it is written in lowercase, and a value of another shape is left
//! out. The top-level names win: an event field called `level` or `trace_id` does not replace
//! them.

use std::fmt;
use std::io::Write;
use std::str::FromStr;
use std::time::SystemTime;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The environment variable that picks the format of the logs: `text` or `json`.
pub const LOG_FORMAT_ENV: &str = "MCP_IDEM_LOG_FORMAT";

/// How the logs on stderr are written: `mcp-idem --log-format`, `MCP_IDEM_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, `tracing-subscriber`'s format (the default).
    #[default]
    Text,
    /// One JSON object per line (see the module docs).
    Json,
}

impl LogFormat {
    /// The format `MCP_IDEM_LOG_FORMAT` names: unset or empty, [`LogFormat::Text`]; another
    /// value than `text` or `json` is an error naming it.
    pub fn from_env() -> Result<Self, UnknownLogFormat> {
        match std::env::var(LOG_FORMAT_ENV) {
            Ok(value) if !value.is_empty() => value.parse(),
            _ => Ok(Self::Text),
        }
    }
}

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// A log format other than `text` or `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {0:?}: expected `text` or `json`")]
pub struct UnknownLogFormat(String);

/// The trace context a span carries, kept in its extensions.
#[derive(Debug, Default, Clone)]
struct TraceIds {
    trace_id: Option<String>,
    span_id: Option<String>,
}

impl Visit for TraceIds {
    fn record_str(&mut self, field: &Field, value: &str) {
        let (slot, digits) = match field.name() {
            "trace_id" => (&mut self.trace_id, 32),
            "span_id" => (&mut self.span_id, 16),
            _ => return,
        };
        *slot = (value.len() == digits && value.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| value.to_ascii_lowercase());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if matches!(field.name(), "trace_id" | "span_id") {
            // `display(id)` and `debug(id)` values: their text, without a string's quotes.
            let text = format!("{value:?}");
            self.record_str(field, text.trim_matches('"'));
        }
    }
}

/// An event's fields as JSON values, in the order the event names them.
struct Fields<'a>(&'a mut Vec<(&'static str, Value)>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.push((field.name(), value));
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value)
            .map_or_else(|| Value::String(value.to_string()), Value::Number);
        self.put(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        let value = i64::try_from(value).map_or_else(|_| value.to_string().into(), Value::from);
        self.put(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        let value = u64::try_from(value).map_or_else(|_| value.to_string().into(), Value::from);
        self.put(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

/// A [`Layer`] that writes each event as one JSON line to `writer` (stderr in
/// [`log_to_stderr_as`](super::log_to_stderr_as)).
pub(crate) struct JsonLayer<W> {
    writer: W,
}

impl<W> JsonLayer<W> {
    pub(crate) fn new(writer: W) -> Self {
        Self { writer }
    }
}

impl<S, W> Layer<S> for JsonLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut ids = TraceIds::default();
        attrs.record(&mut ids);
        if ids.trace_id.is_some() || ids.span_id.is_some() {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(ids);
            }
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(ids) = extensions.get_mut::<TraceIds>() {
            values.record(ids);
        } else {
            let mut ids = TraceIds::default();
            values.record(&mut ids);
            if ids.trace_id.is_some() || ids.span_id.is_some() {
                extensions.insert(ids);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let ids = ctx.event_scope(event).and_then(|scope| {
            scope.into_iter().find_map(|span| {
                let extensions = span.extensions();
                let ids = extensions.get::<TraceIds>()?;
                ids.trace_id.is_some().then(|| ids.clone())
            })
        });
        let mut line = json_line(event, SystemTime::now(), ids.unwrap_or_default());
        line.push('\n');
        // One write per line, so that lines from several threads never interleave; a log that
        // cannot be written is lost, as the text format's.
        let _ = self.writer.make_writer().write_all(line.as_bytes());
    }
}

/// The names a line starts with, or ends with, which an event's field of the same name does not
/// replace.
const TOP_LEVEL: [&str; 6] = [
    "timestamp",
    "level",
    "target",
    "message",
    "trace_id",
    "span_id",
];

/// `event` as one line of JSON (without the newline): `timestamp`, `level`, `target`, `message`,
/// the event's fields in its order, then `ids`. A record of the `log` crate (through
/// `tracing-log`) has its own target, and its `log.*` fields are left out, as in the text format.
fn json_line(event: &Event<'_>, now: SystemTime, ids: TraceIds) -> String {
    let mut fields = Vec::new();
    event.record(&mut Fields(&mut fields));
    let metadata = event.metadata();
    let mut target = Value::from(metadata.target());
    let mut message = Value::from("");
    let mut rest = Vec::new();
    for (name, value) in fields {
        match name {
            "message" => message = value,
            "log.target" => target = value,
            _ if name.starts_with("log.") || TOP_LEVEL.contains(&name) => {}
            _ => rest.push((name, value)),
        }
    }
    let timestamp = humantime::format_rfc3339_micros(now).to_string();
    let mut pairs = vec![
        ("timestamp", Value::from(timestamp)),
        ("level", metadata.level().as_str().into()),
        ("target", target),
        ("message", message),
    ];
    pairs.extend(rest);
    pairs.extend(ids.trace_id.map(|id| ("trace_id", id.into())));
    pairs.extend(ids.span_id.map(|id| ("span_id", id.into())));
    // Written pair by pair: serde_json's map would sort the keys.
    let mut text = String::from("{");
    for (index, (name, value)) in pairs.iter().enumerate() {
        if index > 0 {
            text.push(',');
        }
        text.push_str(&Value::from(*name).to_string());
        text.push(':');
        text.push_str(&value.to_string());
    }
    text.push('}');
    text
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::Map;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The lines written, shared with the test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// Runs `log` under a JSON layer and returns each line written, parsed.
    fn logged(log: impl FnOnce()) -> Vec<Map<String, Value>> {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(JsonLayer::new(lines.clone()));
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(text.ends_with('\n'), "{text:?}");
        text.lines()
            .map(|line| match serde_json::from_str(line) {
                Ok(Value::Object(object)) => object,
                other => panic!("not a JSON object: {line:?} ({other:?})"),
            })
            .collect()
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn an_event_inside_a_span_with_ids_carries_them_at_the_top_level() {
        let lines = logged(|| {
            let call = tracing::info_span!("mcp.call", trace_id = TRACE, span_id = SPAN);
            let _entered = call.enter();
            let inner = tracing::debug_span!("store.claim", key = "k");
            let _inner = inner.enter();
            tracing::warn!(
                attempt = 3,
                retried = true,
                store = "redis",
                "store unavailable"
            );
        });
        let [line] = lines.as_slice() else {
            panic!("{lines:?}")
        };
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "store unavailable");
        assert_eq!(line["target"], module_path!());
        assert_eq!(line["trace_id"], TRACE);
        assert_eq!(line["span_id"], SPAN);
        // The event's fields, flattened, with their JSON types.
        assert_eq!(line["attempt"], 3);
        assert_eq!(line["retried"], true);
        assert_eq!(line["store"], "redis");
        // RFC 3339 in UTC.
        let timestamp = line["timestamp"].as_str().unwrap();
        assert!(timestamp.ends_with('Z'), "{timestamp}");
        humantime::parse_rfc3339(timestamp).unwrap();
    }

    #[test]
    fn without_a_span_with_ids_there_are_none() {
        let lines = logged(|| {
            tracing::error!("outside any span");
            let plain = tracing::info_span!("plain", other = 1);
            let _entered = plain.enter();
            tracing::info!(n = 1u64, "inside a span without ids");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        for line in &lines {
            assert!(!line.contains_key("trace_id"), "{line:?}");
            assert!(!line.contains_key("span_id"), "{line:?}");
        }
        assert_eq!(lines[0]["level"], "ERROR");
        assert_eq!(lines[0]["message"], "outside any span");
        assert_eq!(lines[1]["n"], 1);
    }

    #[test]
    fn ids_recorded_later_count_and_the_innermost_span_wins() {
        let upper = "4BF92F3577B34DA6A3CE929D0E0E4736";
        let lines = logged(|| {
            let outer = tracing::info_span!("outer", trace_id = TRACE, span_id = SPAN);
            let _outer = outer.enter();
            let call = tracing::info_span!(
                "mcp.call",
                trace_id = tracing::field::Empty,
                span_id = tracing::field::Empty
            );
            let _call = call.enter();
            tracing::info!("before the ids");
            call.record("trace_id", upper);
            call.record("span_id", tracing::field::display("b7ad6b7169203331"));
            tracing::info!("after the ids");
            // A field of the event does not replace the span's context.
            tracing::info!(trace_id = "not-an-id", level = "mine", "shadowing");
        });
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0]["trace_id"], TRACE, "the outer span's until then");
        assert_eq!(lines[1]["trace_id"], upper.to_ascii_lowercase());
        assert_eq!(lines[1]["span_id"], "b7ad6b7169203331");
        assert_eq!(lines[2]["trace_id"], upper.to_ascii_lowercase());
        assert_eq!(lines[2]["level"], "INFO");
    }

    #[test]
    fn malformed_ids_are_left_out() {
        let lines = logged(|| {
            let call = tracing::info_span!("mcp.call", trace_id = "xyz", span_id = "123");
            let _entered = call.enter();
            tracing::info!("hello");
        });
        assert!(!lines[0].contains_key("trace_id"), "{:?}", lines[0]);
        assert!(!lines[0].contains_key("span_id"), "{:?}", lines[0]);
    }

    #[test]
    fn a_message_with_quotes_and_newlines_stays_on_one_line() {
        let lines = logged(|| tracing::info!(path = "a\"b", "two\nlines \"quoted\""));
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["message"], "two\nlines \"quoted\"");
        assert_eq!(lines[0]["path"], "a\"b");
    }

    #[test]
    fn a_line_starts_with_the_top_level_keys_and_keeps_the_events_order() {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(JsonLayer::new(lines.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let call = tracing::info_span!("mcp.call", trace_id = TRACE, span_id = SPAN);
            let _entered = call.enter();
            tracing::info!(zeta = 1, alpha = 2, "ordered");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let keys: Vec<&str> = text
            .split(['{', ','])
            .filter_map(|pair| pair.split_once("\":").map(|(key, _)| &key[1..]))
            .collect();
        assert_eq!(
            keys,
            [
                "timestamp",
                "level",
                "target",
                "message",
                "zeta",
                "alpha",
                "trace_id",
                "span_id"
            ],
            "{text}"
        );
    }

    #[test]
    fn formats_parse_from_their_names() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        let err = "xml".parse::<LogFormat>().unwrap_err().to_string();
        assert!(err.contains("\"xml\""), "{err}");
        assert_eq!(LogFormat::default().to_string(), "text");
    }
}
