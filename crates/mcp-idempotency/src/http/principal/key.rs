//! Loading the keys that verify JWT signatures: PEM public keys, JWK Sets and HMAC secrets.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

/// Shortest HMAC secret accepted (RFC 7518 §3.2: at least the hash size, 256 bits for HS256).
const MIN_HMAC_SECRET_BYTES: usize = 32;

/// Shortest RSA modulus accepted, in bits.
const MIN_RSA_BITS: usize = 2048;

/// The keys that verify JWT signatures: one PEM public key, a JWKS, or an HMAC secret.
///
/// Each key allows only the algorithms of its type: RSA `RS*`/`PS*`, EC P-256 `ES256`, EC P-384
/// `ES384`, Ed25519 `EdDSA`, HMAC secret `HS*`; a JWK's `alg` narrows that further.
#[derive(Clone)]
pub struct JwtKey {
    pub(super) keys: Vec<VerifyingKey>,
}

/// One key of a [`JwtKey`] and the algorithms it verifies.
#[derive(Clone)]
pub(super) struct VerifyingKey {
    /// The JWK `kid`; `None` for a PEM key or secret, which verifies tokens with any `kid`.
    pub(super) kid: Option<String>,
    pub(super) key: DecodingKey,
    pub(super) algorithms: Vec<Algorithm>,
}

impl fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<_> = self
            .keys
            .iter()
            .map(|key| (key.kid.as_deref(), &key.algorithms))
            .collect();
        f.debug_struct("JwtKey").field("keys", &keys).finish()
    }
}

impl JwtKey {
    /// Reads a PEM public key (RSA, EC P-256/P-384 or Ed25519) or a JWKS (a JSON object with
    /// `keys`) from `path`, telling them apart by content.
    pub fn load(path: &Path) -> Result<Self, JwtKeyError> {
        let in_file = |source| JwtKeyError::InFile {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        let bytes = std::fs::read(path).map_err(|err| in_file(JwtKeyError::Read(err)))?;
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim_start();
        let key = if text.starts_with('{') {
            Self::from_jwks(text.as_bytes())
        } else if text.starts_with("-----BEGIN ") {
            Self::from_pem(text.as_bytes())
        } else {
            Err(JwtKeyError::NotAKey)
        };
        key.map_err(in_file)
    }

    /// Reads an HMAC secret from `path`: the file's bytes, without a trailing newline.
    pub fn load_hmac_secret(path: &Path) -> Result<Self, JwtKeyError> {
        let in_file = |source| JwtKeyError::InFile {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        let mut bytes = std::fs::read(path).map_err(|err| in_file(JwtKeyError::Read(err)))?;
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        Self::hmac_secret(&bytes).map_err(in_file)
    }

    /// A PEM `PUBLIC KEY` (SPKI: RSA, EC P-256/P-384 or Ed25519) or `RSA PUBLIC KEY` (PKCS#1).
    pub fn from_pem(pem: &[u8]) -> Result<Self, JwtKeyError> {
        let text = std::str::from_utf8(pem).map_err(|_| JwtKeyError::NotAKey)?;
        let label = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("-----BEGIN "))
            .and_then(|rest| rest.strip_suffix("-----"))
            .ok_or(JwtKeyError::NotAKey)?;
        if label.contains("PRIVATE KEY") {
            return Err(JwtKeyError::PrivateKey);
        }
        if label != "PUBLIC KEY" && label != "RSA PUBLIC KEY" {
            return Err(JwtKeyError::UnsupportedPem(label.to_owned()));
        }
        let key = if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
            let bytes = key
                .try_get_as_bytes()
                .map_err(|_| JwtKeyError::InvalidKey)?;
            check_rsa_der(bytes)?;
            VerifyingKey {
                kid: None,
                key,
                algorithms: RSA_ALGORITHMS.to_vec(),
            }
        } else if let Ok(key) = DecodingKey::from_ec_pem(pem) {
            let bytes = key
                .try_get_as_bytes()
                .map_err(|_| JwtKeyError::InvalidKey)?;
            let algorithm = match (bytes.len(), bytes.first()) {
                (65, Some(4)) => Algorithm::ES256,
                (97, Some(4)) => Algorithm::ES384,
                _ => return Err(JwtKeyError::UnsupportedCurve),
            };
            VerifyingKey {
                kid: None,
                key,
                algorithms: vec![algorithm],
            }
        } else if let Ok(key) = DecodingKey::from_ed_pem(pem) {
            let bytes = key
                .try_get_as_bytes()
                .map_err(|_| JwtKeyError::InvalidKey)?;
            if bytes.len() != 32 {
                return Err(JwtKeyError::InvalidKey);
            }
            VerifyingKey {
                kid: None,
                key,
                algorithms: vec![Algorithm::EdDSA],
            }
        } else {
            return Err(JwtKeyError::InvalidKey);
        };
        Ok(Self { keys: vec![key] })
    }

    /// A JWK Set (RFC 7517 §5). Keys for signatures (`use` absent or `sig`, `key_ops` absent or
    /// with `verify`) of type RSA, EC P-256/P-384 or OKP Ed25519 are kept; others (symmetric
    /// `oct` keys included: a published JWKS is public) are skipped. At least one must remain.
    pub fn from_jwks(json: &[u8]) -> Result<Self, JwtKeyError> {
        #[derive(Deserialize)]
        struct RawSet {
            keys: Vec<serde_json::Value>,
        }
        let set: RawSet = serde_json::from_slice(json).map_err(JwtKeyError::Jwks)?;
        let keys: Vec<VerifyingKey> = set
            .keys
            .into_iter()
            .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
            .filter_map(|jwk| jwk_to_key(&jwk))
            .collect();
        if keys.is_empty() {
            return Err(JwtKeyError::NoUsableKeys);
        }
        Ok(Self { keys })
    }

    /// An HMAC shared secret (`HS256`, `HS384`, `HS512`), at least 32 bytes.
    pub fn hmac_secret(secret: &[u8]) -> Result<Self, JwtKeyError> {
        if secret.len() < MIN_HMAC_SECRET_BYTES {
            return Err(JwtKeyError::ShortSecret { len: secret.len() });
        }
        let key = DecodingKey::from_secret(secret).map_err(|_| JwtKeyError::InvalidKey)?;
        Ok(Self {
            keys: vec![VerifyingKey {
                kid: None,
                key,
                algorithms: HMAC_ALGORITHMS.to_vec(),
            }],
        })
    }

    /// The number of keys (more than one only for a JWKS).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: a `JwtKey` holds at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

const RSA_ALGORITHMS: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

const HMAC_ALGORITHMS: [Algorithm; 3] = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];

/// Checks that `der` is a PKCS#1 RSA public key of at least [`MIN_RSA_BITS`].
fn check_rsa_der(der: &[u8]) -> Result<(), JwtKeyError> {
    let provider =
        jsonwebtoken::crypto::CryptoProvider::try_get_default().ok_or(JwtKeyError::InvalidKey)?;
    let (modulus, _) = (provider.key_utils.rsa_pub_components_from_public_key)(der)
        .map_err(|_| JwtKeyError::InvalidKey)?;
    check_rsa_modulus(&modulus)
}

fn check_rsa_modulus(modulus: &[u8]) -> Result<(), JwtKeyError> {
    let significant = match modulus.iter().position(|b| *b != 0) {
        Some(first) => &modulus[first..],
        None => return Err(JwtKeyError::InvalidKey),
    };
    let bits = significant.len() * 8 - significant[0].leading_zeros() as usize;
    if bits < MIN_RSA_BITS {
        return Err(JwtKeyError::WeakRsaKey { bits });
    }
    Ok(())
}

/// The verifying key of a JWK, or `None` if it is not a usable signature key.
fn jwk_to_key(jwk: &Jwk) -> Option<VerifyingKey> {
    let common = &jwk.common;
    if common
        .public_key_use
        .as_ref()
        .is_some_and(|usage| *usage != PublicKeyUse::Signature)
    {
        return None;
    }
    if common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return None;
    }
    let algorithms = match &jwk.algorithm {
        AlgorithmParameters::RSA(params) => {
            let modulus = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(params.n.trim_end_matches('='))
                .ok()?;
            check_rsa_modulus(&modulus).ok()?;
            RSA_ALGORITHMS.to_vec()
        }
        AlgorithmParameters::EllipticCurve(params) => match params.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(params) if params.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        _ => return None,
    };
    let algorithms = match &common.key_algorithm {
        None => algorithms,
        Some(alg) => {
            let alg = Algorithm::from_str(&alg.to_string()).ok()?;
            algorithms.into_iter().filter(|a| *a == alg).collect()
        }
    };
    if algorithms.is_empty() {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(VerifyingKey {
        kid: common.key_id.clone(),
        key,
        algorithms,
    })
}

/// Why a JWT key could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwtKeyError {
    /// The problem below is in this file.
    #[error("cannot use the JWT key file {}", path.display())]
    InFile {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<JwtKeyError>,
    },
    /// The file could not be read.
    #[error("cannot read it")]
    Read(#[source] io::Error),
    /// Neither PEM nor JSON.
    #[error("it is neither a PEM public key nor a JWKS (a JSON object with \"keys\")")]
    NotAKey,
    /// A PEM private key where the public key was expected.
    #[error("it holds a private key; give the public key (openssl pkey -in KEY -pubout)")]
    PrivateKey,
    /// A PEM block other than a public key (a certificate, for example).
    #[error("unsupported PEM block {0:?}: expected PUBLIC KEY or RSA PUBLIC KEY")]
    UnsupportedPem(String),
    /// The PEM block does not hold a valid RSA, EC or Ed25519 public key.
    #[error("it is not a valid RSA, EC (P-256, P-384) or Ed25519 public key")]
    InvalidKey,
    /// An EC key on a curve other than P-256 and P-384.
    #[error("unsupported elliptic curve: use P-256 (ES256) or P-384 (ES384)")]
    UnsupportedCurve,
    /// An RSA key that is too short.
    #[error("the RSA key has {bits} bits; at least 2048 are required")]
    WeakRsaKey {
        /// The modulus size.
        bits: usize,
    },
    /// The JSON is not a JWK Set.
    #[error("it is not a valid JWKS (a JSON object with \"keys\")")]
    Jwks(#[source] serde_json::Error),
    /// A JWKS without any signature key this crate can use.
    #[error(
        "the JWKS has no usable signature key (RSA >= 2048 bits, EC P-256/P-384 or Ed25519, \
         with use \"sig\" or none)"
    )]
    NoUsableKeys,
    /// An HMAC secret that is too short.
    #[error("the HMAC secret is {len} bytes long; at least 32 are required")]
    ShortSecret {
        /// Length of the secret in bytes.
        len: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsa_modulus_bits_ignore_leading_zeros() {
        let mut modulus = vec![0u8; 1];
        modulus.extend(std::iter::repeat_n(0xff, 256));
        assert!(check_rsa_modulus(&modulus).is_ok());
        let short = vec![0x7fu8; 256];
        assert!(matches!(
            check_rsa_modulus(&short),
            Err(JwtKeyError::WeakRsaKey { bits: 2047 })
        ));
    }
}
