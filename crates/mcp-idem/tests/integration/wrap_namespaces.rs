//! Records in one store are scoped by namespace and principal (default: the local user): different
//! servers never share records, the same server does across restarts. The default namespace is the
//! server's own name (`default_scope` and `scope_handshakes` test how it is learned); the calls
//! here come with no handshake first, so `wrap` asks the server its name itself.

use std::time::Duration;

use serde_json::json;

use crate::support::common::ledger_lines;
use crate::support::wrap::{assert_rejected, charge, charge_id, Sandbox};

#[test]
fn different_servers_on_one_store_do_not_share_records_and_the_same_server_does() {
    let sandbox = Sandbox::new();
    let (ledger_a, ledger_b) = (sandbox.path("a.jsonl"), sandbox.path("b.jsonl"));
    let arguments = json!({"amount":20,"currency":"EUR"});
    let named = |ledger: &std::path::Path, name: &str| {
        let mut command = sandbox.demo(ledger);
        command.extend(["--name".into(), name.into()]);
        command
    };

    // Two servers of other names, both running at once on one store file.
    let mut a = sandbox.wrap(&[], &named(&ledger_a, "payments-a"));
    let mut b = sandbox.wrap(&[], &named(&ledger_b, "payments-b"));
    let in_a = charge_id(&a.request(charge(1, arguments.clone(), "shared-key")));
    let in_b = charge_id(&b.request(charge(1, arguments.clone(), "shared-key")));
    assert_ne!(in_a, in_b, "the same key executed in both");
    assert_eq!(ledger_lines(&ledger_a).len(), 1);
    assert_eq!(ledger_lines(&ledger_b).len(), 1);
    assert_eq!(a.finish().code(), Some(0));
    assert_eq!(b.finish().code(), Some(0));

    // The first server again, after a restart: its records are still there.
    let mut a_again = sandbox.wrap(&[], &named(&ledger_a, "payments-a"));
    let replay = a_again.request(charge(2, arguments.clone(), "shared-key"));
    assert_eq!(charge_id(&replay), in_a);
    assert_eq!(a_again.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger_a).len(), 1);
    assert_eq!(ledger_lines(&ledger_b).len(), 1);
}

#[test]
fn an_explicit_namespace_is_shared_and_principals_stay_apart() {
    let sandbox = Sandbox::new();
    let (ledger_a, ledger_b) = (sandbox.path("a.jsonl"), sandbox.path("b.jsonl"));
    let arguments = json!({"amount":30,"currency":"EUR"});
    let namespace = ["--namespace", "payments"];

    let mut a = sandbox.wrap(&namespace, &sandbox.demo(&ledger_a));
    let executed = charge_id(&a.request(charge(1, arguments.clone(), "k")));
    assert_eq!(a.finish().code(), Some(0));

    // Another command line under the same namespace (and user) replays it.
    let mut b = sandbox.wrap(&namespace, &sandbox.demo(&ledger_b));
    assert_eq!(
        charge_id(&b.request(charge(1, arguments.clone(), "k"))),
        executed
    );
    assert_eq!(b.finish().code(), Some(0));
    assert!(ledger_lines(&ledger_b).is_empty());

    // Another principal in that namespace does not see it.
    let mut bob = sandbox.wrap(
        &["--namespace", "payments", "--principal", "bob"],
        &sandbox.demo(&ledger_b),
    );
    let for_bob = charge_id(&bob.request(charge(1, arguments, "k")));
    assert_ne!(for_bob, executed);
    assert_eq!(bob.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger_a).len(), 1);
    assert_eq!(ledger_lines(&ledger_b).len(), 1);
}

/// Two gateways at once on one store and namespace (think: replicas): a duplicate sent to the
/// other one while the call runs is refused as in progress, and replays once it completed.
#[test]
fn a_call_running_in_one_wrap_is_in_progress_for_another_on_the_same_store() {
    let sandbox = Sandbox::new();
    let (ledger_a, ledger_b) = (sandbox.path("a.jsonl"), sandbox.path("b.jsonl"));
    let namespace = ["--namespace", "replicas"];
    let mut a = sandbox.wrap(&namespace, &sandbox.demo(&ledger_a));
    let mut b = sandbox.wrap(&namespace, &sandbox.demo(&ledger_b));
    let arguments = json!({"amount":40,"currency":"EUR","delay_ms":3000});

    a.send(&charge(1, arguments.clone(), "k"));
    // Give `a` the time to claim the key (it does so before forwarding the call).
    std::thread::sleep(Duration::from_millis(300));
    let duplicate = b.request(charge(1, arguments.clone(), "k"));
    // Answered while the call still ran (the demo charges after its delay), not after it.
    assert!(ledger_lines(&ledger_a).is_empty(), "{duplicate}");
    assert_rejected(&duplicate, -32602, "idempotency_key_in_progress", Some("k"));

    let executed = charge_id(&a.response(&json!(1)));
    let replay = b.request(charge(2, arguments, "k"));
    assert_eq!(charge_id(&replay), executed);
    assert_eq!(a.finish().code(), Some(0));
    assert_eq!(b.finish().code(), Some(0));
    assert_eq!(ledger_lines(&ledger_a).len(), 1);
    assert!(ledger_lines(&ledger_b).is_empty());
}
