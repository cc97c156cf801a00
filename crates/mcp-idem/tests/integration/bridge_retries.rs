//! `mcp-idem bridge`'s re-issue decisions, end to end: the real bridge on stdio (driven line by
//! line), `mcp-idem proxy` (the SEP-3182 server) or the bare `demo-server --http` (no capability)
//! behind it, and the demo server's ledger counting executions.

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::bridge::{Fault, Forwarder, Plan};
use crate::support::common::{ledger_lines, meta_2026, StdioPeer};
use crate::support::http::{ledger_in, HttpDemo, Proxy, Raw};

/// `mcp-idem bridge ARGS URL` as a stdio peer, logging at `warn` (the re-issue lines).
fn bridge(dir: &tempfile::TempDir, url: &str, args: &[&str]) -> StdioPeer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
    command
        .arg("bridge")
        .args(args)
        .arg(url)
        .env("MCP_IDEM_LOG", "warn");
    StdioPeer::spawn(command, &dir.path().join("bridge.stderr"))
}

fn call(id: u64, tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments, "_meta": meta_2026()}})
}

fn keyed_call(id: u64, key: &str, arguments: Value) -> Value {
    let mut message = call(id, "charge_payment", arguments);
    message["params"]["idempotencyKey"] = json!(key);
    message
}

fn reissues(bridge: &StdioPeer) -> usize {
    bridge.stderr().matches("re-issuing tools/call").count()
}

#[test]
fn a_call_outliving_its_attempt_timeout_is_reissued_with_its_key_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", "memory"]);
    let mut bridge = bridge(&dir, &proxy.url, &["--attempt-timeout", "500ms"]);

    let slow = json!({"amount": 31, "currency": "usd", "delay_ms": 1500});
    let answer = bridge.request(call(1, "charge_payment", slow));
    let charge = answer["result"]["structuredContent"]["chargeId"].clone();
    assert!(charge.is_string(), "{answer}");
    assert_eq!(answer["id"], 1, "answered under the client's own id");

    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 1, "executed once: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charge);
    let log = bridge.stderr();
    assert!(reissues(&bridge) >= 1, "{log}");
    assert!(log.contains("reason=no answer within 500ms"), "{log}");
    assert!(log.contains("reason=idempotency_key_in_progress"), "{log}");
    assert!(bridge.finish().success());
}

#[test]
fn conflicts_and_other_answers_reach_the_client_as_they_came() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", "memory"]);
    let mut bridge = bridge(&dir, &proxy.url, &[]);

    let first = bridge.request(keyed_call(
        1,
        "own-key",
        json!({"amount": 1, "currency": "usd"}),
    ));
    assert!(
        first["result"]["structuredContent"]["chargeId"].is_string(),
        "{first}"
    );
    let replay = bridge.request(keyed_call(
        2,
        "own-key",
        json!({"amount": 1.0, "currency": "usd"}),
    ));
    assert_eq!(
        replay["result"], first["result"],
        "the client's own key is kept"
    );
    let conflict = bridge.request(keyed_call(
        3,
        "own-key",
        json!({"amount": 2, "currency": "usd"}),
    ));
    assert_eq!(
        conflict["error"]["data"]["type"], "idempotency_key_conflict",
        "{conflict}"
    );
    let unknown_tool = bridge.request(call(4, "no_such_tool", json!({})));
    assert!(unknown_tool.get("error").is_some() || unknown_tool["result"]["isError"] == true);

    assert_eq!(ledger_lines(&ledger).len(), 1);
    assert_eq!(reissues(&bridge), 0, "{}", bridge.stderr());
    assert!(bridge.finish().success());
}

#[test]
fn when_the_time_is_up_the_client_gets_the_key_and_an_unknown_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", "memory"]);
    let mut bridge = bridge(&dir, &proxy.url, &["--max-time", "1500ms"]);
    let discovered = bridge.request(
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                                           "params": {"_meta": meta_2026()}}),
    );
    assert!(discovered["result"]["capabilities"]["tools"]["idempotency"].is_object());

    // The upstream is gone: the proxy answers 502, a lost answer the bridge re-issues.
    drop(demo);
    let answer = bridge.request(call(
        2,
        "charge_payment",
        json!({"amount": 3, "currency": "usd"}),
    ));
    let data = &answer["error"]["data"];
    assert_eq!(data["type"], "mcp_idem_answer_lost", "{answer}");
    assert_eq!(data["reissued"], true, "{answer}");
    assert_eq!(data["mayHaveRun"], true, "{answer}");
    let key = data["idempotencyKey"].as_str().expect("the key is named");
    assert_eq!(key.len(), 36, "a UUID v4: {key}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(key) && message.contains("outcome is unknown"),
        "{message}"
    );
    assert!(data["attempts"].as_u64().unwrap() >= 2, "{answer}");
    assert!(bridge.stderr().contains(&format!("key={key}")));
    assert!(bridge.finish().success());
}

#[test]
fn without_the_capability_a_lost_answer_is_not_reissued() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let mut demo = Some(HttpDemo::spawn(&ledger, &[]));
    let url = demo.as_ref().unwrap().url.clone();
    let mut bridge = bridge(&dir, &url, &["--attempt-timeout", "200ms"]);

    // Slower than the attempt timeout, but not re-issuable: the bridge waits for it.
    let slow = json!({"amount": 4, "currency": "usd", "delay_ms": 600});
    let answer = bridge.request(call(1, "charge_payment", slow));
    assert!(
        answer["result"]["structuredContent"]["chargeId"].is_string(),
        "{answer}"
    );

    // The server dies while the call runs: the answer is lost after the charge may have run.
    bridge.send(&call(
        2,
        "charge_payment",
        json!({"amount": 5, "currency": "usd", "delay_ms": 3000}),
    ));
    crate::support::common::wait_for_ledger(&ledger, 1);
    std::thread::sleep(Duration::from_millis(300));
    drop(demo.take());
    let lost = bridge.response(&json!(2));
    let error = &lost["error"];
    assert!(error.is_object(), "{lost}");
    assert_eq!(error["data"]["mayHaveRun"], true, "{lost}");
    assert_eq!(reissues(&bridge), 0, "{}", bridge.stderr());
    assert_eq!(ledger_lines(&ledger).len(), 1, "nothing ran twice");
    assert!(bridge.finish().success());
}

#[test]
fn a_cancelled_call_stops_being_reissued_and_gets_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", "memory"]);
    let mut bridge = bridge(&dir, &proxy.url, &["--attempt-timeout", "300ms"]);

    bridge.send(&call(
        1,
        "charge_payment",
        json!({"amount": 6, "currency": "usd", "delay_ms": 4000}),
    ));
    let deadline = std::time::Instant::now() + crate::support::common::TIMEOUT;
    while reissues(&bridge) < 2 {
        assert!(std::time::Instant::now() < deadline, "{}", bridge.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    bridge.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 1, "reason": "the user gave up"}}),
    );
    std::thread::sleep(Duration::from_millis(200));
    let after_cancel = reissues(&bridge);
    assert_eq!(
        bridge.try_response(&json!(1), Duration::from_millis(1500)),
        None
    );
    assert_eq!(reissues(&bridge), after_cancel, "{}", bridge.stderr());

    // The bridge goes on serving; the cancelled charge still ran once (the proxy absorbs it).
    let next = bridge.request(call(
        2,
        "charge_payment",
        json!({"amount": 7, "currency": "usd"}),
    ));
    assert!(
        next["result"]["structuredContent"]["chargeId"].is_string(),
        "{next}"
    );
    assert_eq!(crate::support::common::wait_for_ledger(&ledger, 2).len(), 2);
    assert!(bridge.finish().success());
}

#[test]
fn malformed_and_oversized_lines_are_answered_and_the_bridge_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let mut bridge = bridge(&dir, &demo.url, &["--max-line-bytes", "1000"]);

    bridge.send_raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"#);
    let parse_error = bridge
        .next_message(crate::support::common::TIMEOUT)
        .expect("an answer");
    assert_eq!(parse_error["error"]["code"], -32700, "{parse_error}");
    bridge.send_bytes(b"\xff\xfe\n");
    assert_eq!(
        bridge
            .next_message(crate::support::common::TIMEOUT)
            .unwrap()["error"]["code"],
        -32700
    );
    bridge.send_raw("[1,2]x");
    assert_eq!(
        bridge
            .next_message(crate::support::common::TIMEOUT)
            .unwrap()["error"]["code"],
        -32700
    );
    bridge.send_raw(r#"{"jsonrpc":"2.0","id":7,"nothing":true}"#);
    assert_eq!(
        bridge
            .next_message(crate::support::common::TIMEOUT)
            .unwrap()["error"]["code"],
        -32600
    );
    let long = format!(
        r#"{{"jsonrpc":"2.0","id":8,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(2000)
    );
    bridge.send_raw(&long);
    let too_long = bridge.response(&json!(8));
    assert_eq!(too_long["error"]["code"], -32600, "{too_long}");

    let ok = bridge.request(call(
        9,
        "charge_payment",
        json!({"amount": 8, "currency": "usd"}),
    ));
    assert!(
        ok["result"]["structuredContent"]["chargeId"].is_string(),
        "{ok}"
    );
    assert!(!bridge.stderr().contains("panicked"));
    assert!(bridge.finish().success());
}

/// Without the capability, a tool that `tools/list` annotates read-only is re-issued after its
/// answer was lost (a second run is harmless), while a charge is not.
#[test]
fn without_the_capability_a_read_only_tool_is_reissued() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    // The first answer to every call is dropped after the server ran it.
    let plan = Plan::new(|call| {
        if call.attempt == 0 {
            Fault::Drop
        } else {
            Fault::Forward
        }
    });
    let forwarder = Forwarder::start(&demo.url, None, plan, Duration::from_secs(5));
    let mut bridge = bridge(&dir, &forwarder.url, &[]);

    let listed = bridge.request(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                                       "params": {"_meta": meta_2026()}}));
    let tools = listed["result"]["tools"].as_array().expect("tools").clone();
    let balance = tools
        .iter()
        .find(|t| t["name"] == "get_balance")
        .expect("get_balance");
    assert_eq!(balance["annotations"]["readOnlyHint"], true, "{balance}");

    let answer = bridge.request(call(2, "get_balance", json!({})));
    assert!(
        answer["result"].is_object(),
        "re-issued and answered: {answer}"
    );
    assert_eq!(reissues(&bridge), 1, "{}", bridge.stderr());

    let lost = bridge.request(call(
        3,
        "charge_payment",
        json!({"amount": 9, "currency": "usd"}),
    ));
    assert_eq!(lost["error"]["data"]["reissued"], false, "{lost}");
    assert_eq!(reissues(&bridge), 1, "the charge was not re-issued");
    assert_eq!(ledger_lines(&ledger).len(), 1, "the charge ran once");
    assert!(bridge.finish().success());
}

/// A client that keys its calls in `_meta` (`_meta.idempotencyKey`, or a name both the bridge and
/// the proxy are told with `--meta-key`) keeps its key through the bridge: the bridge adds no
/// SEP key of its own (which would outrank it), re-issues a lost answer with the same message,
/// and the same call after a restart of the bridge, or sent straight to the proxy, is replayed.
#[test]
fn a_key_in_meta_is_kept_across_a_restart_of_the_bridge_and_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let named = "io.example/idempotency-key";
    let proxy = Proxy::spawn(
        &demo.base_url(),
        &["--store", "memory", "--meta-key", named],
    );
    // The first answer to each key is dropped after the server ran the call.
    let plan = Plan::new(|call| {
        if call.attempt == 0 {
            Fault::Drop
        } else {
            Fault::Forward
        }
    });
    let forwarder = Forwarder::start(&proxy.url, None, plan, Duration::from_secs(5));
    let meta_call = |id: u64, name: &str, key: &str, amount: u64| {
        let mut message = call(
            id,
            "charge_payment",
            json!({"amount": amount, "currency": "usd"}),
        );
        message["params"]["_meta"][name] = json!(key);
        message
    };
    let charge_of = |answer: &Value| -> String {
        answer["result"]["structuredContent"]["chargeId"]
            .as_str()
            .unwrap_or_else(|| panic!("no charge: {answer}"))
            .to_owned()
    };

    let mut first = bridge(&dir, &forwarder.url, &["--meta-key", named]);
    let charge = charge_of(&first.request(meta_call(1, "idempotencyKey", "m-41", 41)));
    let named_charge = charge_of(&first.request(meta_call(2, named, "m-42", 42)));
    assert_eq!(reissues(&first), 2, "{}", first.stderr());
    assert!(first.finish().success());
    let exchanges = forwarder.exchanges();
    assert_eq!(exchanges.len(), 4, "{}", forwarder.summary());
    for exchange in &exchanges {
        assert_eq!(exchange.key, None, "no SEP key added: {exchange:?}");
        assert!(exchange.meta_key.is_some(), "{exchange:?}");
    }
    assert_eq!(
        ledger_lines(&ledger).len(),
        2,
        "the re-issues were replayed"
    );

    // The client restarts, and so does the bridge it launches: the same calls again.
    let mut second = bridge(&dir, &forwarder.url, &["--meta-key", named]);
    let again = second.request(meta_call(1, "idempotencyKey", "m-41", 41));
    assert_eq!(charge_of(&again), charge, "{again}");
    let again = second.request(meta_call(2, named, "m-42", 42));
    assert_eq!(charge_of(&again), named_charge, "{again}");
    assert!(second.finish().success());

    // The same key sent straight to the proxy.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let raw = Raw::new(&proxy);
    let direct = runtime.block_on(raw.call(meta_call(3, "idempotencyKey", "m-41", 41)));
    assert_eq!(direct.charge_id(), Some(charge), "{direct:?}");
    let direct = runtime.block_on(raw.call(meta_call(4, named, "m-42", 42)));
    assert_eq!(direct.charge_id(), Some(named_charge), "{direct:?}");
    assert_eq!(ledger_lines(&ledger).len(), 2, "each key ran once");
}
