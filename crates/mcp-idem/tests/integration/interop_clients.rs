//! Real third-party MCP clients through the gateway: the TypeScript SDK v2
//! (`@modelcontextprotocol/client` 2.4.0, `interop/ts-client.mjs`) and the Python SDK (`mcp` 2.3.0,
//! `interop/py_client.py`), each against `mcp-idem wrap -- mcp-idem demo-server` over stdio and
//! against `mcp-idem proxy` in front of `mcp-idem demo-server --http` over Streamable HTTP.
//!
//! Each client reads `tools.idempotency` from the raw `server/discover` result, charges with a key,
//! retries (same key, same arguments: the replay), reuses the key with other arguments (conflict),
//! sends two calls with one key at once while the first runs (one executes, the other is told the
//! key is in progress) and retries that key once both answered (the replay). The demo server's
//! ledger then holds exactly one charge per key.

use std::ffi::OsString;

use serde_json::Value;

use crate::support::common::ledger_lines;
use crate::support::http::{HttpDemo, Proxy};
use crate::support::interop::{assert_advertises_idempotency, run_report, script, Toolchain};
use crate::support::wrap::{Sandbox, EXE};

/// `-32602` with `error.data.type == kind`.
fn assert_rejection(step: &Value, kind: &str, report: &Value) {
    assert_eq!(step["error"]["code"], -32602, "{step}\nreport: {report}");
    assert_eq!(
        step["error"]["data"]["type"], kind,
        "{step}\nreport: {report}"
    );
    assert_eq!(
        step["error"]["data"]["idempotencyKey"], "interop-key-2",
        "{step}\nreport: {report}"
    )
}

fn charge_id<'a>(step: &'a Value, report: &Value) -> &'a str {
    assert!(
        step["result"]["isError"] != true,
        "{step}\nreport: {report}"
    );
    step["result"]["structuredContent"]["chargeId"]
        .as_str()
        .unwrap_or_else(|| panic!("no chargeId in {step}\nreport: {report}"))
}

/// Checks a `dedup` report (see the scenario in `interop/ts-client.mjs`) against the ledger.
pub(crate) fn assert_dedup(report: &Value, ledger: &std::path::Path) {
    assert_advertises_idempotency(&report["discover"]);
    let steps = &report["steps"];

    let first = charge_id(&steps["first"], report);
    assert_eq!(
        charge_id(&steps["retry"], report),
        first,
        "the retry is not the replay of the first call"
    );

    let conflict = &steps["conflict"]["error"];
    assert_eq!(conflict["code"], -32602, "{report}");
    assert_eq!(
        conflict["data"]["type"], "idempotency_key_conflict",
        "{report}"
    );
    assert_eq!(
        conflict["data"]["idempotencyKey"], "interop-key-1",
        "{report}"
    );

    // Which of the two concurrent calls the gateway saw first is up to the transport.
    let (a, b) = (&steps["concurrentA"], &steps["concurrentB"]);
    let (ran, rejected) = if a.get("result").is_some() {
        (a, b)
    } else {
        (b, a)
    };
    let second = charge_id(ran, report);
    assert_rejection(rejected, "idempotency_key_in_progress", report);
    assert_eq!(
        charge_id(&steps["concurrentRetry"], report),
        second,
        "the retry after the concurrent calls is not the replay"
    );

    let lines = ledger_lines(ledger);
    let charged: Vec<&str> = lines
        .iter()
        .map(|line| line["chargeId"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        charged,
        [first, second],
        "the ledger must hold exactly one charge per key, in order"
    );
}

/// `[SCRIPT, SCENARIO, "stdio", "--", mcp-idem wrap --store S -- mcp-idem demo-server --ledger L]`.
pub(crate) fn stdio_args(client: &str, scenario: &str, sandbox: &Sandbox) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        script(client).into(),
        scenario.into(),
        "stdio".into(),
        "--".into(),
        EXE.into(),
        "wrap".into(),
        "--store".into(),
        sandbox.store().into(),
        "--".into(),
    ];
    args.extend(sandbox.demo(&sandbox.ledger()));
    args
}

fn over_stdio(toolchain: Toolchain, client: &str) {
    if !toolchain.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let report = run_report(
        toolchain.program(),
        &stdio_args(client, "dedup", &sandbox),
        &sandbox.path("client.stderr"),
    );
    assert_dedup(&report, &sandbox.ledger());
}

fn over_http(toolchain: Toolchain, client: &str) {
    if !toolchain.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let demo = HttpDemo::spawn(&sandbox.ledger(), &[]);
    let store = sandbox.store();
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", &store]);
    let args: Vec<OsString> = vec![
        script(client).into(),
        "dedup".into(),
        "http".into(),
        proxy.url.clone().into(),
    ];
    let report = run_report(toolchain.program(), &args, &sandbox.path("client.stderr"));
    assert_dedup(&report, &sandbox.ledger());
}

#[test]
fn typescript_sdk_client_over_stdio() {
    over_stdio(Toolchain::Node, "ts-client.mjs");
}

#[test]
fn typescript_sdk_client_over_http() {
    over_http(Toolchain::Node, "ts-client.mjs");
}

#[test]
fn python_sdk_client_over_stdio() {
    over_stdio(Toolchain::Python, "py_client.py");
}

#[test]
fn python_sdk_client_over_http() {
    over_http(Toolchain::Python, "py_client.py");
}
