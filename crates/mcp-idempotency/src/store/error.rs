use std::error::Error as StdError;

/// Why a store operation failed.
///
/// Any failure of a claim is answered with `idempotency_store_unavailable` and the tool is not run:
/// the engine fails closed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store URL could not be understood.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given, with any password replaced by `***`
        /// ([`redact_password`](super::redact_password)).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store could not be reached or opened.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },
    /// The store answered with an error.
    #[error("store error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },
    /// A stored record could not be decoded.
    #[error("store holds a record it cannot decode: {0}")]
    Corrupt(#[from] crate::record::CorruptRecord),
}

impl StoreError {
    /// Whether the store could not be reached (as opposed to answering with an error).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the failed operation may have been applied all the same: its answer may have been
    /// lost after the store acted on it (a timeout, a connection reset after sending), or the
    /// store may have acted before failing. Only errors raised before anything was sent (an
    /// invalid URL) or after the store answered (a record that cannot be decoded) rule it out.
    pub fn may_have_applied(&self) -> bool {
        !matches!(self, Self::InvalidUrl { .. } | Self::Corrupt(_))
    }

    #[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
    pub(crate) fn unavailable(
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    #[cfg_attr(not(any(feature = "sqlite", feature = "redis")), allow(dead_code))]
    pub(crate) fn backend(
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}
