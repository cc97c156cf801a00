//! `--log-format json` (or `MCP_IDEM_LOG_FORMAT=json`): the real binary's logs on stderr are one
//! JSON object per line, each with `timestamp`, `level`, `target` and `message` and the event's
//! fields; text stays the default; an unknown format is a usage error. The ready line (`listening
//! on ...`) is not a log and stays as it is.

use std::process::{Command, Stdio};

use serde_json::{Map, Value};

use crate::support::http::{charge, ledger_in, HttpDemo, Raw};

/// `line` as a JSON object with the fields every log line has.
fn log_line(line: &str) -> Map<String, Value> {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(line) else {
        panic!("not a JSON object: {line:?}")
    };
    for name in ["timestamp", "level", "target", "message"] {
        assert!(object[name].is_string(), "no {name} in {line}");
    }
    object
}

#[tokio::test]
async fn the_demo_servers_logs_are_json_lines_with_the_events_fields() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn_with_log(
        "127.0.0.1:0",
        &ledger,
        &["--log-format", "json"],
        "mcp_idem=info",
    );
    let answer = Raw::new(&server).call(charge(1, 5, None)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    server.logged("charge_payment started").await;

    let stderr = server.stderr();
    let lines: Vec<_> = stderr
        .lines()
        .filter(|line| !line.starts_with("listening on "))
        .map(log_line)
        .collect();
    let started = lines
        .iter()
        .find(|line| line["message"] == "charge_payment started")
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(started["level"], "INFO");
    assert_eq!(started["target"], "mcp_idem::commands::demo_server");
    // `amount = %amount` is its text; `delay_ms` a number.
    assert_eq!(started["amount"], "5");
    assert_eq!(started["delay_ms"], 0);
    assert!(
        started["timestamp"].as_str().unwrap().ends_with('Z'),
        "{started:?}"
    );
}

/// `mcp-idem demo-server` on stdio, which logs as it starts and exits at stdin's end: its stderr.
fn demo_server_stderr(args: &[&str], log_format: Option<&str>) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
    command
        .args(args)
        .arg("--ledger")
        .arg(ledger_in(&dir))
        .env("MCP_IDEM_LOG", "info")
        .env_remove("MCP_IDEM_LOG_FORMAT")
        .stdin(Stdio::null());
    if let Some(format) = log_format {
        command.env("MCP_IDEM_LOG_FORMAT", format);
    }
    let output = command.output().expect("run mcp-idem demo-server");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_environment_picks_the_format_and_text_is_the_default() {
    let (ok, json) = demo_server_stderr(&["demo-server"], Some("json"));
    assert!(ok, "{json}");
    assert!(!json.is_empty());
    let lines: Vec<_> = json.lines().map(log_line).collect();
    assert!(
        lines
            .iter()
            .any(|line| line["message"] == "demo server listening on stdio"),
        "{json}"
    );

    let (ok, text) = demo_server_stderr(&["demo-server"], None);
    assert!(ok, "{text}");
    assert!(text.contains("demo server listening on stdio"), "{text}");
    assert!(text.lines().all(|line| !line.starts_with('{')), "{text}");

    // The flag wins over the environment, as every option's.
    let (ok, text) = demo_server_stderr(&["--log-format", "text", "demo-server"], Some("json"));
    assert!(ok, "{text}");
    assert!(text.lines().all(|line| !line.starts_with('{')), "{text}");
}

#[test]
fn an_unknown_format_is_a_usage_error() {
    let (ok, stderr) = demo_server_stderr(&["demo-server", "--log-format", "xml"], None);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("xml"), "{stderr}");
    assert!(stderr.contains("[possible values: text, json]"), "{stderr}");
    let (ok, stderr) = demo_server_stderr(&["demo-server"], Some("yaml"));
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("yaml"), "{stderr}");
}
