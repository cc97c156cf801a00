//! The names of a store's keys: every key starts with the store's hash tag, and the parts of a
//! record's name (namespace, principal, key) are percent-encoded so that two records never share a
//! Redis key.

use crate::key::IdempotencyKey;
use crate::record::{CorruptRecord, RecordId, Scope};

/// The names of one store's keys.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    /// `{PREFIX}:`, the start of every key.
    pub(super) tag: String,
    /// Every record, scored by `expires_at`.
    pub(super) all: String,
    /// Records in progress, scored by `expires_at`.
    pub(super) running: String,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Self {
        let tag = format!("{{{prefix}}}:");
        Self {
            all: format!("{tag}all"),
            running: format!("{tag}run"),
            tag,
        }
    }

    /// `NS:PRINCIPAL:KEY`, each part encoded: how the indexes name a record.
    pub(super) fn member(id: &RecordId) -> String {
        let mut member = Self::scope_part(&id.scope);
        member.push(':');
        encode_into(&mut member, id.key.as_str());
        member
    }

    fn scope_part(scope: &Scope) -> String {
        let mut part = String::new();
        encode_into(&mut part, scope.namespace());
        part.push(':');
        encode_into(&mut part, scope.principal());
        part
    }

    /// The key of the hash holding the record `member` names.
    pub(super) fn record(&self, member: &str) -> String {
        format!("{}r:{member}", self.tag)
    }

    /// The key of `scope`'s index.
    pub(super) fn scope(&self, scope: &Scope) -> String {
        format!("{}s:{}", self.tag, Self::scope_part(scope))
    }
}

/// Appends `part` percent-encoded: `%`, `:`, braces, spaces and control characters become `%XX`
/// (per UTF-8 byte), everything else is kept. The encoding is injective and never contains `:`.
fn encode_into(out: &mut String, part: &str) {
    for ch in part.chars() {
        if matches!(ch, '%' | ':' | '{' | '}') || ch.is_whitespace() || ch.is_control() {
            let mut buf = [0; 4];
            for byte in ch.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(ch);
        }
    }
}

/// Reverses [`encode_into`]; `None` if `part` is not something it wrote.
fn decode_part(part: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The record an index member names (`NS:PRINCIPAL:KEY`, each part encoded).
pub(super) fn member_id(member: &[u8]) -> Result<RecordId, CorruptRecord> {
    let corrupt = || {
        CorruptRecord(format!(
            "Redis index member {:?}",
            String::from_utf8_lossy(member)
        ))
    };
    let member = std::str::from_utf8(member).map_err(|_| corrupt())?;
    let mut parts = member.split(':').map(decode_part);
    let (Some(Some(namespace)), Some(Some(principal)), Some(Some(key)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(corrupt());
    };
    let key = IdempotencyKey::new(&key, usize::MAX).map_err(|_| corrupt())?;
    Ok(RecordId {
        scope: Scope::new(namespace, principal),
        key,
    })
}

/// `=` and the encoded `part`, or `` for no condition: how the list script takes its filters.
pub(super) fn wanted_part(part: Option<&str>) -> String {
    match part {
        Some(part) => {
            let mut wanted = String::from("=");
            encode_into(&mut wanted, part);
            wanted
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(namespace: &str, principal: &str, key: &str) -> RecordId {
        RecordId {
            scope: Scope::new(namespace, principal),
            key: IdempotencyKey::new(key, 255).unwrap(),
        }
    }

    /// CRC16-CCITT (XMODEM), as Redis Cluster uses it.
    fn crc16(data: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &byte in data {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    /// The Redis Cluster slot of `key`, honouring `{hash tags}`.
    fn slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &rest[..len])
        });
        crc16(tagged.unwrap_or(bytes)) % 16384
    }

    #[test]
    fn slot_matches_the_cluster_specification() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn every_key_of_a_store_shares_one_slot() {
        let keys = Keys::new("mcp-idem");
        let expected = slot("{mcp-idem}");
        for id in [
            id("ns", "alice", "k"),
            id("{ns}", "}{", "{key}"),
            id("n:s", "p{x}", "ключ 🔑"),
            id("", "", "}"),
        ] {
            let member = Keys::member(&id);
            for key in [
                keys.record(&member),
                keys.scope(&id.scope),
                keys.all.clone(),
                keys.running.clone(),
            ] {
                assert!(key.starts_with("{mcp-idem}:"), "{key}");
                assert_eq!(slot(&key), expected, "{key}");
            }
        }
    }

    #[test]
    fn encoding_keeps_different_records_apart() {
        let ids = [
            id("a:b", "c", "k"),
            id("a", "b:c", "k"),
            id("a", "b", "c:k"),
            id("a%3Ab", "c", "k"),
            id("a", "b", "k "),
            id("a", "b", "k"),
            id("a", "b", "K"),
        ];
        let members: std::collections::HashSet<_> = ids.iter().map(Keys::member).collect();
        assert_eq!(members.len(), ids.len());
        for member in &members {
            assert_eq!(member.matches(':').count(), 2, "{member}");
            assert!(!member.contains(['{', '}', ' ']), "{member}");
        }
        assert_eq!(Keys::member(&id("é", "p", "{k}")), "é:p:%7Bk%7D");
        for id in &ids {
            assert_eq!(&member_id(Keys::member(id).as_bytes()).unwrap(), id);
        }
        for bad in ["a:b", "a:b:c:d", "a:b:%4", "a:b:%ZZ", "a:b:%FF"] {
            assert!(member_id(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
