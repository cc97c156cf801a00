//! `--scope-by` and the JWT options: whose records an HTTP request may see.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::http::principal::{JwtConfig, JwtKey};
use mcp_idempotency::http::ScopeBy;

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
        ScopeBy::parse(&self.scope_by, jwt)
            .with_context(|| format!("invalid --scope-by {:?}", self.scope_by))
    }
}
