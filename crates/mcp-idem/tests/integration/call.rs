//! `mcp-idem call` end to end, with the real binary on both sides: over stdio against
//! `mcp-idem wrap --store sqlite:… -- mcp-idem demo-server` (a fresh process per run, records
//! shared through the SQLite file), and over HTTP against `mcp-idem proxy` in front of
//! `mcp-idem demo-server --http`. The demo server's ledger counts the charges that really happened;
//! the exit status says success (0), tool error (1) or no outcome (2).

use std::ffi::OsString;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use crate::support::common::{ledger_lines, TIMEOUT};
use crate::support::http::{closed_port_url, HttpDemo, Proxy};

const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// One finished `mcp-idem call`.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// stdout as the `--json` object.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("stdout is not JSON ({err}): {self:?}"))
    }
}

/// Runs `mcp-idem call ARGS`; panics if it does not finish within [`TIMEOUT`].
fn run(args: &[OsString]) -> Run {
    let mut child = Command::new(EXE)
        .arg("call")
        .args(args)
        .env("MCP_IDEM_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mcp-idem call");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "mcp-idem call {args:?} did not finish within {TIMEOUT:?}; stderr:\n{}",
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let run = Run {
        code: status.code().expect("an exit status"),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    eprintln!("mcp-idem call {args:?} -> {run:?}");
    run
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// A store and a ledger, and the wrapped demo server as a `call` command line.
struct Wrapped {
    dir: tempfile::TempDir,
}

impl Wrapped {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn ledger(&self) -> std::path::PathBuf {
        self.dir.path().join("ledger.jsonl")
    }

    /// `mcp-idem call OPTIONS -- mcp-idem wrap --store sqlite:S -- mcp-idem demo-server --ledger L`.
    fn call(&self, options: &[&str]) -> Run {
        let mut args = os(options);
        args.extend(os(&["--", EXE, "wrap", "--store"]));
        args.push(format!("sqlite:{}", self.dir.path().join("r.sqlite3").display()).into());
        args.extend(os(&["--", EXE, "demo-server", "--ledger"]));
        args.push(self.ledger().into());
        run(&args)
    }
}

fn charge_args(amount: u64, extra: Value) -> String {
    let mut args = json!({"amount": amount, "currency": "usd"});
    if let (Some(args), Value::Object(extra)) = (args.as_object_mut(), extra) {
        args.extend(extra);
    }
    args.to_string()
}

fn charge_id_of(result: &Value) -> String {
    result["result"]["structuredContent"]["chargeId"]
        .as_str()
        .or_else(|| result["error"]["data"]["chargeId"].as_str())
        .unwrap_or_else(|| panic!("no charge id in {result}"))
        .to_owned()
}

#[test]
fn over_stdio_a_charge_runs_once_and_its_key_replays_it() {
    let s = Wrapped::new();
    let args = charge_args(4200, json!({}));
    let options = [
        "--tool",
        "charge_payment",
        "--args",
        &args,
        "--key",
        "order-1",
    ];

    let mut json_options = options.to_vec();
    json_options.push("--json");
    let first = s.call(&json_options);
    assert_eq!(first.code, 0, "{first:?}");
    let first = first.json();
    assert_eq!(first["key"], "order-1");
    assert_eq!(first["attempts"], 1);
    assert_eq!(first["result"]["isError"], false);
    let ledger = ledger_lines(&s.ledger());
    assert_eq!(ledger.len(), 1);
    assert_eq!(charge_id_of(&first), ledger[0]["chargeId"]);

    // A new process, the same key: the original charge, replayed.
    let again = s.call(&json_options);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.json()["result"], first["result"]);
    assert_eq!(ledger_lines(&s.ledger()).len(), 1, "still one charge");

    // The human form: contents on stdout, key and attempts on stderr.
    let human = s.call(&options);
    assert_eq!(human.code, 0, "{human:?}");
    let charge_id = charge_id_of(&first);
    assert!(
        human
            .stdout
            .starts_with(&format!("charged 4200 usd: {charge_id}\n")),
        "{human:?}"
    );
    assert!(human.stdout.contains("\"chargeId\""), "{human:?}");
    assert!(human.stderr.contains("key order-1, 1 attempt"), "{human:?}");
    assert_eq!(ledger_lines(&s.ledger()).len(), 1);
}

#[test]
fn without_a_key_a_fresh_one_is_printed() {
    let s = Wrapped::new();
    let args = charge_args(1, json!({}));
    let run = s.call(&["--tool", "charge_payment", "--args", &args]);
    assert_eq!(run.code, 0, "{run:?}");
    let key = run
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("mcp-idem call: key "))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no key on stderr: {run:?}"))
        .to_owned();
    assert_eq!(key.len(), 36, "a UUID: {key}");

    // Reusing the printed key replays the charge.
    let again = s.call(&[
        "--tool",
        "charge_payment",
        "--args",
        &args,
        "--key",
        &key,
        "--json",
    ]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        charge_id_of(&again.json()),
        ledger_lines(&s.ledger())[0]["chargeId"]
    );
    assert_eq!(ledger_lines(&s.ledger()).len(), 1);
}

#[test]
fn a_key_reused_with_other_arguments_is_a_conflict_and_exits_2() {
    let s = Wrapped::new();
    let first = charge_args(10, json!({}));
    let run = s.call(&["--tool", "charge_payment", "--args", &first, "--key", "k"]);
    assert_eq!(run.code, 0, "{run:?}");

    let other = charge_args(11, json!({}));
    let conflict = s.call(&[
        "--tool",
        "charge_payment",
        "--args",
        &other,
        "--key",
        "k",
        "--json",
    ]);
    assert_eq!(conflict.code, 2, "{conflict:?}");
    let json = conflict.json();
    assert_eq!(json["key"], "k");
    assert_eq!(json["attempts"], 1);
    assert_eq!(json["failure"]["type"], "idempotency_key_conflict");
    assert_eq!(json["failure"]["gaveUp"], "final");
    assert_eq!(json["failure"]["mayHaveRun"], false);
    assert_eq!(
        json["failure"]["error"]["data"]["type"],
        "idempotency_key_conflict"
    );
    assert!(conflict.stderr.contains("conflict"), "{conflict:?}");

    let human = s.call(&["--tool", "charge_payment", "--args", &other, "--key", "k"]);
    assert_eq!(human.code, 2, "{human:?}");
    assert!(human.stderr.contains("use a new key"), "{human:?}");
    assert_eq!(ledger_lines(&s.ledger()).len(), 1);
}

#[test]
fn a_tool_error_exits_1_and_is_replayed_not_rerun() {
    let s = Wrapped::new();
    let args = charge_args(5, json!({"fail_after_charge": true}));
    let options = [
        "--tool",
        "charge_payment",
        "--args",
        &args,
        "--key",
        "f-1",
        "--json",
    ];
    let failed = s.call(&options);
    assert_eq!(failed.code, 1, "{failed:?}");
    let failed = failed.json();
    assert_eq!(failed["attempts"], 1, "a tool error is not retried");
    assert_eq!(failed["error"]["code"], -32603);
    let ledger = ledger_lines(&s.ledger());
    assert_eq!(ledger.len(), 1, "it charged, then failed");
    assert_eq!(charge_id_of(&failed), ledger[0]["chargeId"]);

    let replayed = s.call(&options);
    assert_eq!(replayed.code, 1, "{replayed:?}");
    assert_eq!(replayed.json()["error"], failed["error"]);
    assert_eq!(ledger_lines(&s.ledger()).len(), 1);
}

#[test]
fn a_response_lost_to_the_timeout_is_retried_with_the_same_key() {
    let s = Wrapped::new();
    // The charge takes 1.5 s; each attempt waits 300 ms: the first times out, the retries get
    // "in progress" until the outcome is recorded, then the outcome.
    let args = charge_args(7, json!({"delay_ms": 1500}));
    let run = s.call(&[
        "--tool",
        "charge_payment",
        "--args",
        &args,
        "--timeout",
        "300ms",
        "--retries",
        "100",
        "--max-time",
        "60s",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let json = run.json();
    assert!(json["attempts"].as_u64().unwrap() >= 2, "{json}");
    let ledger = ledger_lines(&s.ledger());
    assert_eq!(ledger.len(), 1, "one charge: {ledger:?}");
    assert_eq!(charge_id_of(&json), ledger[0]["chargeId"]);
}

#[test]
fn over_http_through_the_proxy_a_charge_runs_once_per_principal() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = format!("sqlite:{}", dir.path().join("records.sqlite3").display());
    let proxy = Proxy::spawn(
        &server.base_url(),
        &["--store", &store, "--scope-by", "bearer"],
    );
    let args = charge_args(4200, json!({}));
    let call = |token: &str| {
        let header = format!("Authorization: Bearer {token}");
        run(&os(&[
            "--url",
            &proxy.url,
            "-H",
            &header,
            "--tool",
            "charge_payment",
            "--args",
            &args,
            "--key",
            "http-1",
            "--json",
        ]))
    };

    let first = call("alice");
    assert_eq!(first.code, 0, "{first:?}");
    let again = call("alice");
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.json()["result"], first.json()["result"]);
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(charge_id_of(&first.json()), lines[0]["chargeId"]);

    // The header is sent: another bearer is another principal, with records of its own.
    let bob = call("bob");
    assert_eq!(bob.code, 0, "{bob:?}");
    assert_ne!(charge_id_of(&bob.json()), charge_id_of(&first.json()));
    assert_eq!(ledger_lines(&ledger).len(), 2);
}

#[test]
fn a_server_that_cannot_be_reached_exits_2() {
    let url = format!("{}/mcp", closed_port_url());
    let unreachable = run(&os(&[
        "--url",
        &url,
        "--tool",
        "noop",
        "--retries",
        "1",
        "--json",
    ]));
    assert_eq!(unreachable.code, 2, "{unreachable:?}");
    let json = unreachable.json();
    assert_eq!(json["attempts"], 2);
    assert_eq!(json["failure"]["type"], "connect");
    assert_eq!(json["failure"]["mayHaveRun"], false);
    assert_eq!(json["failure"]["gaveUp"], "max_attempts");

    // A header the transport owns is refused at once, not retried.
    let reserved = run(&os(&[
        "--url",
        &url,
        "-H",
        "Accept: text/plain",
        "--tool",
        "noop",
        "--json",
    ]));
    assert_eq!(reserved.code, 2, "{reserved:?}");
    let json = reserved.json();
    assert_eq!(json["attempts"], 1);
    assert_eq!(json["failure"]["gaveUp"], "final");

    let missing = run(&os(&["--tool", "noop", "--", "/nonexistent/mcp-server"]));
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(missing.stderr.contains("cannot start"), "{missing:?}");
    assert_eq!(
        missing.stderr.matches("1 attempt").count(),
        1,
        "not retried: {missing:?}"
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        os(&["--tool", "noop"]),
        os(&[
            "--tool",
            "noop",
            "--url",
            "http://127.0.0.1:1/mcp",
            "--",
            "server",
        ]),
        os(&["--tool", "noop", "-H", "A: b", "--", "server"]),
        os(&["--tool", "noop", "--args", "[1]", "--", "server"]),
    ] {
        let refused = run(&args);
        assert_eq!(refused.code, 2, "{refused:?}");
        assert!(refused.stdout.is_empty(), "{refused:?}");
    }
}
