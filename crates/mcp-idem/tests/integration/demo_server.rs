//! `mcp-idem demo-server`: the rmcp 3.11 payment server behind the gateway, driven over raw
//! stdio (one JSON-RPC message per line).
//!
//! These exact lines work (checked by the tests below; the responses are abridged).
//!
//! Legacy era (2025-06-18, `initialize` handshake; any version up to 2025-11-25 works):
//!
//! ```text
//! -> {"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"mcp-idem-tests","version":"0"}}}
//! <- {"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"mcp-idem-demo-server","version":"0.1.0"},"instructions":"..."}}
//! -> {"jsonrpc":"2.0","method":"notifications/initialized"}
//! -> {"jsonrpc":"2.0","id":2,"method":"tools/list"}
//! <- {"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"charge_payment",...},{"name":"get_balance",...},{"name":"noop",...},{"name":"work_1ms",...}]}}
//! -> {"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"charge_payment","arguments":{"amount":100,"currency":"EUR"}}}
//! <- {"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"charged 100 EUR: ch_..."}],"structuredContent":{"amount":100,"chargeId":"ch_...","currency":"EUR"},"isError":false}}
//! ```
//!
//! 2026-07-28 era (no handshake; every request, `server/discover` included, carries both `_meta`
//! keys, else -32602; `ping` is -32601 in this era):
//!
//! ```text
//! -> {"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}
//! <- {"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2024-11-05","2025-03-26","2025-06-18","2025-11-25","2026-07-28"],"capabilities":{"tools":{}},"instructions":"...","ttlMs":0,"cacheScope":"private","_meta":{"io.modelcontextprotocol/serverInfo":{"name":"mcp-idem-demo-server","version":"0.1.0"}}}}
//! -> {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"name":"charge_payment","arguments":{"amount":100,"currency":"EUR"},"idempotencyKey":"k-1"}}
//! <- {"jsonrpc":"2.0","id":2,"result":{"resultType":"complete","content":[{"type":"text","text":"charged 100 EUR: ch_..."}],"structuredContent":{"amount":100,"chargeId":"ch_...","currency":"EUR"},"isError":false}}
//! ```
//!
//! rmcp drops the `idempotencyKey` silently: the same key charges twice. `fail_after_charge`
//! answers `{"jsonrpc":"2.0","id":N,"error":{"code":-32603,"message":"charge ch_... was recorded,
//! then the call failed (fail_after_charge)","data":{"chargeId":"ch_..."}}}`.

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::common::{
    count_charge, ledger_lines, meta_2026, wait_for_ledger, StdioPeer, TIMEOUT,
};

fn legacy_initialize(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"mcp-idem-tests","version":"0"}}})
}

fn charge_2026(id: u64, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "_meta": meta_2026(), "name":"charge_payment", "arguments": arguments}})
}

fn charge_id(response: &Value) -> String {
    let id = response["result"]["structuredContent"]["chargeId"]
        .as_str()
        .unwrap_or_else(|| panic!("no chargeId in {response}"));
    assert!(id.starts_with("ch_"), "{id}");
    id.to_owned()
}

#[test]
fn legacy_initialize_lists_the_tools_and_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let mut server = StdioPeer::demo_server(&ledger);

    let init = server.request(legacy_initialize(1));
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(
        init["result"]["serverInfo"]["name"], "mcp-idem-demo-server",
        "{init}"
    );
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    server.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));

    let list = server.request(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    let names: HashSet<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {list}"))
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        HashSet::from(["charge_payment", "get_balance", "noop", "work_1ms"])
    );

    let call = server.request(
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
        "name":"charge_payment","arguments":{"amount":100,"currency":"EUR"}}}),
    );
    let id = charge_id(&call);
    let structured = &call["result"]["structuredContent"];
    assert_eq!(structured["amount"], json!(100), "{call}");
    assert_eq!(structured["currency"], "EUR", "{call}");
    assert_eq!(call["result"]["isError"], false, "{call}");
    let text = call["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(&id), "the text names the charge: {text}");

    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], id.as_str());
    assert_eq!(lines[0]["amount"], json!(100));
    assert_eq!(lines[0]["currency"], "EUR");
    assert_eq!(lines[0]["pid"], server.pid());
    assert!(lines[0]["unixMs"].as_u64().unwrap() > 1_600_000_000_000);

    let noop = server
        .request(json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"noop"}}));
    assert_eq!(noop["result"]["content"][0]["text"], "ok", "{noop}");
    let work = server.request(
        json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"work_1ms"}}),
    );
    assert_eq!(work["result"]["content"][0]["text"], "ok", "{work}");
    assert_eq!(
        ledger_lines(&ledger).len(),
        1,
        "noop and work_1ms never charge"
    );

    assert!(server.finish().success());
}

#[test]
fn discover_then_call_in_the_2026_07_28_era_ignoring_the_idempotency_key() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let mut server = StdioPeer::demo_server(&ledger);

    let discover = server.request(json!({"jsonrpc":"2.0","id":1,"method":"server/discover",
        "params":{"_meta": meta_2026()}}));
    let result = &discover["result"];
    assert_eq!(result["resultType"], "complete", "{discover}");
    assert!(
        result["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("2026-07-28")),
        "{discover}"
    );
    assert!(result["capabilities"]["tools"].is_object(), "{discover}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-idem-demo-server"
    );

    // A request without the per-request `_meta` is rejected in this era.
    let bare = server.request(json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"charge_payment","arguments":{"amount":1,"currency":"EUR"}}}));
    assert_eq!(bare["error"]["code"], -32602, "{bare}");

    // The upstream knows nothing about idempotency: the same key charges twice.
    let mut ids = Vec::new();
    for id in [3, 4] {
        let mut call = charge_2026(id, json!({"amount":12.5,"currency":"USD"}));
        call["params"]["idempotencyKey"] = json!("k-1");
        let response = server.request(call);
        assert_eq!(response["result"]["resultType"], "complete", "{response}");
        assert_eq!(
            response["result"]["structuredContent"]["amount"],
            json!(12.5)
        );
        ids.push(charge_id(&response));
    }
    assert_ne!(ids[0], ids[1]);
    for id in &ids {
        assert_eq!(count_charge(&ledger, id), 1);
    }
    assert_eq!(ledger_lines(&ledger).len(), 2);

    let balance = server.request(json!({"jsonrpc":"2.0","id":5,"method":"tools/call",
        "params":{"_meta": meta_2026(), "name":"get_balance"}}));
    assert_eq!(
        balance["result"]["structuredContent"],
        json!({"charges": 2, "sums": {"USD": 25}}),
        "{balance}"
    );
    assert!(server.finish().success());
}

#[test]
fn fail_after_charge_is_a_json_rpc_error_with_one_ledger_line() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let mut server = StdioPeer::demo_server(&ledger);

    let response = server.request(charge_2026(
        1,
        json!({"amount":7,"currency":"EUR","fail_after_charge":true}),
    ));
    assert!(response.get("result").is_none(), "{response}");
    let error = &response["error"];
    assert_eq!(error["code"], -32603, "{response}");
    let charge_id = error["data"]["chargeId"].as_str().unwrap();
    assert!(
        error["message"].as_str().unwrap().contains(charge_id),
        "the message names the charge: {response}"
    );
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["chargeId"], charge_id);
    assert!(server.finish().success());
}

#[test]
fn concurrent_calls_answer_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let mut server = StdioPeer::demo_server(&ledger);

    server.send(&charge_2026(
        10,
        json!({"amount":1,"currency":"EUR","delay_ms":800}),
    ));
    server.send(&charge_2026(
        11,
        json!({"amount":2,"currency":"EUR","delay_ms":20}),
    ));
    let first = server.next_message(TIMEOUT).expect("a response");
    assert_eq!(first["id"], 11, "the shorter call answers first: {first}");
    assert_eq!(first["result"]["structuredContent"]["amount"], json!(2));
    let second = server.response(&json!(10));
    assert_eq!(second["result"]["structuredContent"]["amount"], json!(1));
    assert_eq!(ledger_lines(&ledger).len(), 2);
    assert!(server.finish().success());
}

#[test]
fn stdin_eof_exits_zero_after_answering_calls_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");

    // Nothing sent at all.
    let server = StdioPeer::demo_server(&ledger);
    let status = server.finish();
    assert_eq!(status.code(), Some(0));

    // EOF while a call runs: rmcp still sends its response (it drains for up to 5 s).
    let mut server = StdioPeer::demo_server(&ledger);
    server.send(&charge_2026(
        1,
        json!({"amount":3,"currency":"EUR","delay_ms":200}),
    ));
    server.close_stdin();
    let response = server.response(&json!(1));
    let id = charge_id(&response);
    assert_eq!(server.wait(TIMEOUT).code(), Some(0), "{}", server.stderr());
    assert_eq!(count_charge(&ledger, &id), 1);
}

#[test]
fn charge_ids_are_unique_across_processes_sharing_a_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    const CALLS: u64 = 25;

    // Two servers at once on the same file, each with all its calls in flight together.
    let mut servers = [
        StdioPeer::demo_server(&ledger),
        StdioPeer::demo_server(&ledger),
    ];
    for server in &mut servers {
        for id in 0..CALLS {
            server.send(&charge_2026(id, json!({"amount":id,"currency":"EUR"})));
        }
    }
    let mut ids = HashSet::new();
    for server in &mut servers {
        for id in 0..CALLS {
            ids.insert(charge_id(&server.response(&json!(id))));
        }
    }
    // And a restart on the same ledger.
    let mut restarted = StdioPeer::demo_server(&ledger);
    ids.insert(charge_id(
        &restarted.request(charge_2026(1, json!({"amount":1,"currency":"EUR"}))),
    ));
    let pids: HashSet<u32> = servers
        .iter()
        .chain([&restarted])
        .map(StdioPeer::pid)
        .collect();
    for server in servers.into_iter().chain([restarted]) {
        assert!(server.finish().success());
    }

    let total = 2 * CALLS as usize + 1;
    assert_eq!(ids.len(), total, "every call got its own charge id");
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), total, "one whole line per charge");
    let logged: HashSet<String> = lines
        .iter()
        .map(|line| line["chargeId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(logged, ids);
    let line_pids: HashSet<u32> = lines
        .iter()
        .map(|line| u32::try_from(line["pid"].as_u64().unwrap()).unwrap())
        .collect();
    assert_eq!(line_pids, pids);
}

/// rmcp drops the response of a cancelled request, but the handler runs on: the charge happens.
/// This is the lost-response case the gateway exists for.
#[test]
fn a_cancelled_call_still_charges_and_gets_no_response() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let mut server = StdioPeer::demo_server(&ledger);

    server.send(&charge_2026(
        1,
        json!({"amount":9,"currency":"EUR","delay_ms":500}),
    ));
    std::thread::sleep(Duration::from_millis(50));
    server.send(&json!({"jsonrpc":"2.0","method":"notifications/cancelled",
        "params":{"_meta": meta_2026(), "requestId":1, "reason":"timeout"}}));
    let lines = wait_for_ledger(&ledger, 1);
    assert_eq!(lines[0]["amount"], json!(9));
    // A later round trip: had rmcp answered the cancelled call, that answer came first.
    let noop = server.request(json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"_meta": meta_2026(), "name":"noop"}}));
    assert_eq!(noop["result"]["content"][0]["text"], "ok");
    assert!(
        server
            .try_response(&json!(1), Duration::from_millis(200))
            .is_none(),
        "no response for a cancelled request; also got {:?}",
        server.pending()
    );
    assert!(server.finish().success());
}

#[test]
fn the_ledger_defaults_to_mcp_idem_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("from-env.jsonl");
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
    command.arg("demo-server").env("MCP_IDEM_LEDGER", &ledger);
    let mut server = StdioPeer::spawn(command, &dir.path().join("stderr"));
    let id = charge_id(&server.request(charge_2026(1, json!({"amount":5,"currency":"EUR"}))));
    assert!(server.finish().success());
    assert_eq!(count_charge(&ledger, &id), 1);
}

#[test]
fn help_names_the_default_ledger() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(["demo-server", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(help.contains("--ledger <PATH>"), "{help}");
    assert!(help.contains("MCP_IDEM_LEDGER"), "{help}");
    assert!(help.contains("temporary directory"), "{help}");
}
