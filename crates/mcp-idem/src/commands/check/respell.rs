//! Other spellings of the same JSON value, and a value that differs: the arguments of the
//! equivalence and conflict checks.
//!
//! SEP-3182 compares parsed values: reordered members, whitespace, `1` vs `1.0` and escaped
//! strings are the same arguments. Each function here writes the witness arguments one such way,
//! or returns `None` when the arguments give it nothing to work on (no number to re-spell, say).

use serde_json::{Map, Number, Value};

/// How to write a value.
#[derive(Clone, Copy, Default)]
struct Style {
    /// Object members in reverse order, with spaces around every token.
    reorder: bool,
    /// Every number written another way: `1` as `1.0`, `12.5` as `1250e-2`.
    numbers: bool,
    /// Every character of every string (member names too) as a `\uXXXX` escape.
    escape: bool,
}

/// `value` with the members of every object in reverse order and spaces between tokens; `None`
/// if no object has two members or more.
pub(crate) fn reordered(value: &Value) -> Option<String> {
    has(value, &|v| v.as_object().is_some_and(|o| o.len() >= 2)).then(|| {
        write(
            value,
            Style {
                reorder: true,
                ..Style::default()
            },
        )
    })
}

/// `value` with every number written differently but equal (`1` as `1.0`); `None` if it has no
/// number.
pub(crate) fn respelled_numbers(value: &Value) -> Option<String> {
    has(value, &Value::is_number).then(|| {
        write(
            value,
            Style {
                numbers: true,
                ..Style::default()
            },
        )
    })
}

/// `value` with every string and member name written as `\uXXXX` escapes; `None` if it has no
/// string and no member.
pub(crate) fn escaped_strings(value: &Value) -> Option<String> {
    let stringy = |v: &Value| v.is_string() || v.as_object().is_some_and(|o| !o.is_empty());
    has(value, &stringy).then(|| {
        write(
            value,
            Style {
                escape: true,
                ..Style::default()
            },
        )
    })
}

/// A value that differs from `value`: its first number plus one, else its first string with a
/// suffix, else an object with one more member. Returns it and what changed.
pub(crate) fn different(value: &Value) -> Option<(Value, String)> {
    let mut changed = value.clone();
    if let Some(what) = change_first_number(&mut changed) {
        return Some((changed, what));
    }
    if let Some(what) = change_first_string(&mut changed) {
        return Some((changed, what));
    }
    let object = changed.as_object_mut()?;
    object.insert("mcpIdemCheck".into(), Value::Bool(true));
    Some((changed, "added the member \"mcpIdemCheck\": true".into()))
}

fn has(value: &Value, test: &dyn Fn(&Value) -> bool) -> bool {
    test(value)
        || match value {
            Value::Array(items) => items.iter().any(|v| has(v, test)),
            Value::Object(members) => members.values().any(|v| has(v, test)),
            _ => false,
        }
}

fn write(value: &Value, style: Style) -> String {
    let mut out = String::new();
    write_into(value, style, &mut out);
    out
}

fn write_into(value: &Value, style: Style, out: &mut String) {
    let sep = if style.reorder { " , " } else { "," };
    match value {
        Value::Null | Value::Bool(_) => out.push_str(&value.to_string()),
        Value::Number(n) if style.numbers => out.push_str(&respell_number(&n.to_string())),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, style, out),
        Value::Array(items) => {
            out.push_str(if style.reorder { "[ " } else { "[" });
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                write_into(item, style, out);
            }
            out.push_str(if style.reorder { " ]" } else { "]" });
        }
        Value::Object(members) => {
            out.push_str(if style.reorder { "{ " } else { "{" });
            let mut entries: Vec<(&String, &Value)> = members.iter().collect();
            if style.reorder {
                entries.reverse();
            }
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                write_string(name, style, out);
                out.push_str(if style.reorder { " : " } else { ":" });
                write_into(item, style, out);
            }
            out.push_str(if style.reorder { " }" } else { "}" });
        }
    }
}

fn write_string(s: &str, style: Style, out: &mut String) {
    if !style.escape {
        out.push_str(&Value::from(s).to_string());
        return;
    }
    out.push('"');
    let mut units = [0u16; 2];
    for c in s.chars() {
        for unit in c.encode_utf16(&mut units) {
            out.push_str(&format!("\\u{unit:04x}"));
        }
    }
    out.push('"');
}

/// The same number written another way: an integer `N` as `N.0`; anything else as its digits
/// followed by a zero, with the exponent adjusted (`12.5` as `1250e-2`, `1e20` as `10e19`).
fn respell_number(text: &str) -> String {
    let (sign, unsigned) = match text.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", text),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.trim_start_matches('+').parse::<i64>().unwrap_or(0)),
        None => (unsigned, 0),
    };
    if !unsigned.contains(['.', 'e', 'E']) {
        return format!("{text}.0");
    }
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return format!("{sign}0.0e1");
    }
    let exponent = exponent - frac.len() as i64 - 1;
    format!("{sign}{digits}0e{exponent}")
}

fn change_first_number(value: &mut Value) -> Option<String> {
    match value {
        Value::Number(n) => {
            let old = n.to_string();
            let new = if let Some(i) = n.as_i64() {
                Number::from(i.checked_add(1).unwrap_or(i - 1))
            } else if let Some(u) = n.as_u64() {
                Number::from(u.checked_add(1).unwrap_or(u - 1))
            } else {
                Number::from_f64(n.as_f64()? + 1.0)?
            };
            let what = format!("{old} became {new}");
            *n = new;
            Some(what)
        }
        Value::Array(items) => items.iter_mut().find_map(change_first_number),
        Value::Object(members) => first_member(members, change_first_number),
        _ => None,
    }
}

fn change_first_string(value: &mut Value) -> Option<String> {
    match value {
        Value::String(s) => {
            let what = format!("{:?} became {:?}", s, format!("{s}-changed"));
            s.push_str("-changed");
            Some(what)
        }
        Value::Array(items) => items.iter_mut().find_map(change_first_string),
        Value::Object(members) => first_member(members, change_first_string),
        _ => None,
    }
}

fn first_member(
    members: &mut Map<String, Value>,
    change: fn(&mut Value) -> Option<String>,
) -> Option<String> {
    members
        .iter_mut()
        .find_map(|(name, v)| change(v).map(|what| format!("{name}: {what}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `text` parsed, with every number as a float (so `1` and `1.0` are equal).
    fn parse(text: &str) -> Value {
        fn floats(value: Value) -> Value {
            match value {
                Value::Number(n) => Value::from(n.as_f64().unwrap()),
                Value::Array(items) => Value::Array(items.into_iter().map(floats).collect()),
                Value::Object(members) => {
                    Value::Object(members.into_iter().map(|(k, v)| (k, floats(v))).collect())
                }
                other => other,
            }
        }
        floats(serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}")))
    }

    #[test]
    fn every_spelling_parses_to_the_same_value_and_differs_in_text() {
        let value = json!({"amount": 12.5, "currency": "usd", "n": [1, -0.5, 1e20], "é": "😀"});
        let plain = value.to_string();
        for spelled in [
            reordered(&value).unwrap(),
            respelled_numbers(&value).unwrap(),
            escaped_strings(&value).unwrap(),
        ] {
            assert_ne!(spelled, plain);
            assert_eq!(parse(&spelled), parse(&plain), "{spelled}");
        }
    }

    #[test]
    fn numbers_are_respelled_exactly() {
        for (text, respelled) in [
            ("1", "1.0"),
            ("-7", "-7.0"),
            ("12.5", "1250e-2"),
            ("0.5", "50e-2"),
            ("1e20", "10e19"),
            ("1.5e-7", "150e-9"),
            ("-0.0", "-0.0e1"),
        ] {
            assert_eq!(respell_number(text), respelled, "{text}");
            let a: f64 = text.parse().unwrap();
            let b: f64 = respelled.parse().unwrap();
            assert_eq!(a, b, "{text} vs {respelled}");
        }
        assert_eq!(
            respelled_numbers(&json!({"amount": 12.5, "currency": "usd"})).unwrap(),
            r#"{"amount":1250e-2,"currency":"usd"}"#
        );
    }

    #[test]
    fn nothing_to_respell_gives_none() {
        assert_eq!(respelled_numbers(&json!({"currency": "usd"})), None);
        assert_eq!(reordered(&json!({"currency": "usd"})), None);
        assert_eq!(escaped_strings(&json!({})), None);
        assert_eq!(
            reordered(&json!({"a": 1, "b": 2})).unwrap(),
            r#"{ "b" : 2 , "a" : 1 }"#
        );
        assert_eq!(
            escaped_strings(&json!({"a": "b"})).unwrap(),
            r#"{"\u0061":"\u0062"}"#
        );
    }

    #[test]
    fn different_changes_one_thing() {
        let (changed, what) = different(&json!({"amount": 12.5, "currency": "usd"})).unwrap();
        assert_eq!(changed, json!({"amount": 13.5, "currency": "usd"}));
        assert_eq!(what, "amount: 12.5 became 13.5");
        let (changed, _) = different(&json!({"to": "bob"})).unwrap();
        assert_eq!(changed, json!({"to": "bob-changed"}));
        let (changed, _) = different(&json!({})).unwrap();
        assert_eq!(changed, json!({"mcpIdemCheck": true}));
        assert_eq!(different(&json!(null)), None);
        let (changed, _) = different(&json!({"n": 9})).unwrap();
        assert_eq!(changed, json!({"n": 10}));
    }
}
