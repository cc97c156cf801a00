//! Request fingerprints: SEP-3182 argument equivalence reduced to a 32-byte digest.
//!
//! SEP-3182 says two `tools/call` requests carrying the same `idempotencyKey` are
//! equivalent when they name the same tool and their arguments are equal *as parsed
//! JSON values*. [`fingerprint`] parses the raw `params.arguments` text with its own
//! strict RFC 8259 parser, writes a canonical byte encoding of the parsed value and
//! hashes it with SHA-256, so two calls get the same [`Fingerprint`] exactly when
//! they are equivalent.
//!
//! # Equivalence rules
//!
//! * Absent arguments, `null` and `{}` are all the same value.
//! * Whitespace and the order of object members do not matter.
//! * Duplicate member names: the **last** occurrence wins, as with `serde_json` and
//!   Python's `json` module, so `{"x":1,"x":2}` is equivalent to `{"x":2}`.
//!   (SEP-3182 defers this case to the server's JSON parser; clients should not send
//!   duplicate names.)
//! * Strings are compared after unescaping (`"\u00e9"` equals `"é"`, `"\/"` equals
//!   `"/"`, a surrogate-pair escape equals the astral character it encodes) and
//!   without any Unicode normalisation. Lone surrogate escapes, invalid escapes and
//!   raw control characters are rejected as malformed.
//! * Numbers are compared as exact decimals, never through `f64`: each number is
//!   reduced to a sign, its significant digits and a decimal exponent. Hence
//!   `1`, `1.0`, `1E0`, `10e-1` and `0.1e1` are equal, every spelling of zero
//!   (including `-0`) is equal, but `9007199254740993` and `9007199254740992`
//!   differ. The exponent is kept as an integer, so `1e999999999` costs no memory.
//! * `true`, `false` and `null` are distinct from each other and from every number
//!   and string.
//! * The top-level value may be of any JSON type; checking that arguments form an
//!   object is left to the caller.
//!
//! The grammar is strict RFC 8259: numbers match
//! `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` (so `01`, `1.`, `.5`, `+1`, `NaN`
//! and `Infinity` are malformed), only space, tab, CR and LF count as whitespace, and
//! nothing but whitespace may follow the value. Empty input is malformed.
//!
//! # Limits
//!
//! * Arrays and objects may nest at most [`MAX_DEPTH`] levels; deeper input is
//!   refused with [`ArgumentsError::TooDeep`] as soon as the limit is crossed.
//! * A number whose written exponent has more than 18 digits once leading zeros are
//!   dropped (|exponent| ≥ 10^18) is refused with [`ArgumentsError::NumberOutOfRange`],
//!   even when its value is zero: a clear error is preferred to an equivalence
//!   decision about a value that cannot be represented exactly. Any number of
//!   significant digits is accepted.
//!
//! # Cost
//!
//! Time is linear in the input: the canonical form is produced in one pass. An object
//! whose members are out of order is rewritten in place when it takes at most 4 KiB,
//! as long as the bytes so rewritten stay within twice the size of the output, so
//! copying stays linear however deep the nesting; other objects are put in order
//! without rewriting, while hashing. Objects that repeat the key sequence of their
//! previous sibling at the same depth (rows of an array) reuse its sorted order.
//! Buffers are reused per thread; up to 8 MiB of them is kept between calls.
//!
//! # Canonical encoding
//!
//! The digest is SHA-256 over `b"mcp-idem-fp-v1\0"`, the tool name encoded as a
//! string (see below), and the canonical encoding of the arguments:
//!
//! | value   | encoding |
//! |---------|----------|
//! | `null`  | `n` |
//! | `true`  | `t` |
//! | `false` | `f` |
//! | number  | `-` if negative, the significant digits (no leading or trailing zeros), then `e` and the exponent in decimal unless it is zero, then `;`; the value is ±digits × 10^exponent and zero is always `0;` |
//! | string  | `s`, byte length as minimal unsigned LEB128, UTF-8 bytes of the unescaped string |
//! | array   | `[`, the elements, `]` |
//! | object  | `{`, for each member in ascending byte order of its unescaped name (which is also code point order): the name encoded as a string, then the value; then `}` |
//!
//! Every encoding is self-delimiting, so the concatenation is unambiguous.
//!
//! # Example
//!
//! ```
//! use mcp_idempotency::fingerprint::fingerprint;
//!
//! let a = fingerprint("transfer", Some(r#"{"amount": 1.50, "to": "ACME"}"#)).unwrap();
//! let b = fingerprint("transfer", Some(r#"{"to":"\u0041CME","amount":15e-1}"#)).unwrap();
//! assert_eq!(a, b);
//!
//! let c = fingerprint("transfer", Some(r#"{"amount": 1.51, "to": "ACME"}"#)).unwrap();
//! assert_ne!(a, c);
//! assert_eq!(fingerprint("ping", None).unwrap(), fingerprint("ping", Some("{}")).unwrap());
//! ```

use std::cell::RefCell;
use std::fmt;

mod bytes;
mod number;
mod order;
mod parser;
#[cfg(test)]
mod tests;

/// SHA-256 over a canonical encoding of (tool name, arguments). Equal iff the two calls are equivalent under SEP-3182.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Wraps a digest, for example one read back from a record store.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw 32-byte digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest as 64 lowercase hexadecimal characters.
    pub fn to_hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for &b in &self.0 {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
        s
    }

    /// Parses 64 hexadecimal characters (either case); `None` for anything else.
    pub fn from_hex(s: &str) -> Option<Self> {
        fn nibble(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                b'A'..=b'F' => Some(c - b'A' + 10),
                _ => None,
            }
        }
        let s = s.as_bytes();
        if s.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(s.chunks_exact(2)) {
            *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Some(Self(bytes))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({}…)", &self.to_hex()[..12])
    }
}

/// Maximum nesting depth of arrays/objects accepted (serde_json's own default recursion limit is 128).
///
/// A value nested in exactly `MAX_DEPTH` arrays or objects is accepted; one more
/// level is [`ArgumentsError::TooDeep`].
pub const MAX_DEPTH: usize = 128;

/// Why a call's arguments could not be fingerprinted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentsError {
    /// The text is not a single valid JSON value; `offset` is the byte where parsing failed.
    #[error("arguments are not valid JSON at byte {offset}: {reason}")]
    Malformed {
        /// Byte offset into the arguments text.
        offset: usize,
        /// Short description of what was expected or found.
        reason: &'static str,
    },
    /// Arrays and objects nest more than [`MAX_DEPTH`] levels deep.
    #[error("arguments nest deeper than {max} levels")]
    TooDeep {
        /// The nesting limit that was exceeded.
        max: usize,
    },
    /// A number's exponent part has 19 or more significant digits.
    #[error("number at byte {offset} has an exponent outside the supported range")]
    NumberOutOfRange {
        /// Byte offset of the start of the number.
        offset: usize,
    },
}

/// [`ArgumentsError::Malformed`] at `offset`.
fn malformed(offset: usize, reason: &'static str) -> ArgumentsError {
    ArgumentsError::Malformed { offset, reason }
}

const DOMAIN_TAG: &[u8] = b"mcp-idem-fp-v1\0";

/// Most heap memory the per-thread buffers keep between calls.
const RETAINED_BYTES: usize = 8 << 20;

thread_local! {
    static BUFFERS: RefCell<parser::Buffers> = const { RefCell::new(parser::Buffers::new()) };
}

/// Fingerprints a `tools/call` request.
///
/// `arguments` is the raw JSON text of `params.arguments` (None when absent). Absent and `null` are both equivalent to `{}`.
///
/// # Errors
///
/// Returns [`ArgumentsError`] when `arguments` is not valid JSON, nests deeper than
/// [`MAX_DEPTH`], or contains a number with an exponent of 10^18 or more in magnitude.
pub fn fingerprint(
    tool_name: &str,
    arguments: Option<&str>,
) -> Result<Fingerprint, ArgumentsError> {
    let run = |bufs: &mut parser::Buffers| {
        let digest = parser::hash(bufs, tool_name, arguments);
        bufs.trim(RETAINED_BYTES);
        digest.map(Fingerprint)
    };
    BUFFERS
        .try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut bufs) => run(&mut bufs),
            Err(_) => run(&mut parser::Buffers::new()),
        })
        .unwrap_or_else(|_| run(&mut parser::Buffers::new()))
}
