//! TEMPORARY STUB (replaced by the real exact-decimal fingerprint).
use sha2::{Digest, Sha256};
use std::fmt;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);
impl Fingerprint {
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }
}
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..12])
    }
}
pub const MAX_DEPTH: usize = 128;
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentsError {
    #[error("arguments are not valid JSON at byte {offset}: {reason}")]
    Malformed { offset: usize, reason: &'static str },
    #[error("arguments nest deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("number at byte {offset} has an exponent outside the supported range")]
    NumberOutOfRange { offset: usize },
}
pub fn fingerprint(
    tool_name: &str,
    arguments: Option<&str>,
) -> Result<Fingerprint, ArgumentsError> {
    let v: serde_json::Value = match arguments {
        None => serde_json::json!({}),
        Some(a) => serde_json::from_str(a).map_err(|_| ArgumentsError::Malformed {
            offset: 0,
            reason: "bad",
        })?,
    };
    let v = if v.is_null() {
        serde_json::json!({})
    } else {
        v
    };
    let mut h = Sha256::new();
    h.update(tool_name.len().to_le_bytes());
    h.update(tool_name.as_bytes());
    h.update(v.to_string().as_bytes());
    Ok(Fingerprint(h.finalize().into()))
}
