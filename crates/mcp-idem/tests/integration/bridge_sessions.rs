//! `mcp-idem bridge URL` end to end, driven as a stdio peer with raw JSON-RPC lines (the test
//! controls exactly what the client sends): both protocol eras, the session of a stateful
//! (`initialize`-era) server kept and renewed after a restart, a server-to-client request
//! (`elicitation/create`) answered through the bridge, HTTPS with a CA made in the test, and bad
//! input and faults (issue 12).
//!
//! Upstreams: `demo-server --http-stateful` (rmcp sessions; every new session prints
//! `session opened: ID`, so the test counts them), `demo-server --http` (stateless), `mcp-idem
//! proxy` in front of either (it adds `capabilities.tools.idempotency` and passes
//! `Mcp-Session-Id` through), a TLS listener in this process, and a remote in this process that
//! answers chosen tools with garbage. Every executed charge is one line in the demo server's ledger.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::bridge_sessions::{
    bridge, bridge_command, charge_id, initialize, initialized, legacy_call, legacy_charge,
    run_until_exit, server_request, sessions_opened, spawn, streams_opened, tool_names,
    wait_for_sessions, Fault, FaultyRemote, TestCa, TlsFront, EXE,
};
use crate::support::common::{count_charge, free_port, ledger_lines, StdioPeer, TIMEOUT};
use crate::support::http::{
    charge, closed_port_url, discover, ledger_in, tool_call, HttpDemo, Proxy,
};
use crate::support::wrap::wait_until;

/// The tools of `demo-server --http-stateful`.
const STATEFUL_TOOLS: [&str; 5] = [
    "charge_payment",
    "confirm_charge",
    "get_balance",
    "noop",
    "work_1ms",
];

/// Initializes an `initialize`-era session through `bridge` (revision `version`) and returns the
/// initialize result.
fn handshake(bridge: &mut StdioPeer, version: &str, capabilities: Value) -> Value {
    let init = bridge.request(initialize(1, version, capabilities));
    assert_eq!(init["result"]["protocolVersion"], version, "{init}");
    bridge.send(&initialized());
    init["result"].clone()
}

fn assert_no_panic(peer: &StdioPeer) {
    let stderr = peer.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_initialize_era_client_keeps_one_session_and_sees_the_capability_through_the_proxy() {
    for version in ["2025-06-18", "2025-11-25"] {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(&dir);
        let demo = HttpDemo::spawn(&ledger, &["--http-stateful"]);
        let proxy = Proxy::spawn(&demo.base_url(), &["--store", "memory"]);
        let mut bridge = bridge(&proxy.url, &[], dir.path());

        let result = handshake(&mut bridge, version, json!({}));
        assert!(
            result["capabilities"]["tools"]["idempotency"].is_object(),
            "{version}: the proxy's capability reaches the client: {result}"
        );
        let tools = bridge.request(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
        assert_eq!(tool_names(&tools), STATEFUL_TOOLS, "{version}");

        let first = charge_id(&bridge.request(legacy_charge(3, 10)));
        let second = charge_id(&bridge.request(legacy_charge(4, 11)));
        assert_ne!(first, second, "two calls without a key are two charges");
        let lines = ledger_lines(&ledger);
        assert_eq!(lines.len(), 2, "{version}: {lines:?}");
        assert_eq!(count_charge(&ledger, &first), 1);
        assert_eq!(count_charge(&ledger, &second), 1);

        // One session for the whole conversation: every POST carried its id, and the bridge
        // opened the session's GET stream.
        let sessions = wait_for_sessions(&demo, 1);
        assert_eq!(sessions.len(), 1, "{version}: {}", demo.stderr());
        wait_until("the GET stream of the session", TIMEOUT, || {
            streams_opened(&demo).contains(&sessions[0])
        });
        assert!(
            bridge.pending().is_empty(),
            "unexpected messages: {:?}",
            bridge.pending()
        );
        assert_no_panic(&bridge);
        assert_eq!(bridge.finish().code(), Some(0), "{version}");
        assert_eq!(sessions_opened(&demo).len(), 1, "{version}");
    }
}

/// A stateful server is restarted on its port (its sessions are gone, the old id gets 404); the
/// next call is answered, after the bridge initialized again, and runs once.
fn session_renewed_after_a_restart(through_proxy: bool) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let listen = format!("127.0.0.1:{}", free_port());
    let demo = HttpDemo::spawn_on(&listen, &ledger, &["--http-stateful"]);
    let proxy = through_proxy.then(|| Proxy::spawn(&demo.base_url(), &["--store", "memory"]));
    let url = proxy
        .as_ref()
        .map_or(demo.url.clone(), |proxy| proxy.url.clone());
    let mut bridge = bridge(&url, &[], dir.path());

    handshake(&mut bridge, "2025-06-18", json!({}));
    let before = charge_id(&bridge.request(legacy_charge(2, 20)));
    assert_eq!(wait_for_sessions(&demo, 1).len(), 1);

    drop(demo);
    let demo = HttpDemo::spawn_on(&listen, &ledger, &["--http-stateful"]);
    let answer = bridge.request(legacy_charge(3, 21));
    let after = charge_id(&answer);
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 2, "proxy: {through_proxy}: {lines:?}");
    assert_eq!(count_charge(&ledger, &before), 1);
    assert_eq!(
        count_charge(&ledger, &after),
        1,
        "the renewed call ran once"
    );
    assert_eq!(lines[1]["amount"], 21);

    // The bridge opened one new session and its GET stream, and the client saw none of the
    // re-initialization.
    let sessions = wait_for_sessions(&demo, 1);
    assert_eq!(sessions.len(), 1, "{}", demo.stderr());
    wait_until("the GET stream of the new session", TIMEOUT, || {
        streams_opened(&demo).contains(&sessions[0])
    });
    assert!(
        bridge.pending().is_empty(),
        "the re-initialization reached the client: {:?}",
        bridge.pending()
    );
    // The new session serves the client on.
    let tools = bridge.request(json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}));
    assert_eq!(tool_names(&tools), STATEFUL_TOOLS);
    assert_no_panic(&bridge);
    assert_eq!(bridge.finish().code(), Some(0));
    assert_eq!(sessions_opened(&demo).len(), 1);
}

#[test]
fn an_expired_session_is_renewed_and_the_call_runs_once() {
    session_renewed_after_a_restart(false);
}

#[test]
fn an_expired_session_is_renewed_through_the_proxy_and_the_call_runs_once() {
    session_renewed_after_a_restart(true);
}

/// `confirm_charge` through the bridge: the client reads the server's `elicitation/create` from
/// the bridge's stdout and answers it on stdin.
fn elicitation_answered_through_the_bridge(through_proxy: bool) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &["--http-stateful"]);
    let proxy = through_proxy.then(|| Proxy::spawn(&demo.base_url(), &["--store", "memory"]));
    let url = proxy
        .as_ref()
        .map_or(demo.url.clone(), |proxy| proxy.url.clone());
    let mut bridge = bridge(&url, &[], dir.path());
    handshake(&mut bridge, "2025-06-18", json!({"elicitation": {}}));

    for (id, amount, action) in [(10, 5, "accept"), (11, 6, "decline")] {
        let call = legacy_call(
            id,
            "confirm_charge",
            json!({"amount": amount, "currency": "EUR"}),
        );
        bridge.send(&call);
        let question = server_request(&mut bridge, "elicitation/create", &call["id"]);
        assert_eq!(question["jsonrpc"], "2.0", "{question}");
        assert_eq!(
            question["params"]["message"],
            format!("Charge {amount} EUR?"),
            "{question}"
        );
        assert_eq!(question["params"]["mode"], "form", "{question}");
        bridge.send(&json!({"jsonrpc":"2.0","id":question["id"],
            "result":{"action":action,"content":{}}}));
        let answer = bridge.response(&json!(id));
        let lines = ledger_lines(&ledger);
        assert_eq!(lines.len(), 1, "{action}: {answer}; {lines:?}");
        if action == "accept" {
            assert_eq!(lines[0]["chargeId"], charge_id(&answer).as_str());
        } else {
            assert_eq!(
                answer["result"]["structuredContent"],
                json!({"charged": false, "action": "decline"}),
                "{answer}"
            );
        }
    }
    assert_eq!(wait_for_sessions(&demo, 1).len(), 1);
    assert_no_panic(&bridge);
    assert_eq!(bridge.finish().code(), Some(0));
}

#[test]
fn a_servers_elicitation_is_answered_through_the_bridge() {
    elicitation_answered_through_the_bridge(false);
}

#[test]
fn a_servers_elicitation_is_answered_through_the_bridge_and_the_proxy() {
    elicitation_answered_through_the_bridge(true);
}

/// `true` for a UUID in its hyphenated form with version 4 and the RFC 4122 variant.
fn is_uuid_v4(key: &str) -> bool {
    let bytes = key.as_bytes();
    bytes.len() == 36
        && [8, 13, 18, 23].iter().all(|&at| bytes[at] == b'-')
        && key
            .chars()
            .enumerate()
            .all(|(at, c)| [8, 13, 18, 23].contains(&at) || c.is_ascii_hexdigit())
        && bytes[14] == b'4'
        && matches!(bytes[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

/// The keys of the records in the proxy's SQLite store.
fn stored_keys(store: &str) -> Vec<String> {
    let output = std::process::Command::new(EXE)
        .args(["inspect", "--store", store, "list", "--json"])
        .output()
        .expect("run mcp-idem inspect");
    assert!(output.status.success(), "{output:?}");
    let listing: Value = serde_json::from_slice(&output.stdout).expect("inspect prints JSON");
    listing["records"]
        .as_array()
        .unwrap_or_else(|| panic!("{listing}"))
        .iter()
        .map(|record| record["key"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_2026_client_discovers_the_capability_and_the_bridge_keys_its_calls() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let store = crate::support::http::sqlite_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let proxy = Proxy::spawn(&demo.base_url(), &["--store", &store]);
    let mut bridge = bridge(&proxy.url, &[], dir.path());

    let discovered = bridge.request(discover(1));
    assert!(
        discovered["result"]["capabilities"]["tools"]["idempotency"].is_object(),
        "{discovered}"
    );

    // No key from the client: the bridge gives each call one, and the proxy records it.
    let first = charge_id(&bridge.request(charge(2, 30, None)));
    let second = charge_id(&bridge.request(charge(3, 30, None)));
    assert_ne!(first, second, "two calls without a key are two charges");
    assert_eq!(ledger_lines(&ledger).len(), 2);
    let keys = stored_keys(&store);
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|key| is_uuid_v4(key)), "{keys:?}");
    assert_ne!(keys[0], keys[1]);

    // The client's own key is kept: its retry (a new id) replays the first answer.
    let once = bridge.request(charge(4, 31, Some("client-key-1")));
    let again = bridge.request(charge(5, 31, Some("client-key-1")));
    assert_eq!(charge_id(&once), charge_id(&again));
    assert_eq!(ledger_lines(&ledger).len(), 3);
    assert!(stored_keys(&store).contains(&"client-key-1".to_owned()));
    assert_no_panic(&bridge);
    assert_eq!(bridge.finish().code(), Some(0));
}

#[test]
fn https_with_a_private_ca_from_ca_cert_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let ca = TestCa::new(dir.path());
    let front = TlsFront::start(&ca, &demo.authority);
    let ca_pem = ca.ca_pem.to_str().unwrap();

    let from_flag = bridge_command(&front.url, &["--ca-cert", ca_pem]);
    let mut from_env = bridge_command(&front.url, &[]);
    from_env.env("MCP_IDEM_CA_CERT", ca_pem);
    for (n, command) in [from_flag, from_env].into_iter().enumerate() {
        let mut bridge = spawn(command, dir.path());
        let id = 10 * n as u64;
        let discovered = bridge.request(discover(id + 1));
        assert!(discovered["result"].is_object(), "{discovered}");
        let charged = charge_id(&bridge.request(charge(id + 2, 40 + n as u64, None)));
        assert_eq!(count_charge(&ledger, &charged), 1);
        assert_no_panic(&bridge);
        assert_eq!(bridge.finish().code(), Some(0));
    }
    assert_eq!(ledger_lines(&ledger).len(), 2);
    assert!(front.handshakes() >= 2, "both bridges spoke TLS");
}

#[test]
fn https_without_the_ca_fails_at_startup_with_a_tls_error() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let ca = TestCa::new(dir.path());
    let front = TlsFront::start(&ca, &demo.authority);

    let exited = run_until_exit(bridge_command(&front.url, &[]));
    let stderr = exited.assert_startup_failure(&[]).to_lowercase();
    assert!(
        stderr.contains("tls") || stderr.contains("certificate"),
        "not a clear TLS error: {stderr}"
    );
    // The bridge did reach the TLS listener and refused its certificate.
    front.wait_for_a_failed_handshake();
    assert_eq!(front.handshakes(), 0);
    assert!(ledger_lines(&ledger).is_empty());
}

#[test]
fn an_unreachable_or_malformed_url_fails_at_startup_with_status_2() {
    let closed = format!("{}/mcp", closed_port_url());
    let port = closed.rsplit(':').next().unwrap().trim_end_matches("/mcp");
    let exited = run_until_exit(bridge_command(&closed, &[]));
    let stderr = exited.assert_startup_failure(&[]);
    assert!(
        stderr.contains(port),
        "the message names the address: {stderr}"
    );

    for url in [
        "not a url",
        "ftp://127.0.0.1:21/mcp",
        "http://",
        "http://127.0.0.1:99999/mcp",
        "127.0.0.1:8080/mcp",
    ] {
        let exited = run_until_exit(bridge_command(url, &[]));
        eprintln!("{url:?}: {}", exited.stderr.trim());
        exited.assert_startup_failure(&[]);
    }
}

#[test]
fn a_bad_header_or_an_unreadable_ca_file_fails_at_startup_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let demo = HttpDemo::spawn(&ledger_in(&dir), &[]);
    for header in ["NoColon", "Bad Name: x", ": no-name", "X-Control: a\u{1}b"] {
        let exited = run_until_exit(bridge_command(&demo.url, &["--header", header]));
        eprintln!("--header {header:?}: {}", exited.stderr.trim());
        exited.assert_startup_failure(&["header"]);

        let mut command = bridge_command(&demo.url, &[]);
        command.env("MCP_IDEM_HEADERS", format!("X-Fine: 1\n{header}"));
        let exited = run_until_exit(command);
        eprintln!("MCP_IDEM_HEADERS {header:?}: {}", exited.stderr.trim());
        exited.assert_startup_failure(&["header"]);
    }

    let missing = dir.path().join("no-such-ca.pem");
    let exited = run_until_exit(bridge_command(
        &demo.url,
        &["--ca-cert", missing.to_str().unwrap()],
    ));
    exited.assert_startup_failure(&["no-such-ca.pem"]);
    let not_pem = dir.path().join("not-a-ca.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let exited = run_until_exit(bridge_command(
        &demo.url,
        &["--ca-cert", not_pem.to_str().unwrap()],
    ));
    exited.assert_startup_failure(&["not-a-ca.pem"]);
}

/// Lines that are not a JSON-RPC message the bridge could forward.
const MALFORMED_LINES: [&[u8]; 10] = [
    b"not json",
    br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"charge_payment""#,
    b"\xff\xfe garbage \xc3",
    br#"{"jsonrpc":"2.0","method":"x","params":{"s":"\xff"}}"#,
    b"",
    b"   \t",
    b"{}",
    b"[1,2]",
    b"42",
    br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"oops"}"#,
];

/// Sends every malformed line, each followed by a `noop` call (ids 1000 + n), and returns, per
/// line, the error codes that came back for it (before the `noop`'s answer); then closes stdin.
fn answers_to_malformed_lines(mut peer: StdioPeer) -> Vec<Vec<i64>> {
    let mut answers = Vec::new();
    for (n, line) in MALFORMED_LINES.iter().enumerate() {
        let mut bytes = line.to_vec();
        bytes.push(b'\n');
        peer.send_bytes(&bytes);
        let noop = peer.request(tool_call(1000 + n as u64, "noop", json!({}), None));
        assert!(noop["result"].is_object(), "{noop}");
        let mut codes = Vec::new();
        while let Some(message) = peer.next_message(Duration::ZERO) {
            let code = message["error"]["code"].as_i64();
            codes.push(code.unwrap_or_else(|| panic!("not an error answer: {message}")));
        }
        // A request with a readable id may be answered after the noop (the bridge sends both
        // to the server at once): wait for its answer by id.
        let id = serde_json::from_slice::<Value>(line)
            .ok()
            .and_then(|message| message.get("id").cloned());
        if let (true, Some(id)) = (codes.is_empty(), id) {
            if let Some(answer) = peer.try_response(&id, Duration::from_secs(5)) {
                codes.push(answer["error"]["code"].as_i64().expect("an error answer"));
            }
        }
        answers.push(codes);
    }
    peer.close_stdin();
    assert_eq!(peer.wait(TIMEOUT).code(), Some(0), "{}", peer.stderr());
    assert_no_panic(&peer);
    answers
}

/// The bridge answers a malformed line with the code `wrap` answers it with. Where `wrap` leaves
/// the line to its server and rmcp drops it silently (not JSON, not UTF-8), the bridge, which has no
/// server of its own to ask, answers what JSON-RPC 2.0 prescribes: a parse error, -32700, id null.
#[test]
fn malformed_client_lines_are_answered_as_wrap_answers_them() {
    let sandbox = crate::support::wrap::Sandbox::new();
    let wrap = sandbox.wrap_demo(&[]);
    let by_wrap = answers_to_malformed_lines(wrap);

    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let by_bridge = answers_to_malformed_lines(bridge(&demo.url, &[], dir.path()));
    for ((line, wrap), bridge) in MALFORMED_LINES.iter().zip(&by_wrap).zip(&by_bridge) {
        let line = String::from_utf8_lossy(line);
        let blank = line.trim().is_empty();
        let expected = match wrap.as_slice() {
            [] if !blank => vec![-32700],
            _ => wrap.clone(),
        };
        assert_eq!(bridge, &expected, "line {line:?}: wrap answered {wrap:?}");
    }
    assert!(ledger_lines(&ledger).is_empty());
}

#[test]
fn garbage_from_the_remote_is_a_json_rpc_error_and_the_bridge_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let remote = FaultyRemote::start(&demo.base_url());
    let mut bridge = bridge(&remote.url, &[], dir.path());

    for (n, fault) in Fault::ALL.into_iter().enumerate() {
        let id = 10 + n as u64;
        let answer = bridge.request(tool_call(id, fault.tool(), json!({}), None));
        eprintln!("{fault:?}: {answer}");
        assert!(answer.get("result").is_none(), "{fault:?}: {answer}");
        let error = &answer["error"];
        assert!(error["code"].is_i64(), "{fault:?}: {answer}");
        assert!(
            !error["message"].as_str().unwrap_or_default().is_empty(),
            "{fault:?}: {answer}"
        );
        // Without the capability (the demo server has none), a call whose answer is unreadable
        // is not sent again.
        assert_eq!(remote.served(fault), 1, "{fault:?}");
        let next = bridge.request(tool_call(100 + n as u64, "noop", json!({}), None));
        assert!(next["result"].is_object(), "after {fault:?}: {next}");
    }
    let charged = charge_id(&bridge.request(charge(200, 50, None)));
    assert_eq!(count_charge(&ledger, &charged), 1);
    assert_no_panic(&bridge);
    assert_eq!(bridge.finish().code(), Some(0));
}
