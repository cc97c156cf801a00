//! The URL and connection settings: the `schema` parameter (which tokio-postgres does not know),
//! schema names, timeouts, and the password-free description every error message names the server
//! by.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::Host;

use super::pool::{explain, OPERATION_TIMEOUT};
use crate::store::{redact_password, StoreError};

/// The schema used when neither the URL nor the caller names one.
pub(super) const DEFAULT_SCHEMA: &str = "public";

/// How long establishing one connection (TCP and startup) may take, unless the URL sets
/// `connect_timeout`.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The connection settings a URL (without `schema=`) names, for tables in `schema`, and the
/// connect timeout: the URL's `connect_timeout`, or [`DEFAULT_CONNECT_TIMEOUT`]. A URL without a
/// host, or that tokio-postgres refuses, is an
/// [`StoreError::InvalidUrl`], shown without its password.
pub(super) fn connection_config(
    url: &str,
    schema: &str,
) -> Result<(tokio_postgres::Config, Duration), StoreError> {
    let invalid = |reason: String| StoreError::InvalidUrl {
        url: redact_password(url),
        reason,
    };
    validate_schema_name(schema).map_err(invalid)?;
    let mut config = tokio_postgres::Config::from_str(url).map_err(|err| invalid(explain(&err)))?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(invalid("the URL names no host".into()));
    }
    let connect_timeout = *config
        .get_connect_timeout()
        .unwrap_or(&DEFAULT_CONNECT_TIMEOUT);
    config.connect_timeout(connect_timeout);
    if config.get_tcp_user_timeout().is_none() {
        // Data unacknowledged this long means the server is gone: drop the connection.
        config.tcp_user_timeout(OPERATION_TIMEOUT);
    }
    Ok((config, connect_timeout))
}

/// Schema names are limited to ASCII letters, digits and `_` (and quoted anyway), at most 63
/// bytes, PostgreSQL's identifier limit.
fn validate_schema_name(schema: &str) -> Result<(), String> {
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid schema name {schema:?}: use 1 to 63 ASCII letters, digits and _, not starting with a digit"
        ))
    }
}

/// `ident` as a quoted SQL identifier.
pub(super) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Removes a `schema=NAME` parameter (which tokio-postgres would reject) from a URL's query.
pub(super) fn split_schema_param(url: &str) -> Result<(String, Option<String>), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut schema = None;
    let mut kept = Vec::new();
    for param in query.split('&') {
        match param.strip_prefix("schema=") {
            Some(name) => {
                if schema.replace(name.to_owned()).is_some() {
                    return Err(StoreError::InvalidUrl {
                        url: redact_password(url),
                        reason: "the schema parameter is given twice".into(),
                    });
                }
            }
            None => kept.push(param),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, schema))
}

/// `postgres://user@host:port/db` for the first host (and `+N` for more), without the password.
pub(super) fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => config
            .get_hostaddrs()
            .first()
            .map_or_else(|| "?".to_owned(), ToString::to_string),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .map(|user| format!("{user}@"))
        .unwrap_or_default();
    let db = config.get_dbname().or(config.get_user()).unwrap_or("");
    let more = config.get_hosts().len().max(config.get_hostaddrs().len());
    let more = if more > 1 {
        format!(" (+{} more hosts)", more - 1)
    } else {
        String::new()
    };
    format!("postgres://{user}{host}:{port}/{db}{more}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store shows URLs through the one redactor, [`redact_password`].
    #[test]
    fn redacts_passwords() {
        for (url, shown) in [
            (
                "postgres://me:s3cret@db:5432/app",
                "postgres://me:***@db:5432/app",
            ),
            (
                "postgres://me:p@ss@db/app?x=1",
                "postgres://me:***@db/app?x=1",
            ),
            (
                "postgres://db/app?user=me&password=s3cret&x=1",
                "postgres://db/app?user=me&password=***&x=1",
            ),
            ("postgres://me@db/app", "postgres://me@db/app"),
        ] {
            assert_eq!(redact_password(url), shown);
        }
    }

    #[test]
    fn splits_the_schema_parameter() {
        assert_eq!(
            split_schema_param("postgres://h/db?schema=s1&connect_timeout=2").unwrap(),
            (
                "postgres://h/db?connect_timeout=2".to_owned(),
                Some("s1".to_owned())
            )
        );
        assert_eq!(
            split_schema_param("postgres://h/db?schema=s1").unwrap(),
            ("postgres://h/db".to_owned(), Some("s1".to_owned()))
        );
        assert_eq!(
            split_schema_param("postgres://h/db").unwrap(),
            ("postgres://h/db".to_owned(), None)
        );
        assert!(split_schema_param("postgres://h/db?schema=a&schema=b").is_err());
    }

    #[test]
    fn validates_schema_names() {
        for good in ["public", "idem_test_01", "_x", "A"] {
            assert!(validate_schema_name(good).is_ok(), "{good}");
        }
        for bad in ["", "1abc", "a-b", "a\"b", "a b", "é", &"x".repeat(64)] {
            assert!(validate_schema_name(bad).is_err(), "{bad}");
        }
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn describes_without_password() {
        let config: tokio_postgres::Config =
            "postgres://me:s3cret@db.example:6543/app".parse().unwrap();
        assert_eq!(describe(&config), "postgres://me@db.example:6543/app");
    }
}
