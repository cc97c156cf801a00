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
    /// The URL with any password replaced by `***`, so that it can be logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Redis(url) | Self::Postgres(url) => f.write_str(&redact_password(url)),
        }
    }
}

/// `scheme://user:secret@host/...` becomes `scheme://user:***@host/...`, for logs and reports;
/// anything else is returned as it is.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => url.to_owned(),
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
        #[cfg(feature = "redis")]
        StoreUrl::Redis(redis_url) => Ok(Arc::new(super::RedisStore::open(redis_url).await?)),
        #[cfg(not(feature = "redis"))]
        StoreUrl::Redis(_) => Err(StoreError::InvalidUrl {
            // Not the URL itself, which may hold a password.
            url: "redis://…".into(),
            reason: "this build has no Redis support (enable the `redis` feature)".into(),
        }),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(pg_url) => Ok(Arc::new(super::PostgresStore::open(pg_url).await?)),
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => Err(StoreError::InvalidUrl {
            // Not the URL itself, which may hold a password.
            url: "postgres://…".into(),
            reason: "this build has no PostgreSQL support (enable the `postgres` feature)".into(),
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
    fn passwords_are_never_displayed() {
        for (url, shown) in [
            ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
            (
                "postgres://app:s3cret@db/idem?sslmode=disable",
                "postgres://app:***@db/idem?sslmode=disable",
            ),
            ("postgresql://app@db/idem", "postgresql://app@db/idem"),
            ("redis://host", "redis://host"),
            ("postgres://a:p@ss:w@rd@db/x", "postgres://a:***@db/x"),
        ] {
            let parsed: StoreUrl = url.parse().unwrap();
            assert_eq!(parsed.to_string(), shown);
        }
    }

    #[test]
    fn displays_round_trip() {
        for url in ["memory", "sqlite:/tmp/x.db", "redis://h:1/0"] {
            assert_eq!(url.parse::<StoreUrl>().unwrap().to_string(), url);
        }
    }
}
