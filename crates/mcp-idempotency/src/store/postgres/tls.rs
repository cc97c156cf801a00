//! TLS to the server, over rustls: the libpq URL parameters `sslmode` (`disable`, `prefer`,
//! `require`, `verify-ca`, `verify-full`) and `sslrootcert` (a PEM file of CA certificates),
//! which tokio-postgres does not know (or, for `verify-*`, does not accept): they are taken out
//! of the URL here and turn into a connector for the pool.
//!
//! | `sslmode` | encrypted | certificate checked |
//! | --- | --- | --- |
//! | absent, `disable` | no | — |
//! | `prefer` | if the server offers TLS | no |
//! | `require` | yes | no (as in libpq without a root certificate) |
//! | `verify-ca` | yes | chain to a CA of `sslrootcert` (required) |
//! | `verify-full` | yes | chain to a system root or a CA of `sslrootcert`, and the host name |
//!
//! Unlike libpq, a URL without `sslmode` does not try TLS (libpq's default is `prefer`, which
//! protects nothing anyway).

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

use crate::tls::{client_config, provider, root_store};

/// What the URL asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(format!(
                "unknown sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full"
            ))
            }
        })
    }

    /// What tokio-postgres is told: whether to ask for TLS and whether to insist.
    pub(super) fn ssl_mode(self) -> SslMode {
        match self {
            Self::Disable => SslMode::Disable,
            Self::Prefer => SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => SslMode::Require,
        }
    }
}

/// The TLS parameters of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TlsOptions {
    pub(super) mode: Mode,
    pub(super) root_cert: Option<PathBuf>,
}

/// Takes `sslmode` and `sslrootcert` out of a URL's query; the rest goes to tokio-postgres.
pub(super) fn split_tls_params(url: &str) -> Result<(String, TlsOptions), String> {
    let mut options = TlsOptions {
        mode: Mode::Disable,
        root_cert: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), options));
    };
    let mut kept = Vec::new();
    for param in query.split('&') {
        if let Some(value) = param.strip_prefix("sslmode=") {
            options.mode = Mode::parse(value)?;
        } else if let Some(value) = param.strip_prefix("sslrootcert=") {
            options.root_cert = Some(PathBuf::from(value));
        } else {
            kept.push(param);
        }
    }
    if options.mode == Mode::VerifyCa && options.root_cert.is_none() {
        return Err("sslmode=verify-ca needs sslrootcert=FILE (the CA certificates)".into());
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, options))
}

/// The connector the pool opens connections with: rustls, configured as `options` say, or none
/// at all when TLS is off.
#[derive(Clone)]
pub(super) struct RustlsConnect {
    config: Option<Arc<rustls::ClientConfig>>,
}

impl RustlsConnect {
    /// The connector for `options`; a CA file that cannot be read is an error.
    pub(super) fn new(options: &TlsOptions) -> Result<Self, String> {
        let ca_file = options.root_cert.as_deref();
        let config = match options.mode {
            Mode::Disable => return Ok(Self { config: None }),
            Mode::VerifyFull => client_config(ca_file).map_err(|e| e.to_string())?,
            Mode::Prefer | Mode::Require => unverified(Unchecked::new(provider())),
            Mode::VerifyCa => {
                let ca_file = ca_file.unwrap_or(Path::new(""));
                let roots = root_store(false, Some(ca_file)).map_err(|e| e.to_string())?;
                let inner =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| format!("cannot use the CAs of {}: {e}", ca_file.display()))?;
                unverified(AnyName(inner))
            }
        };
        Ok(Self {
            config: Some(Arc::new(config)),
        })
    }
}

fn unverified(verifier: impl ServerCertVerifier + 'static) -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth()
}

/// `sslmode=require` and `prefer`: any certificate, but the handshake is still checked.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl Unchecked {
    fn new(provider: Arc<CryptoProvider>) -> Self {
        Self(provider)
    }
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to one of the CAs, whatever name the certificate is
/// for.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Why no TLS session could be set up for a host.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct TlsConnectError(String);

impl MakeTlsConnect<Socket> for RustlsConnect {
    type Stream = TlsStream;
    type TlsConnect = Connector;
    type Error = TlsConnectError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connector, TlsConnectError> {
        // Called for every connection, whether TLS is on or not.
        let config = self.config.clone();
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| TlsConnectError(format!("{domain:?} is not a TLS server name: {e}")))?;
        Ok(Connector { config, name })
    }
}

/// Wraps one connection in TLS.
pub(super) struct Connector {
    config: Option<Arc<rustls::ClientConfig>>,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for Connector {
    type Stream = TlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS is off (sslmode=disable)"))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(self.name, stream)
                .await?;
            Ok(TlsStream(Box::new(stream)))
        })
    }
}

/// A TLS connection to the server.
pub(super) struct TlsStream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl tokio_postgres::tls::TlsStream for TlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM then authenticates without binding to the TLS session (channel_binding=prefer).
        ChannelBinding::none()
    }
}

impl AsyncRead for TlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_tls_parameters_out_of_the_url() {
        let (url, options) = split_tls_params(
            "postgres://h/db?sslmode=verify-full&sslrootcert=/x/ca.pem&connect_timeout=2",
        )
        .unwrap();
        assert_eq!(url, "postgres://h/db?connect_timeout=2");
        assert_eq!(options.mode, Mode::VerifyFull);
        assert_eq!(options.root_cert.as_deref(), Some(Path::new("/x/ca.pem")));
        let (url, options) = split_tls_params("postgres://h/db").unwrap();
        assert_eq!(
            (url.as_str(), options.mode),
            ("postgres://h/db", Mode::Disable)
        );
        assert!(split_tls_params("postgres://h/db?sslmode=verify-ca").is_err());
        assert!(split_tls_params("postgres://h/db?sslmode=allow").is_err());
    }
}
