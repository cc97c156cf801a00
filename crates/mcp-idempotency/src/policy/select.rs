//! Which key decides a `tools/call`, from its params and the tool's policy. Sans-IO.
//!
//! The sources, in order (the first that applies decides):
//! 1. the business identifier (`key-from`): it decides even when the client sent a key, so that a
//!    model-style retry (a fresh key per call) does not run twice;
//! 2. `params.idempotencyKey` (the SEP);
//! 3. a `_meta` carrier (`_meta.idempotencyKey`, and the configured names);
//! 4. the key argument (`key-argument`);
//! 5. the duplicate window (`window`).
//!
//! An identifier or a key argument that is absent, `null` or `""` is missing. `required` refuses a
//! call that only a window (or nothing) would protect; a business identifier that names an object
//! or an array is refused, since it cannot be an identifier.

use serde_json::value::RawValue;
use serde_json::Value;

use super::{Pointer, ToolPolicies};
use crate::fingerprint::fingerprint;
use crate::key::KeySource;
use crate::protocol::IDEMPOTENCY_KEY;
use crate::raw_object::RawObject;

/// What decides a call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Chosen {
    /// No source applies: the call runs unprotected. `missing` names the policy's identifier the
    /// call lacked (counted and logged), if any.
    Unkeyed { missing: Option<String> },
    /// Refuse the call with `-32602` and this message; nothing runs.
    Refused(String),
    /// Decide on this key.
    Key {
        source: KeySource,
        /// The client's own key (SEP, then `_meta`) when a business identifier decides a call
        /// that carries one: checked and recorded beside it.
        client_key: Option<(KeySource, Value)>,
        /// The client's key as sent (SEP, `_meta`, argument); the identifier's digest
        /// (`key-from`); `null` for a window (the engine keys it by the call's fingerprint).
        value: Value,
        /// The identifier as a person reads it (`/order_id = "ord_1"`), for `key-from`.
        identifier: Option<String>,
    },
}

/// Chooses the key of a call of `tool` whose params are `params`.
pub(crate) fn choose(policies: &ToolPolicies, tool: &str, params: &RawObject<'_>) -> Chosen {
    let policy = policies.for_tool(tool);
    let arguments = params.get("arguments").map(RawValue::get);
    let mut missing = None;
    if let Some(policy) = policy.filter(|p| !p.key_from.is_empty()) {
        match identifier(tool, &policy.key_from, arguments) {
            Ok(Some((digest, shown))) => {
                return Chosen::Key {
                    source: KeySource::KeyFrom,
                    client_key: clients_own_key(policies, params),
                    value: Value::String(digest),
                    identifier: Some(shown),
                }
            }
            Ok(None) => missing = Some(pointer_list(&policy.key_from)),
            Err(refusal) => return Chosen::Refused(refusal),
        }
    }
    if let Some(raw) = params.get(IDEMPOTENCY_KEY) {
        return client_key(KeySource::Sep, raw);
    }
    if let Some(meta) = params.get("_meta").and_then(|m| RawObject::parse(m.get())) {
        for name in policies.meta_keys() {
            if let Some(raw) = meta.get(name) {
                return client_key(KeySource::Meta, raw);
            }
        }
    }
    let Some(policy) = policy else {
        return Chosen::Unkeyed { missing: None };
    };
    if let Some(name) = &policy.key_argument {
        let raw = arguments
            .and_then(RawObject::parse)
            .and_then(|args| args.get(name))
            .filter(|raw| !is_missing(raw.get()));
        match raw {
            Some(raw) => return client_key(KeySource::Argument, raw),
            None => {
                missing.get_or_insert_with(|| format!("argument `{name}`"));
            }
        }
    }
    if policy.required {
        let wanted = missing.unwrap_or_default();
        return Chosen::Refused(format!(
            "tools/call of `{tool}` needs {wanted}: this server's idempotency policy requires it; \
             nothing ran"
        ));
    }
    if policy.window.is_some() {
        return Chosen::Key {
            source: KeySource::Window,
            client_key: None,
            value: Value::Null,
            identifier: None,
        };
    }
    Chosen::Unkeyed { missing }
}

fn client_key(source: KeySource, raw: &RawValue) -> Chosen {
    Chosen::Key {
        source,
        client_key: None,
        value: serde_json::from_str(raw.get()).unwrap_or(Value::Null),
        identifier: None,
    }
}

/// The client's own key, as sources 2 and 3 would take it.
fn clients_own_key(policies: &ToolPolicies, params: &RawObject<'_>) -> Option<(KeySource, Value)> {
    let parse = |raw: &RawValue| serde_json::from_str(raw.get()).unwrap_or(Value::Null);
    if let Some(raw) = params.get(IDEMPOTENCY_KEY) {
        return Some((KeySource::Sep, parse(raw)));
    }
    let meta = RawObject::parse(params.get("_meta")?.get())?;
    policies
        .meta_keys()
        .iter()
        .find_map(|name| meta.get(name))
        .map(|raw| (KeySource::Meta, parse(raw)))
}

/// Whether a value given for an identifier or a key argument counts as not given: `null` and the
/// empty string, which no client means as an identifier.
fn is_missing(raw: &str) -> bool {
    matches!(raw.trim(), "null" | "\"\"")
}

/// The business identifier's digest and how it reads, `Ok(None)` when a member is absent, `null`
/// or `""` ([`is_missing`]).
/// The digest is the SEP fingerprint of the tool and the array of the identifier's values, so
/// values compare as parsed JSON (numbers as exact decimals, escapes resolved).
fn identifier(
    tool: &str,
    pointers: &[Pointer],
    arguments: Option<&str>,
) -> Result<Option<(String, String)>, String> {
    let mut values = Vec::with_capacity(pointers.len());
    let mut shown = Vec::with_capacity(pointers.len());
    for pointer in pointers {
        let Some(raw) = arguments.and_then(|args| at(args, pointer)) else {
            return Ok(None);
        };
        if is_missing(raw) {
            return Ok(None);
        }
        if let Some(b'{' | b'[') = raw.trim_start().as_bytes().first() {
            return Err(format!(
                "the business identifier `{}` of `{tool}` names an {}, not a string, number or \
                 boolean; nothing ran (check the server's `key-from` policy)",
                pointer.as_str(),
                if raw.trim_start().starts_with('{') {
                    "object"
                } else {
                    "array"
                }
            ));
        }
        shown.push(format!("{} = {}", pointer.as_str(), raw.trim()));
        values.push(raw);
    }
    let list = format!("[{}]", values.join(","));
    let digest = fingerprint(tool, Some(&list)).map_err(|err| {
        format!("the business identifier of `{tool}` is not valid JSON: {err}; nothing ran")
    })?;
    Ok(Some((digest.to_hex(), shown.join(", "))))
}

/// The raw JSON text `pointer` names in `document`, if any.
fn at<'a>(document: &'a str, pointer: &Pointer) -> Option<&'a str> {
    let mut here = document;
    for token in pointer.tokens() {
        let text = here.trim_start();
        here = match text.as_bytes().first()? {
            b'{' => RawObject::parse(text)?.get(&token)?.get(),
            b'[' => {
                let index: usize = token
                    .parse()
                    .ok()
                    .filter(|_| token == "0" || !token.starts_with('0'))?;
                let items: Vec<&'a RawValue> = serde_json::from_str(text).ok()?;
                items.get(index)?.get()
            }
            _ => return None,
        };
    }
    Some(here)
}

fn pointer_list(pointers: &[Pointer]) -> String {
    let names: Vec<String> = pointers
        .iter()
        .map(|p| format!("`{}`", p.as_str()))
        .collect();
    format!("its identifier {}", names.join(", "))
}
