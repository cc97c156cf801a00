//! `--scope-by` and the JWT options: whose records an HTTP request may see.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::http::principal::ScopeBy;
use mcp_idempotency::http::principal::{JwtConfig, JwtKey};

/// The authorization boundary records are scoped to.
#[derive(Debug, Args)]
pub(crate) struct ScopeArgs {
    /// Whose records a request sees: `none` (one tenant), `header:NAME` (set by a trusted auth
    /// proxy in front), `bearer` (a hash of the bearer token) or `jwt` (issuer + subject of a
    /// validated JWT; needs --jwt-key or --jwt-hmac-secret, --jwt-issuer and --jwt-audience).
    #[arg(
        long,
        env = "MCP_IDEM_SCOPE_BY",
        default_value = "none",
        value_name = "MODE"
    )]
    scope_by: String,

    /// PEM public key (RSA, EC, Ed25519) or JWKS file that signs the JWTs.
    #[arg(
        long,
        env = "MCP_IDEM_JWT_KEY",
        value_name = "FILE",
        conflicts_with = "jwt_hmac_secret"
    )]
    jwt_key: Option<PathBuf>,

    /// File holding the HMAC secret that signs the JWTs (HS256/384/512).
    #[arg(long, env = "MCP_IDEM_JWT_HMAC_SECRET", value_name = "FILE")]
    jwt_hmac_secret: Option<PathBuf>,

    /// Required `iss` of the JWTs.
    #[arg(long, env = "MCP_IDEM_JWT_ISSUER")]
    jwt_issuer: Option<String>,

    /// Required `aud` of the JWTs.
    #[arg(long, env = "MCP_IDEM_JWT_AUDIENCE")]
    jwt_audience: Option<String>,

    /// Clock skew tolerated when checking `exp` and `nbf`.
    #[arg(long, env = "MCP_IDEM_JWT_LEEWAY", value_parser = humantime::parse_duration)]
    jwt_leeway: Option<Duration>,
}

impl ScopeArgs {
    pub(crate) fn scope_by(&self) -> anyhow::Result<ScopeBy> {
        let key = match (&self.jwt_key, &self.jwt_hmac_secret) {
            (Some(path), _) => Some(JwtKey::load(path).context("cannot load --jwt-key")?),
            (None, Some(path)) => {
                Some(JwtKey::load_hmac_secret(path).context("cannot load --jwt-hmac-secret")?)
            }
            (None, None) => None,
        };
        let jwt = match (key, &self.jwt_issuer, &self.jwt_audience) {
            (Some(key), Some(issuer), Some(audience)) => {
                let config = JwtConfig::new(key, issuer, audience);
                Some(match self.jwt_leeway {
                    Some(leeway) => config.with_leeway(leeway),
                    None => config,
                })
            }
            (None, None, None) => None,
            _ => anyhow::bail!(
                "--scope-by jwt needs a key (--jwt-key or --jwt-hmac-secret), --jwt-issuer and --jwt-audience"
            ),
        };
        scope_by(&self.scope_by, jwt)
            .with_context(|| format!("invalid --scope-by {:?}", self.scope_by))
    }
}

/// The `--scope-by` value `text` (surrounding whitespace ignored): `none`, `header:NAME`, `bearer`,
/// or `jwt` with `jwt`, the configuration from the JWT options. The other modes refuse one, since a
/// JWT configuration they would ignore is a mistake.
fn scope_by(text: &str, jwt: Option<JwtConfig>) -> anyhow::Result<ScopeBy> {
    let text = text.trim();
    match jwt {
        Some(config) if text == "jwt" => Ok(ScopeBy::jwt(config)?),
        Some(_) => {
            let scope_by: ScopeBy = text.parse()?;
            anyhow::bail!(
                "a JWT key, issuer or audience was given, but the scope mode is {scope_by}, not jwt"
            )
        }
        None => Ok(text.parse()?),
    }
}

#[cfg(test)]
mod tests {
    use mcp_idempotency::http::principal::{JwtConfig, JwtKey, ScopeByError};

    use super::*;

    fn config() -> JwtConfig {
        let key = JwtKey::hmac_secret(&[7; 32]).unwrap();
        JwtConfig::new(key, "https://issuer.example", "mcp-gateway")
    }

    #[test]
    fn jwt_options_are_refused_with_another_mode() {
        let refused = scope_by("bearer", Some(config())).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "a JWT key, issuer or audience was given, but the scope mode is bearer, not jwt"
        );
        let refused = scope_by("header:X-User", Some(config())).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("the scope mode is header:x-user, not jwt"),
            "{refused}"
        );
        // A mode that is wrong by itself is reported as such, not as an unused configuration.
        let refused = scope_by("tenant", Some(config())).unwrap_err();
        assert!(matches!(
            refused.downcast_ref(),
            Some(ScopeByError::UnknownMode(_))
        ));
    }

    #[test]
    fn modes_are_read_with_their_configuration() {
        assert_eq!(scope_by(" bearer ", None).unwrap().to_string(), "bearer");
        assert_eq!(scope_by("jwt", Some(config())).unwrap().to_string(), "jwt");
        assert!(matches!(
            scope_by("jwt", None).unwrap_err().downcast_ref(),
            Some(ScopeByError::JwtConfigMissing)
        ));
        let no_issuer = JwtConfig::new(config().key().clone(), "", "mcp-gateway");
        assert!(matches!(
            scope_by("jwt", Some(no_issuer)).unwrap_err().downcast_ref(),
            Some(ScopeByError::EmptyIssuer)
        ));
    }
}
