//! Scope selection: which [`ScopeBy`] mode finds a request's principal, and how a mode is named.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use http::header::{HeaderMap, HeaderName, AUTHORIZATION};
use sha2::{Digest, Sha256};

use super::identity::{Principal, Unauthorized};
use super::jwt::{JwtConfig, JwtValidator};

/// Longest bearer token accepted, in bytes.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// How the principal of an HTTP request is found. See the [module docs](super).
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

    /// `jwt`, validating with `config`; refuses an empty issuer or audience.
    pub fn jwt(config: JwtConfig) -> Result<Self, ScopeByError> {
        if config.issuer().is_empty() {
            return Err(ScopeByError::EmptyIssuer);
        }
        if config.audience().is_empty() {
            return Err(ScopeByError::EmptyAudience);
        }
        Ok(Self::Jwt(JwtValidator::new(config)))
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
            Self::None => Ok(Principal::new("none")),
            Self::Header(name) => header_principal(headers, name),
            Self::Bearer => {
                let token = bearer_token(headers)?;
                let digest = Sha256::digest(token.as_bytes());
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                Ok(Principal::new(format!("bearer:{hex}")))
            }
            Self::Jwt(validator) => validator.validate(bearer_token(headers)?, now),
        }
    }
}

impl fmt::Display for ScopeBy {
    /// The mode's name: `none`, `header:NAME`, `bearer` or `jwt`, as [`FromStr`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Bearer => f.write_str("bearer"),
            Self::Jwt(_) => f.write_str("jwt"),
        }
    }
}

impl FromStr for ScopeBy {
    type Err = ScopeByError;

    /// Reads a mode by its name, the inverse of [`Display`](fmt::Display): `none`, `bearer` or
    /// `header:NAME` (see [`header`](Self::header)). `jwt` is refused with
    /// [`ScopeByError::JwtConfigMissing`]: it needs a key, an issuer and an audience, which
    /// [`ScopeBy::jwt`] takes.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "bearer" => Ok(Self::Bearer),
            "jwt" => Err(ScopeByError::JwtConfigMissing),
            other => match other.strip_prefix("header:") {
                Some(name) => Self::header(name),
                None => Err(ScopeByError::UnknownMode(other.to_owned())),
            },
        }
    }
}

/// Why a scope mode or its JWT configuration was refused.
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
    /// The JWT issuer is empty.
    #[error("the JWT issuer must not be empty")]
    EmptyIssuer,
    /// The JWT audience is empty.
    #[error("the JWT audience must not be empty")]
    EmptyAudience,
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
    Ok(Principal::new(format!("header:{value}")))
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

#[cfg(test)]
mod tests {
    use http::header::HeaderValue;

    use super::*;

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
}
