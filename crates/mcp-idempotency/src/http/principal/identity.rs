//! The two answers to "who is calling": a [`Principal`], or a request [`Unauthorized`] to have one.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderValue;

/// The caller's identity within a namespace: the principal of a [`Scope`](crate::Scope).
///
/// Its text starts with the mode that produced it (`none`, `header:`, `bearer:`, `jwt:`), so
/// principals of different modes never collide. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal(Arc<str>);

impl Principal {
    /// A principal with this text, which starts with the mode that found it.
    pub(super) fn new(text: impl Into<Arc<str>>) -> Self {
        Self(text.into())
    }

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
    pub(super) fn missing(reason: &'static str) -> Self {
        Self {
            reason,
            invalid: false,
        }
    }

    pub(super) fn invalid(reason: &'static str) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

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
