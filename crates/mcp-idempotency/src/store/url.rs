use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::{MemoryStore, Store, StoreError};

/// A parsed store URL: `memory`, `sqlite:PATH` (also `sqlite://PATH`), `redis://…`,
/// `rediss://…`, `redis-cluster://…`, `rediss-cluster://…`, `postgres://…`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory`: records live in this process only.
    Memory,
    /// `sqlite:PATH`: records live in a SQLite file.
    Sqlite(PathBuf),
    /// `redis://…` or `rediss://…` (one server, `rediss` over TLS), or
    /// `redis-cluster://HOST:PORT,…` or `rediss-cluster://HOST:PORT,…` (a Redis Cluster, over
    /// TLS for `rediss-cluster`).
    Redis(String),
    /// `postgres://…` or `postgresql://…`.
    Postgres(String),
}

impl FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| StoreError::InvalidUrl {
            url: redact_password(url),
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
            Some("redis" | "rediss" | "redis-cluster" | "rediss-cluster") => {
                Ok(Self::Redis(url.to_owned()))
            }
            Some("postgres" | "postgresql") => Ok(Self::Postgres(url.to_owned())),
            Some(other) => Err(invalid(&format!(
                "unknown scheme {other:?}; expected memory, sqlite:PATH, redis://, rediss://, \
                 redis-cluster://, rediss-cluster:// or postgres://"
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

/// `url` with every secret it may hold replaced by `***`, for logs, errors and reports; the one
/// redactor of every store and of the binary. It hides
///
/// * the password of the user information, keeping the user: `scheme://user:secret@host/…`
///   becomes `scheme://user:***@host/…` (the user information ends at the last `@`, so a password
///   with an unescaped `@`, `/`, `?` or `#` is hidden whole);
/// * the value of every query parameter whose name contains `pass` (in any case, percent-encoded
///   or not): PostgreSQL's `?password=` and `?sslpassword=`, Redis' `?pass=`;
/// * in a string that is not a URL (a PostgreSQL key-value string such as `host=db
///   password=secret`), the value of every `NAME=VALUE` whose name contains `pass`, up to the next
///   space, or for a quoted value up to its closing quote.
///
/// Anything else is returned as it is. When a URL is malformed it errs on the side of hiding too
/// much.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_key_values(url);
    };
    // The user information ends at the last `@`: passwords are often not percent-encoded.
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => rest.to_owned(),
        },
        None => rest.to_owned(),
    };
    let (before_fragment, fragment) = rest.split_at(rest.find('#').unwrap_or(rest.len()));
    let redacted = match before_fragment.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query.split('&').map(redact_param).collect();
            format!("{base}?{}", params.join("&"))
        }
        None => before_fragment.to_owned(),
    };
    format!("{scheme}://{redacted}{fragment}")
}

/// Whether a parameter called `name` (percent-encoded or not) may hold a password.
fn is_secret_name(name: &str) -> bool {
    let mut decoded = Vec::with_capacity(name.len());
    let mut bytes = name.as_bytes();
    while let Some((&byte, rest)) = bytes.split_first() {
        let hex = rest
            .get(..2)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (byte, hex) {
            (b'%', Some(decoded_byte)) => {
                decoded.push(decoded_byte);
                bytes = &rest[2..];
            }
            _ => {
                decoded.push(byte);
                bytes = rest;
            }
        }
    }
    String::from_utf8_lossy(&decoded)
        .to_ascii_lowercase()
        .contains("pass")
}

/// `name=***` for a query parameter that may hold a password, the parameter itself otherwise.
fn redact_param(param: &str) -> String {
    match param.split_once('=') {
        Some((name, _value)) if is_secret_name(name) => format!("{name}=***"),
        _ => param.to_owned(),
    }
}

/// [`redact_password`] for a string that is not a URL: `NAME=VALUE` (also `NAME = VALUE`) with a
/// secret name gets `***` for its value.
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let (before, after) = rest.split_at(eq);
        let name = before
            .trim_end()
            .rsplit(char::is_whitespace)
            .next()
            .unwrap_or_default();
        out.push_str(before);
        out.push('=');
        let after = &after[1..];
        if !is_secret_name(name) {
            rest = after;
            continue;
        }
        let value_start = after.len() - after.trim_start().len();
        out.push_str(&after[..value_start]);
        let value = &after[value_start..];
        let value_end = if let Some(quoted) = value.strip_prefix('\'') {
            // Up to the closing quote (`\'` escapes one); an unclosed quote hides the rest.
            let mut escaped = false;
            quoted
                .char_indices()
                .find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                })
                .map_or(value.len(), |(i, _)| i + 2)
        } else {
            value.find(char::is_whitespace).unwrap_or(value.len())
        };
        out.push_str("***");
        rest = &value[value_end..];
    }
    out.push_str(rest);
    out
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
            url: url.to_string(),
            reason: "this build has no Redis support (enable the `redis` feature)".into(),
        }),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(pg_url) => Ok(Arc::new(super::PostgresStore::open(pg_url).await?)),
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => Err(StoreError::InvalidUrl {
            url: url.to_string(),
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
            "redis-cluster://127.0.0.1:7000,127.0.0.1:7001"
                .parse::<StoreUrl>()
                .unwrap(),
            StoreUrl::Redis(_)
        ));
        for tls in [
            "rediss://127.0.0.1:6380",
            "rediss-cluster://127.0.0.1:7100,127.0.0.1:7101?sslrootcert=/etc/ca.pem",
        ] {
            assert!(matches!(
                tls.parse::<StoreUrl>().unwrap(),
                StoreUrl::Redis(_)
            ));
        }
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
        let err = "mysql://app:s3cret@db/x".parse::<StoreUrl>().unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(err.to_string().contains("mysql://app:***@db/x"), "{err}");
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

    /// Every store URL form, with and without user and password, with query strings and
    /// fragments: the secret never shows, everything else does.
    #[test]
    fn the_one_redactor_hides_every_password() {
        for (url, shown) in [
            // Redis, no user information, a password alone, a user and a password (ACL).
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://:s3cret@h:6379/2", "redis://:***@h:6379/2"),
            ("redis://app:s3cret@h/0", "redis://app:***@h/0"),
            ("redis://app@h/0", "redis://app@h/0"),
            ("rediss://h:6380", "rediss://h:6380"),
            (
                "redis-cluster://app:s3cret@a:7000,b:7001?shards=16",
                "redis-cluster://app:***@a:7000,b:7001?shards=16",
            ),
            ("rediss://app:s3cret@h:6380/1", "rediss://app:***@h:6380/1"),
            (
                "rediss://:s3cret@h:6380/?sslrootcert=/etc/ca.pem",
                "rediss://:***@h:6380/?sslrootcert=/etc/ca.pem",
            ),
            (
                "rediss-cluster://app:s3cret@a:7100,b:7101?sslrootcert=/etc/ca.pem&shards=4",
                "rediss-cluster://app:***@a:7100,b:7101?sslrootcert=/etc/ca.pem&shards=4",
            ),
            ("rediss-cluster://a:7100", "rediss-cluster://a:7100"),
            (
                "rediss://:s3cret@h:6380/?protocol=resp3",
                "rediss://:***@h:6380/?protocol=resp3",
            ),
            // Redis over a socket takes the password as a query parameter.
            (
                "redis+unix:///run/redis.sock?db=1&pass=s3cret",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            // PostgreSQL, both schemes.
            ("postgres://db/app", "postgres://db/app"),
            ("postgres://me@db:5432/app", "postgres://me@db:5432/app"),
            (
                "postgres://me:s3cret@db:5432/app",
                "postgres://me:***@db:5432/app",
            ),
            ("postgresql://h/db", "postgresql://h/db"),
            ("postgresql://me:s3cret@h/db", "postgresql://me:***@h/db"),
            (
                "postgres://db/app?user=me&password=s3cret&x=1",
                "postgres://db/app?user=me&password=***&x=1",
            ),
            (
                "postgresql://me@db/app?sslmode=disable&password=s3cret",
                "postgresql://me@db/app?sslmode=disable&password=***",
            ),
            (
                "postgres://me:s3cret@db/app?PassWord=s3cret&sslpassword=s3cret&schema=s",
                "postgres://me:***@db/app?PassWord=***&sslpassword=***&schema=s",
            ),
            (
                "postgres://db/app?pass%77ord=s3cret",
                "postgres://db/app?pass%77ord=***",
            ),
            (
                "postgres://db/app?%70assword=s3cret",
                "postgres://db/app?%70assword=***",
            ),
            (
                "postgres://db/app?options=-c%20statement_timeout%3D10000",
                "postgres://db/app?options=-c%20statement_timeout%3D10000",
            ),
            // Unescaped `@`, `/`, `?` or `#` in a password: hidden whole.
            (
                "postgres://me:p@ss@db/app?x=1",
                "postgres://me:***@db/app?x=1",
            ),
            ("redis://:pa/ss@h/0", "redis://:***@h/0"),
            ("redis://:pa?ss@h/0", "redis://:***@h/0"),
            ("postgres://me:s3#cret@db/app", "postgres://me:***@db/app"),
            ("postgres://db/app#frag", "postgres://db/app#frag"),
            // Other schemes (upstream URLs in config-check reports).
            ("http://u:s3cret@h:80/mcp", "http://u:***@h:80/mcp"),
            // Not URLs: unchanged, except key-value passwords.
            ("memory", "memory"),
            ("sqlite:/var/lib/x.db", "sqlite:/var/lib/x.db"),
            ("/run/secrets/hmac", "/run/secrets/hmac"),
            ("a=b", "a=b"),
            (
                "host=db user=me password=s3cret dbname=app",
                "host=db user=me password=*** dbname=app",
            ),
            ("host=db password = s3cret", "host=db password = ***"),
            ("password='s3 cr\\'et' host=db", "password=*** host=db"),
            ("password='s3 cret", "password=***"),
        ] {
            let redacted = redact_password(url);
            assert_eq!(redacted, shown, "{url}");
            assert!(!redacted.contains("s3"), "{url}: {redacted}");
        }
    }

    #[test]
    fn displays_round_trip() {
        for url in ["memory", "sqlite:/tmp/x.db", "redis://h:1/0"] {
            assert_eq!(url.parse::<StoreUrl>().unwrap().to_string(), url);
        }
    }
}
