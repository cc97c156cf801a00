//! Per-tool key policies: how a `tools/call` that carries no SEP-3182 key is protected anyway.
//!
//! A server operator names, per tool, what makes two calls one operation: a business identifier
//! in the arguments (`key-from`, JSON Pointers), an argument that carries a key (`key-argument`),
//! or a duplicate window (`window`); and what a call gets when its identifier is missing
//! (`required`), when it failed (`on-error`), when the store is down (`store-down`) and how long
//! a duplicate of a running call waits for its outcome (`wait`). `[tools."*"]` applies to every
//! tool, a tool's own table overriding it key by key.
//!
//! The policy is read from a JSON object (the binary converts its TOML `[tools]` table; the
//! bindings pass their language's dict or object), checked once, at start. Choosing the key of one
//! call is [`select`](crate::policy::select), sans-IO; the engine decides on it as on a SEP key.

pub(crate) mod parse;
pub(crate) mod prefilter;
pub(crate) mod select;
pub(crate) mod source;
pub mod suggest;
pub(crate) mod terms;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub use parse::{kebab_case, PolicyError};
pub(crate) use source::{KeyMaterial, KeySource, DERIVED};
pub(crate) use terms::KeyTerms;

/// The shortest duplicate window.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// The longest duplicate window, and the longest wait.
pub const MAX_WINDOW: Duration = Duration::from_secs(600);
/// How long a duplicate of a running call waits for its outcome by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The `_meta` member a client's key is read from by default.
pub const DEFAULT_META_KEY: &str = crate::protocol::IDEMPOTENCY_KEY;

/// What a call whose outcome is an error (a JSON-RPC error, or a result with `isError: true`)
/// leaves behind, under a key that is not the client's (`on-error`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    /// Record it and replay it, as the SEP does for a client's key: nothing runs twice (default).
    #[default]
    Replay,
    /// Forget it (the record is dropped), so that a retry runs the tool again, as AWS Lambda
    /// Powertools does: a transient failure is not answered again for the whole retention.
    Forget,
}

/// What a call of the tool gets when the store cannot be reached or a quota is full
/// (`store-down`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreDown {
    /// Refuse it, and run nothing (`idempotency_store_unavailable`, as for a SEP key; default).
    #[default]
    FailClosed,
    /// Run it unprotected (counted, logged).
    RunUnprotected,
}

/// One tool's effective policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolPolicy {
    pub(crate) key_from: Vec<Pointer>,
    pub(crate) key_argument: Option<String>,
    pub(crate) window: Option<Duration>,
    pub(crate) required: bool,
    pub(crate) on_error: OnError,
    pub(crate) store_down: StoreDown,
    pub(crate) wait: Duration,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        Self {
            key_from: Vec::new(),
            key_argument: None,
            window: None,
            required: false,
            on_error: OnError::default(),
            store_down: StoreDown::default(),
            wait: DEFAULT_WAIT,
        }
    }
}

impl ToolPolicy {
    /// The JSON Pointers of the business identifier (`key-from`).
    pub fn key_from(&self) -> impl Iterator<Item = &str> {
        self.key_from.iter().map(|p| p.0.as_str())
    }

    /// The argument that carries a key (`key-argument`).
    pub fn key_argument(&self) -> Option<&str> {
        self.key_argument.as_deref()
    }

    /// The duplicate window (`window`).
    pub fn window(&self) -> Option<Duration> {
        self.window
    }

    /// Whether a call without its identifier or key argument is refused (`required`).
    pub fn required(&self) -> bool {
        self.required
    }

    /// What an error outcome under a derived key leaves behind (`on-error`).
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// What a call gets when the store is down (`store-down`).
    pub fn store_down(&self) -> StoreDown {
        self.store_down
    }

    /// How long a key-less duplicate of a running call waits for its outcome (`wait`).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether the policy gives key-less calls a key at all.
    pub fn derives_keys(&self) -> bool {
        !self.key_from.is_empty() || self.key_argument.is_some() || self.window.is_some()
    }
}

impl fmt::Display for ToolPolicy {
    /// The policy as a TOML table body (`config-check` prints it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.key_from.is_empty() {
            let pointers: Vec<String> = self.key_from().map(toml_string).collect();
            writeln!(f, "key-from = [{}]", pointers.join(", "))?;
        }
        if let Some(argument) = &self.key_argument {
            writeln!(f, "key-argument = {}", toml_string(argument))?;
        }
        if let Some(window) = self.window {
            writeln!(f, "window = \"{}\"", humantime::format_duration(window))?;
        }
        writeln!(f, "required = {}", self.required)?;
        writeln!(f, "on-error = \"{}\"", self.on_error)?;
        writeln!(f, "store-down = \"{}\"", self.store_down)?;
        writeln!(f, "wait = \"{}\"", humantime::format_duration(self.wait))
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Replay => "replay",
            Self::Forget => "forget",
        })
    }
}

impl fmt::Display for StoreDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FailClosed => "fail-closed",
            Self::RunUnprotected => "run-unprotected",
        })
    }
}

/// A JSON Pointer (RFC 6901) into a call's arguments, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pointer(String);

impl Pointer {
    /// The reference tokens, unescaped (`~1` is `/`, `~0` is `~`).
    pub(crate) fn tokens(&self) -> impl Iterator<Item = String> + '_ {
        self.0
            .split('/')
            .skip(1)
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// The policies of a server's tools, and the `_meta` members a client's key is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolPolicies {
    /// Each named tool's effective policy (`[tools."*"]` merged in).
    tools: BTreeMap<String, ToolPolicy>,
    /// The policy of every other tool (`[tools."*"]`), when one is given.
    any: Option<Box<ToolPolicy>>,
    meta_keys: Vec<String>,
    /// With `--tools suggested`: the tables as written, which override the suggestion once the
    /// server's tools are listed ([`with_listed_tools`](Self::with_listed_tools)).
    suggested: Option<std::sync::Arc<serde_json::Map<String, serde_json::Value>>>,
}

impl Default for ToolPolicies {
    fn default() -> Self {
        Self {
            tools: BTreeMap::new(),
            any: None,
            meta_keys: vec![DEFAULT_META_KEY.to_owned()],
            suggested: None,
        }
    }
}

impl ToolPolicies {
    /// No tool policy; `_meta.idempotencyKey` recognised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the `[tools]` table, as a JSON object of tool name (or `"*"`) to its settings:
    /// `key-from` (a pointer or an array of them), `key-argument`, `window`, `required`,
    /// `on-error` (`replay`, `forget`), `store-down` (`fail-closed`, `run-unprotected`), `wait`.
    /// Setting names may be spelled in kebab-case, snake_case or camelCase. `"suggested"`, or a
    /// member `"suggested": true` beside the tables, applies [`suggest`]'s policy to each tool the
    /// server lists, the tool's own table over it ([`with_listed_tools`](Self::with_listed_tools)).
    pub fn from_json(tools: &serde_json::Value) -> Result<Self, PolicyError> {
        let (tables, suggested) = suggest::split(tools);
        let (tools, any) = parse::tools(&tables)?;
        Ok(Self {
            tools,
            any: any.map(Box::new),
            suggested: match tables {
                serde_json::Value::Object(tables) if suggested => Some(std::sync::Arc::new(tables)),
                _ => None,
            },
            ..Self::default()
        })
    }

    /// Whether the suggested policy applies to the tools the server lists (`--tools suggested`).
    pub fn is_suggested(&self) -> bool {
        self.suggested.is_some()
    }

    /// With `--tools suggested`, the policies once the server listed `tools` (its `tools/list`
    /// entries, [`suggest::classify`]d): the suggestion of each, the tables as written over it.
    /// Without, the policies as they are.
    pub fn with_listed_tools(&self, tools: &[suggest::ToolReport]) -> Result<Self, PolicyError> {
        let Some(explicit) = &self.suggested else {
            return Ok(self.clone());
        };
        let (tools, any) = parse::tools(&suggest::merged(explicit, tools))?;
        Ok(Self {
            tools,
            any: any.map(Box::new),
            ..self.clone()
        })
    }

    /// Also reads a client's key from `_meta[name]` (beside `idempotencyKey`, always read).
    pub fn with_meta_key(mut self, name: &str) -> Result<Self, PolicyError> {
        if name.is_empty() {
            return Err(PolicyError::new("", "a meta key name must not be empty"));
        }
        if !self.meta_keys.iter().any(|known| known == name) {
            self.meta_keys.push(name.to_owned());
        }
        Ok(self)
    }

    /// Also reads a client's key from each of `names` ([`with_meta_key`](Self::with_meta_key)).
    pub fn with_meta_keys<'a>(
        self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, PolicyError> {
        names
            .into_iter()
            .try_fold(self, |policies, name| policies.with_meta_key(name))
    }

    /// The policy of `tool`: its own table over `[tools."*"]`, or `None` when neither names it.
    pub fn for_tool(&self, tool: &str) -> Option<&ToolPolicy> {
        self.tools.get(tool).or(self.any.as_deref())
    }

    /// The tools named by their own table.
    pub fn named_tools(&self) -> impl Iterator<Item = (&str, &ToolPolicy)> {
        self.tools
            .iter()
            .map(|(name, policy)| (name.as_str(), policy))
    }

    /// The `[tools."*"]` policy.
    pub fn any_tool(&self) -> Option<&ToolPolicy> {
        self.any.as_deref()
    }

    /// The `_meta` members a client's key is read from, in order.
    pub fn meta_keys(&self) -> &[String] {
        &self.meta_keys
    }

    /// Whether no tool has a policy (every call is decided by a client's key only).
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.any.is_none()
    }

    /// The named tools that are not in `listed` (a `tools/list` answer's names), to log once.
    pub fn unlisted<'a>(&'a self, listed: &[&str]) -> Vec<&'a str> {
        self.tools
            .keys()
            .map(String::as_str)
            .filter(|name| !listed.contains(name))
            .collect()
    }
}

/// `value` as a TOML basic string.
fn toml_string(value: &str) -> String {
    // A JSON string is a valid TOML basic string, escapes included.
    serde_json::Value::String(value.to_owned()).to_string()
}

#[cfg(test)]
mod tests;
