//! `mcp-idem tools` end to end: the real binary lists the tools of real servers (the demo server
//! over stdio and over Streamable HTTP, and a Python SDK 2.x server with annotations that pages
//! its `tools/list`, `interop/py_tools_server.py`), prints the listing and a policy that the
//! `toml` crate parses, or `--json`; listing runs no tool (the demo server's ledger stays empty);
//! a server that cannot be reached exits with status 2 and a message.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::bridge_sessions::{run_until_exit, Exited, EXE};
use crate::support::common::ledger_lines;
use crate::support::http::{closed_port_url, HttpDemo};
use crate::support::interop::{script, Toolchain};

/// `mcp-idem tools ARGS`, run to its exit.
fn tools(args: &[OsString]) -> Exited {
    let mut command = Command::new(EXE);
    command
        .arg("tools")
        .args(args)
        .env("MCP_IDEM_LOG", "warn")
        .env_remove("MCP_IDEM_CA_CERT");
    let exited = run_until_exit(command);
    eprintln!(
        "mcp-idem tools {args:?} -> {:?}\n{}{}",
        exited.status,
        String::from_utf8_lossy(&exited.stdout),
        exited.stderr
    );
    exited
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// `-- mcp-idem demo-server --ledger LEDGER`.
fn demo_server(ledger: &Path) -> Vec<OsString> {
    let mut args = os(&["--", EXE, "demo-server", "--ledger"]);
    args.push(ledger.into());
    args
}

/// `-- python3 interop/py_tools_server.py`.
fn python_server() -> Vec<OsString> {
    vec![
        "--".into(),
        Toolchain::Python.program().into(),
        script("py_tools_server.py").into(),
    ]
}

/// stdout of a successful run.
fn stdout(exited: &Exited) -> String {
    assert_eq!(exited.status.code(), Some(0), "{exited:?}");
    String::from_utf8(exited.stdout.clone()).expect("UTF-8 stdout")
}

/// The whole text output parsed as TOML (it must be), and its `[tools]` as JSON.
fn policy_of(text: &str) -> Value {
    let parsed: toml::Table =
        toml::from_str(text).unwrap_or_else(|err| panic!("not TOML ({err}):\n{text}"));
    let keys: Vec<_> = parsed.keys().collect();
    assert_eq!(keys, ["tools"], "only [tools] tables:\n{text}");
    serde_json::to_value(parsed).expect("TOML as JSON")
}

/// The listing's block for `tool`: from `# NAME` to the next blank comment line.
fn block<'a>(text: &'a str, tool: &str) -> &'a str {
    let start = text
        .find(&format!("\n# {tool}\n"))
        .unwrap_or_else(|| panic!("no listing of {tool}:\n{text}"));
    let rest = &text[start + 1..];
    &rest[..rest.find("\n#\n").unwrap_or(rest.len())]
}

#[test]
fn the_demo_server_over_stdio_gets_windows_and_its_read_only_tool_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let text = stdout(&tools(&demo_server(&ledger)));

    let policy = policy_of(&text);
    assert_eq!(
        policy["tools"],
        json!({
            "charge_payment": {"window": "30s"},
            "noop": {"window": "30s"},
            "work_1ms": {"window": "30s"},
        }),
        "{text}"
    );
    assert!(
        text.starts_with("# mcp-idem tools: 4 tools listed by "),
        "{text}"
    );
    let balance = block(&text, "get_balance");
    assert!(
        balance.contains("annotations: readOnlyHint: true"),
        "{balance}"
    );
    assert!(balance.contains("suggested: left out"), "{balance}");
    // Its optional order_id is named, but a call may leave it out: a window is suggested.
    assert!(
        block(&text, "charge_payment")
            .contains("/order_id: optional string named *_id (weaker: a call may leave it out)"),
        "{text}"
    );
    assert!(
        text.contains(
            "# Not used, as a call may leave them out: /order_id\n[tools.charge_payment]"
        ),
        "{text}"
    );
    assert!(
        text.contains("#   get_balance: readOnlyHint: true, the server says it changes nothing"),
        "{text}"
    );
    assert!(
        text.contains("two identical calls inside 30s run once"),
        "the window's cost is said: {text}"
    );
    // Listing ran nothing.
    assert!(
        !ledger.exists() || ledger_lines(&ledger).is_empty(),
        "{:?}",
        ledger_lines(&ledger)
    );
}

#[test]
fn the_demo_server_over_http_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let server = HttpDemo::spawn(&ledger, &[]);
    let exited = tools(&os(&[
        "--url",
        &server.url,
        "--header",
        "X-Operator: tools-test",
        "--json",
    ]));
    let json: Value = serde_json::from_str(&stdout(&exited)).expect("one JSON object");

    assert_eq!(json["server"], server.url.as_str());
    let names: Vec<_> = json["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| tool["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["charge_payment", "get_balance", "noop", "work_1ms"]);
    let balance = &json["tools"][1];
    assert_eq!(balance["annotations"], json!({"readOnlyHint": true}));
    assert_eq!(balance["policy"], Value::Null);
    assert_eq!(balance["leftOut"]["reason"], "readOnlyHint");
    let charge = &json["tools"][0];
    assert_eq!(
        charge["identifiers"],
        json!([{"argument": "order_id", "pointer": "/order_id", "type": "string",
                "required": false, "pattern": "*_id",
                "reason": "optional string named *_id (weaker: a call may leave it out)"}])
    );
    assert_eq!(charge["policy"], json!({"window": "30s"}));
    assert_eq!(charge["leftOut"], Value::Null);
    assert_eq!(
        json["policy"]["tools"],
        json!({
            "charge_payment": {"window": "30s"},
            "noop": {"window": "30s"},
            "work_1ms": {"window": "30s"},
        })
    );
    assert!(ledger_lines(&ledger).is_empty() || !ledger.exists());
}

#[test]
fn a_python_sdk_server_gets_keys_from_its_identifiers_over_every_page() {
    if !Toolchain::Python.require() {
        return;
    }
    let text = stdout(&tools(&python_server()));

    // Six tools, listed two per page.
    assert!(
        text.starts_with("# mcp-idem tools: 6 tools listed by "),
        "{text}"
    );
    let policy = policy_of(&text);
    assert_eq!(
        policy["tools"],
        json!({
            "charge_payment": {"key-from": ["/order_id"], "required": true},
            "send_invoice": {"key-from": ["/customerId", "/invoice_number"], "required": true},
            "create_refund": {"key-argument": "idempotency_key"},
            "billing.log_event": {"window": "30s"},
        }),
        "{text}"
    );
    // A name that is not a bare key is quoted, by the toml crate.
    assert!(
        text.contains("\n[tools.\"billing.log_event\"]\nwindow = \"30s\"\n"),
        "{text}"
    );

    let charge = block(&text, "charge_payment");
    assert!(
        charge.contains("annotations: destructiveHint: true, openWorldHint: true"),
        "{charge}"
    );
    assert!(
        charge.contains("/order_id: required string named *_id"),
        "{charge}"
    );
    let invoice = block(&text, "send_invoice");
    assert!(
        invoice.contains("annotations: destructiveHint: false"),
        "{invoice}"
    );
    assert!(
        invoice.contains("/customerId: required string named *Id"),
        "{invoice}"
    );
    assert!(
        invoice.contains("/invoice_number: required integer named *_number"),
        "{invoice}"
    );
    let log = block(&text, "billing.log_event");
    assert!(
        log.contains("/reference: optional string named reference (weaker"),
        "{log}"
    );
    assert!(
        block(&text, "set_status").contains("annotations: idempotentHint: true"),
        "{text}"
    );
    for left_out in [
        "#   get_order: readOnlyHint: true",
        "#   set_status: idempotentHint: true",
    ] {
        assert!(text.contains(left_out), "{left_out}:\n{text}");
    }
    assert!(
        text.contains(
            "# charge_payment: keyed by order_id. CHECK that order_id names ONE operation"
        ),
        "{text}"
    );

    // --json: the same decisions, with the candidates and their reasons.
    let json: Value = serde_json::from_str(&stdout(&tools(&{
        let mut args = python_server();
        args.insert(0, "--json".into());
        args
    })))
    .expect("one JSON object");
    assert_eq!(json["policy"], policy, "the JSON policy is the TOML one");
    let by_name = |name: &str| {
        json["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {json}"))
            .clone()
    };
    let get_order = by_name("get_order");
    assert_eq!(get_order["leftOut"]["reason"], "readOnlyHint");
    assert_eq!(get_order["policy"], Value::Null);
    assert_eq!(
        get_order["identifiers"],
        json!([{"argument": "order_id", "pointer": "/order_id", "type": "string",
                "required": true, "pattern": "*_id", "reason": "required string named *_id"}])
    );
    let refund = by_name("create_refund");
    assert_eq!(refund["annotations"], json!({}));
    assert_eq!(refund["identifiers"][1]["argument"], "idempotency_key");
    assert_eq!(refund["identifiers"][1]["required"], false);
    assert_eq!(
        by_name("charge_payment")["annotations"],
        json!({"destructiveHint": true, "openWorldHint": true})
    );
}

/// A stdio server that takes 11 s to start (as a first `npx -y` does) is listed: `--connect-timeout`
/// bounds the start, not the 10 s rmcp gives `server/discover` (which failed it with "conflict
/// initialized response id: expected 1, got 0"). A shorter `--connect-timeout` ends the wait,
/// saying so.
#[test]
fn a_server_slow_to_start_gets_the_whole_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let slow = |seconds: u32| {
        let start = format!("sleep {seconds}; exec \"$0\" demo-server --ledger \"$1\"",);
        let mut args = os(&["--", "sh", "-c", &start, EXE]);
        args.push(ledger.clone().into());
        args
    };
    let mut impatient = os(&["--connect-timeout", "1s"]);
    impatient.extend(slow(3));
    tools(&impatient).assert_startup_failure(&["no session within 1s (--connect-timeout)"]);

    let mut patient = os(&["--connect-timeout", "60s"]);
    patient.extend(slow(11));
    let text = stdout(&tools(&patient));
    assert!(text.contains("\n# charge_payment\n"), "{text}");
    assert!(ledger_lines(&ledger).is_empty(), "listing runs no tool");
}

#[test]
fn a_server_that_cannot_be_reached_is_a_clear_error() {
    let url = format!("{}/mcp", closed_port_url());
    let refused = tools(&os(&["--url", &url]));
    let stderr = refused.assert_startup_failure(&["cannot connect to", &url]);
    assert!(stderr.starts_with("mcp-idem: error: "), "{stderr}");

    tools(&os(&["--", "/nonexistent/mcp-server"]))
        .assert_startup_failure(&["cannot start /nonexistent/mcp-server"]);

    // A command that exits at once: no handshake.
    tools(&os(&["--json", "--", "false"]))
        .assert_startup_failure(&["cannot connect to false", "handshake"]);

    // Neither a URL nor a command: a usage error.
    let usage = tools(&[]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
    assert!(usage.stderr.contains("--url"), "{}", usage.stderr);
}
