//! The suggested policy, without I/O: from the entries of a server's `tools/list` to, per tool,
//! its annotations, the arguments that look like identifiers (and why), and the policy table to
//! suggest for calls that carry no SEP-3182 key. `mcp-idem tools` prints it; `--tools suggested`
//! (`tools = "suggested"`) applies it in `wrap`, `proxy` and the bindings, a tool's own table
//! overriding it ([`merged`]).
//!
//! The rules, in order:
//! 1. `readOnlyHint: true` or `idempotentHint: true`: left out (the server says a repeat does no
//!    harm). So is a tool named `*`, which the config reads as every tool: no `[tools."*"]`.
//! 2. An argument named `idempotency_key` (any of `idempotencyKey`, `idempotency-key`, …):
//!    `key-argument` naming it.
//! 3. Required identifier-looking arguments: `key-from` with their JSON Pointers, `required`.
//! 4. Otherwise: a `window` of [`WINDOW`].

use serde::Serialize;
use serde_json::{Map, Value};

use super::parse::kebab_case;

/// The window suggested for a tool without an identifier.
pub const WINDOW: &str = "30s";

/// A tool's behaviour hints, as the server annotated it (absent hints stay `None`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    /// `readOnlyHint`: the tool changes nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// `idempotentHint`: a repeat has no further effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// `destructiveHint`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// `openWorldHint`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

impl Annotations {
    /// The hints of a tool's `annotations` object; hints that are not booleans are ignored.
    fn read(annotations: Option<&Value>) -> Self {
        let hint = |name: &str| {
            annotations
                .and_then(|a| a.get(name))
                .and_then(Value::as_bool)
        };
        Self {
            read_only_hint: hint("readOnlyHint"),
            idempotent_hint: hint("idempotentHint"),
            destructive_hint: hint("destructiveHint"),
            open_world_hint: hint("openWorldHint"),
        }
    }

    /// The hints present, as `(wire name, value)`.
    pub fn present(&self) -> Vec<(&'static str, bool)> {
        [
            ("readOnlyHint", self.read_only_hint),
            ("idempotentHint", self.idempotent_hint),
            ("destructiveHint", self.destructive_hint),
            ("openWorldHint", self.open_world_hint),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect()
    }
}

/// The JSON type of an identifier argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A JSON string.
    String,
    /// A JSON integer.
    Integer,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
        }
    }
}

/// An argument whose name and type suggest it identifies the operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Identifier {
    /// The argument's name (a member of `inputSchema.properties`).
    pub argument: String,
    /// Its JSON Pointer into the arguments, escaped per RFC 6901.
    pub pointer: String,
    /// Its JSON type.
    #[serde(rename = "type")]
    pub kind: Kind,
    /// Listed in `inputSchema.required`; an optional one is a weaker candidate.
    pub required: bool,
    /// The name pattern it matched, e.g. `*_id`.
    pub pattern: String,
    /// Why it was picked, in words.
    pub reason: String,
}

/// Why a tool is left out of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LeftOut {
    /// `readOnlyHint: true`: it changes nothing.
    #[serde(rename = "readOnlyHint")]
    ReadOnly,
    /// `idempotentHint: true`: a repeat has no further effect.
    #[serde(rename = "idempotentHint")]
    Idempotent,
    /// Named `*`: `[tools."*"]` would be read as the table of every tool.
    #[serde(rename = "name")]
    Wildcard,
}

impl LeftOut {
    /// Why, in words.
    pub fn why(self) -> &'static str {
        match self {
            Self::ReadOnly => "readOnlyHint: true, the server says it changes nothing",
            Self::Idempotent => {
                "idempotentHint: true, the server says a repeat has no further effect"
            }
            Self::Wildcard => {
                "named \"*\", which in the config means every tool: no table is written"
            }
        }
    }
}

/// The policy table suggested for a tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Suggestion {
    /// No table: calling it twice does no harm, by its annotations.
    LeftOut(LeftOut),
    /// `key-argument = NAME`: the argument carries a key.
    KeyArgument(String),
    /// `key-from = [POINTERS]`, `required = true`: the required identifier arguments.
    KeyFrom(Vec<String>),
    /// `window = WINDOW`: identical calls within the window run once.
    Window,
}

/// What `mcp-idem tools` says about one tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReport {
    /// The tool's name.
    pub name: String,
    /// Its behaviour hints.
    pub annotations: Annotations,
    /// Identifier-looking arguments, required ones first, each group by name.
    pub identifiers: Vec<Identifier>,
    /// The policy table suggested for it.
    pub suggestion: Suggestion,
}

impl ToolReport {
    /// The optional identifier-looking arguments (not used by a suggestion).
    pub fn optional_identifiers(&self) -> impl Iterator<Item = &Identifier> {
        self.identifiers.iter().filter(|id| !id.required)
    }
}

/// Classifies each entry of a `tools/list` result (the `tools` array, all pages). An entry
/// without a string `name` is skipped.
pub fn classify(tools: &[Value]) -> Vec<ToolReport> {
    tools.iter().filter_map(classify_tool).collect()
}

fn classify_tool(tool: &Value) -> Option<ToolReport> {
    let name = tool.get("name")?.as_str()?.to_owned();
    let annotations = Annotations::read(tool.get("annotations"));
    let schema = tool.get("inputSchema");
    let properties = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let required: Vec<&str> = schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut identifiers: Vec<Identifier> = properties
        .into_iter()
        .flatten()
        .filter_map(|(argument, schema)| {
            identifier(argument, schema, required.contains(&argument.as_str()))
        })
        .collect();
    identifiers.sort_by(|a, b| (!a.required, &a.argument).cmp(&(!b.required, &b.argument)));
    let key_argument = properties
        .into_iter()
        .flatten()
        .map(|(argument, _)| argument)
        .find(|argument| is_key_argument(argument));
    let suggestion = if name == "*" {
        Suggestion::LeftOut(LeftOut::Wildcard)
    } else if annotations.read_only_hint == Some(true) {
        Suggestion::LeftOut(LeftOut::ReadOnly)
    } else if annotations.idempotent_hint == Some(true) {
        Suggestion::LeftOut(LeftOut::Idempotent)
    } else if let Some(argument) = key_argument {
        Suggestion::KeyArgument(argument.clone())
    } else {
        let pointers: Vec<String> = identifiers
            .iter()
            .filter(|id| id.required)
            .map(|id| id.pointer.clone())
            .collect();
        if pointers.is_empty() {
            Suggestion::Window
        } else {
            Suggestion::KeyFrom(pointers)
        }
    };
    Some(ToolReport {
        name,
        annotations,
        identifiers,
        suggestion,
    })
}

impl Suggestion {
    /// Whether no table is suggested (the tool's annotations say a repeat does no harm).
    pub fn is_left_out(&self) -> bool {
        matches!(self, Self::LeftOut(_))
    }

    /// The policy table, as the `[tools.NAME]` JSON object `--tools` takes; `None` when left out.
    pub fn table(&self) -> Option<Value> {
        let table = match self {
            Self::LeftOut(_) => return None,
            Self::KeyArgument(argument) => serde_json::json!({ "key-argument": argument }),
            Self::KeyFrom(pointers) => {
                serde_json::json!({ "key-from": pointers, "required": true })
            }
            Self::Window => serde_json::json!({ "window": WINDOW }),
        };
        Some(table)
    }
}

/// The word that asks for the suggested policy: `--tools suggested`, `tools = "suggested"`, or a
/// member `"suggested": true` beside the tool tables.
pub const SUGGESTED: &str = "suggested";

/// The settings that say where a key comes from: a tool's own table that gives one replaces the
/// suggestion's whole choice (with its `required`), not one setting of it.
const KEY_SETTINGS: [&str; 3] = ["key-from", "key-argument", "window"];

/// Reads the `suggested` forms: the tool tables as written, and whether the suggestion applies.
/// `"suggested"` is the suggestion alone; an object's `"suggested": BOOL` member is taken off it.
pub(crate) fn split(tools: &Value) -> (Value, bool) {
    match tools {
        Value::String(word) if word == SUGGESTED => (Value::Object(Map::new()), true),
        Value::Object(tables) => match tables.get(SUGGESTED) {
            Some(Value::Bool(on)) => {
                let mut tables = tables.clone();
                tables.remove(SUGGESTED);
                (Value::Object(tables), *on)
            }
            _ => (tools.clone(), false),
        },
        _ => (tools.clone(), false),
    }
}

/// The `[tools]` object that applies once `reports` are known: the suggested table of each tool
/// that gets one, with the tool's own table in `explicit` over it key by key (a table that says
/// where its key comes from replaces the suggestion's choice whole), and every other table of
/// `explicit` (`"*"` among them) as written.
pub fn merged(explicit: &Map<String, Value>, reports: &[ToolReport]) -> Value {
    let mut tools = explicit.clone();
    for report in reports {
        let Some(Value::Object(mut table)) = report.suggestion.table() else {
            continue;
        };
        match tools.get(&report.name) {
            Some(Value::Object(own)) => {
                if own
                    .keys()
                    .any(|setting| KEY_SETTINGS.contains(&kebab_case(setting).as_str()))
                {
                    table.clear();
                }
                table.extend(own.clone());
            }
            // A table that is not an object is reported by the parser as written.
            Some(_) => continue,
            None => {}
        }
        tools.insert(report.name.clone(), Value::Object(table));
    }
    Value::Object(tools)
}

/// `argument` as an identifier candidate, if its name looks like one and it is a string or an
/// integer.
fn identifier(argument: &str, schema: &Value, required: bool) -> Option<Identifier> {
    let pattern = identifier_pattern(argument)?;
    let kind = scalar_kind(schema)?;
    let reason = if required {
        format!("required {} named {pattern}", kind.as_str())
    } else {
        format!(
            "optional {} named {pattern} (weaker: a call may leave it out)",
            kind.as_str()
        )
    };
    Some(Identifier {
        argument: argument.to_owned(),
        pointer: pointer(argument),
        kind,
        required,
        pattern,
        reason,
    })
}

/// Whole names (compared in lower case, without `_` and `-`) that name an operation or a thing.
const WHOLE_NAMES: [&str; 9] = [
    "id",
    "uuid",
    "guid",
    "reference",
    "idempotencykey",
    "requestid",
    "externalid",
    "clienttoken",
    "clientrequesttoken",
];

/// Name endings after a `_` or `-` (any case): `order_id`, `invoice-number`.
const SEPARATED_SUFFIXES: [&str; 7] = ["id", "uuid", "guid", "reference", "ref", "number", "no"];

/// Name endings in camel case, after a lower-case letter or a digit: `orderId`, `invoiceNumber`.
const CAMEL_SUFFIXES: [&str; 10] = [
    "Id",
    "ID",
    "Uuid",
    "UUID",
    "Guid",
    "GUID",
    "Reference",
    "Ref",
    "Number",
    "No",
];

/// The pattern `name` matches, in the words of the report: the name itself for a whole name
/// (`id`, `request_id`), else `*_id`, `*-number`, `*Id`, ….
fn identifier_pattern(name: &str) -> Option<String> {
    if WHOLE_NAMES.contains(&squashed(name).as_str()) {
        return Some(name.to_owned());
    }
    for suffix in SEPARATED_SUFFIXES {
        let Some(split) = name.len().checked_sub(suffix.len() + 1) else {
            continue;
        };
        let (Some(stem), Some(end)) = (name.get(..split), name.get(split..)) else {
            continue;
        };
        let Some(word) = end.strip_prefix(['_', '-']) else {
            continue;
        };
        if !stem.is_empty() && word.eq_ignore_ascii_case(suffix) {
            return Some(format!("*{end}"));
        }
    }
    for suffix in CAMEL_SUFFIXES {
        let Some(stem) = name.strip_suffix(suffix) else {
            continue;
        };
        if stem
            .chars()
            .last()
            .is_some_and(|c| c.is_lowercase() || c.is_ascii_digit())
        {
            return Some(format!("*{suffix}"));
        }
    }
    None
}

/// Whether `name` is `idempotency_key` in some spelling (`idempotencyKey`, `idempotency-key`).
fn is_key_argument(name: &str) -> bool {
    squashed(name) == "idempotencykey"
}

/// `name` in lower case without `_` and `-`.
fn squashed(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// `string` or `integer`, from `type` (a name, or a list with `null`) or from a lone non-null
/// branch of `anyOf` / `oneOf` (how optional values are often described).
fn scalar_kind(schema: &Value) -> Option<Kind> {
    let named = |name: &str| match name {
        "string" => Some(Kind::String),
        "integer" => Some(Kind::Integer),
        _ => None,
    };
    match schema.get("type") {
        Some(Value::String(name)) => return named(name),
        Some(Value::Array(names)) => {
            let mut kinds = names.iter().filter(|name| *name != "null");
            return match (kinds.next().and_then(Value::as_str), kinds.next()) {
                (Some(name), None) => named(name),
                _ => None,
            };
        }
        _ => {}
    }
    let branches = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))?
        .as_array()?;
    let mut kinds = branches
        .iter()
        .filter(|branch| branch.get("type").and_then(Value::as_str) != Some("null"));
    match (kinds.next(), kinds.next()) {
        (Some(branch), None) => scalar_kind(branch),
        _ => None,
    }
}

/// The JSON Pointer (RFC 6901) of a top-level argument: `~` becomes `~0`, `/` becomes `~1`.
pub fn pointer(argument: &str) -> String {
    format!("/{}", argument.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, annotations: Value, properties: Value, required: &[&str]) -> Value {
        json!({
            "name": name,
            "annotations": annotations,
            "inputSchema": {"type": "object", "properties": properties, "required": required},
        })
    }

    fn one(tool: &Value) -> ToolReport {
        let mut reports = classify(std::slice::from_ref(tool));
        assert_eq!(reports.len(), 1);
        reports.remove(0)
    }

    #[test]
    fn identifier_names_match_their_patterns() {
        for (name, pattern) in [
            ("id", "id"),
            ("ID", "ID"),
            ("_id", "_id"),
            ("client_token", "client_token"),
            ("order_id", "*_id"),
            ("ORDER_ID", "*_ID"),
            ("order-id", "*-id"),
            ("orderId", "*Id"),
            ("orderID", "*ID"),
            ("order2Id", "*Id"),
            ("external_id", "external_id"),
            ("customer_external_id", "*_id"),
            ("request_id", "request_id"),
            ("requestId", "requestId"),
            ("idempotency_key", "idempotency_key"),
            ("idempotencyKey", "idempotencyKey"),
            ("reference", "reference"),
            ("payment_reference", "*_reference"),
            ("invoice_number", "*_number"),
            ("invoiceNumber", "*Number"),
            ("invoice_no", "*_no"),
            ("user_uuid", "*_uuid"),
        ] {
            assert_eq!(identifier_pattern(name).as_deref(), Some(pattern), "{name}");
        }
        for name in [
            "paid",
            "valid",
            "amount",
            "identity",
            "ideas",
            "casino",
            "number",
            "idea_count",
            "kid",
            "Number",
            "IDLE",
            "éid",
            "é_",
            "_no",
            "currency_code",
            "phone",
        ] {
            assert_eq!(identifier_pattern(name), None, "{name}");
        }
    }

    #[test]
    fn pointers_escape_tilde_and_slash() {
        assert_eq!(pointer("order_id"), "/order_id");
        assert_eq!(pointer("a/b~c"), "/a~1b~0c");
        assert_eq!(pointer("~1"), "/~01");
        assert_eq!(pointer(""), "/");
    }

    #[test]
    fn only_strings_and_integers_are_identifiers() {
        for (schema, kind) in [
            (json!({"type": "string"}), Some(Kind::String)),
            (json!({"type": "integer"}), Some(Kind::Integer)),
            (json!({"type": ["string", "null"]}), Some(Kind::String)),
            (
                json!({"anyOf": [{"type": "integer"}, {"type": "null"}]}),
                Some(Kind::Integer),
            ),
            (
                json!({"oneOf": [{"type": "string", "format": "uuid"}]}),
                Some(Kind::String),
            ),
            (json!({"type": "number"}), None),
            (json!({"type": "object"}), None),
            (json!({"type": ["string", "integer"]}), None),
            (
                json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
                None,
            ),
            (json!({}), None),
        ] {
            assert_eq!(scalar_kind(&schema), kind, "{schema}");
        }
    }

    #[test]
    fn required_identifiers_become_key_from_and_optional_ones_are_weaker() {
        let report = one(&tool(
            "send_invoice",
            json!({"destructiveHint": false}),
            json!({
                "customerId": {"type": "string"},
                "invoice_number": {"type": "integer"},
                "note": {"type": "string"},
                "batch_ref": {"type": "string"},
                "tags_id": {"type": "array"},
            }),
            &["customerId", "invoice_number", "note"],
        ));
        assert_eq!(report.annotations.destructive_hint, Some(false));
        let names: Vec<_> = report
            .identifiers
            .iter()
            .map(|i| i.argument.as_str())
            .collect();
        assert_eq!(names, ["customerId", "invoice_number", "batch_ref"]);
        assert_eq!(report.identifiers[0].reason, "required string named *Id");
        assert_eq!(
            report.identifiers[1].reason,
            "required integer named *_number"
        );
        assert!(!report.identifiers[2].required);
        assert!(
            report.identifiers[2].reason.contains("weaker"),
            "{:?}",
            report.identifiers[2]
        );
        assert_eq!(
            report.suggestion,
            Suggestion::KeyFrom(vec!["/customerId".into(), "/invoice_number".into()])
        );
    }

    #[test]
    fn an_idempotency_key_argument_wins_over_identifiers() {
        for name in ["idempotency_key", "idempotencyKey", "idempotency-key"] {
            let report = one(&tool(
                "refund",
                json!({"destructiveHint": true}),
                json!({"charge_id": {"type": "string"}, name: {"type": "string"}}),
                &["charge_id"],
            ));
            assert_eq!(
                report.suggestion,
                Suggestion::KeyArgument(name.into()),
                "{name}"
            );
        }
    }

    #[test]
    fn read_only_and_idempotent_tools_are_left_out() {
        let props = json!({"order_id": {"type": "string"}, "idempotency_key": {"type": "string"}});
        let read_only = one(&tool(
            "get",
            json!({"readOnlyHint": true}),
            props.clone(),
            &["order_id"],
        ));
        assert_eq!(read_only.suggestion, Suggestion::LeftOut(LeftOut::ReadOnly));
        assert_eq!(read_only.identifiers.len(), 2, "still listed");
        let idempotent = one(&tool(
            "put",
            json!({"readOnlyHint": false, "idempotentHint": true}),
            props,
            &["order_id"],
        ));
        assert_eq!(
            idempotent.suggestion,
            Suggestion::LeftOut(LeftOut::Idempotent)
        );
        // A false hint does not leave a tool out.
        let plain = one(&tool(
            "log",
            json!({"readOnlyHint": false, "idempotentHint": false}),
            json!({"message": {"type": "string"}}),
            &["message"],
        ));
        assert_eq!(plain.suggestion, Suggestion::Window);
    }

    #[test]
    fn a_tool_named_star_gets_no_table() {
        let star = one(&tool(
            "*",
            Value::Null,
            json!({"order_id": {"type": "string"}}),
            &["order_id"],
        ));
        assert_eq!(star.suggestion, Suggestion::LeftOut(LeftOut::Wildcard));
    }

    #[test]
    fn a_tool_without_required_identifiers_gets_a_window() {
        let report = one(&tool(
            "log_event",
            Value::Null,
            json!({"message": {"type": "string"}, "reference": {"type": "string"}}),
            &["message"],
        ));
        assert_eq!(report.annotations, Annotations::default());
        assert_eq!(report.suggestion, Suggestion::Window);
        assert_eq!(report.optional_identifiers().count(), 1);
        // No schema at all.
        let bare = one(&json!({"name": "noop"}));
        assert_eq!(bare.suggestion, Suggestion::Window);
        assert!(bare.identifiers.is_empty());
    }

    #[test]
    fn odd_entries_are_handled() {
        let reports = classify(&[
            json!({"inputSchema": {}}),
            json!({"name": 7}),
            json!({
                "name": "weird",
                "annotations": {"readOnlyHint": "yes"},
                "inputSchema": {"properties": {"a/b_id": {"type": "string"}}, "required": ["a/b_id", 3]},
            }),
        ]);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].annotations.read_only_hint, None);
        assert_eq!(
            reports[0].suggestion,
            Suggestion::KeyFrom(vec!["/a~1b_id".into()])
        );
    }
}
