use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::{MemoryStore, Store, StoreError};

/// A parsed store URL: `memory`, `sqlite:PATH` (also `sqlite://PATH`), `redis://…`, `postgres://…`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory`: records live in this process only.
    Memory,
    /// `sqlite:PATH`: records live in a SQLite file.
    Sqlite(PathBuf),
    /// `redis://…` or `rediss://…`.
    Redis(String),
    /// `postgres://…` or `postgresql://…`.
    Postgres(String),
}

impl FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| StoreError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if matches!(url, "memory" | "memory:" | "memory://") {
            return Ok(Self::Memory);
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(invalid(
                    "a SQLite URL needs a file path, e.g. sqlite:/var/lib/mcp-idem/records.sqlite3",
                ));
            }
            if path == ":memory:" {
                return Err(invalid(
                    "use `memory` for an in-memory store; sqlite: takes a file path",
                ));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some("redis" | "rediss") => Ok(Self::Redis(url.to_owned())),
            Some("postgres" | "postgresql") => Ok(Self::Postgres(url.to_owned())),
            Some(other) => Err(invalid(&format!(
                "unknown scheme {other:?}; expected memory, sqlite:PATH, redis:// or postgres://"
            ))),
            None => Err(invalid(
                "expected memory, sqlite:PATH, redis://HOST or postgres://HOST/DB",
            )),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Redis(url) | Self::Postgres(url) => f.write_str(url),
        }
    }
}

/// Opens the store a URL names, creating files and schemas as needed.
///
/// Fails with a specific error if the URL is malformed or the store cannot be opened: callers should
/// treat that as a startup error.
pub async fn open(url: &StoreUrl) -> Result<Arc<dyn Store>, StoreError> {
    match url {
        StoreUrl::Memory => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => Ok(Arc::new(super::SqliteStore::open(path).await?)),
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(StoreError::InvalidUrl {
            url: url.to_string(),
            reason: "this build has no SQLite support (enable the `sqlite` feature)".into(),
        }),
        StoreUrl::Redis(_) | StoreUrl::Postgres(_) => Err(StoreError::InvalidUrl {
            url: url.to_string(),
            reason: "Redis and PostgreSQL stores are not available in this version yet".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_forms() {
        assert_eq!("memory".parse::<StoreUrl>().unwrap(), StoreUrl::Memory);
        assert_eq!(
            "sqlite:/tmp/x.db".parse::<StoreUrl>().unwrap(),
            StoreUrl::Sqlite("/tmp/x.db".into())
        );
        assert_eq!(
            "sqlite://rel/x.db".parse::<StoreUrl>().unwrap(),
            StoreUrl::Sqlite("rel/x.db".into())
        );
        assert_eq!(
            "sqlite:///abs/x.db".parse::<StoreUrl>().unwrap(),
            StoreUrl::Sqlite("/abs/x.db".into())
        );
        assert!(matches!(
            "redis://127.0.0.1:6379".parse::<StoreUrl>().unwrap(),
            StoreUrl::Redis(_)
        ));
        assert!(matches!(
            "postgresql://localhost/test".parse::<StoreUrl>().unwrap(),
            StoreUrl::Postgres(_)
        ));
    }

    #[test]
    fn rejects_malformed_urls_with_a_reason() {
        for (url, needle) in [
            ("", "expected memory"),
            ("sqlite:", "file path"),
            ("sqlite::memory:", "use `memory`"),
            ("mysql://localhost/db", "unknown scheme \"mysql\""),
            ("/var/lib/records.db", "expected memory"),
        ] {
            let err = url.parse::<StoreUrl>().unwrap_err();
            assert!(matches!(err, StoreError::InvalidUrl { .. }));
            assert!(err.to_string().contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn displays_round_trip() {
        for url in ["memory", "sqlite:/tmp/x.db", "redis://h:1/0"] {
            assert_eq!(url.parse::<StoreUrl>().unwrap().to_string(), url);
        }
    }
}
