use std::time::Duration;

use serde_json::json;

use super::*;

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
