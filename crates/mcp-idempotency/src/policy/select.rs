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
//!
//! When a business identifier decides a call that also carries the client's own key (2 or 3),
//! that key goes with it ([`KeyTerms::client_key`]): the engine reads its record first, since the
//! SEP's rules hold for it, and records it beside the identifier's. An MRTR continuation is out of
//! scope whatever the policy: only its SEP key is taken, for the engine to let it pass.

use serde_json::value::RawValue;
use serde_json::Value;

use super::{KeySource, KeyTerms, Pointer, ToolPolicies, ToolPolicy};
use crate::fingerprint::fingerprint;
use crate::protocol::{is_mrtr_continuation, IDEMPOTENCY_KEY};
use crate::raw_object::RawObject;

/// What decides a call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Chosen {
    /// No source applies: the call runs unprotected. `missing` names the policy's identifier the
    /// call lacked (counted and logged), if any.
    Unkeyed { missing: Option<String> },
    /// Refuse the call with `-32602` and this message; nothing runs.
    Refused(String),
    /// Decide on this choice.
    Key(Choice),
}

/// The one complete choice for a keyed call: its key, whether it is an MRTR continuation, and
/// the terms it is decided on (source, the name shown in errors, the client's own key, wait,
/// retention, errors, store outage).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Choice {
    /// The client's key as sent (SEP, `_meta`, argument); the identifier's digest (`key-from`);
    /// `None` for a window (the engine keys it by the call's fingerprint).
    pub(crate) key: Option<Value>,
    /// Whether the call is an MRTR continuation, which the engine lets pass.
    pub(crate) mrtr_continuation: bool,
    pub(crate) terms: KeyTerms,
}

/// Chooses the key of a call of `tool` whose params are `params`.
pub(crate) fn choose(policies: &ToolPolicies, tool: &str, params: &RawObject<'_>) -> Chosen {
    if is_mrtr_continuation(params) {
        return match params.get(IDEMPOTENCY_KEY) {
            Some(raw) => Chosen::Key(Choice {
                mrtr_continuation: true,
                ..client_key(KeySource::Sep, raw, None)
            }),
            None => Chosen::Unkeyed { missing: None },
        };
    }
    let policy = policies.for_tool(tool);
    let arguments = params.get("arguments").map(RawValue::get);
    let mut missing = None;
    if let Some(policy) = policy.filter(|p| !p.key_from.is_empty()) {
        match identifier(tool, &policy.key_from, arguments) {
            Ok(Some((digest, shown))) => {
                let mut terms = KeyTerms {
                    shown_as: Some(shown),
                    ..KeyTerms::new(KeySource::KeyFrom, Some(policy))
                };
                if let Some((source, key)) = clients_own_key(policies, params) {
                    terms = terms.with_client_key(source, key);
                }
                return Chosen::Key(Choice {
                    key: Some(Value::String(digest)),
                    mrtr_continuation: false,
                    terms,
                });
            }
            Ok(None) => missing = Some(pointer_list(&policy.key_from)),
            Err(refusal) => return Chosen::Refused(refusal),
        }
    }
    if let Some(raw) = params.get(IDEMPOTENCY_KEY) {
        return Chosen::Key(client_key(KeySource::Sep, raw, policy));
    }
    if let Some(meta) = params.get("_meta").and_then(|m| RawObject::parse(m.get())) {
        for name in policies.meta_keys() {
            if let Some(raw) = meta.get(name) {
                return Chosen::Key(Choice {
                    terms: KeyTerms {
                        shown_as: Some("the `_meta` idempotency key".to_owned()),
                        ..KeyTerms::new(KeySource::Meta, policy)
                    },
                    ..client_key(KeySource::Meta, raw, policy)
                });
            }
        }
    }
    #[cfg(test)]
    if let Some(raw) = arguments
        .and_then(RawObject::parse)
        .and_then(|args| args.get(TEST_KEY_ARGUMENT))
    {
        return Chosen::Key(Choice {
            terms: KeyTerms {
                shown_as: Some(format!("the test key `{TEST_KEY_ARGUMENT}`")),
                ..KeyTerms::new(KeySource::Test, policy)
            },
            ..client_key(KeySource::Test, raw, policy)
        });
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
            Some(raw) => {
                return Chosen::Key(Choice {
                    terms: KeyTerms {
                        shown_as: Some(format!("the key argument `{name}`")),
                        ..KeyTerms::new(KeySource::Argument, Some(policy))
                    },
                    ..client_key(KeySource::Argument, raw, Some(policy))
                })
            }
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
        return Chosen::Key(Choice {
            key: None,
            mrtr_continuation: false,
            terms: KeyTerms::new(KeySource::Window, Some(policy)),
        });
    }
    Chosen::Unkeyed { missing }
}

/// The argument that carries the test-only source's key ([`KeySource::Test`]).
#[cfg(test)]
pub(crate) const TEST_KEY_ARGUMENT: &str = "__test_key";

/// The choice of a key the client sent (`raw`) under `source`, on the tool's terms.
fn client_key(source: KeySource, raw: &RawValue, policy: Option<&ToolPolicy>) -> Choice {
    Choice {
        key: Some(serde_json::from_str(raw.get()).unwrap_or(Value::Null)),
        mrtr_continuation: false,
        terms: KeyTerms::new(source, policy),
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
