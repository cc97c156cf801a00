//! The names of a store's keys: every key starts with the hash tag of its shard, and the parts of
//! a record's name (namespace, principal, key) are percent-encoded so that two records never share
//! a Redis key.
//!
//! A store has one or more shards. A scope's records, its index and the shard's two indexes share
//! the shard's hash tag, so every script touches one Redis Cluster slot. With one shard (the
//! default on a single server) the tag is `{PREFIX}`, the layout of the earlier versions; with `N`
//! shards shard `j`'s tag is `{PREFIX:j.c}`, the first `c = 0, 1, …` whose slot lies in the `j`-th
//! of `N` equal ranges of the 16384 slots, so that the shards spread over the primaries of a
//! cluster whose slots were handed out in ranges (as `redis-cli --cluster create` does).

use crate::key::IdempotencyKey;
use crate::record::{CorruptRecord, RecordId, Scope};

/// Redis Cluster's number of hash slots.
const SLOTS: u16 = 16384;

/// The names of one store's keys.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    shards: Vec<Shard>,
}

/// The names of one shard's keys.
#[derive(Clone, Debug)]
pub(super) struct Shard {
    /// `{TAG}:`, the start of every key of the shard.
    pub(super) tag: String,
    /// Every record of the shard, scored by `expires_at`.
    pub(super) all: String,
    /// The shard's records in progress, scored by `expires_at`.
    pub(super) running: String,
    /// The marker written before `WAIT` when writes wait for replicas (`replicas=N`).
    pub(super) ack: String,
}

impl Keys {
    /// The keys of a store under `prefix` with `shards` shards (at least one, at most
    /// [`Keys::MAX_SHARDS`]).
    pub(super) fn new(prefix: &str, shards: u16) -> Self {
        let count = shards.clamp(1, Self::MAX_SHARDS);
        let shards = if count == 1 {
            vec![Shard::new(prefix.to_owned())]
        } else {
            (0..count)
                .map(|j| Shard::new(spread_tag(prefix, j, count)))
                .collect()
        };
        Self { shards }
    }

    /// The most shards a store may have.
    pub(super) const MAX_SHARDS: u16 = 1024;

    /// Every shard, in order.
    pub(super) fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The shard holding `scope`'s records.
    pub(super) fn shard_of(&self, scope: &Scope) -> &Shard {
        match self.shards.as_slice() {
            // Without encoding the scope for nothing.
            [only] => only,
            _ => self.shard_of_part(&Self::scope_part(scope)),
        }
    }

    /// The shard holding the records of the scope whose encoded name is `scope_part`.
    fn shard_of_part(&self, scope_part: &str) -> &Shard {
        // One shard (the default on one server): no slot hash to compute.
        if let [only] = self.shards.as_slice() {
            return only;
        }
        &self.shards[usize::from(crc16(scope_part.as_bytes())) % self.shards.len()]
    }

    /// The names of the keys an operation on `id`'s record touches, from one encoding of its
    /// scope.
    pub(super) fn of_record(&self, id: &RecordId) -> RecordKeys<'_> {
        let key = id.key.as_str();
        let mut member = Self::scope_part_with_room(&id.scope, key.len() + 1);
        let shard = self.shard_of_part(&member);
        let scope = shard.key("s:", &member);
        member.push(':');
        encode_into(&mut member, key);
        RecordKeys {
            shard,
            record: shard.record(&member),
            scope,
            member,
        }
    }

    /// `NS:PRINCIPAL:KEY`, each part encoded: how the indexes name a record.
    pub(super) fn member(id: &RecordId) -> String {
        let mut member = Self::scope_part_with_room(&id.scope, id.key.as_str().len() + 1);
        member.push(':');
        encode_into(&mut member, id.key.as_str());
        member
    }

    fn scope_part(scope: &Scope) -> String {
        Self::scope_part_with_room(scope, 0)
    }

    /// [`Self::scope_part`] in a string with room for `more` bytes after it.
    fn scope_part_with_room(scope: &Scope, more: usize) -> String {
        let mut part =
            String::with_capacity(scope.namespace().len() + scope.principal().len() + 1 + more);
        encode_into(&mut part, scope.namespace());
        part.push(':');
        encode_into(&mut part, scope.principal());
        part
    }
}

impl Shard {
    fn new(tag: String) -> Self {
        let tag = format!("{{{tag}}}:");
        Self {
            all: format!("{tag}all"),
            running: format!("{tag}run"),
            ack: format!("{tag}ack"),
            tag,
        }
    }

    /// The key of the hash holding the record `member` names (a record of this shard).
    pub(super) fn record(&self, member: &str) -> String {
        self.key("r:", member)
    }

    /// The key of `scope`'s index (a scope of this shard).
    pub(super) fn scope(&self, scope: &Scope) -> String {
        self.key("s:", &Keys::scope_part(scope))
    }

    /// `{TAG}:KINDNAME`.
    fn key(&self, kind: &str, name: &str) -> String {
        let mut key = String::with_capacity(self.tag.len() + kind.len() + name.len());
        key.push_str(&self.tag);
        key.push_str(kind);
        key.push_str(name);
        key
    }
}

/// The keys of one record's operation: see [`Keys::of_record`].
#[derive(Debug)]
pub(super) struct RecordKeys<'k> {
    /// The shard of the record.
    pub(super) shard: &'k Shard,
    /// The hash holding the record.
    pub(super) record: String,
    /// The index of the record's scope.
    pub(super) scope: String,
    /// The record's name in the indexes ([`Keys::member`]).
    pub(super) member: String,
}

/// The tag of shard `j` of `count`: `PREFIX:j.c` for the first `c` whose slot is in the `j`-th of
/// `count` equal slot ranges. The search is deterministic, so every instance finds the same tags.
fn spread_tag(prefix: &str, j: u16, count: u16) -> String {
    let (low, high) = slot_range(j, count);
    let mut fallback = None;
    for c in 0..u32::from(SLOTS) * 64 {
        let tag = format!("{prefix}:{j}.{c}");
        let slot = slot_of_tag(&tag);
        if (low..high).contains(&slot) {
            return tag;
        }
        fallback.get_or_insert(tag);
    }
    // Not reached in practice (each try lands in the range with probability 1/count).
    fallback.unwrap_or_else(|| format!("{prefix}:{j}"))
}

/// The `j`-th of `count` equal ranges of slots, as `(first, end)`.
fn slot_range(j: u16, count: u16) -> (u16, u16) {
    let bound = |i: u16| (u32::from(i) * u32::from(SLOTS) / u32::from(count)) as u16;
    (bound(j), bound(j + 1))
}

/// The Redis Cluster slot of a key whose hash tag is `tag`.
fn slot_of_tag(tag: &str) -> u16 {
    crc16(tag.as_bytes()) % SLOTS
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

/// Appends `part` percent-encoded: `%`, `:`, braces, spaces and control characters become `%XX`
/// (per UTF-8 byte), everything else is kept. The encoding is injective and never contains `:`.
fn encode_into(out: &mut String, part: &str) {
    let mut rest = part;
    // Most parts (names, UUID keys) have nothing to escape; the others a few characters (the
    // `:` and `/` of a URL): the runs between them are copied whole. The scan goes by bytes: a
    // byte that is not ASCII starts a character, which is then looked at whole.
    while let Some(at) = rest
        .bytes()
        .position(|byte| !byte.is_ascii() || needs_escape(char::from(byte)))
    {
        out.push_str(&rest[..at]);
        let Some(ch) = rest[at..].chars().next() else {
            break;
        };
        if needs_escape(ch) {
            let mut buf = [0; 4];
            for byte in ch.encode_utf8(&mut buf).bytes() {
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xF)]));
            }
        } else {
            out.push(ch);
        }
        rest = &rest[at + ch.len_utf8()..];
    }
    out.push_str(rest);
}

/// Whether [`encode_into`] writes `ch` as `%XX`.
fn needs_escape(ch: char) -> bool {
    matches!(ch, '%' | ':' | '{' | '}') || ch.is_whitespace() || ch.is_control()
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

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
    let key = IdempotencyKey::from_stored(&key).map_err(|_| corrupt())?;
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
        let keys = Keys::new("mcp-idem", 1);
        let shard = &keys.shards()[0];
        let expected = slot("{mcp-idem}");
        for id in [
            id("ns", "alice", "k"),
            id("{ns}", "}{", "{key}"),
            id("n:s", "p{x}", "ключ 🔑"),
            id("", "", "}"),
        ] {
            let member = Keys::member(&id);
            for key in [
                keys.shard_of(&id.scope).record(&member),
                keys.shard_of(&id.scope).scope(&id.scope),
                shard.all.clone(),
                shard.running.clone(),
            ] {
                assert!(key.starts_with("{mcp-idem}:"), "{key}");
                assert_eq!(slot(&key), expected, "{key}");
            }
        }
    }

    #[test]
    fn a_scopes_keys_share_its_shards_slot_and_shards_spread_over_the_slots() {
        let keys = Keys::new("p", 8);
        assert_eq!(keys.shards().len(), 8);
        for (j, shard) in keys.shards().iter().enumerate() {
            let (low, high) = slot_range(j as u16, 8);
            let at = slot(&shard.all);
            assert!((low..high).contains(&at), "shard {j}: slot {at}");
            assert_eq!(at, slot(&shard.running));
        }
        // Deterministic: another instance finds the same tags.
        let again = Keys::new("p", 8);
        for (a, b) in keys.shards().iter().zip(again.shards()) {
            assert_eq!(a.tag, b.tag);
        }
        let mut used = std::collections::HashSet::new();
        for n in 0..200 {
            let id = id(&format!("ns{n}"), "alice", "k");
            let shard = keys.shard_of(&id.scope);
            used.insert(shard.tag.clone());
            let member = Keys::member(&id);
            let expected = slot(&shard.all);
            assert_eq!(slot(&shard.record(&member)), expected);
            assert_eq!(slot(&shard.scope(&id.scope)), expected);
            assert_eq!(shard.record(&member).matches('{').count(), 1);
        }
        assert_eq!(used.len(), 8, "200 scopes use every shard");
    }

    #[test]
    fn a_records_keys_are_named_from_one_encoding_of_its_scope_as_one_at_a_time() {
        for keys in [Keys::new("p", 1), Keys::new("p", 8)] {
            for n in 0..50 {
                let id = id(&format!("http://h:{n}/mcp"), "p{x} y", &format!("k:{n}"));
                let of = keys.of_record(&id);
                let shard = keys.shard_of(&id.scope);
                assert_eq!(of.shard.tag, shard.tag);
                assert_eq!(of.member, Keys::member(&id));
                assert_eq!(of.record, shard.record(&of.member));
                assert_eq!(of.scope, shard.scope(&id.scope));
            }
        }
    }

    #[test]
    fn encoding_escapes_exactly_the_separators_spaces_and_controls() {
        for (part, encoded) in [
            ("order-42_x.Y~", "order-42_x.Y~"),
            (
                "550e8400-e29b-41d4-a716-446655440000",
                "550e8400-e29b-41d4-a716-446655440000",
            ),
            ("a b", "a%20b"),
            ("%:{}", "%25%3A%7B%7D"),
            ("\t\n\u{7f}", "%09%0A%7F"),
            ("café ключ 🔑", "café%20ключ%20🔑"),
            ("\u{a0}\u{2028}", "%C2%A0%E2%80%A8"),
            ("\u{b}\u{85}x", "%0B%C2%85x"),
            ("", ""),
        ] {
            let mut out = String::new();
            encode_into(&mut out, part);
            assert_eq!(out, encoded, "{part:?}");
            assert_eq!(decode_part(&out).as_deref(), Some(part));
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
