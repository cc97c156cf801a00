//! `idempotencyKey` validation.
//!
//! The SEP says the key is an opaque, client-generated string. We accept any JSON string that is
//! non-empty, at most [`EngineConfig::DEFAULT_MAX_KEY_BYTES`](crate::EngineConfig::DEFAULT_MAX_KEY_BYTES) bytes of UTF-8 (configurable) and free of control
//! characters (Unicode category Cc: U+0000..U+001F and U+007F..U+009F), which would make logs and
//! store keys ambiguous. Anything else is refused before the tool runs.

use std::fmt;

use serde_json::Value;

use crate::policy::{KeySource, DERIVED};
use crate::raw_object::json_type_name;

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
        if source.stored_prefix().is_empty() {
            return Self(value.into());
        }
        let rest = if source.per_tool() {
            format!("{tool}:{value}")
        } else {
            value.to_owned()
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

    /// A key as a store holds it, read back: a client's key (as [`IdempotencyKey::new`] accepts
    /// it, of any length) or a key of the derived key space (U+001F, the name of a source other
    /// than the SEP, `:`, and the rest as the engine wrote it). Anything else is refused, so a
    /// store that reads a key it could not have written reports a corrupt record.
    pub(crate) fn from_stored(key: &str) -> Result<Self, KeyError> {
        let derived = key
            .strip_prefix(DERIVED)
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(source, rest)| source.parse::<KeySource>().ok().zip(Some(rest)));
        match derived {
            Some((source, rest)) if !source.stored_prefix().is_empty() && !rest.is_empty() => {
                Ok(Self(key.into()))
            }
            _ => Self::new(key, usize::MAX),
        }
    }

    /// The key's digest, the one name under which telemetry shows a key (keys may be secrets:
    /// spans never carry the key itself) and `mcp-idem inspect` shows and finds it: the first 16
    /// bytes of the SHA-256 of the key as the store holds it ([`as_str`](Self::as_str)), as 32
    /// lowercase hex digits.
    ///
    /// ```
    /// use mcp_idempotency::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::new("order-42", 255).unwrap();
    /// assert_eq!(key.digest(), "3bf8b157c4238eefe5ae4a66eca81c6b");
    /// ```
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.0.as_bytes());
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
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
    fn stored_keys_read_back_as_written_and_nothing_else() {
        for &source in KeySource::ALL {
            for value in ["ord_1", "k:with:colons", "é 🔑"] {
                let key = IdempotencyKey::derived(source, "charge", value, MAX);
                let read = IdempotencyKey::from_stored(key.as_str()).unwrap();
                assert_eq!(read, key);
                assert_eq!(read.source(), source);
                assert_eq!(source.stored_key(read.for_tool()), key.as_str());
            }
        }
        // A tool name is not validated as a key is: whatever the engine wrote reads back.
        let odd = IdempotencyKey::derived(KeySource::Window, "a\tb", "00", MAX);
        assert!(IdempotencyKey::from_stored(odd.as_str()).is_ok());
        for bad in [
            "\u{1F}",
            "\u{1F}sep:k",
            "\u{1F}nope:k",
            "\u{1F}meta:",
            "\u{1F}window",
            "k\u{1F}",
            "",
        ] {
            assert!(IdempotencyKey::from_stored(bad).is_err(), "{bad:?}");
        }
        assert_eq!(KeySource::Sep.stored_key("k"), "k");
        assert_eq!(KeySource::Meta.stored_key("k"), "\u{1F}meta:k");
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
