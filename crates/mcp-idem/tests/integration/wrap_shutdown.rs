//! `mcp-idem wrap` stopped the way clients stop stdio servers (issue 14): SIGTERM or SIGINT (to
//! `wrap`, or to its whole process group), and SIGKILL.
//!
//! - A keyed call in flight at SIGTERM is answered and recorded, and a new `wrap` on the same
//!   SQLite file replays it: one execution in the demo server's ledger. Keyed calls that arrive
//!   meanwhile are refused with `idempotency_shutting_down` and not claimed (a new `wrap` runs
//!   them); other requests are still forwarded.
//! - A call still running when `--shutdown-grace` ends is answered and recorded
//!   `idempotency_outcome_unknown`, never left as a claim nobody owns; the server is then stopped
//!   in the MCP stdio order (input closed, 2 s, SIGTERM, 2 s, SIGKILL) and `wrap` exits with its
//!   status.
//! - The server never outlives `wrap`: after SIGTERM it is stopped, after SIGKILL of `wrap` the
//!   kernel kills it (parent-death signal; Linux).
//!
//! Linux only (`/proc`, and the parent-death signal). Each test waits for the log line that shows the call started ("charge_payment started", from
//! the demo server) or that `wrap` began stopping, never for a fixed time.

use std::process::ExitStatus;
use std::time::Duration;

use serde_json::json;

use crate::support::common::{ledger_lines, StdioPeer, TIMEOUT};
use crate::support::wrap::{
    assert_rejected, call, charge, charge_id, is_running, kill_pid, process_group, read_pid,
    signal_group, signal_pid, wait_for_log, wait_until, PidGuard, Sandbox,
};

/// What the tests log: the demo server's "charge_payment started", `wrap`'s "stopping".
const LOG: &str = "warn,mcp_idem::commands::demo_server=info,mcp_idempotency::stdio=info";

/// `wrap OPTIONS -- sh -c 'echo $$ > PID; exec demo-server'`, logging [`LOG`], in a process
/// group of its own (as MCP clients start their servers); returns it and its server's pid.
fn wrap_with_pid(sandbox: &Sandbox, options: &[&str]) -> (StdioPeer, PidGuard) {
    let pid_file = sandbox.path("upstream.pid");
    let _ = std::fs::remove_file(&pid_file);
    let upstream = sandbox.demo_with_pid_file(&sandbox.ledger(), &pid_file);
    spawn_wrap(sandbox, options, &upstream, &pid_file)
}

fn spawn_wrap(
    sandbox: &Sandbox,
    options: &[&str],
    upstream: &[std::ffi::OsString],
    pid_file: &std::path::Path,
) -> (StdioPeer, PidGuard) {
    use std::os::unix::process::CommandExt;
    let mut command = sandbox.wrap_command(options, upstream);
    command.env("MCP_IDEM_LOG", LOG).process_group(0);
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stderr = sandbox.path(&format!("wrap-shutdown.{n}.stderr"));
    let mut wrap = StdioPeer::spawn(command, &stderr);
    wrap.request(call(0, "noop", json!({}), None));
    let guard = PidGuard {
        pid: read_pid(pid_file),
        marker: sandbox.ledger(),
    };
    (wrap, guard)
}

fn exit_code(wrap: &mut StdioPeer) -> Option<i32> {
    let status: ExitStatus = wrap.wait(TIMEOUT);
    status.code()
}

#[test]
fn sigterm_to_the_group_during_a_keyed_call_answers_records_and_a_new_wrap_replays() {
    let sandbox = Sandbox::new();
    let (mut wrap, server) = wrap_with_pid(&sandbox, &[]);
    // The server has a process group of its own, so the group signal reaches `wrap` only.
    assert_ne!(process_group(server.pid), process_group(wrap.pid()));

    let arguments = json!({"amount":5,"currency":"EUR","delay_ms":1500});
    wrap.send(&charge(1, arguments.clone(), "term-1"));
    wait_for_log(&wrap, "charge_payment started");
    signal_group(process_group(wrap.pid()), "TERM");
    wait_for_log(&wrap, "stopping: no new keyed calls");

    // Meanwhile: a new keyed call is refused without being claimed; an unkeyed one still runs.
    let refused = wrap.request(charge(2, json!({"amount":6,"currency":"EUR"}), "term-2"));
    let error = assert_rejected(
        &refused,
        -32603,
        "idempotency_shutting_down",
        Some("term-2"),
    );
    assert_eq!(error["data"]["retryAfterMs"], 1000, "{refused}");
    let noop = wrap.request(call(3, "noop", json!({}), None));
    assert!(noop.get("result").is_some(), "{noop}");

    // The call in flight is answered; then the server is stopped and `wrap` exits with its
    // status (the demo server exits 0 on stdin EOF).
    let charged = charge_id(&wrap.response(&json!(1)));
    assert_eq!(exit_code(&mut wrap), Some(0), "{}", wrap.stderr());
    wait_until("the server exits", TIMEOUT, || !is_running(server.pid));
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);

    // A new `wrap` on the same SQLite file: the call replays; the refused key was never claimed.
    let (mut again, _server) = wrap_with_pid(&sandbox, &[]);
    let replay = again.request(charge(4, arguments, "term-1"));
    assert_eq!(charge_id(&replay), charged);
    charge_id(&again.request(charge(5, json!({"amount":6,"currency":"EUR"}), "term-2")));
    assert_eq!(again.finish().code(), Some(0));
    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 2, "one execution per key: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charged.as_str());
}

#[test]
fn sigint_after_the_grace_records_the_call_as_outcome_unknown_and_stops_the_server() {
    let sandbox = Sandbox::new();
    let (mut wrap, server) = wrap_with_pid(&sandbox, &["--shutdown-grace", "200ms"]);
    let arguments = json!({"amount":7,"currency":"EUR","delay_ms":60000});
    wrap.send(&charge(1, arguments.clone(), "int-1"));
    wait_for_log(&wrap, "charge_payment started");
    signal_pid(wrap.pid(), "INT");

    let response = wrap.response(&json!(1));
    assert_rejected(
        &response,
        -32603,
        "idempotency_outcome_unknown",
        Some("int-1"),
    );
    // The demo server finishes its calls before it exits on EOF: this one would take a minute,
    // so `wrap` sends SIGTERM after 2 s, and exits with the server's status, 128 + 15.
    assert_eq!(exit_code(&mut wrap), Some(143), "{}", wrap.stderr());
    assert!(!is_running(server.pid));

    let (mut again, _server) = wrap_with_pid(&sandbox, &[]);
    let retry = again.request(charge(2, arguments, "int-1"));
    assert_rejected(&retry, -32603, "idempotency_outcome_unknown", Some("int-1"));
    assert_eq!(again.finish().code(), Some(0));
    assert!(ledger_lines(&sandbox.ledger()).is_empty());
}

#[test]
fn a_server_that_ignores_sigterm_is_killed() {
    let sandbox = Sandbox::new();
    let pid_file = sandbox.path("upstream.pid");
    // SIGTERM ignored (the disposition is inherited across exec), and busy for a minute.
    let script = format!(
        "trap '' TERM; echo $$ > {}; exec {} demo-server --ledger {}",
        crate::support::wrap::sh_quote(&pid_file),
        crate::support::wrap::sh_quote(crate::support::wrap::EXE),
        crate::support::wrap::sh_quote(sandbox.ledger()),
    );
    let upstream = ["sh".into(), "-c".into(), script.into()];
    let (mut wrap, server) = spawn_wrap(
        &sandbox,
        &["--shutdown-grace", "100ms"],
        &upstream,
        &pid_file,
    );
    wrap.send(&charge(
        1,
        json!({"amount":8,"currency":"EUR","delay_ms":60000}),
        "stubborn",
    ));
    wait_for_log(&wrap, "charge_payment started");
    signal_pid(wrap.pid(), "TERM");
    let response = wrap.response(&json!(1));
    assert_rejected(
        &response,
        -32603,
        "idempotency_outcome_unknown",
        Some("stubborn"),
    );
    assert_eq!(exit_code(&mut wrap), Some(137), "{}", wrap.stderr());
    assert!(!is_running(server.pid));
    assert!(ledger_lines(&sandbox.ledger()).is_empty());
}

#[test]
fn the_server_dies_with_a_sigkilled_wrap() {
    let sandbox = Sandbox::new();
    let (mut wrap, server) = wrap_with_pid(&sandbox, &[]);
    // A call that would run for a minute: an orphaned server would still be running it.
    wrap.send(&charge(
        1,
        json!({"amount":9,"currency":"EUR","delay_ms":60000}),
        "killed-1",
    ));
    wait_for_log(&wrap, "charge_payment started");
    kill_pid(wrap.pid());
    wrap.wait(TIMEOUT);
    wait_until("the server dies with wrap", Duration::from_secs(10), || {
        !is_running(server.pid)
    });
    assert!(ledger_lines(&sandbox.ledger()).is_empty());
}
