//! `--tools suggested` (issue 39): `wrap` applies what `mcp-idem tools` prints to the tools the
//! server lists, listing them itself before it decides a key-less call. Driven around
//! `@modelcontextprotocol/server-memory` (pinned in `interop/package.json`; `npm ci` in interop/),
//! whose write tools are annotated `readOnlyHint: false` and its readers `readOnlyHint: true`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::support::common::StdioPeer;
use crate::support::interop::interop_dir;
use crate::support::wrap::{legacy_initialize, Sandbox};

/// The memory server's entry point, or `None` (a note; under `CI=true` a panic) when `npm ci` was
/// not run in interop/.
fn memory_server() -> Option<PathBuf> {
    let server =
        interop_dir().join("node_modules/@modelcontextprotocol/server-memory/dist/index.js");
    if server.is_file() {
        return Some(server);
    }
    let in_ci = std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1");
    assert!(
        !in_ci,
        "CI=true but server-memory is missing: run `npm ci` in interop/"
    );
    eprintln!("NOTE: skipping: server-memory is missing: run `npm ci` in interop/");
    None
}

/// `wrap --tools suggested` around the memory server keeping its graph in `memory_file`, with a
/// client that has initialized (and never lists the tools itself).
fn wrap_memory(
    sandbox: &Sandbox,
    server: &Path,
    memory_file: &Path,
    options: &[&str],
) -> StdioPeer {
    let upstream: Vec<OsString> = vec!["node".into(), server.into()];
    let mut command = sandbox.wrap_command(options, &upstream);
    command.env("MEMORY_FILE_PATH", memory_file);
    let mut wrap = StdioPeer::spawn(command, &sandbox.path("wrap.stderr"));
    let answer = wrap.request(legacy_initialize(0));
    assert!(answer.get("result").is_some(), "{answer}");
    wrap.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    wrap
}

fn call(id: u64, tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments}})
}

fn replayed(answer: &Value) -> Option<&str> {
    answer["result"]["_meta"]["mcp-idem/replayed"].as_str()
}

/// A key-less `create_entities` retried by a restarted client (a new `wrap` on the same store)
/// is the first call's replay: the suggestion gives the tool a window, learned by `wrap`'s own
/// `tools/list` before the call is decided. The read-only tools run every time.
#[test]
fn suggested_policies_replay_a_key_less_retry_and_leave_readers_alone() {
    let Some(server) = memory_server() else {
        return;
    };
    let sandbox = Sandbox::new();
    let memory_file = sandbox.path("memory.jsonl");
    let entity = json!({"entities": [{"name": "ledger", "entityType": "account",
                                      "observations": ["opened"]}]});
    let mut first = wrap_memory(&sandbox, &server, &memory_file, &["--tools", "suggested"]);
    let created = first.request(call(1, "create_entities", entity.clone()));
    assert_eq!(
        created["result"]["structuredContent"]["entities"][0]["name"], "ledger",
        "{created}"
    );
    assert_eq!(replayed(&created), None, "{created}");
    let read = first.request(call(2, "read_graph", json!({})));
    assert_eq!(replayed(&read), None, "{read}");
    // No message the client did not ask for reached it (the gateway's own listing is absorbed).
    assert!(first.pending().is_empty(), "{:?}", first.pending());
    first.finish();

    let mut second = wrap_memory(&sandbox, &server, &memory_file, &["--tools", "suggested"]);
    let retry = second.request(call(1, "create_entities", entity));
    assert_eq!(replayed(&retry), Some("window"), "{retry}");
    assert_eq!(
        retry["result"]["structuredContent"],
        created["result"]["structuredContent"]
    );
    for id in [2, 3] {
        let read = second.request(call(id, "read_graph", json!({})));
        assert_eq!(replayed(&read), None, "read_graph is read-only: {read}");
        let search = second.request(call(id + 10, "search_nodes", json!({"query": "ledger"})));
        assert_eq!(
            replayed(&search),
            None,
            "search_nodes is read-only: {search}"
        );
    }
    second.finish();
    let memory = std::fs::read_to_string(&memory_file).expect("the memory server wrote its file");
    assert_eq!(memory.lines().count(), 1, "{memory}");
}

/// Without `--tools suggested` the same retry runs twice: the suggestion is opt-in.
#[test]
fn without_suggested_policies_a_key_less_retry_runs_twice() {
    let Some(server) = memory_server() else {
        return;
    };
    let sandbox = Sandbox::new();
    let memory_file = sandbox.path("memory.jsonl");
    let observation = json!({"observations": [{"entityName": "ledger", "contents": ["paid"]}]});
    let entity =
        json!({"entities": [{"name": "ledger", "entityType": "account", "observations": []}]});
    let mut wrap = wrap_memory(&sandbox, &server, &memory_file, &[]);
    wrap.request(call(1, "create_entities", entity));
    for id in [2, 3] {
        let added = wrap.request(call(id, "add_observations", observation.clone()));
        assert_eq!(replayed(&added), None, "{added}");
    }
    wrap.finish();
}

/// A tool's own table overrides the suggestion: `create_entities` with a window of its own.
#[test]
fn an_explicit_table_overrides_the_suggestion() {
    let Some(server) = memory_server() else {
        return;
    };
    let sandbox = Sandbox::new();
    let memory_file = sandbox.path("memory.jsonl");
    let tools = r#"{"suggested": true, "read_graph": {"window": "1m"}}"#;
    let mut wrap = wrap_memory(&sandbox, &server, &memory_file, &["--tools", tools]);
    wrap.request(call(1, "read_graph", json!({})));
    let again = wrap.request(call(2, "read_graph", json!({})));
    assert_eq!(replayed(&again), Some("window"), "{again}");
    let entity = json!({"entities": [{"name": "a", "entityType": "t", "observations": []}]});
    wrap.request(call(3, "create_entities", entity.clone()));
    let retry = wrap.request(call(4, "create_entities", entity));
    assert_eq!(replayed(&retry), Some("window"), "{retry}");
    wrap.finish();
}

/// With no tool policy, `wrap` logs once, at the first `tools/list`, the tools a key-less retry
/// would run again and the command that prints a policy for them; the key-less calls to them are
/// counted as unprotected, by tool (a name the server did not list is never a label), and the
/// read-only tool's are not.
#[test]
fn key_less_calls_to_tools_at_risk_are_logged_and_counted() {
    use crate::ops::{metrics_authority, sample, scrape};
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&["--metrics-listen", "127.0.0.1:0"]);
    let answer = wrap.request(legacy_initialize(0));
    assert!(answer.get("result").is_some(), "{answer}");
    wrap.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for id in [1, 2] {
        let listed = wrap.request(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
        assert!(listed["result"]["tools"].is_array(), "{listed}");
    }
    let charge = json!({"amount": 5, "currency": "EUR"});
    for id in [3, 4] {
        let charged = wrap.request(call(id, "charge_payment", charge.clone()));
        assert!(charged.get("result").is_some(), "{charged}");
    }
    wrap.request(call(5, "get_balance", json!({})));
    wrap.request(call(6, "made_up_by_a_client", json!({})));
    let stderr = wrap.stderr();
    let logged: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("no tool policy is set"))
        .collect();
    assert_eq!(logged.len(), 1, "once:\n{stderr}");
    assert!(logged[0].contains("charge_payment"), "{stderr}");
    assert!(!logged[0].contains("get_balance"), "read-only: {stderr}");
    // The command that prints a policy for this very server.
    assert!(logged[0].contains("mcp-idem tools -- "), "{stderr}");
    assert!(logged[0].contains("demo-server --ledger"), "{stderr}");
    let scraped = scrape(&metrics_authority(&stderr));
    let unprotected = |tool: &str| {
        sample(
            &scraped,
            &format!("mcp_idem_unprotected_calls_total{{tool=\"{tool}\"}}"),
        )
    };
    assert_eq!(unprotected("charge_payment"), 2.0, "{scraped}");
    assert_eq!(unprotected("(unlisted)"), 1.0, "{scraped}");
    assert!(!scraped.contains("made_up_by_a_client"), "{scraped}");
    assert!(!scraped.contains("tool=\"get_balance\""), "{scraped}");
    wrap.finish();
}

/// `proxy --tools suggested` lists the upstream's tools itself at start: a key-less
/// `charge_payment` retried by a client that never listed them is the first call's replay, and
/// the ledger holds one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lists_the_tools_itself_and_applies_the_suggestion() {
    use crate::support::common::ledger_lines;
    use crate::support::http::{charge, ledger_in, sqlite_in, HttpDemo, Proxy, Raw};
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let proxy = Proxy::spawn_with_log(
        &server.base_url(),
        &["--store", &store, "--tools", "suggested"],
        "info",
    );
    proxy.logged("listed the upstream's tools").await;
    let raw = Raw::new(&proxy);
    let first = raw.call(charge(1, 10, None)).await;
    assert!(first.charge_id().is_some(), "{}", first.body);
    let retry = raw.call(charge(2, 10, None)).await;
    assert_eq!(retry.charge_id(), first.charge_id(), "{}", retry.body);
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// An upstream that keeps legacy sessions (no 2026-07-28 `tools/list` without one) is listed on a
/// session of the proxy's own, ended at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lists_a_stateful_upstream_on_a_session_of_its_own() {
    use crate::support::http::{ledger_in, sqlite_in, HttpDemo, Proxy};
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &["--http-stateful"]);
    let store = sqlite_in(&dir);
    let proxy = Proxy::spawn_with_log(
        &server.base_url(),
        &["--store", &store, "--tools", "suggested"],
        "info",
    );
    proxy.logged("listed the upstream's tools").await;
    proxy.logged("suggested tool policy applied").await;
    assert!(
        proxy.stderr().contains("charge_payment"),
        "{}",
        proxy.stderr()
    );
}
