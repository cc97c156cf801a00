//! The HTTP client for `http://` and `https://` MCP endpoints: hyper's pooled client over rustls
//! (feature `http-client`), used by the bridge and by `mcp-idem proxy` for its upstream.
//!
//! Certificates are checked against the system's roots plus, optionally, the CAs of a PEM file
//! (`--ca-cert`, for a private CA). The crypto provider is chosen explicitly (ring), so the
//! client works whichever providers other crates enable.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How long a TCP connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// hyper's client with TLS, sending whole request bodies.
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

pub use crate::tls::TlsSetupError;

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

/// Whether `error` is, or was caused by, a server certificate that could not be verified (an
/// unknown issuer, an expired certificate, another name): trying again will not help.
pub fn is_certificate_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(rustls::Error::InvalidCertificate(_)) = error.downcast_ref::<rustls::Error>() {
            return true;
        }
        // An I/O error's `source` skips the error it wraps (TLS errors come wrapped twice).
        next = match error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    false
}

/// A client trusting the system's roots and the certificates in `ca_file`, if given.
pub fn https_client(ca_file: Option<&Path>) -> Result<HttpsClient, TlsSetupError> {
    let tls = crate::tls::client_config(ca_file)?;
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

    #[test]
    fn certificate_errors_are_found_under_the_io_errors_that_wrap_them() {
        let invalid = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            invalid,
        ));
        assert!(is_certificate_error(&wrapped));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_certificate_error(&refused));
        let other = std::io::Error::other(rustls::Error::DecryptError);
        assert!(!is_certificate_error(&other));
    }

    #[tokio::test]
    async fn builds_without_a_ca_file() {
        assert!(https_client(None).is_ok());
    }
}
