//! The fingerprint parser on arbitrary text: it never panics, and whenever the text is JSON whose
//! numbers are all integers serde_json keeps exactly, re-serializing it (compact or pretty, which
//! changes whitespace, member order is kept, escapes are re-spelled) gives the same fingerprint.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_idempotency::fingerprint::fingerprint;
use serde_json::Value;

fn exact_integers_only(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::Array(items) => items.iter().all(exact_integers_only),
        Value::Object(members) => members.values().all(exact_integers_only),
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ours = fingerprint("tool", Some(text));
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return;
    };
    // Integers in the text must be exact in serde_json too (it reads big ones as floats).
    if !exact_integers_only(&value) || text.contains(['.', 'e', 'E']) {
        return;
    }
    let ours = ours.expect("serde_json accepted it, so must the strict parser");
    for respelled in [
        serde_json::to_string(&value).unwrap(),
        serde_json::to_string_pretty(&value).unwrap(),
    ] {
        assert_eq!(
            fingerprint("tool", Some(&respelled)).unwrap(),
            ours,
            "{text:?} vs {respelled:?}"
        );
    }
});
