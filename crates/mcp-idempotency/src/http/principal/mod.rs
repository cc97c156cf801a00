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
//! The parts, each depending only on those above it: `identity` (the two answers, [`Principal`]
//! and [`Unauthorized`]), `key` (loading a [`JwtKey`]), `jwt` (validating a token with a
//! [`JwtConfig`]) and `scope` ([`ScopeBy`]: which mode finds the principal, and how it is spelt).
//!
//! # Example
//!
//! ```
//! use std::time::SystemTime;
//!
//! use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
//! use mcp_idempotency::http::principal::ScopeBy;
//!
//! let scope_by: ScopeBy = "bearer".parse().unwrap();
//! let mut headers = HeaderMap::new();
//! let refused = scope_by.principal(&headers, SystemTime::now()).unwrap_err();
//! assert_eq!(refused.www_authenticate(), "Bearer");
//!
//! headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer opaque-token-1"));
//! let principal = scope_by.principal(&headers, SystemTime::now()).unwrap();
//! assert!(principal.as_str().starts_with("bearer:"));
//! assert!(!principal.as_str().contains("opaque-token-1"));
//! ```

mod identity;
mod jwt;
mod key;
mod scope;

pub use identity::{Principal, Unauthorized};
pub use jwt::{JwtConfig, JwtValidator, DEFAULT_LEEWAY};
pub use key::{JwtKey, JwtKeyError};
pub use scope::{ScopeBy, ScopeByError};
