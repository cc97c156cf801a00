//! The one table of a gateway's options: each option's name, default, parser and help, read by
//! `mcp-idem wrap` and `proxy` (their flags and their config file) and by [`Settings::set`] (the
//! Python and TypeScript bindings).
//!
//! The parsers are the flags' `value_parser`s too, so a value is accepted or refused, with the
//! same words, whichever front end reads it.

use std::time::Duration;

use crate::interceptor::CancelPolicy;
use crate::policy::parse::kebab_case;
use crate::policy::ToolPolicies;
use crate::AfterCrash;

use super::Settings;

/// One option of a gateway.
#[derive(Clone, Copy, Debug)]
pub struct GatewayOption {
    /// Its name: `wrap`'s long flag and config file key, and the bindings' option (there `_` or
    /// camelCase may stand for `-`).
    pub name: &'static str,
    /// Its default, spelled as a value of it (`--help` shows it); `None` when each front end
    /// computes its own (the store's file, the namespace, the principal).
    pub default: Option<&'static str>,
    /// What it does, as `--help` says it (without a final period, as clap shows doc comments).
    /// `namespace` and `principal` are described by each front end, since their defaults differ.
    pub help: &'static str,
    /// Parses a value and sets it.
    pub(super) set: fn(&mut Settings, &str) -> Result<(), String>,
}

/// Where records live (the default SQLite file is computed where it is used).
pub const STORE: GatewayOption = GatewayOption {
    name: "store",
    default: None,
    help: "Record store: `sqlite:PATH`, `memory` (this process only), `redis://…`, \
           `redis-cluster://HOST:PORT,…` or `postgres://…` (shared by many instances; over TLS: \
           `rediss://…`, `rediss-cluster://…`, `postgres://…?sslmode=verify-full`, each taking \
           `sslrootcert=CA.pem`) [default: sqlite: in the user's data directory, e.g. \
           ~/.local/share/mcp-idem/records.sqlite3, so records survive restarts]. On Redis, \
           `?replicas=N[&replica_timeout_ms=T]` makes each write wait for N replicas (T ms, \
           default 1000) and fail closed without them",
    set: |settings, value| {
        settings.store = Some(value.to_owned());
        Ok(())
    },
};

/// The namespace of the records.
pub const NAMESPACE: GatewayOption = GatewayOption {
    name: "namespace",
    default: None,
    help: "Namespace of this server's records",
    set: |settings, value| {
        settings.namespace = non_empty(value)?;
        Ok(())
    },
};

/// The principal the records belong to.
pub const PRINCIPAL: GatewayOption = GatewayOption {
    name: "principal",
    default: None,
    help: "Principal the records belong to",
    set: |settings, value| {
        settings.principal = Some(non_empty(value)?);
        Ok(())
    },
};

/// How long an outcome is kept.
pub const RETENTION: GatewayOption = GatewayOption {
    name: "retention",
    default: Some("24h"),
    help: "How long a completed call's outcome is kept for replay",
    set: |settings, value| {
        settings.engine = settings.engine.clone().with_retention(duration(value)?);
        Ok(())
    },
};

/// How long a claim lives without renewal.
pub const LEASE: GatewayOption = GatewayOption {
    name: "lease",
    default: Some("30s"),
    help: "How long a running call's claim lives without renewal (renewed every third of it)",
    set: |settings, value| {
        settings.engine = settings.engine.clone().with_lease(duration(value)?);
        Ok(())
    },
};

/// What a retry gets after its original's owner died.
pub const AFTER_CRASH: GatewayOption = GatewayOption {
    name: "after-crash",
    default: Some("reject"),
    help: "What a retry gets when the original call's owner died before recording an outcome: \
           `reject` (idempotency_outcome_unknown, never a second execution) or `reexecute`",
    set: |settings, value| {
        settings.engine = settings
            .engine
            .clone()
            .with_after_crash(after_crash(value)?);
        Ok(())
    },
};

/// Whether the key also stays in the params.
pub const FORWARD_KEY: GatewayOption = GatewayOption {
    name: "forward-key",
    default: Some("false"),
    help: "Also forward `idempotencyKey` to the server (it is always in \
           `_meta[\"mcp-idem/idempotencyKey\"]`)",
    set: |settings, value| {
        settings.interceptor = settings.interceptor.clone().forward_key(boolean(value)?);
        Ok(())
    },
};

/// What to do with a cancellation of a claimed call.
pub const CANCEL: GatewayOption = GatewayOption {
    name: "cancel",
    default: Some("absorb"),
    help:
        "What to do with `notifications/cancelled` for a keyed call: `absorb` (let it finish and \
           record its outcome) or `forward` (and record it as outcome-unknown)",
    set: |settings, value| {
        settings.interceptor = settings.interceptor.clone().cancel_policy(cancel(value)?);
        Ok(())
    },
};

/// The tools' key policies, for calls that carry no SEP key.
pub const TOOLS: GatewayOption = GatewayOption {
    name: "tools",
    default: None,
    help: "Per-tool key policies for calls without a SEP key, as a JSON object of tool name (or \
           \"*\") to settings: key-from, key-argument, window, required, on-error, store-down, \
           wait (the config file's [tools.NAME] tables; see docs/key-sources.md). `suggested` (or \
           a member \"suggested\": true beside the tables) applies what `mcp-idem tools` prints \
           to each tool the server lists, the tables over it",
    set: |settings, value| {
        let meta_keys = settings.interceptor.policies().meta_keys().iter();
        let policies = tool_policies(value)?
            .with_meta_keys(meta_keys.map(String::as_str))
            .map_err(|err| err.to_string())?;
        settings.interceptor = settings.interceptor.clone().tool_policies(policies);
        Ok(())
    },
};

/// More `_meta` members a client's key is read from.
pub const META_KEY: GatewayOption = GatewayOption {
    name: "meta-key",
    default: None,
    help: "Also read a client's idempotency key from these `params._meta` members \
           (comma-separated), beside `_meta.idempotencyKey`, always read",
    set: |settings, value| {
        let policies = settings
            .interceptor
            .policies()
            .clone()
            .with_meta_keys(meta_keys(value)?.0.iter().map(String::as_str))
            .map_err(|err| err.to_string())?;
        settings.interceptor = settings.interceptor.clone().tool_policies(policies);
        Ok(())
    },
};

/// The longest key.
pub const MAX_KEY_BYTES: GatewayOption = GatewayOption {
    name: "max-key-bytes",
    default: Some("255"),
    help: "Longest accepted idempotencyKey, in bytes",
    set: |settings, value| {
        settings.engine = settings.engine.clone().with_max_key_bytes(size(value)?);
        Ok(())
    },
};

/// The largest arguments.
pub const MAX_ARGUMENT_BYTES: GatewayOption = GatewayOption {
    name: "max-argument-bytes",
    default: Some("1048576"),
    help: "Largest accepted `arguments` of a keyed call, in bytes",
    set: |settings, value| {
        settings.engine = settings
            .engine
            .clone()
            .with_max_argument_bytes(size(value)?);
        Ok(())
    },
};

/// The largest outcome kept.
pub const MAX_OUTCOME_BYTES: GatewayOption = GatewayOption {
    name: "max-outcome-bytes",
    default: Some("1048576"),
    help: "Largest outcome kept for replay, in bytes; larger ones are recorded as not retained",
    set: |settings, value| {
        settings.engine = settings.engine.clone().with_max_outcome_bytes(size(value)?);
        Ok(())
    },
};

/// The most records per principal.
pub const MAX_RECORDS_PER_SCOPE: GatewayOption = GatewayOption {
    name: "max-records-per-scope",
    default: Some("10000"),
    help: "Most live records per principal",
    set: |settings, value| {
        settings.engine = settings
            .engine
            .clone()
            .with_max_records_per_scope(count(value)?);
        Ok(())
    },
};

/// The most records in the store.
pub const MAX_RECORDS_TOTAL: GatewayOption = GatewayOption {
    name: "max-records-total",
    default: Some("100000"),
    help: "Most live records in the store",
    set: |settings, value| {
        settings.engine = settings
            .engine
            .clone()
            .with_max_records_total(count(value)?);
        Ok(())
    },
};

/// Where a binding runs the decisions that wait on the store ([`StoreIo`](super::StoreIo)).
pub const STORE_IO: GatewayOption = GatewayOption {
    name: "store-io",
    default: Some("runtime"),
    help: "Where a decision that waits on the store runs: `runtime` (the library's tokio \
           runtime; the host's event loop never waits on the store) or `inline` (on the host's \
           thread, which waits for it: no hand-off between threads; `sqlite:` and `memory` only)",
    set: |settings, value| {
        settings.store_io = value.parse()?;
        Ok(())
    },
};

/// Every option of `wrap` and `proxy`, in `--help`'s order.
pub const ALL: [GatewayOption; 15] = [
    STORE,
    NAMESPACE,
    PRINCIPAL,
    RETENTION,
    LEASE,
    AFTER_CRASH,
    FORWARD_KEY,
    CANCEL,
    TOOLS,
    META_KEY,
    MAX_KEY_BYTES,
    MAX_ARGUMENT_BYTES,
    MAX_OUTCOME_BYTES,
    MAX_RECORDS_PER_SCOPE,
    MAX_RECORDS_TOTAL,
];

/// The options only a binding takes: `wrap` and `proxy` run their store I/O on their own thread.
pub const EMBEDDED: [GatewayOption; 1] = [STORE_IO];

/// Every option [`Settings::set`] takes: [`ALL`], then [`EMBEDDED`].
pub fn every() -> impl Iterator<Item = &'static GatewayOption> {
    ALL.iter().chain(EMBEDDED.iter())
}

/// The option called `name`: `wrap`'s kebab-case name, or the same in snake_case or camelCase
/// (`max_key_bytes`, `maxKeyBytes`), as the bindings' languages spell it.
pub fn find(name: &str) -> Option<&'static GatewayOption> {
    let name = kebab_case(name);
    every().find(|option| option.name == name)
}

/// A duration: `24h`, `30s`, `1h 30m`, `500ms`.
pub fn duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|_| "expected a duration such as 24h, 30m or 500ms".to_owned())
}

/// Tool policies: a JSON object of tool name (or `"*"`) to its settings.
pub fn tool_policies(value: &str) -> Result<ToolPolicies, String> {
    if value.trim() == crate::policy::suggest::SUGGESTED {
        let suggested = serde_json::Value::from(crate::policy::suggest::SUGGESTED);
        return ToolPolicies::from_json(&suggested).map_err(|err| err.to_string());
    }
    let tools: serde_json::Value = serde_json::from_str(value)
        .map_err(|err| format!("not a JSON object of tool policies: {err}"))?;
    ToolPolicies::from_json(&tools).map_err(|err| err.to_string())
}

/// `_meta` member names, comma-separated.
pub fn meta_keys(value: &str) -> Result<MetaKeys, String> {
    let names: Vec<String> = value
        .split(',')
        .map(|name| name.trim().to_owned())
        .collect();
    if names.iter().any(String::is_empty) {
        return Err("expected `_meta` member names separated by commas, none of them empty".into());
    }
    Ok(MetaKeys(names))
}

/// The names [`meta_keys`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaKeys(pub Vec<String>);

/// `reject` or `reexecute`.
pub fn after_crash(value: &str) -> Result<AfterCrash, String> {
    value
        .parse()
        .map_err(|_| "expected reject or reexecute".to_owned())
}

/// `absorb` or `forward`.
pub fn cancel(value: &str) -> Result<CancelPolicy, String> {
    value
        .parse()
        .map_err(|_| "expected absorb or forward".to_owned())
}

/// `true` or `false`.
pub fn boolean(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// A positive whole number.
pub fn count(value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "expected a positive whole number".into())
}

/// A positive whole number of bytes (beyond the address space: as many as there can be).
pub fn size(value: &str) -> Result<usize, String> {
    count(value).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn non_empty(value: &str) -> Result<String, String> {
    if value.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interceptor::InterceptorConfig;
    use crate::EngineConfig;

    #[test]
    fn names_are_found_in_each_languages_spelling() {
        for option in every() {
            assert_eq!(find(option.name).map(|o| o.name), Some(option.name));
            let snake = option.name.replace('-', "_");
            assert_eq!(find(&snake).map(|o| o.name), Some(option.name));
        }
        assert_eq!(find("maxKeyBytes").map(|o| o.name), Some("max-key-bytes"));
        assert_eq!(find("afterCrash").map(|o| o.name), Some("after-crash"));
        assert_eq!(find("storeIo").map(|o| o.name), Some("store-io"));
        assert!(find("retension").is_none());
    }

    #[test]
    fn the_defaults_are_the_engines_and_the_interceptors() {
        let mut settings = Settings::new("n");
        for option in every() {
            if let Some(default) = option.default {
                (option.set)(&mut settings, default).unwrap();
            }
        }
        assert_eq!(settings.engine, EngineConfig::default());
        assert_eq!(
            format!("{:?}", settings.interceptor),
            format!("{:?}", InterceptorConfig::default())
        );
        assert_eq!(settings.store_io, super::super::StoreIo::Runtime);
    }
}
