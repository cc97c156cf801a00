//! The one place TLS client configurations are made: the roots certificates are checked
//! against (the system's, plus the CAs of an optional PEM file), and the crypto provider, chosen
//! explicitly (ring) so that TLS works whichever providers other crates enable. Used by the
//! HTTP client, the PostgreSQL store and the Redis store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// Why no TLS configuration could be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[cfg_attr(not(feature = "http-client"), allow(unreachable_pub))]
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

/// The crypto provider every TLS configuration of the crate uses.
#[cfg_attr(
    not(any(feature = "http-client", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes the crate's provider (ring, as [`provider`]) the process' default, unless one is set
/// already: for the crates that build their rustls configurations themselves with the default
/// provider (the `redis` crate), which would otherwise panic when several providers are compiled
/// in.
#[cfg(feature = "redis")]
pub(crate) fn install_default_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: that one is kept, which is as good.
        let _ = rustls::crypto::CryptoProvider::install_default(
            rustls::crypto::ring::default_provider(),
        );
    }
}

/// The CA certificates of the PEM file `path` (at least one).
#[cfg_attr(
    not(any(feature = "http-client", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    parse_ca_pem(path, &read_ca_file(path)?)
}

/// The PEM file `path` as it is, once checked to hold at least one certificate (all of them
/// readable): for the crates that take CA certificates as PEM bytes (the `redis` crate).
#[cfg(feature = "redis")]
pub(crate) fn ca_file_pem(path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    let pem = read_ca_file(path)?;
    parse_ca_pem(path, &pem)?;
    Ok(pem)
}

/// The bytes of the CA file `path`.
fn read_ca_file(path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|e| TlsSetupError::CaFile {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// The certificates of `pem`, the contents of the file `path` (named in errors).
fn parse_ca_pem(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let ca_error = |reason: String| TlsSetupError::CaFile {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ca_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(ca_error("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The roots: the system's (unless `system` is false) and the certificates in `ca_file`.
#[cfg_attr(
    not(any(feature = "http-client", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) fn root_store(
    system: bool,
    ca_file: Option<&Path>,
) -> Result<rustls::RootCertStore, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    if system {
        let native = rustls_native_certs::load_native_certs();
        for error in &native.errors {
            tracing::debug!(%error, "a system CA certificate could not be loaded");
        }
        let (_added, _ignored) = roots.add_parsable_certificates(native.certs);
    }
    if let Some(path) = ca_file {
        for cert in ca_certificates(path)? {
            roots.add(cert).map_err(|e| TlsSetupError::CaFile {
                path: path.to_owned(),
                reason: format!("not a usable CA certificate: {e}"),
            })?;
        }
    }
    Ok(roots)
}

/// A client configuration checking server certificates (and their names) against the system's
/// roots and the certificates in `ca_file`, if given.
#[cfg_attr(
    not(any(feature = "http-client", feature = "postgres")),
    allow(dead_code)
)]
pub(crate) fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsSetupError> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(root_store(true, ca_file)?)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_a_clear_error() {
        let error = client_config(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(matches!(error, TlsSetupError::CaFile { .. }), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = client_config(Some(&empty)).unwrap_err().to_string();
        assert!(error.contains("no PEM certificate"), "{error}");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn a_ca_file_as_pem_is_checked_first() {
        let error = ca_file_pem(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(matches!(error, TlsSetupError::CaFile { .. }), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let error = ca_file_pem(&empty).unwrap_err().to_string();
        assert!(error.contains("no PEM certificate"), "{error}");
    }

    #[test]
    fn builds_without_a_ca_file() {
        assert!(client_config(None).is_ok());
    }
}
