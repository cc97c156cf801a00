//! Whether a `tools/call`'s params must be parsed, told from their text: most calls carry no key
//! and their tool has no policy, and those pass through with a few substring checks, as cheaply as
//! when no tool has a policy (`benches/key_sources.rs`).

use serde_json::value::RawValue;

use super::ToolPolicies;
use crate::protocol::IDEMPOTENCY_KEY;

/// Whether the call whose message is `message` and whose params are `params` (a part of it) may be
/// decided by a key or a policy, so that its params must be parsed. `false` means certainly not.
pub(crate) fn needs_parsing(message: &str, params: &RawValue, policies: &ToolPolicies) -> bool {
    may_name_key(message, policies.meta_keys()) || may_apply(policies, params.get())
}

/// Whether `text` may hold a member named `idempotencyKey` or one of the `_meta` key names: it
/// holds the name, or a `\u` escape (the only other way to spell its letters).
fn may_name_key(text: &str, meta_keys: &[String]) -> bool {
    // A name that holds `idempotencyKey` (the default `_meta` name is it) is not looked for again.
    #[cfg(test)]
    if text.contains(super::select::TEST_KEY_ARGUMENT) {
        return true;
    }
    text.contains(IDEMPOTENCY_KEY)
        || text.contains("\\u")
        || meta_keys
            .iter()
            .any(|name| !name.contains(IDEMPOTENCY_KEY) && text.contains(name.as_str()))
}

/// Whether a policy may apply to the call with these params, which hold no `\u` escape
/// ([`may_name_key`] said so): not when no tool has one, nor when the params start with the tool's
/// `name` (as clients write them) and no policy applies to it.
fn may_apply(policies: &ToolPolicies, params: &str) -> bool {
    !policies.is_empty()
        && leading_name(params).is_none_or(|tool| policies.for_tool(tool).is_some())
}

/// The `name` of a `tools/call`'s params, read off their text without parsing them, for text that
/// holds no `\u` escape: only when it is their first member, a string without escapes, and no
/// later member is called `name` too (the last of repeated names is the one that counts; without
/// `\u` escapes a member name can only spell `name` as is). `None` when that cannot be told so
/// cheaply. Nothing after the value is checked, so a `Some` says nothing of whether `params` is
/// valid JSON (a call whose params are not is forwarded unparsed either way).
pub(crate) fn leading_name(params: &str) -> Option<&str> {
    debug_assert!(!params.contains("\\u"), "leading_name on a \\u escape");
    let rest = skip_whitespace(params).strip_prefix('{')?;
    let rest = skip_whitespace(rest).strip_prefix(r#""name""#)?;
    let rest = skip_whitespace(rest).strip_prefix(':')?;
    let rest = skip_whitespace(rest).strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    let (name, after) = rest.split_at(end);
    (after.starts_with('"') && !after.contains(r#""name""#)).then_some(name)
}

fn skip_whitespace(text: &str) -> &str {
    text.trim_start_matches([' ', '\t', '\n', '\r'])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::raw_object::RawObject;

    #[test]
    fn a_leading_name_is_read_without_parsing() {
        for (text, name) in [
            (r#"{"name":"lookup","arguments":{"q":1}}"#, Some("lookup")),
            (
                " {\n \"name\" :\t\"lookup\" , \"arguments\": {}}",
                Some("lookup"),
            ),
            (r#"{"name":"","arguments":{}}"#, Some("")),
            // Not first, or not a plain string.
            (r#"{"arguments":{},"name":"lookup"}"#, None),
            (r#"{"name":"look\"up","arguments":{}}"#, None),
            (r#"{"name":7}"#, None),
            (r#"{"names":"lookup"}"#, None),
            (r#"{"name":"lookup"#, None),
            (r#"["name","lookup"]"#, None),
            // A later member may be called `name` too (the last one counts).
            (r#"{"name":"lookup","name":"charge"}"#, None),
            (r#"{"name":"lookup","arguments":{"name":"Ada"}}"#, None),
        ] {
            assert_eq!(leading_name(text), name, "{text}");
            if let Some(name) = name {
                let parsed = RawObject::parse(text).and_then(|o| o.get_str("name"));
                assert_eq!(parsed.as_deref(), Some(name), "{text}");
            }
        }
    }

    #[test]
    fn only_calls_no_key_and_no_policy_can_concern_pass_unparsed() {
        let none = ToolPolicies::new();
        let some = ToolPolicies::from_json(&json!({"charge": {"key-from": "/order_id"}})).unwrap();
        let every = ToolPolicies::from_json(&json!({"*": {"window": "30s"}})).unwrap();
        let meta = ToolPolicies::new().with_meta_key("io.example/key").unwrap();
        for (params, policies, parse) in [
            (r#"{"name":"lookup","arguments":{}}"#, &none, false),
            (r#"{"name":"lookup","arguments":{}}"#, &some, false),
            (r#"{"name":"charge","arguments":{}}"#, &some, true),
            (r#"{"name":"lookup","arguments":{}}"#, &every, true),
            (r#"{"arguments":{},"name":"lookup"}"#, &some, true),
            (
                r#"{"name":"lookup","arguments":{},"name":"charge"}"#,
                &some,
                true,
            ),
            (r#"{"name":"ch\u0061rge","arguments":{}}"#, &some, true),
            (r#"{"name":"lookup","idempotencyKey":"k"}"#, &none, true),
            (
                r#"{"name":"lookup","_meta":{"idempotencyKey":"k"}}"#,
                &none,
                true,
            ),
            (
                r#"{"name":"lookup","_meta":{"io.example/key":"k"}}"#,
                &meta,
                true,
            ),
            (
                r#"{"name":"lookup","arguments":{"t":"caf\u00e9"}}"#,
                &none,
                true,
            ),
        ] {
            let message =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#);
            let raw: &RawValue = serde_json::from_str(params).unwrap();
            assert_eq!(needs_parsing(&message, raw, policies), parse, "{params}");
        }
    }
}
