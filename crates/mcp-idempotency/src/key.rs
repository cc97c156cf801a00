//! `idempotencyKey` validation.
//!
//! The SEP says the key is an opaque, client-generated string. We accept any JSON string that is
//! non-empty, at most [`EngineConfig::DEFAULT_MAX_KEY_BYTES`](crate::EngineConfig::DEFAULT_MAX_KEY_BYTES) bytes of UTF-8 (configurable) and free of control
//! characters (Unicode category Cc: U+0000..U+001F and U+007F..U+009F), which would make logs and
//! store keys ambiguous. Anything else is refused before the tool runs.

use std::fmt;

use serde_json::Value;

/// Default upper bound on a key's length in bytes, as Stripe and the IETF draft use.
pub(crate) const DEFAULT_MAX_KEY_BYTES: usize = 255;

/// A validated `idempotencyKey`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Box<str>);

/// Why an `idempotencyKey` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value is a number, boolean, null, object or array.
    #[error("idempotencyKey must be a string, got {found}")]
    NotAString {
        /// The JSON type that was sent: `number`, `boolean`, `null`, `object` or `array`.
        found: &'static str,
    },
    /// The string is empty.
    #[error("idempotencyKey must not be empty")]
    Empty,
    /// The string is longer than the configured limit.
    #[error("idempotencyKey is {len} bytes long, more than the limit of {max} bytes")]
    TooLong {
        /// Length of the key in bytes of UTF-8.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// The string contains a control character.
    #[error("idempotencyKey contains a control character (U+{code_point:04X}) at byte {offset}")]
    ControlCharacter {
        /// Byte offset of the character in the key.
        offset: usize,
        /// The offending character's code point.
        code_point: u32,
    },
}

impl IdempotencyKey {
    /// Validates the raw `params.idempotencyKey` value.
    pub fn from_json(value: &Value, max_bytes: usize) -> Result<Self, KeyError> {
        match value {
            Value::String(s) => Self::new(s, max_bytes),
            other => Err(KeyError::NotAString {
                found: json_type_name(other),
            }),
        }
    }

    /// Validates a key given as a string.
    pub fn new(key: &str, max_bytes: usize) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > max_bytes {
            return Err(KeyError::TooLong {
                len: key.len(),
                max: max_bytes,
            });
        }
        if let Some((offset, c)) = key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(KeyError::ControlCharacter {
                offset,
                code_point: u32::from(c),
            });
        }
        Ok(Self(key.into()))
    }

    /// The key as the store holds it: the client's key for a SEP key, or a key of the derived
    /// key space ([`KeySource`] prefix) for the other sources.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of `source` for a call of `tool`, from `value` (the client's key for
    /// [`KeySource::Sep`] and [`KeySource::Meta`], already validated; the identifier's digest,
    /// the argument's value or the call's fingerprint for the others).
    ///
    /// Every key but a SEP key begins with U+001F and its source's name, a character a client's
    /// key can never hold (control characters are refused), so no client key names a derived
    /// record. A derived key longer than `max_bytes` is hashed, not refused.
    pub(crate) fn derived(source: KeySource, tool: &str, value: &str, max_bytes: usize) -> Self {
        let rest = match source {
            KeySource::Sep => return Self(value.into()),
            KeySource::Meta => value.to_owned(),
            KeySource::KeyFrom | KeySource::Argument | KeySource::Window => {
                format!("{tool}:{value}")
            }
        };
        let rest = if rest.len() > max_bytes {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(rest.as_bytes());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            format!("sha256:{hex}")
        } else {
            rest
        };
        Self(format!("{DERIVED}{}:{rest}", source.as_str()).into())
    }

    /// Where the key came from, read off the key itself.
    pub fn source(&self) -> KeySource {
        self.0
            .strip_prefix(DERIVED)
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(source, _)| source.parse().ok())
            .unwrap_or(KeySource::Sep)
    }

    /// The key as the tool sees it in `_meta["mcp-idem/idempotencyKey"]` and as error data names
    /// it: the client's key for a SEP or `_meta` key, `TOOL:VALUE` (or `sha256:HEX`) for the
    /// others; never the store's prefix.
    pub fn for_tool(&self) -> &str {
        match self
            .0
            .strip_prefix(DERIVED)
            .and_then(|rest| rest.split_once(':'))
        {
            Some((_, rest)) => rest,
            None => &self.0,
        }
    }
}

/// The first character of every key that is not a SEP key: U+001F, the unit separator.
const DERIVED: char = '\u{1F}';

/// Where the key that decides a call came from, in the order they are tried: a business
/// identifier (`key-from`), the SEP's `params.idempotencyKey`, a `_meta` carrier, a tool argument
/// (`key-argument`), a duplicate window. Label of the metrics and of `inspect`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeySource {
    /// The tool's business identifier: JSON Pointers into the arguments (`key-from`).
    KeyFrom,
    /// The SEP's `params.idempotencyKey`.
    #[default]
    Sep,
    /// A `_meta` carrier: `params._meta.idempotencyKey` or another configured name.
    Meta,
    /// A tool argument that carries a key (`key-argument`).
    Argument,
    /// A duplicate window: the tool's name and arguments are the key (`window`).
    Window,
}

impl KeySource {
    /// Every source, in the order they are tried.
    pub const ALL: [Self; 5] = [
        Self::KeyFrom,
        Self::Sep,
        Self::Meta,
        Self::Argument,
        Self::Window,
    ];

    /// `key-from`, `sep`, `meta`, `argument` or `window`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KeyFrom => "key-from",
            Self::Sep => "sep",
            Self::Meta => "meta",
            Self::Argument => "argument",
            Self::Window => "window",
        }
    }

    /// Whether the client sent this key as a key (SEP, `_meta`): its replays stay byte for byte,
    /// and its error outcomes are always replayed, as the SEP says.
    pub fn is_client_key(self) -> bool {
        matches!(self, Self::Sep | Self::Meta)
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KeySource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|source| source.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown key source {s:?}; expected key-from, sep, meta, argument or window"
                )
            })
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The JSON type name of a value, as used in error messages.
pub(crate) fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MAX: usize = DEFAULT_MAX_KEY_BYTES;

    #[test]
    fn accepts_ordinary_keys() {
        for key in [
            "b3b6c1e4-6b8b-4f1a-9c1e-2a6e6b1d9f2a",
            "x",
            "clé 🔑",
            "a b/c:d",
        ] {
            assert_eq!(
                IdempotencyKey::from_json(&json!(key), MAX)
                    .unwrap()
                    .as_str(),
                key
            );
        }
    }

    #[test]
    fn refuses_non_strings_naming_the_type() {
        let cases = [
            (json!(42), "number"),
            (json!(null), "null"),
            (json!(true), "boolean"),
            (json!({"k": 1}), "object"),
            (json!(["k"]), "array"),
        ];
        for (value, found) in cases {
            let err = IdempotencyKey::from_json(&value, MAX).unwrap_err();
            assert_eq!(err, KeyError::NotAString { found });
            assert!(err.to_string().contains(found));
        }
    }

    #[test]
    fn refuses_empty_and_oversized() {
        assert_eq!(IdempotencyKey::new("", MAX), Err(KeyError::Empty));
        assert!(IdempotencyKey::new(&"k".repeat(255), MAX).is_ok());
        assert_eq!(
            IdempotencyKey::new(&"k".repeat(256), MAX),
            Err(KeyError::TooLong { len: 256, max: 255 })
        );
        // The limit is in bytes, not characters.
        assert_eq!(
            IdempotencyKey::new("é", 1),
            Err(KeyError::TooLong { len: 2, max: 1 })
        );
        assert!(IdempotencyKey::new(&"k".repeat(1000), 1000).is_ok());
    }

    #[test]
    fn refuses_control_characters() {
        assert_eq!(
            IdempotencyKey::new("ab\ncd", MAX),
            Err(KeyError::ControlCharacter {
                offset: 2,
                code_point: 0x0A
            })
        );
        for bad in ["\u{0}", "x\u{7f}", "\u{85}y", "\t"] {
            assert!(matches!(
                IdempotencyKey::new(bad, MAX),
                Err(KeyError::ControlCharacter { .. })
            ));
        }
    }
}
