//! TLS to Redis (`rediss://`, `rediss-cluster://`, `sslrootcert=FILE`): the shared store suite on
//! one TLS server and on a TLS Redis Cluster, and the refusals that keep TLS honest — no CA or a
//! wrong CA (unknown issuer), a name the certificate is not for, a CA file that cannot be read.
//!
//! Runs against `REDIS_TLS_URL` (default `rediss://127.0.0.1:6380`) and `REDIS_TLS_CLUSTER_URL`
//! (default `rediss-cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102`), whose certificate,
//! for `localhost` and `127.0.0.1`, is issued by the CA in `REDIS_TLS_CA` (default
//! `/tmp/mcp-idem-redis-tls/ca.pem`); `scripts/tls-redis.sh start` starts both (the one server
//! also listens on 127.0.0.2, which the certificate does not name). Under `CI=true` the tests fail
//! when a server or the CA file is missing; otherwise they print a note and check nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_idempotency::store::{RedisStore, Store, StoreError};

const DEFAULT_URL: &str = "rediss://127.0.0.1:6380";
const DEFAULT_CLUSTER_URL: &str = "rediss-cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102";
const DEFAULT_CA: &str = "/tmp/mcp-idem-redis-tls/ca.pem";
const HINT: &str = "start them with scripts/tls-redis.sh start, or set REDIS_TLS_URL, \
                    REDIS_TLS_CLUSTER_URL and REDIS_TLS_CA";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

fn random_prefix() -> String {
    format!("mcp-idem-test-{:016x}", rand::random::<u64>())
}

/// The one server's or the cluster's URL (without `sslrootcert`).
fn base_url(cluster: bool) -> String {
    let (var, default) = if cluster {
        ("REDIS_TLS_CLUSTER_URL", DEFAULT_CLUSTER_URL)
    } else {
        ("REDIS_TLS_URL", DEFAULT_URL)
    };
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn ca_file() -> PathBuf {
    std::env::var_os("REDIS_TLS_CA").map_or_else(|| PathBuf::from(DEFAULT_CA), PathBuf::from)
}

/// `url` with `sslrootcert=ca`.
fn with_ca(url: &str, ca: &Path) -> String {
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}sslrootcert={}", ca.display())
}

/// A store over TLS under a fresh prefix, checked against the test CA; `None` (with a note)
/// off CI when the server or the CA is missing.
async fn tls_store(cluster: bool) -> Option<RedisStore> {
    let ca = ca_file();
    if !ca.is_file() {
        assert!(
            !in_ci(),
            "CI=true but the CA file REDIS_TLS_CA ({}) is missing; {HINT}",
            ca.display()
        );
        eprintln!(
            "NOTE: skipping a Redis TLS check: no CA file at {}; {HINT}",
            ca.display()
        );
        return None;
    }
    let url = with_ca(&base_url(cluster), &ca);
    match RedisStore::open_with_prefix(&url, &random_prefix()).await {
        Ok(store) => Some(store),
        Err(err) if in_ci() => {
            panic!("CI=true but the TLS Redis {url} cannot be used: {err}; {HINT}")
        }
        Err(err) => {
            eprintln!("NOTE: skipping a Redis TLS check: {err}; {HINT}");
            None
        }
    }
}

mod suite {
    use super::*;

    mcp_idempotency::store_test_suite!(|| async {
        tls_store(false)
            .await
            .map(|store| Arc::new(store) as Arc<dyn Store>)
    });
}

mod cluster_suite {
    use super::*;

    // As on the plaintext cluster: the store-wide quota is bounded, not exact, on a cluster
    // (store_redis_cluster.rs checks the bound).
    mcp_idempotency::store_test_suite!(total_quota_bounded: || async {
        tls_store(true)
            .await
            .map(|store| Arc::new(store) as Arc<dyn Store>)
    });
}

/// Opens `url` and expects a refusal of the server's certificate: an [`StoreError::Unavailable`]
/// saying so (with `reason`, rustls' words for it), soon, without a password in it.
async fn expect_certificate_refused(url: &str, reason: &str) {
    let started = Instant::now();
    let err = RedisStore::open(url)
        .await
        .expect_err("the certificate must be refused");
    let message = err.to_string();
    assert!(err.is_unavailable(), "{url}: {err:?}");
    assert!(
        message.contains("TLS certificate was refused") && message.contains(reason),
        "{url}: {message}"
    );
    assert!(!message.contains("s3cret"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{url}: took {:?}",
        started.elapsed()
    );
}

/// A CA that issued nothing the servers use, made with openssl in `dir`.
fn other_ca(dir: &Path) -> PathBuf {
    let pem = dir.join("other-ca.pem");
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=not the mcp-idem test CA", "-keyout"])
        .arg(dir.join("other-ca.key"))
        .arg("-out")
        .arg(&pem)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs (scripts/tls-redis.sh needs it too)");
    assert!(status.success(), "openssl made no CA");
    pem
}

/// Without `sslrootcert` the system's roots are used, which do not know the test CA; with a CA
/// that did not issue the certificate it is refused just the same. The same on the cluster.
#[tokio::test]
async fn an_unknown_issuer_is_refused_clearly() {
    for cluster in [false, true] {
        if tls_store(cluster).await.is_none() {
            return;
        }
        let url = base_url(cluster);
        let with_password = url.replacen("://", "://:s3cret@", 1);
        expect_certificate_refused(&with_password, "UnknownIssuer").await;
        let dir = tempfile::tempdir().unwrap();
        expect_certificate_refused(&with_ca(&url, &other_ca(dir.path())), "UnknownIssuer").await;
    }
}

/// The one server also answers on 127.0.0.2, a name its certificate is not for: refused, with
/// the right CA.
#[tokio::test]
async fn a_name_the_certificate_is_not_for_is_refused() {
    if tls_store(false).await.is_none() {
        return;
    }
    let url = base_url(false);
    assert!(
        url.contains("127.0.0.1:"),
        "this check needs REDIS_TLS_URL on 127.0.0.1: {url}"
    );
    let wrong = with_ca(&url.replacen("127.0.0.1:", "127.0.0.2:", 1), &ca_file());
    expect_certificate_refused(&wrong, "not valid for name \"127.0.0.2\"").await;
}

/// A CA file that cannot be read or holds no certificate, `#insecure`, or `sslrootcert` without
/// TLS: a bad URL, said at open (before connecting), without the password.
#[tokio::test]
async fn a_bad_ca_file_is_a_bad_url() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    for (url, needle) in [
        (
            "rediss://:s3cret@127.0.0.1:6380/?sslrootcert=/nonexistent/ca.pem".to_owned(),
            "cannot read CA certificates from /nonexistent/ca.pem",
        ),
        (
            "rediss-cluster://:s3cret@127.0.0.1:7100?sslrootcert=/nonexistent/ca.pem".to_owned(),
            "cannot read CA certificates from /nonexistent/ca.pem",
        ),
        (
            format!(
                "rediss://:s3cret@127.0.0.1:6380?sslrootcert={}",
                empty.display()
            ),
            "no PEM certificate",
        ),
        (
            "rediss://:s3cret@127.0.0.1:6380/#insecure".to_owned(),
            "always checked",
        ),
        (
            "redis://:s3cret@127.0.0.1:6379/?sslrootcert=/etc/ca.pem".to_owned(),
            "needs TLS",
        ),
    ] {
        let err = RedisStore::open(&url).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(needle), "{url}: {message}");
        assert!(!message.contains("s3cret"), "{message}");
    }
}

/// Plain `redis://` to a TLS-only port fails within the store's bounds (no hang).
#[tokio::test]
async fn plaintext_to_a_tls_port_fails_without_hanging() {
    if tls_store(false).await.is_none() {
        return;
    }
    let plain = base_url(false).replacen("rediss://", "redis://", 1);
    let started = Instant::now();
    let err = RedisStore::open(&plain).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}
