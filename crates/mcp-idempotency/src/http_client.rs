//! The HTTP client for `http://` and `https://` MCP endpoints: hyper's pooled client over rustls
//! (feature `http-client`), used by the bridge and by `mcp-idem proxy` for its upstream.
//!
//! Certificates are checked against the system's roots plus, optionally, the CAs of a PEM file
//! (`--ca-cert`, for a private CA). The crypto provider is chosen explicitly (aws-lc-rs), so the
//! client works whichever providers other crates enable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// How long a TCP connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// hyper's client with TLS, sending whole request bodies.
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    /// The CA file could not be read or holds no PEM certificate.
    #[error("cannot read CA certificates from {path}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// `error` and its sources, joined by `: `, each said once: hyper's own message alone ("client
/// error (Connect)") does not say what happened, its causes (a refused connection, a certificate
/// from an unknown issuer) do.
pub fn error_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// A client trusting the system's roots and the certificates in `ca_file`, if given.
pub fn https_client(ca_file: Option<&Path>) -> Result<HttpsClient, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "a system CA certificate could not be loaded");
    }
    let (_added, _ignored) = roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let ca_error = |reason: String| TlsSetupError::CaFile {
            path: path.to_owned(),
            reason,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| ca_error(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_error(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_error("no PEM certificate in it".into()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| ca_error(format!("not a usable CA certificate: {e}")))?;
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_a_clear_error() {
        let error = https_client(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(matches!(error, TlsSetupError::CaFile { .. }), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = https_client(Some(&empty)).unwrap_err().to_string();
        assert!(error.contains("no PEM certificate"), "{error}");
    }

    #[tokio::test]
    async fn builds_without_a_ca_file() {
        assert!(https_client(None).is_ok());
    }
}
