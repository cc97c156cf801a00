//! [`Settings`]: the options of an embedded gateway, by the names and in the spelling of
//! `mcp-idem wrap`'s flags, parsed once here for every binding.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::default_scope::local_user;
use crate::interceptor::InterceptorConfig;
use crate::store::{self, StoreError, StoreUrl};
use crate::{Deduplicator, EngineConfig, RejectionKind, Scope};

use super::options::{self, GatewayOption};
use super::{Embedded, StoreIo};

/// Why an embedded gateway could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// An option the gateway does not know.
    #[error("unknown option {name:?}; expected one of: {expected}")]
    UnknownOption {
        /// The option as given.
        name: String,
        /// Every option's name, spelled as the one given is (snake_case, camelCase or
        /// kebab-case).
        expected: String,
    },
    /// One option given twice, in two spellings (`max_key_bytes` and `maxKeyBytes`).
    #[error("{first:?} and {second:?} are one option; give it once")]
    DuplicateOption {
        /// The first spelling.
        first: String,
        /// The second.
        second: String,
    },
    /// An option whose value does not parse.
    #[error("{name}: {reason}{}", value.as_ref().map(|v| format!(", got {v}")).unwrap_or_default())]
    InvalidValue {
        /// The option, spelled as it was given.
        name: String,
        /// The value as given (as JSON, or quoted text), when the error is about it as a whole.
        value: Option<String>,
        /// What is wrong with it, and what is accepted.
        reason: String,
    },
    /// No `namespace` option, and the server has no name to keep its records under
    /// ([`Settings::from_json`]).
    #[error(
        "the server has no name (its serverInfo.name) to keep its records under: name it, or \
         pass the namespace option"
    )]
    NoServerName,
    /// No store URL was given and the user's data directory, where the default SQLite file
    /// lives, cannot be found.
    #[error("cannot find the user's data directory; pass the store option")]
    NoDataDirectory,
    /// The store URL does not parse, or the store cannot be opened: the same words as
    /// `mcp-idem wrap` (`cannot open the record store URL: why`).
    #[error("{}", store_message(.url, .source))]
    Store {
        /// The store URL (password redacted), or `None` when the URL itself did not parse.
        url: Option<String>,
        /// What the store said.
        #[source]
        source: StoreError,
    },
}

impl SetupError {
    /// The option `name`, spelled as the user gave it, refused with `value` (as the user's
    /// language shows it; `None` when the error is not about the value as a whole) for `reason`:
    /// also what a binding raises for a value its language cannot pass on as JSON.
    pub fn invalid_option(name: &str, value: Option<String>, reason: impl Into<String>) -> Self {
        Self::InvalidValue {
            name: name.to_owned(),
            value,
            reason: reason.into(),
        }
    }

    /// The error's stable type, as the bindings' exceptions carry it: the SEP's
    /// `idempotency_store_unavailable` for a store that cannot be opened,
    /// `idempotency_invalid_store_url` and `idempotency_invalid_option` for bad configuration.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::UnknownOption { .. }
            | Self::DuplicateOption { .. }
            | Self::InvalidValue { .. }
            | Self::NoServerName => "idempotency_invalid_option",
            Self::Store { url: None, .. } => "idempotency_invalid_store_url",
            Self::Store { url: Some(_), .. } | Self::NoDataDirectory => {
                RejectionKind::StoreUnavailable.as_str()
            }
        }
    }

    /// The JSON-RPC error code of the same failure on the wire: `-32602` (invalid params) for bad
    /// configuration, the store-unavailable rejection's code (`-32603`) otherwise.
    pub fn code(&self) -> i64 {
        match self {
            Self::Store { url: Some(_), .. } | Self::NoDataDirectory => {
                RejectionKind::StoreUnavailable.code()
            }
            _ => crate::jsonrpc::INVALID_PARAMS,
        }
    }
}

/// `wrap`'s words for a store error: its message and each of its causes, `: ` between them.
fn store_message(url: &Option<String>, source: &StoreError) -> String {
    let mut message = match url {
        Some(url) => format!("cannot open the record store {url}: {source}"),
        None => source.to_string(),
    };
    let mut cause = std::error::Error::source(source);
    while let Some(err) = cause {
        message.push_str(": ");
        message.push_str(&err.to_string());
        cause = err.source();
    }
    message
}

/// The options of an [`Embedded`] gateway: the store, the scope of its records, the engine's
/// limits and the interceptor's settings. Names and values are those of `mcp-idem wrap`'s flags
/// (`retention` takes `24h`, `after-crash` takes `reject` or `reexecute`, …; see [`options`]), so
/// a server moved from `wrap` into process keeps its configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub(super) store: Option<String>,
    pub(super) namespace: String,
    pub(super) principal: Option<String>,
    pub(super) engine: EngineConfig,
    pub(super) interceptor: InterceptorConfig,
    pub(super) store_io: StoreIo,
    /// The options set, by their kebab-case names: with the namespace, what tells two gateways
    /// apart ([`Gateways`](super::Gateways)).
    given: BTreeMap<&'static str, String>,
    /// Each option set, by its kebab-case name, spelled as it was given (for later errors).
    spelled: BTreeMap<&'static str, String>,
}

impl Settings {
    /// Defaults (the SQLite file in the user's data directory, the local user as principal,
    /// `wrap`'s limits), with records kept under `namespace`.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            store: None,
            namespace: namespace.into(),
            principal: None,
            engine: EngineConfig::default(),
            interceptor: InterceptorConfig::default(),
            store_io: StoreIo::default(),
            given: BTreeMap::new(),
            spelled: BTreeMap::new(),
        }
    }

    /// Sets the option `name` to `value` (see [`options::every`]). `name` is `wrap`'s, or the same
    /// in snake_case or camelCase (`max_key_bytes`, `maxKeyBytes`).
    /// Errors name the option as `name` spells it. A binding gives its options as JSON:
    /// [`from_json`](Self::from_json).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), SetupError> {
        let option = options::find(name).ok_or_else(|| SetupError::UnknownOption {
            expected: super::host::option_names_like(name),
            name: name.to_owned(),
        })?;
        (option.set)(self, value).map_err(|reason| {
            SetupError::invalid_option(name, Some(format!("{value:?}")), reason)
        })?;
        self.remember(option, name, value.to_owned());
        Ok(())
    }

    /// Records that `option` was set, spelled `given`, to `value` (as text, or JSON text).
    pub(super) fn remember(&mut self, option: &GatewayOption, given: &str, value: String) {
        self.given.insert(option.name, value);
        self.spelled.insert(option.name, given.to_owned());
    }

    /// `option`'s name as it was given, else `wrap`'s.
    fn spelled(&self, option: &GatewayOption) -> &str {
        self.spelled
            .get(option.name)
            .map_or(option.name, String::as_str)
    }

    /// What tells this gateway apart from another: its namespace and the options set.
    pub(super) fn identity(&self) -> (String, BTreeMap<&'static str, String>) {
        (self.namespace.clone(), self.given.clone())
    }

    /// The store URL, with the default SQLite file when none was set.
    pub fn store_url(&self) -> Result<StoreUrl, SetupError> {
        store_url_or_default(self.store.as_deref())
    }

    /// Opens the store and starts the gateway (on the current tokio runtime): a malformed URL or
    /// an unreachable store is an error here, as it is when `wrap` starts.
    pub async fn open(self) -> Result<Embedded, SetupError> {
        let url = self.store_url()?;
        if self.store_io == StoreIo::Inline
            && !matches!(url, StoreUrl::Sqlite(_) | StoreUrl::Memory)
        {
            return Err(SetupError::invalid_option(
                self.spelled(&options::STORE_IO),
                Some("\"inline\"".into()),
                "only the sqlite: and memory stores run on the host's thread",
            ));
        }
        let store = store::open(&url)
            .await
            .map_err(|source| SetupError::Store {
                url: Some(url.to_string()),
                source,
            })?;
        let principal = self.principal.unwrap_or_else(local_user);
        Ok(Embedded::start(
            Deduplicator::new(self.engine, store),
            Scope::new(self.namespace, principal),
            self.interceptor,
            self.store_io,
        ))
    }
}

/// The store at `url`, or, when none is given, the one every gateway uses by default: SQLite at
/// [`default_sqlite_path`] (`mcp-idem wrap`, `proxy` and `inspect` read `--store` with it too).
pub fn store_url_or_default(url: Option<&str>) -> Result<StoreUrl, SetupError> {
    match url {
        Some(url) => url
            .parse()
            .map_err(|source| SetupError::Store { url: None, source }),
        None => Ok(StoreUrl::Sqlite(default_sqlite_path()?)),
    }
}

/// The SQLite file every gateway uses when no store is given (`mcp-idem wrap` and `inspect`
/// too): `mcp-idem/records.sqlite3` in the user's data directory, e.g.
/// `~/.local/share/mcp-idem/records.sqlite3`.
pub fn default_sqlite_path() -> Result<PathBuf, SetupError> {
    let data = dirs::data_local_dir().ok_or(SetupError::NoDataDirectory)?;
    Ok(data.join("mcp-idem").join("records.sqlite3"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::interceptor::CancelPolicy;
    use crate::AfterCrash;

    #[test]
    fn options_take_wraps_spellings() {
        let mut settings = Settings::new("n");
        settings.set("retention", "2h").unwrap();
        settings.set("after_crash", "reexecute").unwrap();
        settings.set("max-key-bytes", "16").unwrap();
        settings.set("forwardKey", "true").unwrap();
        settings.set("cancel", "forward").unwrap();
        assert_eq!(settings.engine.retention(), Duration::from_secs(7200));
        assert_eq!(settings.interceptor.cancel(), CancelPolicy::Forward);
        assert_eq!(
            settings.identity().1.keys().copied().collect::<Vec<_>>(),
            [
                "after-crash",
                "cancel",
                "forward-key",
                "max-key-bytes",
                "retention"
            ]
        );
        assert_eq!(settings.engine.after_crash(), AfterCrash::Reexecute);
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let mut settings = Settings::new("n");
        let unknown = settings.set("retension", "2h").unwrap_err().to_string();
        assert!(
            unknown.starts_with("unknown option \"retension\""),
            "{unknown}"
        );
        let bad = settings.set("lease", "soon").unwrap_err().to_string();
        assert_eq!(
            bad,
            "lease: expected a duration such as 24h, 30m or 500ms, got \"soon\""
        );
        assert!(settings.set("max-key-bytes", "0").is_err());
        assert!(settings.set("forward-key", "yes").is_err());
        assert!(settings.set("namespace", "").is_err());
    }

    #[test]
    fn a_store_url_that_does_not_parse_is_refused_with_the_stores_words() {
        let mut settings = Settings::new("n");
        settings.set("store", "mysql://db").unwrap();
        let err = settings.store_url().unwrap_err().to_string();
        let direct = "mysql://db".parse::<StoreUrl>().unwrap_err().to_string();
        assert_eq!(err, direct);
        assert_eq!(
            settings.store_url().unwrap_err().error_type(),
            "idempotency_invalid_store_url"
        );
    }
}
