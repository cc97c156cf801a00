//! `mcp-idem check` against real servers: it passes `wrap` around the demo server (stdio) and
//! `proxy` in front of the HTTP demo server, and it fails exactly the right checks of small
//! deliberately-broken SEP-3182 servers written in Python (tests/fixtures/broken_servers/).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::http::{ledger_in, HttpDemo, Proxy};

const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// Every check, in report order.
const CHECKS: [&str; 19] = [
    "capability.discover",
    "capability.initialize",
    "no_key.executes",
    "replay.result",
    "equivalence.key_order",
    "equivalence.numbers",
    "equivalence.strings",
    "conflict.rejected",
    "conflict.error_data",
    "meta.replay",
    "meta.conflict",
    "in_progress.single_execution",
    "in_progress.not_blocked",
    "in_progress.rejected",
    "replay.error",
    "key.not_a_string",
    "key.empty",
    "key.too_long",
    "mrtr.continuation",
];

/// The charges a run with [`witness_options`] makes on a server that passes: two calls without a
/// key, then one per key that ran (replay, three equivalences, conflict, `_meta` replay, `_meta`
/// conflict, in progress, error); rejected and replayed calls run nothing.
pub(crate) const CHARGES_OF_A_PASSING_RUN: usize = 11;

/// The witness options for the demo server's `charge_payment` (and the Python servers', which
/// take the same arguments), observed with `get_balance`.
pub(crate) fn witness_options() -> Vec<String> {
    [
        "--tool",
        "charge_payment",
        "--args",
        r#"{"amount": 12.5, "currency": "usd"}"#,
        "--slow-args",
        r#"{"amount": 12.5, "currency": "usd", "delay_ms": 1500}"#,
        "--error-args",
        r#"{"amount": 12.5, "currency": "usd", "fail_after_charge": true}"#,
        "--observe-tool",
        "get_balance",
        "--json",
    ]
    .map(String::from)
    .to_vec()
}

/// A finished `mcp-idem check --json` run.
pub(crate) struct Run {
    output: Output,
    pub(crate) report: Value,
}

impl Run {
    pub(crate) fn new(options: &[String], target: &[&str]) -> Self {
        let output = Command::new(EXE)
            .arg("check")
            .args(options)
            .args(target)
            .env("MCP_IDEM_LOG", "error")
            // No __pycache__ next to the Python fixtures.
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("run mcp-idem check");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let report = serde_json::from_str(&stdout).unwrap_or_else(|err| {
            panic!(
                "the report is not JSON ({err}): {stdout}\nstderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        Self { output, report }
    }

    /// The names of the checks with this status.
    fn with_status(&self, status: &str) -> BTreeSet<String> {
        self.checks()
            .iter()
            .filter(|c| c["status"] == status)
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn checks(&self) -> &Vec<Value> {
        self.report["checks"].as_array().expect("checks")
    }

    pub(crate) fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    /// Asserts that every check ran, in order, and that exactly `failed` failed and `skipped`
    /// were skipped; every skip says why.
    pub(crate) fn assert_outcome(&self, failed: &[&str], skipped: &[&str]) {
        let names: Vec<&str> = self
            .checks()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, CHECKS, "{:#}", self.report);
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(self.with_status("fail"), set(failed), "{:#}", self.report);
        assert_eq!(self.with_status("skip"), set(skipped), "{:#}", self.report);
        for check in self.checks() {
            assert!(
                check["detail"].as_str().is_some_and(|d| !d.is_empty()),
                "{check}"
            );
            if check["status"] == "fail" {
                assert!(!check["evidence"].as_array().unwrap().is_empty(), "{check}");
            }
        }
    }
}

fn level_of<'a>(run: &'a Run, name: &str) -> &'a str {
    run.checks()
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["level"].as_str())
        .unwrap_or_else(|| panic!("no check {name}"))
}

#[test]
fn check_passes_wrap_around_the_demo_server_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let ledger = ledger.to_str().unwrap();
    let run = Run::new(
        &witness_options(),
        &[
            "--",
            EXE,
            "wrap",
            "--store",
            "memory",
            "--",
            EXE,
            "demo-server",
            "--ledger",
            ledger,
        ],
    );
    run.assert_outcome(&[], &["mrtr.continuation"]);
    assert_eq!(run.code(), Some(0));
    assert_eq!(run.report["conformant"], true);
    assert!(run.report["era"]
        .as_str()
        .unwrap()
        .starts_with("2026-07-28"));
    let charges = crate::support::common::ledger_lines(Path::new(ledger)).len();
    assert_eq!(charges, CHARGES_OF_A_PASSING_RUN, "{:#}", run.report);
}

/// `proxy` (memory store) in front of `demo-server --http`, with `extra` demo-server options.
fn check_through_the_proxy(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, extra);
    let proxy = Proxy::spawn(&server.base_url(), &["--store", "memory"]);
    let run = Run::new(&witness_options(), &["--url", &proxy.url]);
    run.assert_outcome(&[], &["mrtr.continuation"]);
    assert_eq!(run.code(), Some(0));
    assert_eq!(
        crate::support::common::ledger_lines(&ledger).len(),
        CHARGES_OF_A_PASSING_RUN,
        "{:#}",
        run.report
    );
}

#[test]
fn check_passes_the_proxy_over_http() {
    check_through_the_proxy(&[]);
}

#[test]
fn check_passes_the_proxy_over_http_with_event_streams() {
    check_through_the_proxy(&["--http-sse"]);
}

#[test]
fn check_fails_the_bare_demo_server_which_has_no_idempotency() {
    let dir = tempfile::tempdir().unwrap();
    let server = HttpDemo::spawn(&ledger_in(&dir), &[]);
    let run = Run::new(&witness_options(), &["--url", &server.url]);
    assert_eq!(run.code(), Some(1), "{:#}", run.report);
    assert_eq!(run.report["conformant"], false);
    for name in [
        "capability.discover",
        "replay.result",
        "conflict.rejected",
        "meta.replay",
        "meta.conflict",
        "in_progress.single_execution",
        "replay.error",
    ] {
        assert!(
            run.with_status("fail").contains(name),
            "{name}: {:#}",
            run.report
        );
    }
    // Calls without a key still behave: that check passes.
    assert!(run.with_status("pass").contains("no_key.executes"));
    // A failed `_meta` check says what it costs a client.
    let meta = run
        .checks()
        .iter()
        .find(|c| c["name"] == "meta.replay")
        .unwrap();
    assert_eq!(meta["level"], "SHOULD");
    assert!(
        meta["detail"].as_str().unwrap().contains("only in _meta"),
        "{meta}"
    );
    assert_eq!(run.report["notes"], serde_json::json!([]));
}

/// `check` of `wrap` whose witness tool has a key policy (`--tools POLICIES`), with witness
/// arguments that carry an `order_id`.
fn check_with_a_policy(policies: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let mut options = witness_options();
    for (flag, args) in [
        (
            "--args",
            r#"{"amount": 12.5, "currency": "usd", "order_id": "o-1"}"#,
        ),
        (
            "--slow-args",
            r#"{"amount": 12.5, "currency": "usd", "order_id": "o-2", "delay_ms": 1500}"#,
        ),
        (
            "--error-args",
            r#"{"amount": 12.5, "currency": "usd", "order_id": "o-3", "fail_after_charge": true}"#,
        ),
    ] {
        let at = options.iter().position(|option| option == flag).unwrap();
        options[at + 1] = args.to_owned();
    }
    let target = [
        "--",
        EXE,
        "wrap",
        "--store",
        "memory",
        "--tools",
        policies,
        "--",
        EXE,
        "demo-server",
        "--ledger",
        ledger.to_str().unwrap(),
    ];
    Run::new(&options, &target)
}

fn detail<'a>(run: &'a Run, name: &str) -> &'a str {
    run.checks()
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["detail"].as_str())
        .unwrap_or_else(|| panic!("no check {name}"))
}

/// A window on the witness tool: the replayed call without a key is reported as the policy's
/// doing (skipped, not failed, not passed), and every keyed check still runs and passes.
#[test]
fn check_says_when_the_witness_tool_has_a_window() {
    let run = check_with_a_policy(r#"{"charge_payment": {"window": "30s"}}"#);
    run.assert_outcome(&[], &["no_key.executes", "mrtr.continuation"]);
    assert_eq!(run.code(), Some(0));
    let no_key = detail(&run, "no_key.executes");
    assert!(
        no_key.contains(r#"marked _meta["mcp-idem/replayed"] = "window""#)
            && no_key.contains("two calls with different keys both ran"),
        "{no_key}"
    );
    let note = run.report["notes"][0].as_str().unwrap_or_default();
    assert!(
        note.contains("key policy") && note.contains(r#""window""#),
        "{:#}",
        run.report
    );
}

/// A business identifier on the witness tool decides key-less calls and fresh keys: the replay
/// checks cannot tell the key's replay from the policy's and are skipped; a duplicate with its
/// own key is still refused at once (the SEP's rules hold for the client's key); the note says
/// why.
#[test]
fn check_says_when_the_witness_tool_is_keyed_by_an_identifier() {
    let run = check_with_a_policy(r#"{"charge_payment": {"key-from": ["/order_id"]}}"#);
    for name in ["no_key.executes", "replay.result", "meta.replay"] {
        assert!(
            run.with_status("skip").contains(name),
            "{name}: {:#}",
            run.report
        );
    }
    assert!(detail(&run, "replay.result").contains("cannot be told from one by the policy"));
    for name in [
        "in_progress.not_blocked",
        "in_progress.rejected",
        "in_progress.single_execution",
    ] {
        assert!(
            run.with_status("pass").contains(name),
            "{name}: {:#}",
            run.report
        );
    }
    let note = run.report["notes"][0].as_str().unwrap_or_default();
    assert!(
        note.contains(r#""key-from""#) && note.contains("keeps the SEP's rules"),
        "{:#}",
        run.report
    );
}

/// `python3 FIXTURE` for a server in tests/fixtures/broken_servers, or `None` (with a note)
/// when python3 is missing; under CI=true a missing python3 fails the test.
fn python_server(fixture: &str) -> Option<Vec<String>> {
    let found = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !found {
        let message = "python3 is not installed: the broken-server fixtures need it";
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{message}; CI=true requires it");
        }
        eprintln!("note: {message}; skipping this test");
        return None;
    }
    let script: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests/fixtures/broken_servers",
        fixture,
    ]
    .iter()
    .collect();
    assert!(script.exists(), "{}", script.display());
    Some(vec![
        "--".into(),
        "python3".into(),
        script.to_str().unwrap().into(),
    ])
}

/// Runs `check` against a Python fixture (legacy era; it has an MRTR tool).
fn check_python(fixture: &str, extra: &[&str]) -> Option<Run> {
    let target = python_server(fixture)?;
    let mut options = witness_options();
    options.extend(
        [
            "--mrtr-tool",
            "approve_transfer",
            "--mrtr-args",
            r#"{"amount": 5}"#,
            "--mrtr-responses",
            r#"{"confirm": {"action": "accept", "content": {}}}"#,
        ]
        .map(String::from),
    );
    options.extend(extra.iter().map(|s| s.to_string()));
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    let run = Run::new(&options, &target);
    assert!(
        run.report["era"].as_str().unwrap().starts_with("legacy"),
        "{:#}",
        run.report
    );
    Some(run)
}

#[test]
fn the_conforming_python_server_passes_including_mrtr() {
    let Some(run) = check_python("conforming.py", &[]) else {
        return;
    };
    // A legacy server cannot advertise in server/discover: skipped, not passed.
    run.assert_outcome(&[], &["capability.discover"]);
    assert_eq!(run.code(), Some(0));
}

#[test]
fn comparing_arguments_as_text_fails_the_equivalence_checks() {
    let Some(run) = check_python("textual_arguments.py", &[]) else {
        return;
    };
    let failed = [
        "equivalence.key_order",
        "equivalence.numbers",
        "equivalence.strings",
    ];
    run.assert_outcome(&failed, &["capability.discover"]);
    for name in failed {
        assert_eq!(level_of(&run, name), "MUST");
        let check = run.checks().iter().find(|c| c["name"] == name).unwrap();
        assert!(
            check["detail"]
                .as_str()
                .unwrap()
                .contains("idempotency_key_conflict"),
            "{check}"
        );
    }
    assert_eq!(run.code(), Some(1));
}

#[test]
fn holding_a_duplicate_until_the_original_finishes_fails_the_in_progress_checks() {
    let Some(run) = check_python("blocking_duplicate.py", &[]) else {
        return;
    };
    run.assert_outcome(
        &["in_progress.not_blocked", "in_progress.rejected"],
        &["capability.discover"],
    );
    assert_eq!(level_of(&run, "in_progress.not_blocked"), "MUST");
    assert_eq!(level_of(&run, "in_progress.rejected"), "SHOULD");
    // Nothing ran twice: the duplicate shared the original's outcome.
    assert!(run
        .with_status("pass")
        .contains("in_progress.single_execution"));
    // The durations are the evidence.
    let check = run
        .checks()
        .iter()
        .find(|c| c["name"] == "in_progress.not_blocked")
        .unwrap();
    let timing = &check["evidence"][0];
    assert_eq!(timing["label"], "timing", "{check}");
    assert!(timing["text"]
        .as_str()
        .unwrap()
        .contains("duplicate sent at +"));
    assert_eq!(run.code(), Some(1));
}

#[test]
fn re_executing_after_an_error_fails_error_replay() {
    let Some(run) = check_python("reexecuting_errors.py", &[]) else {
        return;
    };
    run.assert_outcome(&["replay.error"], &["capability.discover"]);
    assert_eq!(level_of(&run, "replay.error"), "MUST");
    assert_eq!(run.code(), Some(1));
}

#[test]
fn missing_options_skip_their_checks_with_a_reason() {
    // Without --slow-args, --error-args and --observe-tool.
    let Some(target) = python_server("conforming.py") else {
        return;
    };
    // One member and no number: nothing to reorder, no number to re-spell.
    let options: Vec<String> = [
        "--tool",
        "charge_payment",
        "--json",
        "--args",
        r#"{"currency": "usd"}"#,
    ]
    .map(String::from)
    .to_vec();
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    let run = Run::new(&options, &target);
    run.assert_outcome(
        &[],
        &[
            "capability.discover",
            "equivalence.key_order",
            "equivalence.numbers",
            "in_progress.single_execution",
            "in_progress.not_blocked",
            "in_progress.rejected",
            "replay.error",
            "mrtr.continuation",
        ],
    );
    let detail = |name: &str| {
        run.checks().iter().find(|c| c["name"] == name).unwrap()["detail"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(detail("equivalence.numbers").contains("no number"));
    assert!(detail("in_progress.rejected").contains("--slow-args"));
    assert!(detail("replay.error").contains("--error-args"));
    assert!(detail("conflict.rejected").contains("not verified that nothing ran"));
    assert_eq!(run.code(), Some(0));
}

#[test]
fn text_report_and_usage_errors() {
    let Some(target) = python_server("reexecuting_errors.py") else {
        return;
    };
    let output = Command::new(EXE)
        .args(["check", "--tool", "charge_payment", "--args"])
        .arg(r#"{"amount": 1, "currency": "usd"}"#)
        .arg("--error-args")
        .arg(r#"{"amount": 1, "currency": "usd", "fail_after_charge": true}"#)
        .args(&target)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("replay.error"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with("FAIL  MUST"), "{line}");
    // The evidence follows the failed check: the request and the offending response.
    assert!(text.contains("retry request: {\"jsonrpc\""), "{text}");
    assert!(text.contains("retry response: {\"jsonrpc\""), "{text}");
    assert!(text.contains("NOT CONFORMANT"), "{text}");

    for (args, message) in [
        (vec!["check", "--tool", "t"], "nothing to check"),
        (
            vec!["check", "--tool", "t", "--args", "[1]", "--", "true"],
            "JSON object",
        ),
        (
            vec!["check", "--tool", "t", "--url", "ftp://127.0.0.1:1/mcp"],
            "must start with http:// or https://",
        ),
        (
            vec![
                "check",
                "--tool",
                "t",
                "--url",
                "https://127.0.0.1:1/mcp",
                "--ca-cert",
                "/nonexistent/ca.pem",
            ],
            "cannot read CA certificates from /nonexistent/ca.pem",
        ),
        (
            vec!["check", "--tool", "t", "--", "/nonexistent/mcp-server"],
            "cannot start",
        ),
    ] {
        let output = Command::new(EXE).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}
