//! Property tests: re-spellings of a value share a fingerprint, single-leaf changes do not,
//! and arbitrary input never panics.

use mcp_idempotency::fingerprint::{fingerprint, ArgumentsError, Fingerprint};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    /// `±mantissa × 10^exponent`.
    Num {
        negative: bool,
        mantissa: u64,
        exponent: i32,
    },
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}",
        prop::collection::vec(any::<char>(), 0..8).prop_map(String::from_iter),
        prop::sample::select(vec![
            "",
            "é",
            "e\u{301}",
            "😀",
            "\"\\/",
            "\n\t\u{0}",
            "\u{ffff}"
        ])
        .prop_map(String::from),
    ]
}

/// Any JSON value nesting at most five levels, or an array of objects sharing one
/// set of member names.
fn arb_json() -> impl Strategy<Value = Json> {
    let table = (
        prop::collection::btree_set(arb_string(), 1..5),
        prop::collection::vec(prop::collection::vec(arb_tree(2), 5), 1..5),
    )
        .prop_map(|(keys, rows)| {
            Json::Arr(
                rows.into_iter()
                    .map(|row| Json::Obj(keys.iter().cloned().zip(row).collect()))
                    .collect(),
            )
        });
    prop_oneof![3 => arb_tree(4), 1 => table]
}

/// A JSON value with at most `depth` levels of arrays and objects above its leaves.
fn arb_tree(depth: u32) -> impl Strategy<Value = Json> {
    let number = (
        any::<bool>(),
        prop_oneof![0u64..1000, any::<u64>()],
        -30i32..30,
    )
        .prop_map(|(negative, mantissa, exponent)| Json::Num {
            negative,
            mantissa,
            exponent,
        });
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        number,
        arb_string().prop_map(Json::Str),
    ];
    leaf.prop_recursive(depth, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Json::Arr),
            prop::collection::btree_map(arb_string(), inner, 0..6)
                .prop_map(|members| Json::Obj(members.into_iter().collect())),
        ]
    })
}

/// SplitMix64, so one `u64` from proptest drives every rendering choice.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// Writes `value` as JSON text; with an `Rng`, every spelling choice is randomised.
struct Renderer {
    rng: Option<Rng>,
    out: String,
}

impl Renderer {
    fn render(value: &Json, seed: Option<u64>) -> String {
        let mut r = Renderer {
            rng: seed.map(Rng),
            out: String::new(),
        };
        r.ws();
        r.value(value);
        r.ws();
        r.out
    }

    fn ws(&mut self) {
        if let Some(rng) = &mut self.rng {
            for _ in 0..rng.below(3) {
                self.out
                    .push([' ', '\t', '\n', '\r'][rng.below(4) as usize]);
            }
        }
    }

    fn value(&mut self, value: &Json) {
        match value {
            Json::Null => self.out.push_str("null"),
            Json::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Json::Num {
                negative,
                mantissa,
                exponent,
            } => self.number(*negative, *mantissa, *exponent),
            Json::Str(s) => self.string(s),
            Json::Arr(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.ws();
                        self.out.push(',');
                    }
                    self.ws();
                    self.value(item);
                }
                self.ws();
                self.out.push(']');
            }
            Json::Obj(members) => {
                let mut order: Vec<(&str, Option<&Json>)> =
                    members.iter().map(|(k, v)| (k.as_str(), Some(v))).collect();
                if let Some(rng) = &mut self.rng {
                    for i in (1..order.len()).rev() {
                        order.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    if !order.is_empty() && rng.chance(3) {
                        let target = rng.below(order.len() as u64) as usize;
                        order.insert(target, (order[target].0, None));
                    }
                }
                self.out.push('{');
                for (i, (key, value)) in order.into_iter().enumerate() {
                    if i > 0 {
                        self.ws();
                        self.out.push(',');
                    }
                    self.ws();
                    self.string(key);
                    self.ws();
                    self.out.push(':');
                    self.ws();
                    match value {
                        Some(value) => self.value(value),
                        None => self.out.push_str("[\"overwritten duplicate\"]"),
                    }
                }
                self.ws();
                self.out.push('}');
            }
        }
    }

    fn number(&mut self, negative: bool, mantissa: u64, exponent: i32) {
        let Some(rng) = &mut self.rng else {
            if negative {
                self.out.push('-');
            }
            self.out.push_str(&mantissa.to_string());
            if exponent != 0 {
                self.out.push_str(&format!("e{exponent}"));
            }
            return;
        };
        if mantissa == 0 {
            if rng.chance(2) {
                self.out.push('-');
            }
            let zero = ["0", "0.0", "0e5", "0.000E-3", "0E+0", "0.0e-0"][rng.below(6) as usize];
            self.out.push_str(zero);
            return;
        }
        if negative {
            self.out.push('-');
        }
        let trailing = rng.below(3) as usize;
        let digits = format!("{mantissa}{}", "0".repeat(trailing));
        let mut exp = i64::from(exponent) - trailing as i64;
        let point = rng.below(digits.len() as u64 + 1) as usize;
        let (int, frac) = if point == 0 {
            let leading = rng.below(3) as usize;
            exp += (leading + digits.len()) as i64;
            ("0".to_string(), format!("{}{digits}", "0".repeat(leading)))
        } else {
            exp += (digits.len() - point) as i64;
            (digits[..point].to_string(), digits[point..].to_string())
        };
        let frac = format!("{frac}{}", "0".repeat(rng.below(2) as usize));
        self.out.push_str(&int);
        if !frac.is_empty() {
            self.out.push('.');
            self.out.push_str(&frac);
        }
        if exp != 0 || rng.chance(2) {
            self.out.push(if rng.chance(2) { 'e' } else { 'E' });
            if exp < 0 {
                self.out.push('-');
            } else if rng.chance(2) {
                self.out.push('+');
            }
            self.out.push_str(&"0".repeat(rng.below(3) as usize));
            self.out.push_str(&exp.unsigned_abs().to_string());
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            let escape_anyway = self.rng.as_mut().is_some_and(|rng| rng.chance(4));
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\t' => Some("\\t"),
                '\r' => Some("\\r"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '/' if escape_anyway => Some("\\/"),
                _ => None,
            };
            let must_escape = short.is_some() || c < ' ';
            let use_unicode = self.rng.as_mut().is_some_and(|rng| rng.chance(2));
            if (must_escape || escape_anyway) && (use_unicode || short.is_none()) {
                let upper = self.rng.as_mut().is_some_and(|rng| rng.chance(2));
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let hex = if upper {
                        format!("\\u{unit:04X}")
                    } else {
                        format!("\\u{unit:04x}")
                    };
                    self.out.push_str(&hex);
                }
            } else if let Some(short) = short {
                self.out.push_str(short);
            } else {
                self.out.push(c);
            }
        }
        self.out.push('"');
    }
}

fn fp(text: &str) -> Fingerprint {
    fingerprint("tool", Some(text)).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn leaf_count(value: &Json) -> usize {
    match value {
        Json::Arr(items) if !items.is_empty() => items.iter().map(leaf_count).sum(),
        Json::Obj(members) if !members.is_empty() => {
            members.iter().map(|(_, v)| leaf_count(v)).sum()
        }
        _ => 1,
    }
}

/// Changes the `index`-th leaf (empty containers count as leaves) to a different value.
fn mutate_leaf(value: &mut Json, index: &mut usize, choice: u64) -> bool {
    match value {
        Json::Arr(items) if !items.is_empty() => {
            items.iter_mut().any(|v| mutate_leaf(v, index, choice))
        }
        Json::Obj(members) if !members.is_empty() => members
            .iter_mut()
            .any(|(_, v)| mutate_leaf(v, index, choice)),
        _ if *index > 0 => {
            *index -= 1;
            false
        }
        leaf => {
            *leaf = match leaf.clone() {
                Json::Null => Json::Num {
                    negative: false,
                    mantissa: 0,
                    exponent: 0,
                },
                Json::Bool(b) => Json::Bool(!b),
                Json::Num {
                    negative,
                    mantissa,
                    exponent,
                } => match (choice % 3, mantissa) {
                    (_, 0) => Json::Num {
                        negative,
                        mantissa: 1,
                        exponent,
                    },
                    (0, _) => Json::Num {
                        negative: !negative,
                        mantissa,
                        exponent,
                    },
                    (1, _) => Json::Num {
                        negative,
                        mantissa,
                        exponent: exponent + 1,
                    },
                    _ => Json::Num {
                        negative,
                        mantissa: mantissa.checked_add(1).unwrap_or(mantissa - 1),
                        exponent,
                    },
                },
                Json::Str(s) if choice.is_multiple_of(2) => Json::Str(format!("{s}x")),
                Json::Str(s) => Json::Str(format!("\u{e9}{s}")),
                Json::Arr(_) => Json::Arr(vec![Json::Null]),
                Json::Obj(_) => Json::Obj(vec![(String::new(), Json::Null)]),
            };
            true
        }
    }
}

/// Renames the member of the first non-empty object found walking down by `choice`.
fn rename_key(value: &mut Json, choice: u64) -> bool {
    match value {
        Json::Obj(members) if !members.is_empty() => {
            let i = (choice % members.len() as u64) as usize;
            if !rename_key(&mut members[i].1, choice / 7) {
                let mut key = format!("{}~", members[i].0);
                while members.iter().any(|(k, _)| *k == key) {
                    key.push('~');
                }
                members[i].0 = key;
            }
            true
        }
        Json::Arr(items) if !items.is_empty() => {
            let i = (choice % items.len() as u64) as usize;
            rename_key(&mut items[i], choice / 7)
        }
        _ => false,
    }
}

fn is_null_or_empty_object(value: &Json) -> bool {
    match value {
        Json::Null => true,
        Json::Obj(members) => members.is_empty(),
        _ => false,
    }
}

fn soup_token() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "\\",
        "0",
        "1",
        "9",
        "-",
        "+",
        ".",
        "e",
        "E",
        " ",
        "\n",
        "true",
        "null",
        "fals",
        "u",
        "\\u",
        "d83d",
        "\\ud83d",
        "\\udc00",
        "a",
        "é",
        "\u{1}",
        "\"k\":",
        "1e1000000000000000000",
    ])
}

/// serde_json accepting implies we accept (barring our exponent limit), and we accept
/// only what serde_json accepts; neither side may panic.
fn agrees_with_serde_json(text: &str) -> Result<(), TestCaseError> {
    let ours = fingerprint("tool", Some(text));
    if serde_json::from_str::<serde_json::Value>(text).is_ok() {
        prop_assert!(
            matches!(ours, Ok(_) | Err(ArgumentsError::NumberOutOfRange { .. })),
            "serde_json accepts {:?} but we return {:?}",
            text,
            ours
        );
    }
    if ours.is_ok() {
        prop_assert!(
            serde_json::from_str::<Box<serde_json::value::RawValue>>(text).is_ok(),
            "we accept {:?} but serde_json does not",
            text
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn respellings_share_a_fingerprint(value in arb_json(), seed_a: u64, seed_b: u64) {
        let plain = Renderer::render(&value, None);
        let a = Renderer::render(&value, Some(seed_a));
        let b = Renderer::render(&value, Some(seed_b));
        prop_assert!(serde_json::from_str::<serde_json::Value>(&a).is_ok(), "renderer produced {}", a);
        prop_assert_eq!(fp(&plain), fp(&a), "{} vs {}", plain, a);
        prop_assert_eq!(fp(&a), fp(&b), "{} vs {}", a, b);
    }

    #[test]
    fn changing_one_leaf_changes_the_fingerprint(
        value in arb_json(),
        pick: u64,
        choice: u64,
        seed_a: u64,
        seed_b: u64,
    ) {
        let mut changed = value.clone();
        let mut index = (pick % leaf_count(&value) as u64) as usize;
        prop_assert!(mutate_leaf(&mut changed, &mut index, choice));
        let before = Renderer::render(&value, Some(seed_a));
        let after = Renderer::render(&changed, Some(seed_b));
        prop_assert_ne!(fp(&before), fp(&after), "{} vs {}", before, after);
    }

    #[test]
    fn renaming_a_key_changes_the_fingerprint(
        members in prop::collection::btree_map(arb_string(), arb_json(), 1..6),
        choice: u64,
        seed_a: u64,
        seed_b: u64,
    ) {
        let value = Json::Obj(members.into_iter().collect());
        let mut changed = value.clone();
        prop_assert!(rename_key(&mut changed, choice));
        let before = Renderer::render(&value, Some(seed_a));
        let after = Renderer::render(&changed, Some(seed_b));
        prop_assert_ne!(fp(&before), fp(&after), "{} vs {}", before, after);
    }

    #[test]
    fn tool_name_changes_the_fingerprint(value in arb_json(), name in ".{0,12}", seed: u64) {
        let text = Renderer::render(&value, Some(seed));
        let other = format!("{name}_");
        prop_assert_ne!(
            fingerprint(&name, Some(&text)).unwrap(),
            fingerprint(&other, Some(&text)).unwrap()
        );
        if is_null_or_empty_object(&value) {
            prop_assert_eq!(fingerprint(&name, Some(&text)).unwrap(), fingerprint(&name, None).unwrap());
        }
    }

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        let _ = fingerprint("tool", Some(&text));
    }

    #[test]
    fn punctuation_soup_never_panics(tokens in prop::collection::vec(soup_token(), 0..40)) {
        let text = tokens.concat();
        agrees_with_serde_json(&text)?;
    }

    #[test]
    fn edited_valid_json_agrees_with_serde_json(
        value in arb_json(),
        seed: u64,
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0..3u8, soup_token()), 1..3),
    ) {
        let mut text = Renderer::render(&value, Some(seed));
        for (at, kind, token) in edits {
            let boundaries: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            let i = boundaries[at.index(boundaries.len())];
            let next = boundaries.iter().copied().find(|&j| j > i).unwrap_or(i);
            match kind {
                0 => text.insert_str(i, token),
                1 => text.replace_range(i..next, ""),
                _ => text.replace_range(i..next, token),
            }
        }
        agrees_with_serde_json(&text)?;
    }
}
