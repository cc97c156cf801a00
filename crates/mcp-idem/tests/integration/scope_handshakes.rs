//! The namespace a call is decided under never depends on what its connection sent before it
//! (issue 39): under MCP 2026-07-28 a client need send no handshake, and the TS SDK v2 client
//! sends `server/discover` on one connection and not on the next. Each scenario runs a call
//! through one `mcp-idem wrap` process, then its retry through a new one (a new connection and a
//! new process, as after a client restart) on the same SQLite file, with every combination of
//! no handshake, `server/discover` and `initialize` on either side, for every key source; the
//! demo server's ledger counts what ran. A server moved from `wrap` into a binding keeps its
//! records too.

use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::binding_scenarios::Binding;
use crate::support::common::{ledger_lines, StdioPeer};
use crate::support::wrap::{
    assert_rejected, call, charge_id, discover, legacy_initialize, sh_join, Sandbox,
};

/// What a connection sends before its call.
#[derive(Clone, Copy, Debug)]
enum Handshake {
    None,
    Discover,
    Initialize,
}

const HANDSHAKES: [Handshake; 3] = [Handshake::None, Handshake::Discover, Handshake::Initialize];

/// Where the call's key comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// `params.idempotencyKey`.
    Sep,
    /// `params._meta.idempotencyKey`.
    Meta,
    /// A `key-argument` policy on `order_id`.
    Argument,
    /// A `key-from = ["/order_id"]` policy.
    KeyFrom,
    /// A 10-minute window: the call alone is its key.
    Window,
}

impl Source {
    /// `wrap`'s options for this source.
    fn options(self) -> Vec<&'static str> {
        let tools = match self {
            Self::Sep | Self::Meta => return Vec::new(),
            Self::Argument => r#"{"charge_payment":{"key-argument":"order_id"}}"#,
            Self::KeyFrom => r#"{"charge_payment":{"key-from":["/order_id"]}}"#,
            Self::Window => r#"{"charge_payment":{"window":"10m"}}"#,
        };
        vec!["--tools", tools]
    }

    /// The call, keyed by `key` as this source keys it.
    fn call(self, id: u64, key: &str) -> Value {
        let arguments = json!({"amount": 17, "currency": "EUR", "order_id": key});
        match self {
            Self::Sep => call(id, "charge_payment", arguments, Some(json!(key))),
            Self::Meta => {
                let mut message = call(id, "charge_payment", arguments, None);
                message["params"]["_meta"]["idempotencyKey"] = json!(key);
                message
            }
            Self::Argument | Self::KeyFrom | Self::Window => {
                call(id, "charge_payment", arguments, None)
            }
        }
    }
}

/// Sends `handshake` on `peer` (request id 1).
fn shake(peer: &mut StdioPeer, handshake: Handshake) {
    match handshake {
        Handshake::None => {}
        Handshake::Discover => {
            let result = peer.request(discover(1));
            assert!(result["result"].is_object(), "{result}");
        }
        Handshake::Initialize => {
            let result = peer.request(legacy_initialize(1));
            assert!(result["result"]["serverInfo"].is_object(), "{result}");
            peer.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        }
    }
}

/// For each pair of handshakes: the call through one `wrap`, its retry through the next; one
/// charge.
fn one_execution_whatever_the_handshakes(source: Source) {
    for first in HANDSHAKES {
        for second in HANDSHAKES {
            let sandbox = Sandbox::new();
            let scenario = format!("{source:?}: {first:?} then {second:?}");
            let mut before = sandbox.wrap_demo(&source.options());
            shake(&mut before, first);
            let executed = charge_id(&before.request(source.call(2, "k-restart")));
            assert_eq!(before.finish().code(), Some(0), "{scenario}");

            let mut after = sandbox.wrap_demo(&source.options());
            shake(&mut after, second);
            let retry = after.request(source.call(2, "k-restart"));
            assert_eq!(charge_id(&retry), executed, "{scenario}: {retry}");
            assert_eq!(after.finish().code(), Some(0), "{scenario}");
            assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1, "{scenario}");
        }
    }
}

#[test]
fn a_sep_keyed_retry_runs_once_whatever_each_connection_sent_first() {
    one_execution_whatever_the_handshakes(Source::Sep);
}

#[test]
fn a_meta_keyed_retry_runs_once_whatever_each_connection_sent_first() {
    one_execution_whatever_the_handshakes(Source::Meta);
}

#[test]
fn a_key_argument_retry_runs_once_whatever_each_connection_sent_first() {
    one_execution_whatever_the_handshakes(Source::Argument);
}

#[test]
fn a_key_from_retry_runs_once_whatever_each_connection_sent_first() {
    one_execution_whatever_the_handshakes(Source::KeyFrom);
}

#[test]
fn a_windowed_retry_runs_once_whatever_each_connection_sent_first() {
    one_execution_whatever_the_handshakes(Source::Window);
}

/// Two `wrap`s at once on one store, one whose client sent `server/discover` and one whose
/// client sent nothing: a duplicate sent to the second while the call runs in the first is in
/// progress there, and its retry is a replay.
#[test]
fn two_wraps_at_once_one_without_a_handshake_decide_in_one_namespace() {
    let sandbox = Sandbox::new();
    let mut named = sandbox.wrap_demo(&[]);
    let mut silent = sandbox.wrap_demo(&[]);
    shake(&mut named, Handshake::Discover);
    let slow = json!({"amount": 18, "currency": "EUR", "delay_ms": 1500});
    named.send(&call(
        2,
        "charge_payment",
        slow.clone(),
        Some(json!("k-both")),
    ));
    // Give `named` the time to claim the key (it does so before forwarding the call).
    std::thread::sleep(Duration::from_millis(300));
    let duplicate = silent.request(call(
        2,
        "charge_payment",
        slow.clone(),
        Some(json!("k-both")),
    ));
    assert_rejected(
        &duplicate,
        -32602,
        "idempotency_key_in_progress",
        Some("k-both"),
    );
    let executed = charge_id(&named.response(&json!(2)));
    let replay = silent.request(call(3, "charge_payment", slow, Some(json!("k-both"))));
    assert_eq!(charge_id(&replay), executed, "{replay}");
    assert_eq!(named.finish().code(), Some(0));
    assert_eq!(silent.finish().code(), Some(0));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
}

/// The request `wrap` sends to learn the server's name is its own: the client sees only the
/// answers to what it sent, and the call is recorded under `mcp-server:<name>`.
#[test]
fn the_name_request_is_absorbed_and_the_record_is_under_the_servers_name() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    let arguments = json!({"amount": 19, "currency": "EUR"});
    charge_id(&wrap.request(call(7, "charge_payment", arguments, Some(json!("k-own")))));
    wrap.close_stdin();
    assert_eq!(wrap.wait(crate::support::common::TIMEOUT).code(), Some(0));
    if let Some(message) = wrap.next_message(Duration::from_millis(200)) {
        panic!("the client got a message it did not ask for: {message}");
    }
    let ids: Vec<&Value> = wrap.pending().iter().map(|m| &m["id"]).collect();
    assert!(
        ids.is_empty(),
        "the client got messages it did not ask for: {ids:?}"
    );
    assert_eq!(wrap.raw_lines().len(), 1, "{:?}", wrap.raw_lines());

    let listed = std::process::Command::new(crate::support::wrap::EXE)
        .args(["inspect", "--store", &sandbox.store(), "list", "--json"])
        .output()
        .expect("run inspect");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("mcp-server:"), "{listed}");
    assert!(!listed.contains("wrap:"), "{listed}");
}

/// A server that does not know `server/discover` (a revision before 2026-07-28) and a client that
/// sends no `initialize` first: the keyed call is refused with `idempotency_scope_unknown`, not
/// run under another namespace; after `initialize` it runs.
#[test]
fn a_server_that_does_not_name_itself_gets_keyed_calls_refused_until_initialize() {
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    // The demo server behind a filter that answers `server/discover` as a legacy server does.
    let upstream: Vec<OsString> = vec![
        "python3".into(),
        "-c".into(),
        LEGACY_FILTER.into(),
        sh_join(&sandbox.demo(&ledger)).into(),
    ];
    let mut wrap = sandbox.wrap(&[], &upstream);
    let arguments = json!({"amount": 20, "currency": "EUR"});
    let refused = wrap.request(call(
        2,
        "charge_payment",
        arguments.clone(),
        Some(json!("k-legacy")),
    ));
    assert_rejected(
        &refused,
        -32603,
        "idempotency_scope_unknown",
        Some("k-legacy"),
    );
    assert!(ledger_lines(&ledger).is_empty());
    shake(&mut wrap, Handshake::Initialize);
    charge_id(&wrap.request(call(
        3,
        "charge_payment",
        arguments,
        Some(json!("k-legacy")),
    )));
    assert_eq!(wrap.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// A server moved from `wrap` (no handshake yet) into the binding keeps its records: process 1 is
/// `wrap` around the plain payments server of `binding`, whose client sends a SEP-keyed call and
/// nothing before it; process 2 is the same server with the binding in process, on the same SQLite
/// file, and the same call's retry is the first call's replay: one charge. Both keep the record
/// under `mcp-server:payments` for the local user.
fn a_server_moved_from_wrap_into_the_binding_keeps_its_records(binding: Binding) {
    if !binding.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let store = sandbox.store();
    let arguments = json!({"amount": 21, "currency": "EUR"});
    let keyed = call(2, "charge_payment", arguments, Some(json!("k1")));

    let mut wrapped = sandbox.wrap(&[], &binding.stdio_command(&ledger, &["--plain"]));
    let executed = charge_id(&wrapped.request(keyed.clone()));
    assert_eq!(wrapped.finish().code(), Some(0));

    let argv = binding.stdio_command(&ledger, &["--store", &store]);
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("MCP_IDEM_NAMESPACE")
        .env_remove("MCP_IDEM_PRINCIPAL");
    let mut bound = StdioPeer::spawn(command, &sandbox.path("bound.stderr"));
    let retry = bound.request(keyed);
    assert_eq!(charge_id(&retry), executed, "{retry}\n{}", bound.stderr());
    assert_eq!(bound.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

#[test]
fn a_python_server_moved_from_wrap_into_the_binding_keeps_its_records() {
    a_server_moved_from_wrap_into_the_binding_keeps_its_records(Binding::Python);
}

#[test]
fn a_node_server_moved_from_wrap_into_the_binding_keeps_its_records() {
    a_server_moved_from_wrap_into_the_binding_keeps_its_records(Binding::Node);
}

/// A stdio filter in front of a server command (its argument, run by `sh -c`): answers
/// `server/discover` itself with "method not found", as a server before 2026-07-28 does, and
/// passes everything else both ways.
const LEGACY_FILTER: &str = r#"
import json, subprocess, sys, threading
server = subprocess.Popen(sys.argv[1], shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
lock = threading.Lock()
def out(line):
    with lock:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
def pump():
    for line in server.stdout:
        out(line)
threading.Thread(target=pump, daemon=True).start()
for line in sys.stdin.buffer:
    message = json.loads(line)
    if isinstance(message, dict) and message.get("method") == "server/discover":
        error = {"code": -32601, "message": "Method not found"}
        out((json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}) + "\n").encode())
        continue
    server.stdin.write(line)
    server.stdin.flush()
server.stdin.close()
server.wait()
"#;
