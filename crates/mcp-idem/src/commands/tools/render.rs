//! The output of `mcp-idem tools`, without I/O: the listing as TOML comments followed by the
//! suggested policy (one valid TOML document, to save as the config file), or one JSON object.
//! Keys and strings are written by the `toml` crate.

use crate::shown::escape_controls;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::classify::{Identifier, LeftOut, Suggestion, ToolReport, WINDOW};

/// The policy table of a suggestion (the one the gateways apply with `--tools suggested`); `None`
/// for a tool left out.
pub(crate) fn table(suggestion: &Suggestion) -> Option<toml::Table> {
    // A JSON object of strings, arrays of strings and booleans is always a TOML table.
    toml::Table::try_from(suggestion.table()?).ok()
}

/// The suggested policy: `{"tools": {NAME: TABLE, ...}}` (the first of tools listed twice).
pub(crate) fn policy(reports: &[ToolReport]) -> toml::Table {
    let mut tools = toml::Table::new();
    for report in reports {
        if let Some(table) = table(&report.suggestion) {
            tools.entry(report.name.clone()).or_insert(table.into());
        }
    }
    let mut policy = toml::Table::new();
    policy.insert("tools".into(), tools.into());
    policy
}

/// The whole text output: the listing (comments), then the policy, table by table, each after
/// comments saying what to check.
pub(crate) fn text(server: &str, reports: &[ToolReport]) -> String {
    let mut out = String::new();
    listing(&mut out, server, reports);
    out.push_str("#\n");
    out.push_str(
        "# A starting policy for tools/call requests that carry no SEP-3182 idempotency key\n\
         # (a call with a key is deduplicated by its key). Check every table before use.\n",
    );
    let mut written = Vec::new();
    for report in reports {
        let Some(table) = table(&report.suggestion) else {
            continue;
        };
        if written.contains(&report.name.as_str()) {
            continue;
        }
        written.push(&report.name);
        out.push('\n');
        for line in advice(report) {
            let _ = writeln!(out, "# {}", escape_controls(&line));
        }
        out.push_str(&tool_table(&report.name, table));
    }
    let left_out: Vec<_> = reports
        .iter()
        .filter_map(|report| match report.suggestion {
            Suggestion::LeftOut(why) => Some((report, why)),
            _ => None,
        })
        .collect();
    if !left_out.is_empty() {
        out.push_str("\n# Left out of the policy:\n");
        for (report, why) in left_out {
            let _ = writeln!(out, "#   {}: {}", escape_controls(&report.name), why.why());
        }
    }
    out
}

/// The listing: per tool, its annotations, identifier-looking arguments and what is suggested.
fn listing(out: &mut String, server: &str, reports: &[ToolReport]) {
    let left_out = reports
        .iter()
        .filter(|r| matches!(r.suggestion, Suggestion::LeftOut(_)))
        .count();
    let _ = writeln!(
        out,
        "# mcp-idem tools: {} listed by {} ({} left out of the policy)",
        count(reports.len(), "tool"),
        escape_controls(server),
        left_out
    );
    for report in reports {
        out.push_str("#\n");
        let _ = writeln!(out, "# {}", escape_controls(&report.name));
        let hints = report.annotations.present();
        let hints = if hints.is_empty() {
            "none".to_owned()
        } else {
            hints
                .iter()
                .map(|(name, value)| format!("{name}: {value}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(out, "#   annotations: {hints}");
        if report.identifiers.is_empty() {
            out.push_str("#   identifier-looking arguments: none\n");
        } else {
            out.push_str("#   identifier-looking arguments:\n");
            for id in &report.identifiers {
                let _ = writeln!(
                    out,
                    "#     {}: {}",
                    escape_controls(&id.pointer),
                    escape_controls(&id.reason)
                );
            }
        }
        let _ = writeln!(
            out,
            "#   suggested: {}",
            escape_controls(&summary(&report.suggestion))
        );
    }
}

/// The suggestion in one line.
fn summary(suggestion: &Suggestion) -> String {
    match suggestion {
        Suggestion::LeftOut(why) => format!("left out ({})", why.why()),
        Suggestion::KeyArgument(argument) => format!("key-argument = {}", string(argument)),
        Suggestion::KeyFrom(pointers) => format!(
            "key-from = [{}], required",
            pointers
                .iter()
                .map(|p| string(p))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Suggestion::Window => format!("window = {}", string(WINDOW)),
    }
}

/// The comment lines above a tool's table: what to check.
fn advice(report: &ToolReport) -> Vec<String> {
    let name = &report.name;
    let mut lines = match &report.suggestion {
        Suggestion::LeftOut(_) => Vec::new(),
        Suggestion::KeyArgument(argument) => vec![
            format!("{name}: its argument {argument} carries a key; calls with the same value run once."),
        ],
        Suggestion::KeyFrom(_) => {
            let required: Vec<&Identifier> =
                report.identifiers.iter().filter(|id| id.required).collect();
            let names = required
                .iter()
                .map(|id| id.argument.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let (subject, values) = match required.as_slice() {
                [_] => (format!("{names} names"), "value"),
                _ => ("together they name".to_owned(), "values"),
            };
            vec![
                format!("{name}: keyed by {names}. CHECK that {subject} ONE operation:"),
                format!("two calls with the same {values} run once (the second gets the first's outcome);"),
                "an id of a customer or an account names many operations: drop it, or add the"
                    .into(),
                "argument that tells them apart. A call without them is refused (-32602).".into(),
            ]
        }
        Suggestion::Window => vec![
            format!("{name}: no identifier argument, so identical calls are merged within a window."),
            format!("The cost: two identical calls inside {WINDOW} run once, even when both were meant."),
        ],
    };
    let optional: Vec<&Identifier> = report.optional_identifiers().collect();
    if !optional.is_empty() && !matches!(report.suggestion, Suggestion::KeyArgument(_)) {
        lines.push(format!(
            "Not used, as a call may leave them out: {}",
            optional
                .iter()
                .map(|id| id.pointer.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    lines
}

/// `[tools.NAME]` and its keys, as the `toml` crate writes them (quoting NAME when needed).
fn tool_table(name: &str, table: toml::Table) -> String {
    let mut tools = toml::Table::new();
    tools.insert(name.to_owned(), table.into());
    let mut document = toml::Table::new();
    document.insert("tools".into(), tools.into());
    toml::to_string(&document).unwrap_or_else(|err| format!("# cannot write the table: {err}\n"))
}

/// `text` as a TOML basic string.
fn string(text: &str) -> String {
    toml::Value::from(text).to_string()
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The `--json` output: the server, each tool with its annotations, identifier candidates and
/// suggested table (or why it is left out), and the whole policy.
pub(crate) fn json(server: &str, reports: &[ToolReport]) -> Value {
    let tools: Vec<Value> = reports
        .iter()
        .map(|report| {
            let left_out = match report.suggestion {
                Suggestion::LeftOut(why) => Some(why),
                _ => None,
            };
            json!({
                "name": report.name,
                "annotations": report.annotations,
                "identifiers": report.identifiers,
                "policy": table(&report.suggestion),
                "leftOut": left_out.map(|why: LeftOut| json!({"reason": why, "why": why.why()})),
            })
        })
        .collect();
    json!({
        "server": server,
        "tools": tools,
        "policy": policy(reports),
    })
}

#[cfg(test)]
mod tests {
    use super::super::classify::classify;
    use super::*;
    use serde_json::json;

    fn reports() -> Vec<ToolReport> {
        classify(&[
            json!({"name": "get_order", "annotations": {"readOnlyHint": true},
                   "inputSchema": {"properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}),
            json!({"name": "charge_payment", "annotations": {"destructiveHint": true},
                   "inputSchema": {"properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
                                   "required": ["order_id", "amount"]}}),
            json!({"name": "refund", "inputSchema": {"properties": {"idempotencyKey": {"type": "string"}}}}),
            json!({"name": "billing.log event\n[x]", "inputSchema": {"properties": {"a/b~c_ref": {"type": "string"}}}}),
            json!({"name": "set", "annotations": {"idempotentHint": true}}),
            json!({"name": "*"}),
        ])
    }

    #[test]
    fn the_text_is_toml_with_the_expected_tables() {
        let text = text("python3 server.py\nx", &reports());
        let parsed: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let tools = parsed["tools"].as_table().expect("[tools]");
        assert_eq!(tools.len(), 3, "{text}");
        assert!(
            text.contains("[tools.charge_payment]\nkey-from = [\"/order_id\"]\nrequired = true\n"),
            "{text}"
        );
        assert_eq!(
            tools["refund"]["key-argument"].as_str(),
            Some("idempotencyKey")
        );
        assert_eq!(
            tools["billing.log event\n[x]"]["window"].as_str(),
            Some(WINDOW)
        );
        assert!(!tools.contains_key("get_order") && !tools.contains_key("set"));
        assert!(!tools.contains_key("*"), "{text}");
        assert!(
            text.contains("#   *: named \"*\", which in the config means every tool"),
            "{text}"
        );
        assert_eq!(parsed.len(), 1, "only [tools]: {text}");
        assert_eq!(
            toml::Value::Table(policy(&reports())),
            toml::Value::Table(parsed)
        );
        // The quoted key, as the toml crate writes it.
        assert!(
            text.contains("[tools.\"billing.log event\\n[x]\"]\n"),
            "{text}"
        );
        // The listing: annotations, reasons, what is left out and why.
        assert!(
            text.contains("#   annotations: destructiveHint: true\n"),
            "{text}"
        );
        assert!(
            text.contains("#     /order_id: required string named *_id\n"),
            "{text}"
        );
        assert!(
            text.contains("#     /a~1b~0c_ref: optional string named *_ref (weaker"),
            "{text}"
        );
        assert!(text.contains("#   get_order: readOnlyHint: true"), "{text}");
        assert!(text.contains("#   set: idempotentHint: true"), "{text}");
        assert!(text.contains("ONE operation"), "{text}");
        assert!(
            text.contains("two identical calls inside 30s run once"),
            "{text}"
        );
    }

    #[test]
    fn no_tools_is_an_empty_policy() {
        let text = text("srv", &[]);
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert!(parsed.is_empty(), "{text}");
        assert!(
            text.starts_with("# mcp-idem tools: 0 tools listed by srv"),
            "{text}"
        );
    }

    #[test]
    fn the_json_carries_tools_candidates_and_the_policy() {
        let json = json("srv", &reports());
        assert_eq!(json["server"], "srv");
        let tools = json["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 6);
        assert_eq!(tools[0]["annotations"], json!({"readOnlyHint": true}));
        assert_eq!(tools[0]["policy"], Value::Null);
        assert_eq!(tools[0]["leftOut"]["reason"], "readOnlyHint");
        assert_eq!(
            tools[1]["identifiers"][0],
            json!({"argument": "order_id", "pointer": "/order_id", "type": "string",
                   "required": true, "pattern": "*_id", "reason": "required string named *_id"})
        );
        assert_eq!(
            tools[1]["policy"],
            json!({"key-from": ["/order_id"], "required": true})
        );
        assert_eq!(tools[1]["leftOut"], Value::Null);
        assert_eq!(
            json["policy"]["tools"]["charge_payment"],
            tools[1]["policy"]
        );
        assert_eq!(json["policy"]["tools"].as_object().unwrap().len(), 3);
    }
}
