//! Validating JWT bearer tokens: signature, algorithm, `iss`, `aud`, `exp` and `nbf`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::identity::{Principal, Unauthorized};
use super::key::{JwtKey, JwtKeyError};

/// Default tolerance for clock skew when checking a JWT's `exp` and `nbf`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

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
    /// A validator for `config`, whose issuer and audience [`ScopeBy::jwt`](super::ScopeBy::jwt)
    /// has checked are not empty.
    pub(super) fn new(config: JwtConfig) -> Self {
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
        Self {
            inner: Arc::new(ValidatorInner {
                keys,
                issuer: config.issuer,
                audience: config.audience,
                leeway: config.leeway,
            }),
        }
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
        Ok(Principal::new(format!("jwt:{pair}")))
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
