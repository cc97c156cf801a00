//! One default scope for a server in every form (docs/scopes.md): `wrap` keeps records under
//! `mcp-server:<the server's own name>` as the bindings do, so a server moved from `wrap` into a
//! binding, with default options on both sides, replays what it answered under `wrap`; and the
//! records `wrap` kept under its previous default (`wrap:<program>:<hash>`) are still found.

use std::ffi::OsString;
use std::process::Command;

use mcp_idempotency::default_scope::wrap_legacy_namespace;
use serde_json::json;

use crate::binding_scenarios::Binding;
use crate::support::common::{ledger_lines, StdioPeer};
use crate::support::wrap::{assert_rejected, charge, charge_id, discover, Sandbox};

/// The binding's payments server, first without the binding under `wrap`, then with it on the
/// same SQLite file: the retry of a call answered under `wrap` is a replay.
fn moved_from_wrap_into(binding: Binding) {
    if !binding.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let arguments = json!({"amount": 12, "currency": "eur"});

    let mut wrapped = sandbox.wrap(&[], &binding.stdio_command(&ledger, &["--plain"]));
    let discovered = wrapped.request(discover(1));
    assert!(
        discovered["result"]["capabilities"]["tools"]["idempotency"].is_object(),
        "{discovered}"
    );
    let executed = charge_id(&wrapped.request(charge(2, arguments.clone(), "moved")));
    assert_eq!(wrapped.finish().code(), Some(0));

    let argv = binding.stdio_command(&ledger, &["--store", &sandbox.store()]);
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).env("PYTHONDONTWRITEBYTECODE", "1");
    let mut bound = StdioPeer::spawn(command, &sandbox.path("bound.stderr"));
    bound.request(discover(1));
    let replay = bound.request(charge(2, arguments.clone(), "moved"));
    assert_eq!(charge_id(&replay), executed, "{replay}");
    let conflict = bound.request(charge(3, json!({"amount": 13, "currency": "eur"}), "moved"));
    assert_rejected(&conflict, -32602, "idempotency_key_conflict", Some("moved"));
    drop(bound);
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

#[test]
fn a_server_moved_from_wrap_into_the_python_binding_keeps_its_records() {
    moved_from_wrap_into(Binding::Python);
}

#[test]
fn a_server_moved_from_wrap_into_the_node_binding_keeps_its_records() {
    moved_from_wrap_into(Binding::Node);
}

/// What the previous `wrap` kept under its default namespace is replayed by this one, and a
/// conflicting reuse of its key is still a conflict.
#[test]
fn records_of_the_previous_wrap_default_are_found_after_the_upgrade() {
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let demo = sandbox.demo(&ledger);
    let command: Vec<String> = demo
        .iter()
        .map(|arg| arg.to_str().unwrap().into())
        .collect();
    let legacy = wrap_legacy_namespace(&command);
    let arguments = json!({"amount": 21, "currency": "EUR"});

    // The previous `wrap`: the same command line, its default namespace.
    let mut before = sandbox.wrap(&["--namespace", &legacy], &demo);
    before.request(discover(1));
    let executed = charge_id(&before.request(charge(2, arguments.clone(), "old")));
    assert_eq!(before.finish().code(), Some(0));

    let mut after = sandbox.wrap(&[], &demo);
    after.request(discover(1));
    let replay = after.request(charge(2, arguments.clone(), "old"));
    assert_eq!(charge_id(&replay), executed, "{replay}");
    let conflict = after.request(charge(3, json!({"amount": 22, "currency": "EUR"}), "old"));
    assert_rejected(&conflict, -32602, "idempotency_key_conflict", Some("old"));
    // A new key is recorded under the server's name.
    charge_id(&after.request(charge(4, arguments, "new")));
    assert_eq!(after.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger).len(), 2);
}

/// A client that calls before `initialize` / `server/discover` gets the call decided under the
/// server's name all the same (`wrap` asks for it); its retry after a handshake replays, also in a
/// later `wrap`.
#[test]
fn a_call_made_before_the_server_named_itself_replays_after() {
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let arguments = json!({"amount": 31, "currency": "EUR"});

    let mut early = sandbox.wrap_demo(&[]);
    let executed = charge_id(&early.request(charge(1, arguments.clone(), "early")));
    early.request(discover(2));
    let replay = early.request(charge(3, arguments.clone(), "early"));
    assert_eq!(charge_id(&replay), executed, "{replay}");
    assert_eq!(early.finish().code(), Some(0));

    // A later `wrap` finds the legacy record when it starts.
    let mut later = sandbox.wrap_demo(&[]);
    later.request(discover(1));
    let replay = later.request(charge(2, arguments, "early"));
    assert_eq!(charge_id(&replay), executed, "{replay}");
    assert_eq!(later.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

/// The rule names the server, not the command line: two command lines of one server on one store
/// share its records once it has named itself; `--namespace` keeps them apart.
#[test]
fn one_server_under_two_command_lines_shares_its_records() {
    let sandbox = Sandbox::new();
    let (ledger_a, ledger_b) = (sandbox.path("a.jsonl"), sandbox.path("b.jsonl"));
    let arguments = json!({"amount": 41, "currency": "EUR"});
    let run = |options: &[&str], ledger: &std::path::Path| -> String {
        let upstream: Vec<OsString> = sandbox.demo(ledger);
        let mut wrap = sandbox.wrap(options, &upstream);
        wrap.request(discover(1));
        let id = charge_id(&wrap.request(charge(2, arguments.clone(), "k")));
        assert_eq!(wrap.finish().code(), Some(0));
        id
    };
    let in_a = run(&[], &ledger_a);
    assert_eq!(run(&[], &ledger_b), in_a);
    assert_ne!(run(&["--namespace", "other"], &ledger_b), in_a);
    assert_eq!(ledger_lines(&ledger_a).len(), 1);
    assert_eq!(ledger_lines(&ledger_b).len(), 1);
}
