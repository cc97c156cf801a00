use super::*;
use sha2::{Digest, Sha256};

fn fp(args: &str) -> Fingerprint {
    fingerprint("tool", Some(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn err(args: &str) -> ArgumentsError {
    match fingerprint("tool", Some(args)) {
        Ok(_) => panic!("{args:?} was accepted"),
        Err(e) => e,
    }
}

fn malformed_at(args: &str) -> usize {
    match err(args) {
        ArgumentsError::Malformed { offset, .. } => offset,
        other => panic!("{args:?}: expected Malformed, got {other:?}"),
    }
}

fn canonical(args: &str) -> Vec<u8> {
    let mut bufs = parser::Buffers::new();
    parser::parse("", args, &mut bufs).unwrap();
    bufs.canonical()
}

fn all_same(spellings: &[&str]) {
    let first = fp(spellings[0]);
    for s in &spellings[1..] {
        assert_eq!(fp(s), first, "{s:?} vs {:?}", spellings[0]);
    }
}

fn all_distinct(values: &[&str]) {
    for (i, a) in values.iter().enumerate() {
        for b in &values[i + 1..] {
            assert_ne!(fp(a), fp(b), "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn hex_round_trip() {
    let f = fp(r#"{"a":1}"#);
    let hex = f.to_hex();
    assert_eq!(hex.len(), 64);
    assert!(hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(Fingerprint::from_hex(&hex), Some(f));
    assert_eq!(Fingerprint::from_hex(&hex.to_uppercase()), Some(f));
    assert_eq!(f.to_string(), hex);
    assert_eq!(format!("{f:?}"), format!("Fingerprint({}…)", &hex[..12]));
    assert_eq!(Fingerprint::from_bytes(*f.as_bytes()), f);
}

#[test]
fn from_hex_rejects_bad_input() {
    let hex = "ab".repeat(32);
    assert!(Fingerprint::from_hex(&hex).is_some());
    assert_eq!(Fingerprint::from_hex(&hex[..62]), None);
    assert_eq!(Fingerprint::from_hex(&format!("{hex}00")), None);
    assert_eq!(Fingerprint::from_hex(&format!("g{}", &hex[1..])), None);
    assert_eq!(Fingerprint::from_hex(&format!("{}é", &hex[..62])), None);
    assert_eq!(Fingerprint::from_hex(""), None);
}

#[test]
fn digest_is_sha256_of_documented_encoding() {
    let mut expected = b"mcp-idem-fp-v1\0".to_vec();
    expected.extend_from_slice(b"s\x04tool");
    expected.extend_from_slice(b"{s\x01a15e-1;s\x01b[tfn]}");
    let digest: [u8; 32] = Sha256::digest(&expected).into();
    assert_eq!(
        fp(r#"{"b":[true,false,null],"a":1.50}"#).as_bytes(),
        &digest
    );
}

#[test]
fn streamed_digest_matches_canonical_encoding() {
    let mut text = String::from("[");
    for i in 0..2000 {
        let pad = "q".repeat(i % 50);
        text.push_str(&format!(
            r#"{{"z":{i},"long\n{pad}":"{pad}","a":[{{"y":1,"x":"\u00e9"}}],"b":{{}}}},"#
        ));
    }
    text.push_str(&format!(
        r#""{}", {{"k":"{}","c":0}}]"#,
        "w".repeat(40_000),
        "v".repeat(20_000)
    ));
    let mut expected = b"mcp-idem-fp-v1\0s\x04tool".to_vec();
    expected.extend_from_slice(&canonical(&text));
    let digest: [u8; 32] = Sha256::digest(&expected).into();
    assert_eq!(fp(&text).as_bytes(), &digest);
}

#[test]
fn absent_null_and_empty_object_are_equivalent() {
    let absent = fingerprint("tool", None).unwrap();
    for args in ["{}", "null", " null\n", "{ }", "\t{\r\n}"] {
        assert_eq!(fp(args), absent, "{args:?}");
    }
    assert_ne!(fp("[]"), absent);
    assert_ne!(fp("[null]"), fp("[{}]"));
    assert_ne!(fp(r#"{"a":null}"#), fp(r#"{"a":{}}"#));
}

#[test]
fn whitespace_and_member_order_are_ignored() {
    all_same(&[
        r#"{"a":1,"b":[1,2,{"c":"d","e":null}]}"#,
        r#"{"b":[1,2,{"e":null,"c":"d"}],"a":1}"#,
        " {\n\t\"b\" : [ 1 , 2 , { \"e\" : null , \"c\" : \"d\" } ] ,\r\n \"a\" : 1 } \n",
    ]);
}

#[test]
fn array_order_matters() {
    all_distinct(&["[1,2]", "[2,1]", "[1,2,2]", "[[1],2]", "[1,[2]]", "[12]"]);
}

#[test]
fn members_sort_by_unescaped_key_bytes() {
    assert_eq!(
        canonical(r#"{"b":1,"\u0061":2,"é":3,"Z":4}"#),
        b"{s\x01Z4;s\x01a2;s\x01b1;s\x02\xc3\xa93;}"
    );
    all_same(&[r#"{"b":1,"":2,"a":3}"#, r#"{"":2,"a":3,"b":1}"#]);
    all_same(&[
        r#"{"b":0,"":{"":{"z":0,"":1}}}"#,
        r#"{"":{"":{"":1,"z":0}},"b":0}"#,
    ]);
    all_same(&[
        r#"{"abcdefgh2":0,"abcdefgh":1,"abcdefgh1":2}"#,
        r#"{"abcdefgh":1,"abcdefgh1":2,"abcdefgh2":0}"#,
    ]);
    all_same(&[r#"{"a\u0000":0,"a":1}"#, r#"{"a":1,"a\u0000":0}"#]);
    assert_ne!(fp(r#"{"a\u0000":0}"#), fp(r#"{"a":0}"#));
    let forward: Vec<String> = (0..500).map(|i| format!("\"k{i}\":{i}")).collect();
    let backward: Vec<String> = forward.iter().rev().cloned().collect();
    assert_eq!(
        fp(&format!("{{{}}}", forward.join(","))),
        fp(&format!("{{{}}}", backward.join(",")))
    );
}

#[test]
fn repeated_key_sequences_reuse_the_sorted_order() {
    all_same(&[
        r#"[{"b":1,"a":2},{"b":3,"a":4},{"b":5,"b":6,"a":7},{"b":8,"b":9,"a":0}]"#,
        r#"[{"a":2,"b":1},{"a":4,"b":3},{"a":7,"b":6},{"a":0,"b":9}]"#,
    ]);
    all_same(&[
        r#"[{"zzzzzzzzA":1,"zzzzzzzzB":2,"a":0},{"zzzzzzzzB":1,"zzzzzzzzA":2,"a":0}]"#,
        r#"[{"a":0,"zzzzzzzzA":1,"zzzzzzzzB":2},{"a":0,"zzzzzzzzA":2,"zzzzzzzzB":1}]"#,
    ]);
    all_same(&[
        r#"[{"k\u0000":1,"k":2},{"k":1,"k\u0000":2},{"k":3,"k":4}]"#,
        r#"[{"k":2,"k\u0000":1},{"k":1,"k\u0000":2},{"k":4}]"#,
    ]);
    assert_ne!(
        fp(r#"[{"b":1,"a":2},{"b":3,"a":4}]"#),
        fp(r#"[{"b":1,"a":2},{"b":4,"a":3}]"#)
    );
}

#[test]
fn duplicate_members_last_occurrence_wins() {
    all_same(&[r#"{"x":2}"#, r#"{"x":1,"x":2}"#, r#"{"x":{"y":[1]},"x":2}"#]);
    assert_ne!(fp(r#"{"x":1,"x":2}"#), fp(r#"{"x":1}"#));
    all_same(&[r#"{"b":1,"a":2,"b":3}"#, r#"{"a":2,"b":3}"#]);
    all_same(&[r#"{"a":1,"a":2,"a":3,"c":0}"#, r#"{"c":0,"a":3}"#]);
    all_same(&[r#"{"\u0078":1,"x":2}"#, r#"{"x":2}"#]);
    all_same(&[
        r#"[{"k":{"z":1,"z":2},"k":{"a":1,"a":{"q":0,"q":5}}}]"#,
        r#"[{"k":{"a":{"q":5}}}]"#,
    ]);
}

#[test]
fn strings_compare_after_unescaping() {
    all_same(&[r#""é""#, r#""\u00e9""#, r#""\u00E9""#]);
    all_same(&[r#""/""#, r#""\/""#, r#""\u002f""#]);
    all_same(&[r#""😀""#, r#""\ud83d\ude00""#, r#""\uD83D\uDE00""#]);
    all_same(&[
        "\"\\n\\t\\r\\b\\f\\\"\\\\\"",
        "\"\\u000a\\u0009\\u000d\\u0008\\u000c\\u0022\\u005c\"",
    ]);
    all_same(&[r#""\u0000""#, "\"\\u0000\""]);
    all_same(&[r#"{"clé":"v"}"#, r#"{"cl\u00e9":"\u0076"}"#]);
    all_same(&["\"a\u{7f}\"", r#""a\u007f""#]);
}

#[test]
fn strings_are_not_unicode_normalised() {
    all_distinct(&[r#""é""#, r#""e\u0301""#]);
    all_same(&[r#""e\u0301""#, "\"e\u{301}\""]);
    all_distinct(&[r#""a""#, r#""A""#, r#""a ""#, r#""""#]);
}

#[test]
fn string_lengths_are_leb128() {
    let encoded = |len: usize| canonical(&format!("\"{}\"", "a".repeat(len)));
    assert_eq!(encoded(0), b"s\0");
    assert_eq!(&encoded(127)[..2], b"s\x7f");
    assert_eq!(&encoded(128)[..4], b"s\x80\x01a");
    assert_eq!(encoded(128).len(), 3 + 128);
    assert_eq!(&encoded(16_384)[..5], b"s\x80\x80\x01a");
    let long_key = "k".repeat(200);
    assert_eq!(
        canonical(&format!(
            r#"{{"{long_key}":1,"b":[{{"{long_key}":2,"a":3}}],"a":0}}"#
        )),
        canonical(&format!(
            r#"{{"a":0,"b":[{{"a":3,"{long_key}":2}}],"{long_key}":1}}"#
        )),
    );
}

#[test]
fn long_strings_with_mixed_escapes() {
    let plain = "abcdefghijklmnopqrstuvwxyz0123456789 é😀".repeat(40);
    let escaped: String = plain
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 7 == 0 {
                let mut units = [0u16; 2];
                c.encode_utf16(&mut units)
                    .iter()
                    .map(|u| format!("\\u{u:04x}"))
                    .collect()
            } else {
                c.to_string()
            }
        })
        .collect();
    assert_eq!(fp(&format!("\"{plain}\"")), fp(&format!("\"{escaped}\"")));
}

#[test]
fn invalid_strings_are_malformed() {
    assert_eq!(malformed_at(r#""\ud83d""#), 1);
    assert_eq!(malformed_at(r#""\ud83dx""#), 1);
    assert_eq!(malformed_at(r#""\ud83d\u0041""#), 1);
    assert_eq!(malformed_at(r#""\ud83d\ud83d""#), 1);
    assert_eq!(malformed_at(r#""ab\ude00""#), 3);
    assert_eq!(malformed_at(r#""\x""#), 1);
    assert_eq!(malformed_at(r#""\'""#), 1);
    assert_eq!(malformed_at(r#""\u12""#), 1);
    assert_eq!(malformed_at(r#""\u12g4""#), 1);
    assert_eq!(malformed_at(r#""\ud83d\u12""#), 7);
    assert_eq!(malformed_at("\"a\u{1}b\""), 2);
    assert_eq!(malformed_at("\"line\nbreak\""), 5);
    assert_eq!(malformed_at("\"tab\there\""), 4);
    assert_eq!(malformed_at("\"0123456789abcdef\u{1f}\""), 17);
    assert_eq!(malformed_at(r#""abc"#), 4);
    assert_eq!(malformed_at(r#""abc\"#), 5);
    assert_eq!(
        err(r#""\ud83d""#),
        ArgumentsError::Malformed {
            offset: 1,
            reason: "lone surrogate in \\u escape"
        }
    );
}

#[test]
fn numbers_compare_as_exact_decimals() {
    all_same(&[
        "1", "1.0", "1E0", "1e0", "10e-1", "0.1e1", "100e-2", "1.000e+0", "1e00",
    ]);
    all_same(&["0", "-0", "0.0", "0e5", "-0.0e-3", "0.000", "0E-999999"]);
    all_same(&["12", "12.0", "1.2e1", "120E-1", "0.12e+2", "1200e-2"]);
    all_same(&["-0.00123", "-1.23e-3", "-123e-5", "-0.0123E-1"]);
    all_same(&["1e999999999", "10e999999998", "0.1e1000000000"]);
    all_distinct(&[
        "9007199254740993",
        "9007199254740992",
        "1",
        "-1",
        "0",
        "0.1",
        "0.10000000000000001",
        "1e999999999",
        "1e-999999999",
        "10",
        "11",
        "1.1",
    ]);
}

#[test]
fn canonical_number_encoding() {
    assert_eq!(canonical("0"), b"0;");
    assert_eq!(canonical("-0.0e-3"), b"0;");
    assert_eq!(canonical("100"), b"1e2;");
    assert_eq!(canonical("-7"), b"-7;");
    assert_eq!(canonical("1.5e1"), b"15;");
    assert_eq!(canonical("-12.50"), b"-125e-1;");
    assert_eq!(canonical("0.00120"), b"12e-4;");
    assert_eq!(canonical("1e999999999"), b"1e999999999;");
    assert_eq!(
        canonical("1.5e-999999999999999999"),
        b"15e-1000000000000000000;"
    );
    assert_eq!(
        canonical("123456789012345678901234567890"),
        b"12345678901234567890123456789e1;"
    );
}

#[test]
fn exponent_limit() {
    assert!(fingerprint("tool", Some("1e999999999999999999")).is_ok());
    assert!(fingerprint("tool", Some("1e-0000000000000000000000999999999999999999")).is_ok());
    assert_eq!(
        err("1e1000000000000000000"),
        ArgumentsError::NumberOutOfRange { offset: 0 }
    );
    assert_eq!(
        err(r#"{"a": [1, -2.5E+1234567890123456789]}"#),
        ArgumentsError::NumberOutOfRange { offset: 10 }
    );
}

#[test]
fn invalid_numbers_are_malformed() {
    for (text, offset) in [
        ("01", 1),
        ("-01", 2),
        ("00", 1),
        ("1.", 2),
        ("1.e5", 2),
        (".5", 0),
        ("+1", 0),
        ("-", 1),
        ("-a", 1),
        ("NaN", 0),
        ("Infinity", 0),
        ("-Infinity", 1),
        ("1e", 2),
        ("1e+", 3),
        ("1E-x", 3),
        ("0x10", 1),
        ("1 2", 2),
        ("[1.5.2]", 4),
    ] {
        assert_eq!(malformed_at(text), offset, "{text:?}");
    }
}

#[test]
fn literals() {
    all_distinct(&[
        "true",
        "false",
        "null",
        "0",
        r#""""#,
        "[]",
        r#""true""#,
        r#""null""#,
    ]);
    assert_eq!(malformed_at("tru"), 0);
    assert_eq!(malformed_at("[nul]"), 1);
    assert_eq!(malformed_at("True"), 0);
    assert_eq!(malformed_at("truex"), 4);
}

#[test]
fn structure_errors() {
    for (text, offset, reason) in [
        ("", 0, "unexpected end of input"),
        ("   ", 3, "unexpected end of input"),
        ("{} {}", 3, "trailing characters"),
        ("{}x", 2, "trailing characters"),
        ("[1,]", 3, "expected value"),
        ("[1 2]", 3, "expected ',' or ']'"),
        ("[1", 2, "unexpected end of input"),
        (r#"{"a":1,}"#, 7, "expected string key"),
        ("{a:1}", 1, "expected string key"),
        (r#"{"a" 1}"#, 5, "expected ':'"),
        (r#"{"a":1 "b":2}"#, 7, "expected ',' or '}'"),
        (r#"{"a":"#, 5, "unexpected end of input"),
        ("{", 1, "unexpected end of input"),
        ("]", 0, "expected value"),
        ("\u{feff}{}", 0, "expected value"),
        ("{}\u{a0}", 2, "trailing characters"),
    ] {
        assert_eq!(
            err(text),
            ArgumentsError::Malformed { offset, reason },
            "{text:?}"
        );
    }
}

#[test]
fn depth_limit() {
    let nested =
        |open: &str, close: &str, n: usize| format!("{}0{}", open.repeat(n), close.repeat(n));
    assert!(fingerprint("tool", Some(&nested("[", "]", MAX_DEPTH))).is_ok());
    assert!(fingerprint("tool", Some(&nested(r#"{"a":"#, "}", MAX_DEPTH))).is_ok());
    let too_deep = ArgumentsError::TooDeep { max: MAX_DEPTH };
    assert_eq!(err(&nested("[", "]", MAX_DEPTH + 1)), too_deep);
    assert_eq!(err(&nested(r#"{"a":"#, "}", MAX_DEPTH + 1)), too_deep);
    assert_eq!(err(&"[".repeat(100_000)), too_deep);
    assert_eq!(err(&r#"[{"a":"#.repeat(100_000)), too_deep);
}

#[test]
fn tool_name_is_part_of_the_fingerprint() {
    let args = Some(r#"{"a":1}"#);
    assert_ne!(
        fingerprint("a", args).unwrap(),
        fingerprint("b", args).unwrap()
    );
    assert_ne!(
        fingerprint("", None).unwrap(),
        fingerprint(" ", None).unwrap()
    );
    assert_ne!(
        fingerprint("x{}", Some("[]")).unwrap(),
        fingerprint("x", Some("[]")).unwrap()
    );
    assert_eq!(
        fingerprint("é", None).unwrap(),
        fingerprint("\u{e9}", None).unwrap()
    );
}

#[test]
fn encoding_is_unambiguous_across_boundaries() {
    all_distinct(&[
        r#"["a","b"]"#,
        r#"["ab"]"#,
        r#"["a","","b"]"#,
        r#"{"a":"b"}"#,
        r#"{"ab":""}"#,
        r#"{"a":{"b":null}}"#,
        r#"[[],[]]"#,
        r#"[[[]]]"#,
        r#"[1,2]"#,
        r#"[12]"#,
        r#"["1"]"#,
        r#"[1]"#,
        r#"["1;"]"#,
    ]);
}

#[test]
fn buffers_are_reset_after_errors() {
    let good = r#"{"b":{"y":1,"x":2},"a":[1,2]}"#;
    let before = fp(good);
    assert!(fingerprint("tool", Some(r#"{"b":{"y":1,"x":2},"a":[1,"#)).is_err());
    assert!(fingerprint("tool", Some(&"[".repeat(500))).is_err());
    assert_eq!(fp(good), before);
}

#[test]
fn error_messages() {
    assert_eq!(
        err("[1,]").to_string(),
        "arguments are not valid JSON at byte 3: expected value"
    );
    assert_eq!(
        ArgumentsError::TooDeep { max: MAX_DEPTH }.to_string(),
        "arguments nest deeper than 128 levels"
    );
    assert_eq!(
        ArgumentsError::NumberOutOfRange { offset: 7 }.to_string(),
        "number at byte 7 has an exponent outside the supported range"
    );
}

/// Digests recorded before the parser and hasher were tuned for speed (and checked
/// against an independent implementation of the documented encoding): any change to the
/// canonical encoding, or to how it is fed to SHA-256, breaks this test.
#[test]
fn pinned_digests() {
    let mut records = String::from("[");
    for i in 0..400u32 {
        let pad = "p".repeat((i % 37) as usize * 7);
        records.push_str(&format!(
            r#"{{"name":"n{i}\t\u00e9{pad}","id":{i},"score":-{i}.{}e-{},"tags":["x","\ud83d\ude00"],"geo":{{"lng":1.{i},"lat":0.0{i}}},"id":{}}},"#,
            i % 10,
            i % 4,
            i * 3
        ));
    }
    records.push_str(r#"{"z":null,"y":true,"x":false}]"#);
    let long_key = "k".repeat(300);
    let mut wide = String::from("[");
    for i in 0..60usize {
        let pad = "w".repeat((i * 131) % 6000);
        wide.push_str(&format!(
            r#"{{"zeta_long_name_{}":{i},"alpha_long_name":{{"y":[{i},{{"q":1,"p":2}}],"x":"{}"}},"alpha_long_namf":-{i}.50,"m":true,"m":false,"beta":"{pad}","gamma_gamma":null,"delta_delta_delta":[1,2,3],"epsilon":"\u00e9","eta":0.0,"alpha_long_name":"dup{i}"}},"#,
            i % 3,
            &pad[..pad.len().min(20)],
        ));
    }
    wide.push_str("{}]");
    let cases: [(&str, Option<&str>, &str); 8] = [
        (
            "tool",
            None,
            "a6aa95f9365fda501d1583010f0fbff2919abdcd5e87097657a102760ba1f746",
        ),
        (
            "tool",
            Some(
                r#"{"customer_id":"cus_9f8e7d6c","amount":1999,"currency":"usd","description":"Order #1042 – rush","items":[{"sku":"A-17","qty":2,"price":9.995}],"metadata":{"source":"web","retry":false},"dry_run":false}"#,
            ),
            "1df7ad78cd4c100e7d7fc2254a8e6c6f2401428389af58be47d654000cb1eb72",
        ),
        (
            "transfer",
            Some(
                r#" {"b":[true,false,null],"a":1.50,"a":-0.0120e+3,"c":{"z":"\u00e9\n","y":{"k":"v","j":[]}}} "#,
            ),
            "4a5cc9e7fe2bd867a695b47e3160be90a29fe1c85d9d94066e912a79d10f02a7",
        ),
        (
            "é",
            Some(
                r#"[{"b":1,"a":2},{"b":3,"a":4,"b":5},{"a":6,"b":7},{"abcdefgh2":0,"abcdefgh":1,"abcdefgh1":2}]"#,
            ),
            "279888018a1788bd35faeab91e868992e707b875f1275e902219a5f571c217ed",
        ),
        (
            "t",
            Some(&format!(
                r#"{{"{long_key}":"{long_key}","a":[1e999999999,0,-0.5,100]}}"#
            )),
            "0d153bd29883d9b7b9de40cd356858d4bdc166b1238aea3de15680188a934d5b",
        ),
        (
            "big",
            Some(&records),
            "d57c956d07212f91d50526ccbe55ca8d785888c4e8a446449390058573426ebb",
        ),
        (
            "",
            Some(r#""just a string \"with\" escapes \/ \b\f\r""#),
            "5213a6f418a757ba5a8231de21763209571a10d4bc6b4330dc5b35a79d00d1d7",
        ),
        (
            "wide",
            Some(&wide),
            "3582f9026917f986381d49fbf8254a5087442ac3ca254fd3c634484d1f072373",
        ),
    ];
    for (tool, args, hex) in cases {
        let digest = fingerprint(tool, args).unwrap().to_hex();
        assert_eq!(digest, hex, "{tool:?} {args:?}");
    }
}

/// Objects with more members than are sorted directly reuse the order found for their
/// previous sibling; that order must not be reused for names that only share their
/// first eight bytes and length, even after the sibling was rewritten in place.
#[test]
fn recent_order_compares_whole_names() {
    let padding: String = (0..9).rev().map(|i| format!(r#""pad{i}":{i},"#)).collect();
    let sorted_padding: String = (0..9).map(|i| format!(r#","pad{i}":{i}"#)).collect();
    let row = |first: &str, second: &str| format!(r#"{{{padding}"{first}":1,"{second}":2}}"#);
    let sorted_row = |(a, x): (&str, u8), (b, y): (&str, u8)| {
        format!(r#"{{"{a}":{x},"{b}":{y}{sorted_padding}}}"#)
    };
    all_same(&[
        &format!(
            "[{},{},{}]",
            row("prefix00_b", "prefix00_a"),
            row("prefix00_a", "prefix00_b"),
            row("prefix00_d", "prefix00_c"),
        ),
        &format!(
            "[{},{},{}]",
            sorted_row(("prefix00_a", 2), ("prefix00_b", 1)),
            sorted_row(("prefix00_a", 1), ("prefix00_b", 2)),
            sorted_row(("prefix00_c", 2), ("prefix00_d", 1)),
        ),
    ]);
    // Duplicates and a row too large to rewrite in place.
    let big = "x".repeat(5000);
    all_same(&[
        &format!(
            r#"[{},{{"pad9":"{big}",{padding}"prefix00_a":1,"prefix00_a":3}}]"#,
            row("prefix00_b", "prefix00_a"),
        ),
        &format!(
            r#"[{},{{"prefix00_a":3{sorted_padding},"pad9":"{big}"}}]"#,
            sorted_row(("prefix00_a", 2), ("prefix00_b", 1)),
        ),
    ]);
}

/// Deeply nested objects out of order: past the budget for rewriting in place, the
/// outer levels are put in order while hashing, around inner levels already rewritten.
#[test]
fn deeply_nested_objects_out_of_order() {
    let mut unsorted = String::from("0");
    let mut sorted = String::from("0");
    // The innermost array makes one level more.
    for level in 0..MAX_DEPTH - 1 {
        unsorted =
            format!(r#"{{"z{level}":{level},"m":{unsorted},"a":[{level}],"z{level}":-{level}}}"#);
        sorted = format!(r#"{{"a":[{level}],"m":{sorted},"z{level}":-{level}}}"#);
    }
    all_same(&[&unsorted, &sorted]);
    assert_ne!(fp(&unsorted), fp(&unsorted.replacen("-0", "-1", 1)));
}
