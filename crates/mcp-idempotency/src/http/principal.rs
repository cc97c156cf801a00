//! Who is calling: the principal that scopes idempotency records over HTTP.
//!
//! The SEP requires records to be scoped to the authorization boundary of the tool call: a key
//! sent by one caller is never matched against another caller's records. Over HTTP that boundary
//! comes from the request headers, and [`ScopeBy`] says how (the gateway's `--scope-by`):
//!
//! | mode          | principal                                   | refused (401) when                  |
//! |---------------|---------------------------------------------|-------------------------------------|
//! | `none`        | `none` (one tenant)                         | never                               |
//! | `header:NAME` | `header:` + the header's value              | missing, empty, repeated, not ASCII |
//! | `bearer`      | `bearer:` + hex SHA-256 of the bearer token | no or malformed `Bearer` token      |
//! | `jwt`         | `jwt:` + JSON array `[iss, sub]`            | the JWT does not validate           |
//!
//! The prefixes keep principals of different modes apart, and the JSON array keeps `iss`/`sub`
//! pairs apart (`["a:b","c"]` is not `["a","b:c"]`). A bearer token is never stored, only its hash.
//!
//! `header:NAME` trusts the header: use it only behind an authenticating proxy that sets the header
//! and strips any copy sent by the client.
//!
//! `jwt` checks the signature with the configured [`JwtKey`] (the algorithms follow the key type:
//! an RSA, EC or Ed25519 public key never accepts an HMAC token, and `alg: none` is never
//! accepted), then `iss`, `aud`, `exp` (required) and `nbf` (when present) against the `now` passed
//! in, with [`DEFAULT_LEEWAY`] for clock skew unless configured otherwise.
//!
//! No I/O here except [`JwtKey::load`] and friends, which read key files once at startup.
//!
//! # Example
//!
//! ```
//! use std::time::SystemTime;
//!
//! use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
//! use mcp_idempotency::http::principal::ScopeBy;
//!
//! let scope_by = ScopeBy::parse("bearer", None).unwrap();
//! let mut headers = HeaderMap::new();
//! let refused = scope_by.principal(&headers, SystemTime::now()).unwrap_err();
//! assert_eq!(refused.www_authenticate(), "Bearer");
//!
//! headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer opaque-token-1"));
//! let principal = scope_by.principal(&headers, SystemTime::now()).unwrap();
//! assert!(principal.as_str().starts_with("bearer:"));
//! assert!(!principal.as_str().contains("opaque-token-1"));
//! ```

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Default tolerance for clock skew when checking a JWT's `exp` and `nbf`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

/// Longest bearer token accepted, in bytes.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Shortest HMAC secret accepted (RFC 7518 §3.2: at least the hash size, 256 bits for HS256).
const MIN_HMAC_SECRET_BYTES: usize = 32;

/// Shortest RSA modulus accepted, in bits.
const MIN_RSA_BITS: usize = 2048;

/// The caller's identity within a namespace: the principal of a [`Scope`](crate::Scope).
///
/// Its text starts with the mode that produced it (`none`, `header:`, `bearer:`, `jwt:`), so
/// principals of different modes never collide. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal(Arc<str>);

impl Principal {
    /// The principal's text, as stored in records.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Principal({:?})", self.0)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Principal {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<Principal> for Arc<str> {
    fn from(principal: Principal) -> Self {
        principal.0
    }
}

/// How the principal of an HTTP request is found. See the [module docs](self).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ScopeBy {
    /// Every request has the same principal, `none`: one tenant.
    None,
    /// The value of this header, set by a trusted authenticating proxy.
    Header(HeaderName),
    /// A hash of the `Authorization: Bearer` token (an opaque token checked elsewhere).
    Bearer,
    /// The issuer and subject of a validated JWT bearer token.
    Jwt(JwtValidator),
}

impl ScopeBy {
    /// Parses a `--scope-by` value: `none`, `header:NAME`, `bearer` or `jwt`.
    ///
    /// `jwt` needs `jwt` (the key, issuer and audience); the other modes refuse one, since a
    /// JWT configuration they would ignore is a mistake.
    pub fn parse(spec: &str, jwt: Option<JwtConfig>) -> Result<Self, ScopeByError> {
        let scope_by = match spec.trim() {
            "none" => Self::None,
            "bearer" => Self::Bearer,
            "jwt" => {
                return match jwt {
                    Some(config) => Self::jwt(config),
                    None => Err(ScopeByError::JwtConfigMissing),
                }
            }
            other => match other.strip_prefix("header:") {
                Some(name) => Self::header(name)?,
                None => return Err(ScopeByError::UnknownMode(other.to_owned())),
            },
        };
        if jwt.is_some() {
            return Err(ScopeByError::JwtConfigUnused(scope_by.to_string()));
        }
        Ok(scope_by)
    }

    /// `header:NAME`. Headers that carry credentials (`Authorization`, `Proxy-Authorization`,
    /// `Cookie`) are refused: their values must not be stored as principals; use `bearer`.
    pub fn header(name: &str) -> Result<Self, ScopeByError> {
        let invalid = || ScopeByError::InvalidHeaderName(name.to_owned());
        let name = HeaderName::from_str(name.trim()).map_err(|_| invalid())?;
        if [
            AUTHORIZATION,
            http::header::PROXY_AUTHORIZATION,
            http::header::COOKIE,
        ]
        .contains(&name)
        {
            return Err(ScopeByError::CredentialHeader(name));
        }
        Ok(Self::Header(name))
    }

    /// `jwt`, validating with `config`.
    pub fn jwt(config: JwtConfig) -> Result<Self, ScopeByError> {
        JwtValidator::new(config).map(Self::Jwt)
    }

    /// The principal of a request with these `headers`, or why it is refused. A refused request
    /// gets 401 with [`Unauthorized::www_authenticate`] before any record is touched.
    ///
    /// `now` is checked against a JWT's `exp` and `nbf`; the other modes ignore it.
    pub fn principal(
        &self,
        headers: &HeaderMap,
        now: SystemTime,
    ) -> Result<Principal, Unauthorized> {
        match self {
            Self::None => Ok(Principal(Arc::from("none"))),
            Self::Header(name) => header_principal(headers, name),
            Self::Bearer => {
                let token = bearer_token(headers)?;
                let digest = Sha256::digest(token.as_bytes());
                Ok(Principal(Arc::from(format!("bearer:{digest:x}"))))
            }
            Self::Jwt(validator) => validator.validate(bearer_token(headers)?, now),
        }
    }
}

impl fmt::Display for ScopeBy {
    /// The `--scope-by` spelling: `none`, `header:NAME`, `bearer` or `jwt`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Bearer => f.write_str("bearer"),
            Self::Jwt(_) => f.write_str("jwt"),
        }
    }
}

/// Why a `--scope-by` value or its JWT configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeByError {
    /// Not `none`, `header:NAME`, `bearer` or `jwt`.
    #[error("unknown scope mode {0:?}: expected none, header:NAME, bearer or jwt")]
    UnknownMode(String),
    /// `header:` followed by something that is not a header name.
    #[error("{0:?} is not a valid header name")]
    InvalidHeaderName(String),
    /// `header:` naming a header that carries credentials.
    #[error(
        "header {0} carries credentials and must not be stored as a principal; use bearer or jwt"
    )]
    CredentialHeader(HeaderName),
    /// `jwt` without a key, issuer and audience.
    #[error("scoping by jwt needs a key, an issuer and an audience")]
    JwtConfigMissing,
    /// A JWT configuration given with another mode, which would ignore it.
    #[error("a JWT key, issuer or audience was given, but the scope mode is {0}, not jwt")]
    JwtConfigUnused(String),
    /// The JWT issuer is empty.
    #[error("the JWT issuer must not be empty")]
    EmptyIssuer,
    /// The JWT audience is empty.
    #[error("the JWT audience must not be empty")]
    EmptyAudience,
}

/// A request refused because its principal could not be established: answer 401 with
/// [`www_authenticate`](Self::www_authenticate), and [`reason`](Self::reason) in the body.
///
/// The reason is a short fixed text, safe to send to the client: it never echoes the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Unauthorized {
    reason: &'static str,
    /// Credentials were sent but are not valid (`error="invalid_token"`), as opposed to missing.
    invalid: bool,
}

impl Unauthorized {
    fn missing(reason: &'static str) -> Self {
        Self {
            reason,
            invalid: false,
        }
    }

    fn invalid(reason: &'static str) -> Self {
        Self {
            reason,
            invalid: true,
        }
    }

    /// Why the request was refused, e.g. `token expired`. Safe to return to the client.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// True if credentials were sent but were not valid; false if they were missing.
    pub fn is_invalid_credentials(&self) -> bool {
        self.invalid
    }

    /// The `WWW-Authenticate` value to send with the 401 (RFC 6750 §3): `Bearer` when credentials
    /// are missing, `Bearer error="invalid_token", error_description="<reason>"` when they are
    /// not valid.
    pub fn www_authenticate(&self) -> HeaderValue {
        if self.invalid {
            // Reasons are fixed ASCII texts without quotes or backslashes.
            HeaderValue::from_str(&format!(
                r#"Bearer error="invalid_token", error_description="{}""#,
                self.reason
            ))
            .unwrap_or_else(|_| HeaderValue::from_static(r#"Bearer error="invalid_token""#))
        } else {
            HeaderValue::from_static("Bearer")
        }
    }
}

/// `header:` + the value of `name`.
fn header_principal(headers: &HeaderMap, name: &HeaderName) -> Result<Principal, Unauthorized> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Err(Unauthorized::missing("missing identity header"));
    };
    if values.next().is_some() {
        return Err(Unauthorized::invalid("repeated identity header"));
    }
    let value = value
        .to_str()
        .map_err(|_| Unauthorized::invalid("identity header is not visible ASCII"))?
        .trim();
    if value.is_empty() {
        return Err(Unauthorized::missing("empty identity header"));
    }
    Ok(Principal(Arc::from(format!("header:{value}"))))
}

/// The token of the request's single `Authorization: Bearer <token>` header (RFC 6750 §2.1).
fn bearer_token(headers: &HeaderMap) -> Result<&str, Unauthorized> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(Unauthorized::missing("missing bearer token"));
    };
    if values.next().is_some() {
        return Err(Unauthorized::invalid("repeated Authorization header"));
    }
    let value = value
        .to_str()
        .map_err(|_| Unauthorized::invalid("malformed Authorization header"))?
        .trim();
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Unauthorized::missing("not a bearer token"));
    }
    let token = token.trim_start_matches(' ');
    if token.is_empty() {
        return Err(Unauthorized::invalid("empty bearer token"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Unauthorized::invalid("bearer token too long"));
    }
    // b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
    let body = token.trim_end_matches('=');
    let valid = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    if !valid {
        return Err(Unauthorized::invalid("malformed bearer token"));
    }
    Ok(token)
}

/// The keys that verify JWT signatures: one PEM public key, a JWKS, or an HMAC secret.
///
/// Each key allows only the algorithms of its type: RSA `RS*`/`PS*`, EC P-256 `ES256`, EC P-384
/// `ES384`, Ed25519 `EdDSA`, HMAC secret `HS*`; a JWK's `alg` narrows that further.
#[derive(Clone)]
pub struct JwtKey {
    keys: Vec<VerifyingKey>,
}

#[derive(Clone)]
struct VerifyingKey {
    /// The JWK `kid`; `None` for a PEM key or secret, which verifies tokens with any `kid`.
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
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

/// What `jwt` scoping needs: the verifying key, the expected `iss` and `aud`, and the clock-skew
/// leeway ([`DEFAULT_LEEWAY`] unless set).
#[derive(Debug, Clone)]
pub struct JwtConfig {
    key: JwtKey,
    issuer: String,
    audience: String,
    leeway: Duration,
}

impl JwtConfig {
    /// Tokens must be signed by `key`, issued by `issuer` and meant for `audience`.
    pub fn new(key: JwtKey, issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            key,
            issuer: issuer.into(),
            audience: audience.into(),
            leeway: DEFAULT_LEEWAY,
        }
    }

    /// [`new`](Self::new) with the key read by [`JwtKey::load`] (PEM public key or JWKS).
    pub fn from_files(
        key_path: &Path,
        issuer: impl Into<String>,
        audience: impl Into<String>,
    ) -> Result<Self, JwtKeyError> {
        Ok(Self::new(JwtKey::load(key_path)?, issuer, audience))
    }

    /// Tolerance for clock skew when checking `exp` and `nbf`.
    #[must_use]
    pub fn with_leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway;
        self
    }

    /// The verifying key.
    pub fn key(&self) -> &JwtKey {
        &self.key
    }

    /// The required `iss`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The required `aud` (one of the token's audiences).
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The clock-skew tolerance.
    pub fn leeway(&self) -> Duration {
        self.leeway
    }
}

/// Validates JWT bearer tokens against a [`JwtConfig`]. Cloning is cheap.
#[derive(Clone)]
pub struct JwtValidator {
    inner: Arc<ValidatorInner>,
}

struct ValidatorInner {
    keys: Vec<ValidatingKey>,
    issuer: String,
    audience: String,
    leeway: Duration,
}

struct ValidatingKey {
    kid: Option<String>,
    key: DecodingKey,
    /// Signature, algorithm, `iss`, `aud` and the presence of `exp`, `iss`, `aud` and `sub`.
    /// `exp` and `nbf` are checked against the caller's `now` instead (jsonwebtoken would read
    /// the system clock).
    validation: Validation,
}

impl fmt::Debug for JwtValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtValidator")
            .field("keys", &self.inner.keys.len())
            .field("issuer", &self.inner.issuer)
            .field("audience", &self.inner.audience)
            .field("leeway", &self.inner.leeway)
            .finish()
    }
}

/// The JOSE header fields read before choosing a key.
#[derive(Deserialize)]
struct JoseHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// The claims read after the signature checked out. Optional here so that a missing claim is
/// reported as missing (jsonwebtoken checks presence after deserializing this).
#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    nbf: Option<f64>,
}

impl JwtValidator {
    /// A validator for `config`; refuses an empty issuer or audience.
    pub fn new(config: JwtConfig) -> Result<Self, ScopeByError> {
        if config.issuer.is_empty() {
            return Err(ScopeByError::EmptyIssuer);
        }
        if config.audience.is_empty() {
            return Err(ScopeByError::EmptyAudience);
        }
        let keys = config
            .key
            .keys
            .into_iter()
            .map(|key| {
                let mut validation = Validation {
                    algorithms: key.algorithms,
                    validate_exp: false,
                    validate_nbf: false,
                    validate_aud: true,
                    leeway: 0,
                    ..Validation::default()
                };
                validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
                validation.set_issuer(&[&config.issuer]);
                validation.set_audience(&[&config.audience]);
                ValidatingKey {
                    kid: key.kid,
                    key: key.key,
                    validation,
                }
            })
            .collect();
        Ok(Self {
            inner: Arc::new(ValidatorInner {
                keys,
                issuer: config.issuer,
                audience: config.audience,
                leeway: config.leeway,
            }),
        })
    }

    /// The principal `jwt:["<iss>","<sub>"]` of a valid `token` at `now`.
    pub fn validate(&self, token: &str, now: SystemTime) -> Result<Principal, Unauthorized> {
        let header = read_header(token)?;
        if header.crit.is_some() {
            return Err(Unauthorized::invalid("unsupported critical header"));
        }
        let alg = Algorithm::from_str(&header.alg)
            .map_err(|_| Unauthorized::invalid("algorithm not allowed"))?;

        // A key with a `kid` verifies only tokens naming it; a key without one, any token.
        let candidates: Vec<&ValidatingKey> = self
            .inner
            .keys
            .iter()
            .filter(|key| match (&key.kid, &header.kid) {
                (Some(kid), Some(wanted)) => kid == wanted,
                (Some(_), None) => self.inner.keys.len() == 1,
                (None, _) => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(Unauthorized::invalid(if header.kid.is_some() {
                "unknown key id"
            } else {
                "token has no key id"
            }));
        }
        let mut candidates = candidates
            .into_iter()
            .filter(|key| key.validation.algorithms.contains(&alg))
            .peekable();
        if candidates.peek().is_none() {
            return Err(Unauthorized::invalid("algorithm not allowed"));
        }

        let mut refusal = Unauthorized::invalid("invalid signature");
        for key in candidates {
            match jsonwebtoken::decode::<Claims>(token, &key.key, &key.validation) {
                Ok(data) => return self.check_claims(data.claims, now),
                Err(err) => {
                    use jsonwebtoken::errors::ErrorKind;
                    let key_mismatch = matches!(
                        err.kind(),
                        ErrorKind::InvalidSignature
                            | ErrorKind::InvalidEcdsaKey
                            | ErrorKind::InvalidEddsaKey
                            | ErrorKind::InvalidRsaKey(_)
                            | ErrorKind::InvalidKeyFormat
                    );
                    if !key_mismatch {
                        return Err(refusal_of(err.kind()));
                    }
                    refusal = refusal_of(err.kind());
                }
            }
        }
        Err(refusal)
    }

    fn check_claims(&self, claims: Claims, now: SystemTime) -> Result<Principal, Unauthorized> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs_f64();
        let leeway = self.inner.leeway.as_secs_f64();
        let Some(exp) = claims.exp else {
            return Err(Unauthorized::invalid("token has no exp"));
        };
        if !exp.is_finite() || now >= exp + leeway {
            return Err(Unauthorized::invalid("token expired"));
        }
        if let Some(nbf) = claims.nbf {
            if !nbf.is_finite() || now + leeway < nbf {
                return Err(Unauthorized::invalid("token not yet valid"));
            }
        }
        let Some(iss) = claims.iss else {
            return Err(Unauthorized::invalid("token has no iss"));
        };
        let sub = match claims.sub {
            Some(sub) if !sub.is_empty() => sub,
            _ => return Err(Unauthorized::invalid("token has no sub")),
        };
        let pair = serde_json::to_string(&[iss.as_str(), sub.as_str()])
            .map_err(|_| Unauthorized::invalid("malformed token"))?;
        Ok(Principal(Arc::from(format!("jwt:{pair}"))))
    }
}

/// The JOSE header of a compact JWS, read without trusting it.
fn read_header(token: &str) -> Result<JoseHeader, Unauthorized> {
    let malformed = || Unauthorized::invalid("malformed token");
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| malformed())?;
    serde_json::from_slice(&json).map_err(|_| malformed())
}

/// The client-safe reason for a jsonwebtoken error.
fn refusal_of(kind: &jsonwebtoken::errors::ErrorKind) -> Unauthorized {
    use jsonwebtoken::errors::ErrorKind;
    Unauthorized::invalid(match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => "invalid signature",
        ErrorKind::InvalidAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::UnsupportedAlgorithm => "algorithm not allowed",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "exp" => "token has no exp",
            "iss" => "token has no iss",
            "aud" => "token has no aud",
            "sub" => "token has no sub",
            _ => "token lacks a required claim",
        },
        ErrorKind::InvalidClaimFormat(_) => "malformed claim",
        ErrorKind::ExpiredSignature => "token expired",
        ErrorKind::ImmatureSignature => "token not yet valid",
        _ => "malformed token",
    })
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

    #[test]
    fn bearer_token_syntax() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, HeaderValue::from_static(value));
            bearer_token(&headers).map(str::to_owned)
        };
        assert_eq!(with("Bearer abc").unwrap(), "abc");
        assert_eq!(with("bearer  a.b-c_d~e+f/g==").unwrap(), "a.b-c_d~e+f/g==");
        assert!(!with("Basic dXNlcg==").unwrap_err().is_invalid_credentials());
        assert!(with("Bearer").unwrap_err().is_invalid_credentials());
        assert!(with("Bearer a b").unwrap_err().is_invalid_credentials());
        assert!(with("Bearer ==").unwrap_err().is_invalid_credentials());
        assert!(with("Bearer a\"b").unwrap_err().is_invalid_credentials());
    }

    #[test]
    fn www_authenticate_values() {
        assert_eq!(
            Unauthorized::missing("missing bearer token").www_authenticate(),
            "Bearer"
        );
        assert_eq!(
            Unauthorized::invalid("token expired").www_authenticate(),
            r#"Bearer error="invalid_token", error_description="token expired""#
        );
    }
}
