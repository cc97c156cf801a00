//! Reading the `[tools]` table: every setting checked, every mistake a clear error naming the tool
//! and the setting, before anything starts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::{OnError, Pointer, StoreDown, ToolPolicy, MAX_WINDOW, MIN_WINDOW};

/// Why a tool policy was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}{}{reason}",
    if tool.is_empty() { String::new() } else { format!("tool policy [tools.{tool:?}]: ") },
    setting.as_ref().map(|s| format!("`{s}`: ")).unwrap_or_default()
)]
pub struct PolicyError {
    tool: String,
    setting: Option<String>,
    reason: String,
}

impl PolicyError {
    pub(super) fn new(tool: &str, reason: impl Into<String>) -> Self {
        Self {
            tool: tool.to_owned(),
            setting: None,
            reason: reason.into(),
        }
    }

    fn of_setting(tool: &str, setting: &str, reason: impl Into<String>) -> Self {
        Self {
            setting: Some(setting.to_owned()),
            ..Self::new(tool, reason)
        }
    }

    /// The tool whose table is wrong (`*` for `[tools."*"]`; empty when no tool's).
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The setting whose value is wrong, spelled as it was given (`key_from`, `keyFrom`,
    /// `key-from`); `None` when the error is about the table as a whole.
    pub fn setting(&self) -> Option<&str> {
        self.setting.as_deref()
    }

    /// What is wrong, without the tool and the setting.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// One table as written: every setting optional, so that a tool's own table can override
/// `[tools."*"]` key by key.
#[derive(Clone, Debug, Default)]
struct Written {
    key_from: Option<Vec<Pointer>>,
    key_argument: Option<String>,
    window: Option<Duration>,
    required: Option<bool>,
    on_error: Option<OnError>,
    store_down: Option<StoreDown>,
    wait: Option<Duration>,
}

impl Written {
    /// `self` over `base`, key by key.
    fn over(self, base: &Self) -> Self {
        Self {
            key_from: self.key_from.or_else(|| base.key_from.clone()),
            key_argument: self.key_argument.or_else(|| base.key_argument.clone()),
            window: self.window.or(base.window),
            required: self.required.or(base.required),
            on_error: self.on_error.or(base.on_error),
            store_down: self.store_down.or(base.store_down),
            wait: self.wait.or(base.wait),
        }
    }

    fn effective(self, tool: &str) -> Result<ToolPolicy, PolicyError> {
        let defaults = ToolPolicy::default();
        let policy = ToolPolicy {
            key_from: self.key_from.unwrap_or_default(),
            key_argument: self.key_argument,
            window: self.window,
            required: self.required.unwrap_or(defaults.required),
            on_error: self.on_error.unwrap_or(defaults.on_error),
            store_down: self.store_down.unwrap_or(defaults.store_down),
            wait: self.wait.unwrap_or(defaults.wait),
        };
        if policy.required && policy.key_from.is_empty() && policy.key_argument.is_none() {
            return Err(PolicyError::new(
                tool,
                "`required = true` needs `key-from` or `key-argument`: it refuses a call without them",
            ));
        }
        Ok(policy)
    }
}

type Tables = (BTreeMap<String, ToolPolicy>, Option<ToolPolicy>);

pub(super) fn tools(value: &Value) -> Result<Tables, PolicyError> {
    let Value::Object(tables) = value else {
        return Err(PolicyError::new(
            "",
            format!(
                "`tools` must be a table of tool names or \"suggested\", not {}",
                kind(value)
            ),
        ));
    };
    let mut written = BTreeMap::new();
    for (tool, table) in tables {
        if tool.is_empty() {
            return Err(PolicyError::new("", "a tool name must not be empty"));
        }
        written.insert(tool.clone(), table_of(tool, table)?);
    }
    let base = written.remove("*");
    let any = base.clone().map(|base| base.effective("*")).transpose()?;
    let base = base.unwrap_or_default();
    let tools = written
        .into_iter()
        .map(|(tool, table)| {
            let policy = table.over(&base).effective(&tool)?;
            Ok((tool, policy))
        })
        .collect::<Result<_, PolicyError>>()?;
    Ok((tools, any))
}

fn table_of(tool: &str, value: &Value) -> Result<Written, PolicyError> {
    let Value::Object(settings) = value else {
        return Err(PolicyError::new(
            tool,
            format!("must be a table of settings, not {}", kind(value)),
        ));
    };
    let mut written = Written::default();
    // Each setting's name as given, by its kebab-case name: one setting given twice is an error.
    let mut given: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in settings {
        let error = |reason: String| PolicyError::of_setting(tool, name, reason);
        let setting = kebab_case(name);
        if let Some(first) = given.insert(setting.clone(), name) {
            return Err(PolicyError::new(
                tool,
                format!("`{first}` and `{name}` are one setting; give it once"),
            ));
        }
        match setting.as_str() {
            "key-from" => written.key_from = Some(pointers(value).map_err(error)?),
            "key-argument" => written.key_argument = Some(non_empty(value).map_err(error)?),
            "window" => {
                written.window = Some(duration(value, MIN_WINDOW, MAX_WINDOW).map_err(error)?)
            }
            "required" => written.required = Some(boolean(value).map_err(error)?),
            "on-error" => {
                written.on_error =
                    Some(match choice(value, &["replay", "forget"]).map_err(error)? {
                        "replay" => OnError::Replay,
                        _ => OnError::Forget,
                    })
            }
            "store-down" => {
                written.store_down = Some(
                    match choice(value, &["fail-closed", "run-unprotected"]).map_err(error)? {
                        "fail-closed" => StoreDown::FailClosed,
                        _ => StoreDown::RunUnprotected,
                    },
                )
            }
            "wait" => {
                written.wait = Some(duration(value, Duration::ZERO, MAX_WINDOW).map_err(error)?)
            }
            _ => {
                return Err(PolicyError::new(
                    tool,
                    format!(
                        "unknown setting `{name}`; expected key-from, key-argument, window, \
                         required, on-error, store-down or wait (each multi-word name also as \
                         key_from or keyFrom)"
                    ),
                ))
            }
        }
    }
    Ok(written)
}

/// A setting's or an option's name in kebab-case, however a language spells it: `keyFrom`,
/// `key_from` and `key-from` are one setting (`maxKeyBytes` is `max-key-bytes`).
pub fn kebab_case(name: &str) -> String {
    let mut kebab = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            '_' => kebab.push('-'),
            c if c.is_ascii_uppercase() => {
                kebab.push('-');
                kebab.push(c.to_ascii_lowercase());
            }
            c => kebab.push(c),
        }
    }
    kebab
}

fn pointers(value: &Value) -> Result<Vec<Pointer>, String> {
    let list = match value {
        Value::String(_) => std::slice::from_ref(value),
        Value::Array(list) if !list.is_empty() => list.as_slice(),
        Value::Array(_) => return Err("needs at least one JSON Pointer".into()),
        other => {
            return Err(format!(
                "must be a JSON Pointer or an array of them, not {}",
                kind(other)
            ))
        }
    };
    list.iter().map(pointer).collect()
}

/// A JSON Pointer (RFC 6901) naming a member of the arguments: `/order_id`, `/customer/id`,
/// `/items/0/sku`; `~0` and `~1` are the only escapes.
fn pointer(value: &Value) -> Result<Pointer, String> {
    let Value::String(text) = value else {
        return Err(format!(
            "a JSON Pointer must be a string, not {}",
            kind(value)
        ));
    };
    if !text.starts_with('/') {
        return Err(format!(
            "{text:?} is not a JSON Pointer into the arguments: it must start with `/`, as in \"/order_id\""
        ));
    }
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "{text:?} is not a JSON Pointer: `~` must be followed by 0 or 1 (RFC 6901)"
            ));
        }
    }
    Ok(Pointer(text.clone()))
}

fn non_empty(value: &Value) -> Result<String, String> {
    match value {
        Value::String(text) if !text.is_empty() => Ok(text.clone()),
        Value::String(_) => Err("must not be empty".into()),
        other => Err(format!("must be a string, not {}", kind(other))),
    }
}

fn boolean(value: &Value) -> Result<bool, String> {
    value
        .as_bool()
        .ok_or_else(|| format!("must be true or false, not {}", kind(value)))
}

fn choice<'a>(value: &Value, choices: &[&'a str]) -> Result<&'a str, String> {
    let text = value.as_str().unwrap_or_default();
    choices
        .iter()
        .find(|choice| **choice == text)
        .copied()
        .ok_or_else(|| format!("must be one of {}, not {value}", choices.join(", ")))
}

fn duration(value: &Value, min: Duration, max: Duration) -> Result<Duration, String> {
    let Value::String(text) = value else {
        return Err(format!(
            "must be a duration such as \"30s\" or \"5m\", not {}",
            kind(value)
        ));
    };
    let duration = humantime::parse_duration(text).map_err(|err| format!("{text:?}: {err}"))?;
    if duration < min || duration > max {
        return Err(format!(
            "{text:?} is out of range: from {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(duration)
}

fn kind(value: &Value) -> &'static str {
    crate::raw_object::json_type_name(value)
}
