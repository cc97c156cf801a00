//! MRTR continuations from a real client are not deduplicated. The TypeScript SDK v2 client
//! (`interop/ts-client.mjs mrtr`) calls `confirm_charge` on a TypeScript SDK v2 server
//! (`interop/ts-server.mjs`) behind the gateway, with an `idempotencyKey`, twice with the same key.
//! The server answers the first round with `input_required`; the SDK fulfils the elicitation and
//! re-sends the original params, `idempotencyKey` included, with `inputResponses` and
//! `requestState`, which the SEP leaves out of scope.
//!
//! What the fixture server's executions file must show: one `asked` round (the second run's first
//! round is the gateway's replay of the stored `input_required`, so it never reaches the server)
//! and two `executed` rounds (each continuation passes through to the server, so the tool runs
//! twice). Over stdio (`wrap`) and over Streamable HTTP (`proxy`).

use std::ffi::OsString;
use std::path::Path;

use serde_json::Value;

use crate::support::http::Proxy;
use crate::support::interop::{
    assert_advertises_idempotency, executions, run_report, script, HttpFixture, Toolchain,
};
use crate::support::wrap::{Sandbox, EXE};

const KEY: &str = "interop-mrtr-key";

fn assert_mrtr(report: &Value, executions_file: &Path) {
    assert_advertises_idempotency(&report["discover"]);

    // What the SDK put on the wire: each run is a first round and a continuation carrying the key.
    let sent = report["sent"].as_array().expect("sent");
    assert_eq!(sent.len(), 4, "{report}");
    for round in sent.chunks(2) {
        let (first, continuation) = (&round[0], &round[1]);
        assert_eq!(first["idempotencyKey"], KEY, "{first}");
        assert!(first.get("requestState").is_none(), "{first}");
        assert_eq!(continuation["idempotencyKey"], KEY, "{continuation}");
        assert_eq!(continuation["requestState"], "confirm:7", "{continuation}");
        assert_eq!(
            continuation["inputResponses"]["confirm"]["content"]["confirm"], true,
            "{continuation}"
        );
        assert_eq!(continuation["arguments"], first["arguments"]);
    }

    let execution_id = |step: &Value| -> String {
        step["result"]["structuredContent"]["executionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no executionId in {step}\nreport: {report}"))
            .to_owned()
    };
    let first = execution_id(&report["steps"]["first"]);
    let again = execution_id(&report["steps"]["again"]);
    assert_ne!(
        first, again,
        "the second continuation was answered without running"
    );

    let lines = executions(executions_file);
    let asked: Vec<&Value> = lines.iter().filter(|l| l["phase"] == "asked").collect();
    let executed: Vec<&Value> = lines.iter().filter(|l| l["phase"] == "executed").collect();
    assert_eq!(
        asked.len(),
        1,
        "the repeated first round must be replayed by the gateway: {lines:?}"
    );
    // The first round was claimed: the gateway handed the key to the server in _meta.
    assert_eq!(asked[0]["key"], KEY, "{lines:?}");
    let executed_ids: Vec<&str> = executed
        .iter()
        .map(|l| l["executionId"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        executed_ids,
        [first.as_str(), again.as_str()],
        "each continuation must reach the server: {lines:?}"
    );
    for line in &executed {
        // Passed through unclaimed: no key in _meta, the SDK's requestState intact.
        assert_eq!(line["key"], Value::Null, "{line}");
        assert_eq!(line["requestState"], "confirm:7", "{line}");
    }
}

#[test]
fn typescript_mrtr_continuation_passes_through_wrap() {
    if !Toolchain::Node.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let executions_file = sandbox.path("executions.jsonl");
    let args: Vec<OsString> = vec![
        script("ts-client.mjs").into(),
        "mrtr".into(),
        "stdio".into(),
        "--".into(),
        EXE.into(),
        "wrap".into(),
        "--store".into(),
        sandbox.store().into(),
        "--".into(),
        "node".into(),
        script("ts-server.mjs").into(),
        "--executions".into(),
        executions_file.clone().into(),
    ];
    let report = run_report("node", &args, &sandbox.path("client.stderr"));
    assert_mrtr(&report, &executions_file);
}

#[test]
fn typescript_mrtr_continuation_passes_through_proxy() {
    if !Toolchain::Node.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let executions_file = sandbox.path("executions.jsonl");
    let server = HttpFixture::spawn(
        "node",
        &[
            script("ts-server.mjs").into(),
            "--executions".into(),
            executions_file.clone().into(),
            "--http".into(),
        ],
    );
    let store = sandbox.store();
    let proxy = Proxy::spawn(&server.base_url(), &["--store", &store]);
    let args: Vec<OsString> = vec![
        script("ts-client.mjs").into(),
        "mrtr".into(),
        "http".into(),
        proxy.url.clone().into(),
    ];
    let report = run_report("node", &args, &sandbox.path("client.stderr"));
    assert_mrtr(&report, &executions_file);
}
