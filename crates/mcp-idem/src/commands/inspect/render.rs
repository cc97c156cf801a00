//! What `inspect` prints: tables and key-value blocks for people, JSON documents for programs.
//! The JSON field names are part of the interface (docs/inspect.md).

use crate::shown::escape_controls;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use mcp_idempotency::store::{StoreStats, StoreUrl};
use mcp_idempotency::{Outcome, Record, RecordState, Timestamp};
use serde::Serialize;
use serde_json::value::RawValue;

/// A record in JSON.
#[derive(Serialize)]
struct RecordJson<'a> {
    namespace: &'a str,
    principal: &'a str,
    key: &'a str,
    key_digest: String,
    key_source: &'static str,
    state: &'static str,
    tool: &'a str,
    fingerprint: String,
    created_at: String,
    expires_at: String,
    owner: Option<String>,
    lease_expires_at: Option<String>,
    completed_at: Option<String>,
    outcome_kind: Option<&'static str>,
    trace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<OutcomeJson<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum OutcomeJson<'a> {
    Success { result: Body<'a> },
    Error { error: Body<'a> },
    NotRetained { size: u64 },
    Unknown { reason: &'a str },
}

/// A stored JSON-RPC member: as the server sent it, or as a string if it is not JSON.
#[derive(Serialize)]
#[serde(untagged)]
enum Body<'a> {
    Json(&'a RawValue),
    Text(&'a str),
}

impl<'a> Body<'a> {
    fn of(raw: &'a str) -> Self {
        serde_json::from_str(raw).map_or(Self::Text(raw), Self::Json)
    }
}

/// `in_progress`, `completed` or `expired`.
fn state_name(record: &Record, now: Timestamp) -> &'static str {
    match &record.state {
        _ if record.is_expired(now) => "expired",
        RecordState::InProgress { .. } => "in_progress",
        RecordState::Completed { .. } => "completed",
    }
}

fn record_json(record: &Record, now: Timestamp, with_outcome: bool) -> RecordJson<'_> {
    let (owner, lease, completed, outcome) = match &record.state {
        RecordState::InProgress {
            owner,
            lease_expires_at,
        } => (
            Some(format!("{:016x}", owner.as_u64())),
            Some(time(*lease_expires_at)),
            None,
            None,
        ),
        RecordState::Completed {
            outcome,
            completed_at,
        } => (None, None, Some(time(*completed_at)), Some(outcome)),
    };
    RecordJson {
        namespace: record.id.scope.namespace(),
        principal: record.id.scope.principal(),
        key: record.id.key.for_tool(),
        key_digest: record.id.key.digest(),
        key_source: record.id.key.source().as_str(),
        state: state_name(record, now),
        tool: &record.tool_name,
        fingerprint: record.fingerprint.to_hex(),
        created_at: time(record.created_at),
        expires_at: time(record.expires_at),
        owner,
        lease_expires_at: lease,
        completed_at: completed,
        outcome_kind: outcome.map(|o| o.kind().as_str()),
        trace_id: record.trace.map(|trace| trace.trace_id_hex()),
        outcome: outcome
            .filter(|_| with_outcome)
            .map(|outcome| match outcome {
                Outcome::Success(raw) => OutcomeJson::Success {
                    result: Body::of(raw),
                },
                Outcome::Error(raw) => OutcomeJson::Error {
                    error: Body::of(raw),
                },
                Outcome::NotRetained { size } => OutcomeJson::NotRetained { size: *size },
                Outcome::Unknown { reason } => OutcomeJson::Unknown { reason },
            }),
    }
}

fn json(value: &impl Serialize) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|err| {
        serde_json::json!({ "error": format!("cannot encode the output: {err}") }).to_string()
    });
    text.push('\n');
    text
}

/// The last instant RFC 3339 can write (9999-12-31T23:59:59.999Z); later ones are "never".
const LAST_RFC3339_MILLIS: u64 = 253_402_300_799_999;

/// `2026-11-30T10:00:00.000Z`, or `never` for instants past year 9999.
fn time(t: Timestamp) -> String {
    if t.as_millis() > LAST_RFC3339_MILLIS {
        return "never".to_owned();
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(t.as_millis());
    humantime::format_rfc3339_millis(at).to_string()
}

/// `5m12s`: the two largest units of a duration.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// `2026-…Z (5m12s ago)` or `2026-…Z (in 23h54m)`.
fn time_from_now(t: Timestamp, now: Timestamp) -> String {
    if t.as_millis() > LAST_RFC3339_MILLIS {
        return "never".to_owned();
    }
    if t <= now {
        format!("{} ({} ago)", time(t), short(now.saturating_since(t)))
    } else {
        format!("{} (in {})", time(t), short(t.saturating_since(now)))
    }
}

/// `text` as one word for a POSIX shell.
pub(super) fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/=+@%,".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", escape_controls(text).replace('\'', r"'\''"))
    }
}

/// The records as a table, or `{"records": [...], "truncated": bool}`.
pub(super) fn list(records: &[Record], truncated: bool, now: Timestamp, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct List<'a> {
            records: Vec<RecordJson<'a>>,
            truncated: bool,
        }
        return json(&List {
            records: records
                .iter()
                .map(|record| record_json(record, now, false))
                .collect(),
            truncated,
        });
    }
    if records.is_empty() {
        return "no matching records\n".to_owned();
    }
    let header = [
        "STATE",
        "AGE",
        "TOOL",
        "OUTCOME",
        "NAMESPACE",
        "PRINCIPAL",
        "SOURCE",
        "KEY",
    ];
    let rows: Vec<[String; 8]> = records
        .iter()
        .map(|record| {
            let outcome = match &record.state {
                RecordState::InProgress { .. } if lease_ran_out(record, now) => "lease ran out",
                RecordState::InProgress { .. } => "-",
                RecordState::Completed { outcome, .. } => outcome.kind().as_str(),
            };
            [
                state_name(record, now).replace('_', "-"),
                short(now.saturating_since(record.created_at)),
                escape_controls(&record.tool_name),
                outcome.to_owned(),
                escape_controls(record.id.scope.namespace()),
                escape_controls(record.id.scope.principal()),
                record.id.key.source().to_string(),
                escape_controls(record.id.key.for_tool()),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                let _ = write!(out, "{cell}{}  ", " ".repeat(pad));
            }
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    text
}

fn lease_ran_out(record: &Record, now: Timestamp) -> bool {
    matches!(record.state, RecordState::InProgress { lease_expires_at, .. } if lease_expires_at <= now)
}

/// One record with its outcome, as `name value` lines, or as a JSON object.
pub(super) fn show(record: &Record, now: Timestamp, as_json: bool) -> String {
    if as_json {
        return json(&record_json(record, now, true));
    }
    let mut text = String::new();
    let mut field = |name: &str, value: &str| {
        let _ = writeln!(text, "{name:<14} {value}");
    };
    field("key", &escape_controls(record.id.key.for_tool()));
    field("key digest", &record.id.key.digest());
    field("source", record.id.key.source().as_str());
    field("namespace", &escape_controls(record.id.scope.namespace()));
    field("principal", &escape_controls(record.id.scope.principal()));
    field("state", &state_name(record, now).replace('_', "-"));
    field("tool", &escape_controls(&record.tool_name));
    field("fingerprint", &record.fingerprint.to_hex());
    field("created", &time_from_now(record.created_at, now));
    field("expires", &time_from_now(record.expires_at, now));
    if let Some(trace) = record.trace {
        field("trace", &trace.to_traceparent());
    }
    let body = match &record.state {
        RecordState::InProgress {
            owner,
            lease_expires_at,
        } => {
            field("owner", &format!("{:016x}", owner.as_u64()));
            let mut lease = time_from_now(*lease_expires_at, now);
            if *lease_expires_at <= now {
                lease.push_str(": the owner is presumed dead");
            }
            field("lease expires", &lease);
            None
        }
        RecordState::Completed {
            outcome,
            completed_at,
        } => {
            field("completed", &time_from_now(*completed_at, now));
            match outcome {
                Outcome::Success(raw) => {
                    field("outcome", "success; the JSON-RPC result:");
                    Some(raw)
                }
                Outcome::Error(raw) => {
                    field("outcome", "error; the JSON-RPC error:");
                    Some(raw)
                }
                Outcome::NotRetained { size } => {
                    field(
                        "outcome",
                        &format!("not retained ({size} bytes, over the size limit)"),
                    );
                    None
                }
                Outcome::Unknown { reason } => {
                    field("outcome", &format!("unknown: {}", escape_controls(reason)));
                    None
                }
            }
        }
    };
    if let Some(raw) = body {
        let pretty = serde_json::from_str::<serde_json::Value>(raw)
            .and_then(|value| serde_json::to_string_pretty(&value));
        text.push_str(&pretty.unwrap_or_else(|_| escape_controls(raw)));
        text.push('\n');
    }
    text
}

/// Counts by state.
pub(super) fn stats(
    url: &StoreUrl,
    stats: StoreStats,
    lease_expired: u64,
    as_json: bool,
) -> String {
    let total = stats.in_progress + stats.completed + stats.expired;
    if as_json {
        return json(&serde_json::json!({
            "store": url.to_string(),
            "in_progress": stats.in_progress,
            "completed": stats.completed,
            "expired": stats.expired,
            "total": total,
            "lease_expired": lease_expired,
        }));
    }
    let mut text = String::new();
    for (name, value) in [
        ("store", url.to_string()),
        ("in-progress", stats.in_progress.to_string()),
        ("  lease ran out", lease_expired.to_string()),
        ("completed", stats.completed.to_string()),
        ("expired", stats.expired.to_string()),
        ("total", total.to_string()),
    ] {
        let _ = writeln!(text, "{name:<16} {value}");
    }
    text
}

/// How many records a purge deleted.
pub(super) fn purged(purged: u64, as_json: bool) -> String {
    if as_json {
        return json(&serde_json::json!({ "purged": purged }));
    }
    format!("purged {purged} expired records\n")
}

/// The record a deletion removed.
pub(super) fn deleted(record: &Record, now: Timestamp, as_json: bool) -> String {
    if as_json {
        return json(&serde_json::json!({
            "deleted": serde_json::to_value(record_json(record, now, false)).unwrap_or_default(),
        }));
    }
    format!(
        "deleted key {} (source {}, namespace {}, principal {})\n",
        shell_word(record.id.key.for_tool()),
        record.id.key.source(),
        shell_word(record.id.scope.namespace()),
        shell_word(record.id.scope.principal())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_short() {
        let s = Duration::from_secs;
        assert_eq!(short(s(0)), "0s");
        assert_eq!(short(s(59)), "59s");
        assert_eq!(short(s(312)), "5m12s");
        assert_eq!(short(s(3 * 3600 + 5 * 60 + 9)), "3h05m");
        assert_eq!(short(s(2 * 86400 + 4 * 3600)), "2d04h");
    }

    #[test]
    fn far_future_times_are_never() {
        assert_eq!(time(Timestamp::from_millis(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            time(Timestamp::from_millis(LAST_RFC3339_MILLIS)),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(time(Timestamp::from_millis(u64::MAX)), "never");
        assert_eq!(
            time_from_now(Timestamp::from_millis(u64::MAX), Timestamp::from_millis(0)),
            "never"
        );
    }

    #[test]
    fn stored_text_cannot_drive_the_terminal() {
        assert_eq!(escape_controls("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(shell_word("wrap:server:0a1b"), "wrap:server:0a1b");
        assert_eq!(shell_word("bearer:ab/+="), "bearer:ab/+=");
        assert_eq!(
            shell_word(r#"jwt:["iss","it's"]"#),
            r#"'jwt:["iss","it'\''s"]'"#
        );
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn bodies_are_kept_as_sent_or_as_text() {
        let raw = r#"{ "n" : 1.0e0 }"#;
        assert_eq!(serde_json::to_string(&Body::of(raw)).unwrap(), raw);
        assert_eq!(
            serde_json::to_string(&Body::of("not json")).unwrap(),
            r#""not json""#
        );
    }
}
