//! JSON objects edited without re-encoding their values.
//!
//! Messages are rewritten (a member removed, one added) while every other member keeps its exact
//! text: re-encoding through `serde_json::Value` would change how numbers are spelled and lose
//! precision beyond `f64`.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The members of a JSON object, in order, with their values as raw JSON text.
#[derive(Debug, Default)]
pub(crate) struct RawObject<'a> {
    members: Vec<(Name<'a>, &'a RawValue)>,
}

/// A member's name: borrowed from the text when it was written without escapes (most are, and
/// then reading an object allocates nothing per member), decoded otherwise.
type Name<'a> = Cow<'a, str>;

impl<'a> RawObject<'a> {
    /// Parses `text` as an object; `None` if it is not one.
    pub(crate) fn parse(text: &'a str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// The value of the last member called `name`: with repeated names the last one wins, as in
    /// serde_json and the fingerprint.
    pub(crate) fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.members
            .iter()
            .rev()
            .find(|(member, _)| member == name)
            .map(|(_, value)| *value)
    }

    /// The value of the member called `name` when exactly one is.
    pub(crate) fn only(&self, name: &str) -> Option<&'a RawValue> {
        let mut named = self.members.iter().filter(|(member, _)| member == name);
        match (named.next(), named.next()) {
            (Some((_, value)), None) => Some(*value),
            _ => None,
        }
    }

    /// The value of `name` as a string, if it is one.
    pub(crate) fn get_str(&self, name: &str) -> Option<String> {
        self.get(name)
            .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
    }

    /// Whether a member called `name` exists (with any value, `null` included).
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Removes every member called `name`.
    pub(crate) fn remove(&mut self, name: &str) {
        self.members.retain(|(member, _)| member != name);
    }

    /// Writes the object with `name` set to `value` (raw JSON), replacing any member of that name.
    pub(crate) fn to_string_with(&self, name: &str, value: &str) -> String {
        self.to_string_with_all(&[(name, value)])
    }

    /// Writes the object with each `(name, value)` (raw JSON) of `set` set, replacing any member
    /// of those names, in one pass.
    pub(crate) fn to_string_with_all(&self, set: &[(&str, &str)]) -> String {
        let mut out = String::with_capacity(
            self.members
                .iter()
                .map(|(k, v)| k.len() + v.get().len() + 4)
                .sum::<usize>()
                + set
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 8)
                    .sum::<usize>(),
        );
        out.push('{');
        let replaced = |member: &str| set.iter().any(|(name, _)| *name == member);
        for (member, raw) in self.members.iter().filter(|(member, _)| !replaced(member)) {
            push_member(&mut out, member, raw.get());
        }
        for (name, value) in set {
            push_member(&mut out, name, value);
        }
        out.push('}');
        out
    }

    /// Writes the object.
    pub(crate) fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (member, raw) in &self.members {
            push_member(&mut out, member, raw.get());
        }
        out.push('}');
        out
    }
}

fn push_member(out: &mut String, name: &str, raw: &str) {
    if out.len() > 1 {
        out.push(',');
    }
    push_json_string(out, name);
    out.push(':');
    out.push_str(raw);
}

/// `text` as a JSON string, as `serde_json` writes it.
pub(crate) fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_json_string(&mut out, text);
    out
}

/// Appends `text` as a JSON string. Most text (names, keys) has nothing to escape and is copied
/// between quotes; the rest goes through `serde_json`, which escapes exactly `"`, `\\` and the
/// control characters below U+0020.
fn push_json_string(out: &mut String, text: &str) {
    if text.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        out.push_str(&serde_json::Value::from(text).to_string());
    } else {
        out.push('"');
        out.push_str(text);
        out.push('"');
    }
}

/// Reads a member name, borrowing it from the text when it has no escapes.
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Name<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Name<'de>, D::Error> {
        deserializer.deserialize_str(NameSeed)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Name<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, name: &'de str) -> Result<Name<'de>, E> {
        Ok(Cow::Borrowed(name))
    }

    fn visit_str<E>(self, name: &str) -> Result<Name<'de>, E> {
        Ok(Cow::Owned(name.to_owned()))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for MembersVisitor<'a> {
            type Value = RawObject<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(4));
                while let Some(name) = map.next_key_seed(NameSeed)? {
                    members.push((name, map.next_value::<&'de RawValue>()?));
                }
                Ok(RawObject { members })
            }
        }

        deserializer.deserialize_map(MembersVisitor(std::marker::PhantomData))
    }
}

/// The JSON type name of a value, as used in error messages.
pub(crate) fn json_type_name(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_written_as_serde_json_writes_them() {
        for text in [
            "order-42",
            "",
            "quote \" and \\ backslash",
            "\n\t\u{0}\u{1f}",
            "\u{7f} café 🔑 \u{2028}",
        ] {
            assert_eq!(
                json_string(text),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn keeps_member_text_exactly() {
        let text = r#"{"a": 1.000, "b": 12345678901234567890123, "c": "\u00e9", "a": 2}"#;
        let object = RawObject::parse(text).unwrap();
        assert_eq!(object.get("a").unwrap().get(), "2");
        assert_eq!(
            object.to_string_with("d", "{}"),
            r#"{"a":1.000,"b":12345678901234567890123,"c":"\u00e9","a":2,"d":{}}"#
        );
    }

    #[test]
    fn replaces_and_removes_members() {
        let mut object = RawObject::parse(r#"{"k":1,"x":2,"k":3}"#).unwrap();
        assert_eq!(object.to_string_with("k", "9"), r#"{"x":2,"k":9}"#);
        object.remove("x");
        assert_eq!(object.to_json(), r#"{"k":1,"k":3}"#);
    }

    #[test]
    fn rejects_non_objects() {
        for text in ["[]", "1", "\"s\"", "null", "{", ""] {
            assert!(RawObject::parse(text).is_none(), "{text}");
        }
    }

    #[test]
    fn escapes_member_names() {
        let object = RawObject::parse(r#"{"a\"b":1,"\u0063":2,"\n":3}"#).unwrap();
        assert_eq!(object.get("c").unwrap().get(), "2");
        assert_eq!(object.to_json(), r#"{"a\"b":1,"c":2,"\n":3}"#);
    }

    #[test]
    fn names_without_escapes_are_borrowed() {
        let object = RawObject::parse(r#"{"plain":1,"\u00e9":2}"#).unwrap();
        assert!(matches!(object.members[0].0, Cow::Borrowed("plain")));
        assert!(matches!(&object.members[1].0, Cow::Owned(name) if name == "é"));
    }
}
