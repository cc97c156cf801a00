//! `mcp-idem inspect` on the store `mcp-idem wrap` filled: calls run through `wrap` around the demo
//! payment server (executions counted in its ledger), then `inspect list/show/stats/purge/delete`
//! (and `inspect` alone, which lists) read and change the same SQLite file, as tables and as JSON.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::support::common::ledger_lines;
use crate::support::wrap::{call, charge, charge_id, raw_outcome, Sandbox, EXE};

/// Options that put `wrap`'s records in the `shop` namespace for principal `alice`.
const SHOP: [&str; 4] = ["--namespace", "shop", "--principal", "alice"];

/// The result of one `mcp-idem inspect` run.
struct Inspect {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Inspect {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}\n{}", self.stdout, self.stderr))
    }

    fn ok(self) -> Self {
        assert_eq!(self.code, Some(0), "{}\n{}", self.stdout, self.stderr);
        self
    }
}

impl From<Output> for Inspect {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
            stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
        }
    }
}

/// `mcp-idem inspect --store sqlite://<store file> ARGS`, stdin closed (not a terminal).
fn command(sandbox: &Sandbox, args: &[&str]) -> Command {
    let mut command = Command::new(EXE);
    command
        .arg("inspect")
        .arg("--store")
        .arg(format!("sqlite://{}", sandbox.path("r.sqlite3").display()))
        .args(args)
        .env_remove("MCP_IDEM_STORE")
        .env("MCP_IDEM_LOG", "warn");
    command
}

fn inspect(sandbox: &Sandbox, args: &[&str]) -> Inspect {
    command(sandbox, args)
        .stdin(Stdio::null())
        .output()
        .expect("run mcp-idem inspect")
        .into()
}

/// Runs `wrap` with `options`, sends `charge_payment` with each `(key, arguments)`, and returns
/// the responses and the raw JSON text of each outcome.
fn charges(sandbox: &Sandbox, options: &[&str], calls: &[(&str, Value)]) -> Vec<(Value, String)> {
    let mut wrap = sandbox.wrap_demo(options);
    let mut answers = Vec::new();
    for (i, (key, arguments)) in calls.iter().enumerate() {
        let id = json!(i + 1);
        let response = wrap.request(charge(i + 1, arguments.clone(), key));
        answers.push((response, raw_outcome(&wrap, &id)));
    }
    assert_eq!(wrap.finish().code(), Some(0));
    answers
}

fn keys(listed: &Value) -> Vec<&str> {
    listed["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|record| record["key"].as_str().expect("key"))
        .collect()
}

#[test]
fn inspect_lists_shows_counts_purges_and_deletes_what_wrap_recorded() {
    let sandbox = Sandbox::new();
    let paid = json!({"amount": 4200, "currency": "usd"});
    let declined = json!({"amount": 7, "currency": "eur", "fail_after_charge": true});
    let answers = charges(
        &sandbox,
        &SHOP,
        &[("order-1", paid.clone()), ("order-2", declined.clone())],
    );
    // Recorded with a retention that ends at once: expired when inspected. (Last, because `wrap`
    // purges expired records when it starts.)
    charges(
        &sandbox,
        &[
            "--namespace",
            "shop-short",
            "--principal",
            "alice",
            "--retention",
            "1ms",
        ],
        &[("order-1", paid.clone())],
    );
    let first_charge = charge_id(&answers[0].0);
    let raw_result = &answers[0].1;
    let raw_error = &answers[1].1;
    assert!(answers[1].0.get("error").is_some(), "{}", answers[1].0);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 3);

    // The table: one row per record, expired ones included.
    let table = inspect(&sandbox, &["list"]).ok().stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for column in [
        "STATE",
        "AGE",
        "TOOL",
        "OUTCOME",
        "NAMESPACE",
        "PRINCIPAL",
        "SOURCE",
        "KEY",
    ] {
        assert!(lines[0].contains(column), "{table}");
    }
    let row = |key: &str, namespace: &str| {
        lines
            .iter()
            .find(|line| line.ends_with(key) && line.contains(&format!(" {namespace} ")))
            .unwrap_or_else(|| panic!("no row for {namespace}/{key} in\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let shop_1 = row("order-1", "shop");
    assert_eq!(shop_1[0], "completed");
    assert_eq!(
        &shop_1[2..],
        [
            "charge_payment",
            "success",
            "shop",
            "alice",
            "sep",
            "order-1"
        ]
    );
    assert_eq!(row("order-2", "shop")[3], "error");
    assert_eq!(row("order-1", "shop-short")[0], "expired");
    // Without a subcommand, `inspect` lists, as `list` does.
    let default_table = inspect(&sandbox, &[]).ok().stdout;
    assert_eq!(default_table.lines().count(), 4, "{default_table}");
    assert!(default_table.starts_with("STATE"), "{default_table}");
    let default_json = inspect(&sandbox, &["--json"]).ok().json();
    assert_eq!(
        default_json,
        inspect(&sandbox, &["list", "--json"]).ok().json()
    );
    assert_eq!(keys(&default_json).len(), 3);

    // JSON: every field, and the filters.
    let listed = inspect(&sandbox, &["list", "--json", "--namespace", "shop"])
        .ok()
        .json();
    assert_eq!(listed["truncated"], false);
    let mut shop_keys = keys(&listed);
    shop_keys.sort();
    assert_eq!(shop_keys, ["order-1", "order-2"]);
    let record = listed["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|record| record["key"] == "order-2")
        .unwrap();
    assert_eq!(record["namespace"], "shop");
    assert_eq!(record["principal"], "alice");
    assert_eq!(record["key_source"], "sep");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["tool"], "charge_payment");
    assert_eq!(record["outcome_kind"], "error");
    assert_eq!(record["owner"], Value::Null);
    assert_eq!(record["fingerprint"].as_str().unwrap().len(), 64);
    // The key's digest: SHA-256 of the stored key, its first 16 bytes; no trace (tracing off).
    assert_eq!(record["key_digest"], "3d5e3106cd72ba03fededf6dbb9fc336");
    assert_eq!(record["trace_id"], Value::Null);
    let by_digest = inspect(
        &sandbox,
        &[
            "list",
            "--json",
            "--key-digest",
            "3D5E3106CD72BA03FEDEDF6DBB9FC336",
        ],
    )
    .ok()
    .json();
    assert_eq!(keys(&by_digest), ["order-2"]);
    let by_trace = inspect(
        &sandbox,
        &["list", "--json", "--trace-id", &"ab".repeat(16)],
    )
    .ok()
    .json();
    assert!(keys(&by_trace).is_empty());
    for time in ["created_at", "expires_at", "completed_at"] {
        let text = record[time].as_str().unwrap();
        assert!(humantime::parse_rfc3339(text).is_ok(), "{time}: {text}");
    }
    assert!(
        record.get("outcome").is_none(),
        "list leaves bodies out: {record}"
    );

    for (args, expected) in [
        (&["--state", "expired"][..], vec!["order-1"]),
        (
            &["--state", "completed", "--namespace", "shop"],
            vec!["order-2", "order-1"],
        ),
        (&["--state", "in-progress"], vec![]),
        (&["--key", "order-2"], vec!["order-2"]),
        (&["--principal", "bob"], vec![]),
        (&["--older-than", "1h"], vec![]),
        (
            &[
                "--newer-than",
                "1h",
                "--namespace",
                "shop",
                "--key",
                "order-1",
            ],
            vec!["order-1"],
        ),
    ] {
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        let listed = inspect(&sandbox, &all).ok().json();
        let mut got = keys(&listed);
        let mut want = expected.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{args:?}");
    }
    let limited = inspect(&sandbox, &["list", "--json", "--limit", "1"]).ok();
    assert_eq!(keys(&limited.json()).len(), 1);
    assert_eq!(limited.json()["truncated"], true);
    let limited = inspect(&sandbox, &["list", "--limit", "1"]).ok();
    assert!(limited.stderr.contains("--limit"), "{}", limited.stderr);

    // `show` needs a scope when the key exists in two.
    let ambiguous = inspect(&sandbox, &["show", "order-1"]);
    assert_eq!(ambiguous.code, Some(2));
    assert!(
        ambiguous
            .stderr
            .contains("--namespace shop --principal alice")
            && ambiguous
                .stderr
                .contains("--namespace shop-short --principal alice"),
        "{}",
        ambiguous.stderr
    );
    let shown = inspect(
        &sandbox,
        &["show", "order-1", "--namespace", "shop", "--json"],
    )
    .ok();
    // The stored result, byte for byte as the server sent it and `wrap` replays it.
    assert!(
        shown.stdout.contains(raw_result.as_str()),
        "{}",
        shown.stdout
    );
    let shown = shown.json();
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["outcome"]["kind"], "success");
    assert_eq!(
        shown["outcome"]["result"],
        serde_json::from_str::<Value>(raw_result).unwrap()
    );
    assert_eq!(
        shown["outcome"]["result"]["structuredContent"]["chargeId"],
        first_charge.as_str()
    );
    let error = inspect(&sandbox, &["show", "order-2", "--json"])
        .ok()
        .json();
    assert_eq!(error["outcome"]["kind"], "error");
    assert_eq!(
        error["outcome"]["error"],
        serde_json::from_str::<Value>(raw_error).unwrap()
    );
    let text = inspect(&sandbox, &["show", "order-2"]).ok().stdout;
    for line in [
        "key            order-2",
        "namespace      shop",
        "state          completed",
    ] {
        assert!(text.contains(line), "{text}");
    }
    assert!(text.contains("the JSON-RPC error"), "{text}");
    let missing = inspect(&sandbox, &["show", "order-9"]);
    assert_eq!(missing.code, Some(1));
    assert!(missing.stderr.contains("order-9"), "{}", missing.stderr);

    // Counts, then a purge of the expired record.
    let stats = inspect(&sandbox, &["stats", "--json"]).ok().json();
    assert_eq!(
        (
            &stats["in_progress"],
            &stats["completed"],
            &stats["expired"],
            &stats["total"]
        ),
        (&json!(0), &json!(2), &json!(1), &json!(3))
    );
    assert_eq!(stats["lease_expired"], 0);
    assert!(stats["store"].as_str().unwrap().starts_with("sqlite:"));
    let text = inspect(&sandbox, &["stats"]).ok().stdout;
    assert!(text.contains("completed        2"), "{text}");
    assert_eq!(
        inspect(&sandbox, &["purge", "--json"]).ok().json(),
        json!({"purged": 1})
    );
    assert_eq!(
        inspect(&sandbox, &["purge"]).ok().stdout,
        "purged 0 expired records\n"
    );
    assert_eq!(
        inspect(&sandbox, &["stats", "--json"]).ok().json()["total"],
        2
    );

    // `delete` asks; without a terminal it needs --yes and deletes nothing.
    let refused = inspect(&sandbox, &["delete", "order-1"]);
    assert_eq!(refused.code, Some(2));
    assert!(refused.stderr.contains("--yes"), "{}", refused.stderr);
    inspect(&sandbox, &["show", "order-1"]).ok();

    // While the record exists, the key replays: no second charge.
    let replayed = charges(&sandbox, &SHOP, &[("order-1", paid.clone())]);
    assert_eq!(charge_id(&replayed[0].0), first_charge);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 3);

    let deleted = inspect(&sandbox, &["delete", "order-1", "--yes", "--json"])
        .ok()
        .json();
    assert_eq!(deleted["deleted"]["key"], "order-1");
    assert_eq!(deleted["deleted"]["namespace"], "shop");
    assert_eq!(inspect(&sandbox, &["show", "order-1"]).code, Some(1));
    assert_eq!(
        inspect(&sandbox, &["delete", "order-1", "--yes"]).code,
        Some(1)
    );

    // The deleted key runs again: a second execution in the ledger, then replays of it.
    let again = charges(
        &sandbox,
        &SHOP,
        &[("order-1", paid.clone()), ("order-1", paid)],
    );
    let second_charge = charge_id(&again[0].0);
    assert_ne!(second_charge, first_charge);
    assert_eq!(charge_id(&again[1].0), second_charge);
    let ledger = ledger_lines(&sandbox.ledger());
    assert_eq!(ledger.len(), 4, "{ledger:?}");
    let order_1 = ledger
        .iter()
        .filter(|line| {
            [first_charge.as_str(), second_charge.as_str()]
                .contains(&line["chargeId"].as_str().unwrap_or(""))
        })
        .count();
    assert_eq!(order_1, 2, "{ledger:?}");

    let text = inspect(&sandbox, &["delete", "order-2", "--yes"]).ok();
    assert!(
        text.stdout.starts_with("deleted key order-2"),
        "{}",
        text.stdout
    );
    assert_eq!(
        inspect(&sandbox, &["stats", "--json"]).ok().json()["total"],
        1
    );
}

#[test]
fn delete_asks_on_a_terminal() {
    let sandbox = Sandbox::new();
    charges(
        &sandbox,
        &SHOP,
        &[("order-1", json!({"amount": 1, "currency": "usd"}))],
    );
    // `script` gives the command a pseudo-terminal; its stdin is what we type.
    let answer = |typed: &str| -> Inspect {
        let line = crate::support::wrap::sh_join(&[
            EXE.to_owned(),
            "inspect".into(),
            "--store".into(),
            sandbox.store(),
            "delete".into(),
            "order-1".into(),
        ]);
        let mut child = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run script(1)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(typed.as_bytes())
            .unwrap();
        child.wait_with_output().expect("script finishes").into()
    };
    let declined = answer("n\n");
    assert_eq!(
        declined.code,
        Some(1),
        "{}{}",
        declined.stdout,
        declined.stderr
    );
    assert!(
        declined.stdout.contains("Delete this record?"),
        "{}",
        declined.stdout
    );
    assert!(declined.stdout.contains("order-1"), "{}", declined.stdout);
    inspect(&sandbox, &["show", "order-1"]).ok();

    let confirmed = answer("y\n");
    assert_eq!(
        confirmed.code,
        Some(0),
        "{}{}",
        confirmed.stdout,
        confirmed.stderr
    );
    assert_eq!(inspect(&sandbox, &["show", "order-1"]).code, Some(1));
}

#[test]
fn inspect_refuses_stores_it_cannot_read() {
    let sandbox = Sandbox::new();
    let missing = inspect(&sandbox, &["list"]);
    assert_eq!(missing.code, Some(2));
    assert!(
        missing.stderr.contains("does not exist"),
        "{}",
        missing.stderr
    );
    assert!(
        !sandbox.path("r.sqlite3").exists(),
        "inspect must not create a store"
    );
    let memory = Command::new(EXE)
        .args(["inspect", "--store", "memory", "stats"])
        .stdin(Stdio::null())
        .output()
        .expect("run mcp-idem inspect");
    let memory = Inspect::from(memory);
    assert_eq!(memory.code, Some(2));
    assert!(memory.stderr.contains("memory store"), "{}", memory.stderr);
}

/// `charge_payment`'s policy for the key-source records: its business identifier `/order_id`,
/// then (for a call without one and without a client's key) its argument `idempotency_key`, then
/// a duplicate window.
const POLICY: &str = r#"{"charge_payment": {"key-from": ["/order_id"],
    "key-argument": "idempotency_key", "window": "10min"}}"#;

/// A `charge_payment` of each key source, in the order `key-from`, `sep`, `meta`, `argument`,
/// `window`, each with its own amount.
fn charge_of_each_source() -> Vec<Value> {
    let usd = |amount: u64| json!({"amount": amount, "currency": "usd"});
    let mut with_meta = call(3, "charge_payment", usd(3), None);
    with_meta["params"]["_meta"]["idempotencyKey"] = json!("k-1");
    let mut with_argument = usd(4);
    with_argument["idempotency_key"] = json!("k-1");
    let mut with_identifier = usd(1);
    with_identifier["order_id"] = json!("ord_1");
    vec![
        call(1, "charge_payment", with_identifier, None),
        charge(2, usd(2), "k-1"),
        with_meta,
        call(4, "charge_payment", with_argument, None),
        call(5, "charge_payment", usd(5), None),
    ]
}

/// Runs `wrap --tools POLICY` (namespace `shop`, principal `alice`) and sends `calls`; returns
/// the responses.
fn through_wrap(sandbox: &Sandbox, calls: &[Value]) -> Vec<Value> {
    let mut options = SHOP.to_vec();
    options.extend(["--tools", POLICY]);
    let mut wrap = sandbox.wrap_demo(&options);
    let answers = calls.iter().map(|c| wrap.request(c.clone())).collect();
    assert_eq!(wrap.finish().code(), Some(0));
    answers
}

/// `inspect` shows each record's key source and its key as the tool saw it (no U+001F prefix),
/// filters on sources (`--source`, repeated or comma-separated), finds a key as shown (of
/// whichever source, or the one `--source` names), and deletes a derived record so that its call
/// runs again. The records are those `wrap --tools` kept for a call of each source.
#[test]
fn inspect_shows_filters_and_finds_records_by_key_source() {
    let sandbox = Sandbox::new();
    let calls = charge_of_each_source();
    for answer in through_wrap(&sandbox, &calls) {
        charge_id(&answer);
    }
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 5);
    let sources = ["key-from", "sep", "meta", "argument", "window"];

    // JSON: the key as the tool saw it, and its source.
    let listed = inspect(&sandbox, &["list", "--json"]).ok().json();
    let key_of = |source: &str| -> String {
        let records = listed["records"].as_array().unwrap();
        let mut of_source = records.iter().filter(|r| r["key_source"] == source);
        let record = of_source
            .next()
            .unwrap_or_else(|| panic!("no {source}: {listed}"));
        assert!(of_source.next().is_none(), "{listed}");
        record["key"].as_str().unwrap().to_owned()
    };
    let seen: Vec<String> = sources.iter().map(|source| key_of(source)).collect();
    assert_eq!(listed["records"].as_array().unwrap().len(), 5, "{listed}");
    for hashed in [&seen[0], &seen[4]] {
        let hex = hashed.strip_prefix("charge_payment:").expect(hashed);
        assert!(
            hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()),
            "{hashed}"
        );
    }
    assert_ne!(seen[0], seen[4]);
    assert_eq!(seen[1..4], ["k-1", "k-1", "charge_payment:k-1"]);

    // The table: a SOURCE column, keys without the prefix (not even escaped).
    let table = inspect(&sandbox, &["list"]).ok().stdout;
    assert!(
        table.lines().next().unwrap().contains(" SOURCE "),
        "{table}"
    );
    assert!(
        !table.contains('\u{1f}') && !table.contains("u{1f}"),
        "{table}"
    );
    for (source, key) in sources.iter().zip(&seen) {
        assert!(
            table.lines().any(|line| {
                let cells: Vec<&str> = line.split_whitespace().collect();
                cells.ends_with(&[source, key.as_str()])
            }),
            "no {source} row with {key} in\n{table}"
        );
    }

    // Filters on sources, alone and with a key as shown.
    let listed_sources = |args: &[&str]| {
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        let mut got: Vec<String> = inspect(&sandbox, &all).ok().json()["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key_source"].as_str().unwrap().to_owned())
            .collect();
        got.sort();
        got
    };
    for (args, want) in [
        (&["--source", "window"][..], &["window"][..]),
        (&["--source", "sep,meta"], &["meta", "sep"]),
        (
            &["--source", "key-from", "--source", "argument"],
            &["argument", "key-from"],
        ),
        (&["--key", "k-1"], &["meta", "sep"]),
        (&["--key", "k-1", "--source", "meta,window"], &["meta"]),
        (&["--key", "charge_payment:k-1"], &["argument"]),
        (&["--key", seen[0].as_str()], &["key-from"]),
        (&["--key", seen[4].as_str(), "--source", "sep"], &[]),
    ] {
        assert_eq!(listed_sources(args), want, "{args:?}");
    }
    let bad = inspect(&sandbox, &["list", "--source", "header"]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr
            .contains("expected key-from, sep, meta, argument or window"),
        "{}",
        bad.stderr
    );

    // `show` of a key that names two records (a SEP key and a `_meta` key) asks for a source.
    let ambiguous = inspect(&sandbox, &["show", "k-1"]);
    assert_eq!(ambiguous.code, Some(2));
    for option in ["--source sep", "--source meta"] {
        assert!(ambiguous.stderr.contains(option), "{}", ambiguous.stderr);
    }
    let meta = inspect(&sandbox, &["show", "k-1", "--source", "meta", "--json"])
        .ok()
        .json();
    assert_eq!(
        (&meta["key"], &meta["key_source"]),
        (&json!("k-1"), &json!("meta"))
    );
    assert_eq!(meta["outcome"]["result"]["structuredContent"]["amount"], 3);
    let argument = inspect(&sandbox, &["show", "charge_payment:k-1"])
        .ok()
        .stdout;
    assert!(
        argument.contains("\nsource         argument\n"),
        "{argument}"
    );
    let missing = inspect(&sandbox, &["show", "charge_payment:k-1", "--source", "sep"]);
    assert_eq!(missing.code, Some(1));
    assert!(
        missing.stderr.contains("from source sep"),
        "{}",
        missing.stderr
    );

    // A derived record deleted by its key as shown: the replay stops, the call runs again.
    let by_identifier = std::slice::from_ref(&calls[0]);
    let replayed = &through_wrap(&sandbox, by_identifier)[0];
    assert_eq!(
        replayed["result"]["_meta"]["mcp-idem/replayed"], "key-from",
        "{replayed}"
    );
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 5);
    let deleted = inspect(&sandbox, &["delete", seen[0].as_str(), "--yes"]).ok();
    assert!(
        deleted.stdout.contains("(source key-from,"),
        "{}",
        deleted.stdout
    );
    charge_id(&through_wrap(&sandbox, by_identifier)[0]);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 6);
}
