use std::time::Duration;

use serde_json::json;

use super::*;

mod new_source;

#[test]
fn a_tools_own_table_overrides_the_star_table_key_by_key() {
    let policies = ToolPolicies::from_json(&json!({
        "*": {"window": "30s", "on-error": "forget"},
        "charge": {"key_from": ["/order_id"], "required": true},
        "refund": {"keyArgument": "idempotency_key", "window": "5s"},
    }))
    .unwrap();
    let charge = policies.for_tool("charge").unwrap();
    assert_eq!(charge.key_from().collect::<Vec<_>>(), ["/order_id"]);
    assert!(charge.required());
    assert_eq!(charge.window(), Some(Duration::from_secs(30)));
    assert_eq!(charge.on_error(), OnError::Forget);
    let refund = policies.for_tool("refund").unwrap();
    assert_eq!(refund.window(), Some(Duration::from_secs(5)));
    assert_eq!(refund.key_argument(), Some("idempotency_key"));
    let other = policies.for_tool("anything").unwrap();
    assert_eq!(other.window(), Some(Duration::from_secs(30)));
    assert_eq!(other.wait(), DEFAULT_WAIT);
    assert_eq!(policies.unlisted(&["charge"]), ["refund"]);
}

#[test]
fn without_tables_no_tool_has_a_policy_and_meta_idempotency_key_is_read() {
    let policies = ToolPolicies::new();
    assert!(policies.is_empty());
    assert!(policies.for_tool("charge").is_none());
    assert_eq!(policies.meta_keys(), [DEFAULT_META_KEY]);
    let more = policies
        .with_meta_key("io.mcp-gateway/idempotency-key")
        .unwrap();
    assert_eq!(more.meta_keys().len(), 2);
}

#[test]
fn every_mistake_is_a_clear_error_naming_the_tool_and_setting() {
    let cases = [
        (json!([]), "`tools` must be a table"),
        (json!({"charge": 1}), "must be a table of settings"),
        (json!({"": {}}), "tool name must not be empty"),
        (
            json!({"charge": {"key-from": "order_id"}}),
            "must start with `/`",
        ),
        (
            json!({"charge": {"key-from": []}}),
            "at least one JSON Pointer",
        ),
        (
            json!({"charge": {"key-from": ["/a~2"]}}),
            "`~` must be followed by 0 or 1",
        ),
        (
            json!({"charge": {"key-from": [{"x": 1}]}}),
            "must be a string, not object",
        ),
        (json!({"charge": {"window": "0s"}}), "out of range"),
        (json!({"charge": {"window": "11m"}}), "out of range"),
        (json!({"charge": {"window": "soon"}}), "\"soon\""),
        (json!({"charge": {"window": 30}}), "duration"),
        (json!({"charge": {"wait": "11m"}}), "out of range"),
        (json!({"charge": {"required": "yes"}}), "true or false"),
        (
            json!({"charge": {"required": true}}),
            "needs `key-from` or `key-argument`",
        ),
        (json!({"charge": {"key-argument": ""}}), "must not be empty"),
        (json!({"charge": {"on-error": "retry"}}), "replay, forget"),
        (
            json!({"charge": {"store-down": "open"}}),
            "fail-closed, run-unprotected",
        ),
        (
            json!({"charge": {"keyfrom": "/x"}}),
            "unknown setting `keyfrom`",
        ),
    ];
    for (tools, expected) in cases {
        let err = ToolPolicies::from_json(&tools).unwrap_err().to_string();
        assert!(err.contains(expected), "{tools}: {err}");
    }
    let err = ToolPolicies::from_json(&json!({"charge": {"window": "0s"}}))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("tool policy [tools.\"charge\"]: `window`"),
        "{err}"
    );
}

#[test]
fn the_effective_policy_prints_as_toml() {
    let policies = ToolPolicies::from_json(
        &json!({"charge": {"key-from": ["/order_id", "/a~1b"], "required": true}}),
    )
    .unwrap();
    let printed = policies.for_tool("charge").unwrap().to_string();
    assert_eq!(
        printed,
        "key-from = [\"/order_id\", \"/a~1b\"]\nrequired = true\non-error = \"replay\"\n\
         store-down = \"fail-closed\"\nwait = \"30s\"\n"
    );
}

/// The key `choose` picks for a call of `charge` with these `arguments` under `tools`.
fn chosen(tools: serde_json::Value, arguments: serde_json::Value) -> select::Chosen {
    let policies = ToolPolicies::from_json(&tools).unwrap();
    let params = json!({"name": "charge", "arguments": arguments}).to_string();
    let params = crate::raw_object::RawObject::parse(&params).unwrap();
    select::choose(&policies, "charge", &params)
}

#[test]
fn an_empty_identifier_is_missing_as_null_is() {
    let required = json!({"charge": {"key-from": ["/memo"], "required": true}});
    for memo in [json!(null), json!("")] {
        let arguments = json!({"amount": 1, "memo": memo});
        let select::Chosen::Refused(message) = chosen(required.clone(), arguments) else {
            panic!("memo {memo} is missing: the call is refused");
        };
        assert!(
            message.contains("needs its identifier `/memo`"),
            "{message}"
        );
    }
    // A composite identifier with one empty member is missing too.
    let composite = json!({"charge": {"key-from": ["/memo", "/amount"], "required": true}});
    assert!(matches!(
        chosen(composite, json!({"amount": 1, "memo": ""})),
        select::Chosen::Refused(_)
    ));
    // Without `required`, the call goes on to the next source: a window, or none.
    let windowed = json!({"charge": {"key-from": ["/memo"], "window": "30s"}});
    assert!(matches!(
        chosen(windowed, json!({"memo": ""})),
        select::Chosen::Key(select::Choice {
            terms: KeyTerms {
                source: KeySource::Window,
                ..
            },
            ..
        })
    ));
    assert_eq!(
        chosen(
            json!({"charge": {"key-from": "/memo"}}),
            json!({"memo": ""})
        ),
        select::Chosen::Unkeyed {
            missing: Some("its identifier `/memo`".into())
        }
    );
    // Any other string is an identifier, blank or not.
    for memo in [" ", "0", "\"\""] {
        assert!(
            matches!(
                chosen(required.clone(), json!({"memo": memo})),
                select::Chosen::Key(select::Choice {
                    terms: KeyTerms {
                        source: KeySource::KeyFrom,
                        ..
                    },
                    ..
                })
            ),
            "{memo:?}"
        );
    }
}

#[test]
fn an_empty_key_argument_is_missing_as_null_is() {
    let required = json!({"charge": {"key-argument": "idempotency_key", "required": true}});
    for key in [json!(null), json!("")] {
        let select::Chosen::Refused(message) =
            chosen(required.clone(), json!({"idempotency_key": key}))
        else {
            panic!("key {key} is missing: the call is refused");
        };
        assert!(
            message.contains("needs argument `idempotency_key`"),
            "{message}"
        );
    }
    let windowed = json!({"charge": {"key-argument": "idempotency_key", "window": "5s"}});
    assert!(matches!(
        chosen(windowed, json!({"idempotency_key": ""})),
        select::Chosen::Key(select::Choice {
            terms: KeyTerms {
                source: KeySource::Window,
                ..
            },
            ..
        })
    ));
    assert_eq!(
        chosen(
            json!({"charge": {"key-argument": "idempotency_key"}}),
            json!({"idempotency_key": ""})
        ),
        select::Chosen::Unkeyed {
            missing: Some("argument `idempotency_key`".into())
        }
    );
    assert!(matches!(
        chosen(required, json!({"idempotency_key": "k-1"})),
        select::Chosen::Key(select::Choice {
            terms: KeyTerms {
                source: KeySource::Argument,
                ..
            },
            ..
        })
    ));
}

#[test]
fn every_multi_word_setting_is_taken_in_kebab_snake_and_camel_case() {
    let spelled = |kebab: bool, snake: bool| {
        let name = |words: [&str; 2]| match (kebab, snake) {
            (true, _) => format!("{}-{}", words[0], words[1]),
            (false, true) => format!("{}_{}", words[0], words[1]),
            (false, false) => {
                let mut second = words[1].to_owned();
                second[..1].make_ascii_uppercase();
                format!("{}{second}", words[0])
            }
        };
        let mut table = serde_json::Map::new();
        table.insert(name(["key", "from"]), json!("/order_id"));
        table.insert(name(["key", "argument"]), json!("idempotency_key"));
        table.insert(name(["on", "error"]), json!("forget"));
        table.insert(name(["store", "down"]), json!("run-unprotected"));
        ToolPolicies::from_json(&json!({"charge": table})).unwrap()
    };
    let kebab = spelled(true, false);
    assert_eq!(spelled(false, true), kebab);
    assert_eq!(spelled(false, false), kebab);
    let charge = kebab.for_tool("charge").unwrap();
    assert_eq!(charge.key_from().collect::<Vec<_>>(), ["/order_id"]);
    assert_eq!(charge.key_argument(), Some("idempotency_key"));
    assert_eq!(charge.on_error(), OnError::Forget);
    assert_eq!(charge.store_down(), StoreDown::RunUnprotected);
}

#[test]
fn an_error_quotes_the_setting_as_it_was_given() {
    for name in ["key-from", "key_from", "keyFrom"] {
        let err = ToolPolicies::from_json(&json!({"charge": {name: "order_id"}})).unwrap_err();
        assert_eq!(err.tool(), "charge");
        assert_eq!(err.setting(), Some(name));
        assert!(err.reason().contains("must start with `/`"), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("tool policy [tools.\"charge\"]: `{name}`: ")),
            "{err}"
        );
    }
    let err = ToolPolicies::from_json(&json!({"charge": {"onError": "retry"}})).unwrap_err();
    assert_eq!(err.setting(), Some("onError"));
    // One setting given twice, in two spellings: an error naming both.
    let err = ToolPolicies::from_json(&json!({"charge": {"key-from": "/a", "keyFrom": "/b"}}))
        .unwrap_err();
    assert_eq!(err.setting(), None);
    assert!(
        err.reason()
            .contains("`key-from` and `keyFrom` are one setting"),
        "{err}"
    );
}

#[test]
fn suggested_policies_apply_to_listed_tools_under_their_own_tables() {
    use super::suggest::classify;
    let listed = classify(&[
        json!({"name": "charge", "inputSchema": {"properties": {"order_id": {"type": "string"}},
                                                  "required": ["order_id"]}}),
        json!({"name": "refund", "inputSchema": {"properties": {"order_id": {"type": "string"}},
                                                  "required": ["order_id"]}}),
        json!({"name": "log"}),
        json!({"name": "get", "annotations": {"readOnlyHint": true}}),
    ]);
    let alone = ToolPolicies::from_json(&json!("suggested")).unwrap();
    assert!(alone.is_suggested() && alone.is_empty());
    let applied = alone.with_listed_tools(&listed).unwrap();
    assert_eq!(
        applied
            .for_tool("charge")
            .unwrap()
            .key_from()
            .collect::<Vec<_>>(),
        ["/order_id"]
    );
    assert!(applied.for_tool("charge").unwrap().required());
    assert_eq!(
        applied.for_tool("log").unwrap().window(),
        Some(Duration::from_secs(30))
    );
    assert_eq!(applied.for_tool("get"), None, "read-only: left alone");
    // A tool's own table: a key source of its own replaces the suggestion's; another setting
    // joins it.
    let tables = json!({"suggested": true, "charge": {"keyArgument": "ref"},
                        "refund": {"wait": "0s"}});
    let mixed = ToolPolicies::from_json(&tables).unwrap();
    assert!(mixed.is_suggested());
    let applied = mixed.with_listed_tools(&listed).unwrap();
    let charge = applied.for_tool("charge").unwrap();
    assert_eq!(charge.key_argument(), Some("ref"));
    assert_eq!(charge.key_from().count(), 0);
    assert!(!charge.required());
    let refund = applied.for_tool("refund").unwrap();
    assert_eq!(refund.key_from().collect::<Vec<_>>(), ["/order_id"]);
    assert_eq!(refund.wait(), Duration::ZERO);
    // Without the word, nothing is suggested; a wrong word names the accepted forms.
    let plain = ToolPolicies::from_json(&json!({"suggested": {"window": "5s"}})).unwrap();
    assert!(!plain.is_suggested());
    assert!(
        plain.for_tool("suggested").is_some(),
        "a tool named suggested"
    );
    let err = ToolPolicies::from_json(&json!("suggest")).unwrap_err();
    assert!(err.to_string().contains("\"suggested\""), "{err}");
}
