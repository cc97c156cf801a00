//! `mcp-idem wrap` when things go wrong: the upstream dies mid-call, `wrap` itself dies mid-call
//! (lease expiry, `--after-crash`), garbage on stdin, stdin EOF, unusable stores and command lines.
//!
//! Two kinds of crash, two outcomes:
//! - The upstream dies while `wrap` lives: `wrap` answers the call with
//!   `idempotency_outcome_unknown` and records that outcome. It is final: every retry of the key gets
//!   `idempotency_outcome_unknown`, whatever `--after-crash` says.
//! - `wrap` dies (the record's owner): the record stays in progress. Retries get
//!   `idempotency_key_in_progress` until its lease runs out, then `--after-crash` decides: `reject`
//!   (default) answers `idempotency_outcome_unknown`; `reexecute` runs the tool again, which may
//!   execute it twice (the first run may have had its effect before `wrap` died; its server dies
//!   with `wrap`, so it does not finish the call later). A graceful stop (SIGTERM) is in
//!   `wrap_shutdown`.

use std::fs::File;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::common::{ledger_lines, TIMEOUT};
use crate::support::wrap::{
    assert_rejected, call, charge, charge_id, is_running, kill_pid, raw_outcome, read_pid,
    wait_until, PidGuard, Sandbox, EXE,
};

fn signal_of(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[test]
fn an_upstream_crash_mid_call_is_answered_and_recorded_as_outcome_unknown() {
    let sandbox = Sandbox::new();
    let pid_file = sandbox.path("upstream.pid");
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &pid_file);
    let mut wrap = sandbox.wrap(&[], &upstream);
    wrap.request(call(0, "noop", json!({}), None));
    let pid = read_pid(&pid_file);
    let _guard = PidGuard {
        pid,
        marker: sandbox.ledger(),
    };

    let arguments = json!({"amount":99,"currency":"EUR","delay_ms":2000});
    wrap.send(&charge(1, arguments.clone(), "crash-1"));
    std::thread::sleep(Duration::from_millis(100));
    kill_pid(pid);

    let response = wrap.response(&json!(1));
    assert_rejected(
        &response,
        -32603,
        "idempotency_outcome_unknown",
        Some("crash-1"),
    );
    // `wrap` exits on its own, with the status of its child (128 + SIGKILL).
    let status = wrap.wait(Duration::from_secs(5));
    assert_eq!(status.code(), Some(137), "{}", wrap.stderr());
    assert!(ledger_lines(&sandbox.ledger()).is_empty());

    // Restarted on the same store with the same command line (so the same namespace): the outcome
    // stays unknown, under either --after-crash policy, and the tool does not run again.
    for options in [
        &[][..],
        &["--after-crash", "reexecute", "--lease", "1s"][..],
    ] {
        let mut again = sandbox.wrap(options, &upstream);
        let retry = again.request(charge(2, arguments.clone(), "crash-1"));
        assert_rejected(
            &retry,
            -32603,
            "idempotency_outcome_unknown",
            Some("crash-1"),
        );
        assert_eq!(again.finish().code(), Some(0));
    }
    assert!(ledger_lines(&sandbox.ledger()).is_empty());

    // Other keys are unaffected.
    let mut again = sandbox.wrap(&[], &upstream);
    charge_id(&again.request(charge(3, json!({"amount":1,"currency":"EUR"}), "crash-2")));
    assert_eq!(again.finish().code(), Some(0));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
}

/// Starts `wrap --lease LEASE` around the demo server, sends a keyed 300 ms charge, SIGKILLs `wrap`
/// once the charge started, and waits until the upstream is gone: it dies with `wrap`
/// (parent-death signal), before charging. Returns when `wrap` died.
fn kill_wrap_mid_call(sandbox: &Sandbox, lease: &str, key: &str) -> (Instant, Value) {
    let pid_file = sandbox.path("upstream.pid");
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &pid_file);
    let mut command = sandbox.wrap_command(&["--lease", lease], &upstream);
    command.env("MCP_IDEM_LOG", "warn,mcp_idem::commands::demo_server=info");
    let mut wrap =
        crate::support::common::StdioPeer::spawn(command, &sandbox.path("killed-wrap.stderr"));
    wrap.request(call(0, "noop", json!({}), None));
    let pid = read_pid(&pid_file);
    let _guard = PidGuard {
        pid,
        marker: sandbox.ledger(),
    };
    let arguments = json!({"amount":10,"currency":"EUR","delay_ms":300});
    wrap.send(&charge(1, arguments.clone(), key));
    wait_until("the charge starts", TIMEOUT, || {
        wrap.stderr().contains("charge_payment started")
    });
    kill_pid(wrap.pid());
    let killed_at = Instant::now();
    assert_eq!(signal_of(wrap.wait(TIMEOUT)), Some(9));
    wait_until(
        "the upstream dies with wrap",
        Duration::from_secs(10),
        || !is_running(pid),
    );
    (killed_at, arguments)
}

#[test]
fn after_wrap_dies_a_retry_waits_for_the_lease_then_is_rejected() {
    let sandbox = Sandbox::new();
    let key = "owner-died-1";
    // Lease 2 s, renewed every 667 ms: it runs out 1.3 to 2 s after the kill.
    let (killed_at, arguments) = kill_wrap_mid_call(&sandbox, "2s", key);
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &sandbox.path("upstream.pid"));

    let mut again = sandbox.wrap(&[], &upstream);
    let early = again.request(charge(2, arguments.clone(), key));
    assert!(
        killed_at.elapsed() < Duration::from_millis(1300),
        "too slow to test the lease"
    );
    assert_rejected(&early, -32602, "idempotency_key_in_progress", Some(key));

    std::thread::sleep(Duration::from_millis(2100).saturating_sub(killed_at.elapsed()));
    let late = again.request(charge(3, arguments, key));
    assert_rejected(&late, -32603, "idempotency_outcome_unknown", Some(key));
    assert_eq!(again.finish().code(), Some(0));
    assert!(
        ledger_lines(&sandbox.ledger()).is_empty(),
        "not run again (and the first run died with wrap)"
    );
}

#[test]
fn after_wrap_dies_reexecute_runs_the_call_again_once_the_lease_ran_out() {
    let sandbox = Sandbox::new();
    let key = "owner-died-2";
    let (killed_at, arguments) = kill_wrap_mid_call(&sandbox, "1s", key);
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &sandbox.path("upstream.pid"));
    // The first run died with wrap before charging (with a server that is not killed, or a call
    // that had its effect before the kill, this is where `reexecute` runs it twice).
    assert!(ledger_lines(&sandbox.ledger()).is_empty());

    std::thread::sleep(Duration::from_millis(1100).saturating_sub(killed_at.elapsed()));
    let mut again = sandbox.wrap(&["--after-crash", "reexecute", "--lease", "1s"], &upstream);
    let retry = again.request(charge(2, arguments.clone(), key));
    let second_run = charge_id(&retry);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);

    // The re-execution is recorded like any call.
    let replay = again.request(charge(3, arguments, key));
    assert_eq!(charge_id(&replay), second_run);
    assert_eq!(
        raw_outcome(&again, &json!(3)),
        raw_outcome(&again, &json!(2))
    );
    assert_eq!(again.finish().code(), Some(0));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
}

#[test]
fn malformed_lines_pass_through_without_breaking_the_session() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);

    wrap.send_raw("not json");
    wrap.send_raw("{}");
    wrap.send_raw("[1,2]");
    wrap.send_raw("");
    wrap.send_raw("   \t");
    wrap.send_bytes(b"\xff\xfe garbage \xc3\n");
    wrap.send_bytes(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"s\":\"\xff\"}}\n");
    wrap.send_raw(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"oops"}"#);
    // A truncated keyed call: not JSON, so forwarded as is; it must not claim its key.
    wrap.send_raw(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"charge_payment","arguments":{"amount":1,"currency":"EUR"},"idempotencyKey":"after-garbage""#,
    );
    // A keyed call without a tool name is refused by the gateway.
    let nameless = wrap.request(json!({"jsonrpc":"2.0","id":6,"method":"tools/call",
        "params":{"idempotencyKey":"nameless"}}));
    assert_eq!(nameless["error"]["code"], -32602, "{nameless}");

    // The session still works, CRLF line endings included.
    let keyed = charge(7, json!({"amount":1,"currency":"EUR"}), "after-garbage");
    wrap.send_bytes(format!("{keyed}\r\n").as_bytes());
    let first = wrap.response(&json!(7));
    let charged = charge_id(&first);
    let retry = wrap.request(charge(
        8,
        json!({"amount":1,"currency":"EUR"}),
        "after-garbage",
    ));
    assert_eq!(charge_id(&retry), charged);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);

    // Every line on wrap's stdout is one JSON-RPC message (StdioPeer panics on anything else).
    wrap.close_stdin();
    assert_eq!(wrap.wait(TIMEOUT).code(), Some(0), "{}", wrap.stderr());
    while wrap.next_message(Duration::from_millis(200)).is_some() {}
    for line in wrap.raw_lines() {
        let message: Value = serde_json::from_str(line).unwrap();
        assert_eq!(message["jsonrpc"], "2.0", "{line}");
        assert!(
            message.get("result").is_some() || message.get("error").is_some(),
            "only responses: {line}"
        );
    }
    assert!(!wrap.stderr().contains("panicked"), "{}", wrap.stderr());
}

#[test]
fn stdin_eof_ends_wrap_with_the_servers_status_and_keeps_the_last_outcome() {
    let sandbox = Sandbox::new();
    let pid_file = sandbox.path("upstream.pid");
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &pid_file);
    let mut wrap = sandbox.wrap(&[], &upstream);
    wrap.request(call(0, "noop", json!({}), None));
    let pid = read_pid(&pid_file);
    let _guard = PidGuard {
        pid,
        marker: sandbox.ledger(),
    };

    // EOF while a keyed call runs: the server finishes it, wrap forwards and records the outcome.
    let arguments = json!({"amount":3,"currency":"EUR","delay_ms":300});
    wrap.send(&charge(1, arguments.clone(), "eof-1"));
    wrap.close_stdin();
    let charged = charge_id(&wrap.response(&json!(1)));
    assert_eq!(wrap.wait(TIMEOUT).code(), Some(0), "{}", wrap.stderr());
    assert!(!is_running(pid), "the upstream is gone");

    let mut again = sandbox.wrap(&[], &upstream);
    let retry = again.request(charge(2, arguments, "eof-1"));
    assert_eq!(charge_id(&retry), charged);
    assert_eq!(again.finish().code(), Some(0));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);

    // The exit status is the upstream's.
    let mut failing = sandbox.wrap(&[], &["sh".into(), "-c".into(), "exit 3".into()]);
    assert_eq!(failing.wait(Duration::from_secs(5)).code(), Some(3));
    failing.close_stdin();
}

/// Runs `command` to its end (stdin closed); panics after [`TIMEOUT`].
fn run(mut command: Command, sandbox: &Sandbox, name: &str) -> (ExitStatus, String) {
    let stderr_path = sandbox.path(&format!("{name}.stderr"));
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&stderr_path).unwrap())
        .spawn()
        .expect("spawn mcp-idem");
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, std::fs::read_to_string(stderr_path).unwrap())
}

#[test]
fn unusable_stores_and_command_lines_fail_at_startup_with_status_2() {
    let sandbox = Sandbox::new();
    let pid_file = sandbox.path("upstream.pid");
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &pid_file);

    for (n, (store, problem)) in [
        ("mysql://x", "unknown scheme \"mysql\""),
        ("sqlite:/proc/nope/r.db", "/proc/nope/r.db"),
        ("sqlite:", "needs a file path"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut command = Command::new(EXE);
        command
            .args(["wrap", "--store", store, "--"])
            .args(&upstream);
        let (status, stderr) = run(command, &sandbox, &format!("store-{n}"));
        assert_eq!(status.code(), Some(2), "{store}: {stderr}");
        assert!(stderr.contains(problem), "{store}: {stderr}");
        assert!(stderr.contains("store"), "{store}: {stderr}");
        assert!(!stderr.contains("panicked"), "{store}: {stderr}");
        assert!(!pid_file.exists(), "{store}: the server was never started");
    }

    let missing = sandbox.path("no-such-server");
    let mut command = sandbox.wrap_command(&[], &[missing.clone().into()]);
    command.env("MCP_IDEM_LOG", "off");
    let (status, stderr) = run(command, &sandbox, "missing");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot start"), "{stderr}");
    assert!(stderr.contains(missing.to_str().unwrap()), "{stderr}");

    for args in [
        &["wrap"][..],
        &["wrap", "--"][..],
        &["wrap", "--store", "memory"][..],
    ] {
        let mut command = Command::new(EXE);
        command.args(args);
        let (status, stderr) = run(command, &sandbox, "usage");
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("Usage"), "{args:?}: {stderr}");
        assert!(stderr.contains("COMMAND"), "{args:?}: {stderr}");
    }
}

/// Several gateways started at once on a store file that does not exist yet (say, a client that
/// launches its wrapped servers together on first use of the default store) all start. Switching
/// the new file to WAL used to fail with "database is locked" in one of them now and then.
#[test]
fn wraps_started_together_on_a_new_store_all_start() {
    for round in 0..8 {
        let sandbox = Sandbox::new();
        let children: Vec<_> = (0..4)
            .map(|n| {
                let mut command =
                    sandbox.wrap_command(&[], &["sh".into(), "-c".into(), "exit 0".into()]);
                command
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(File::create(sandbox.path(&format!("wrap.{n}.stderr"))).unwrap());
                command.spawn().expect("spawn mcp-idem wrap")
            })
            .collect();
        for (n, mut child) in children.into_iter().enumerate() {
            let deadline = Instant::now() + TIMEOUT;
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("wrap {n} did not exit");
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            let stderr = std::fs::read_to_string(sandbox.path(&format!("wrap.{n}.stderr")));
            assert_eq!(
                status.code(),
                Some(0),
                "round {round}, wrap {n}: {stderr:?}"
            );
        }
    }
}
