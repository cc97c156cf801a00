//! Helpers for the `mcp-idem wrap` end-to-end tests (`wrap_*`): a sandbox per test (its own
//! store, ledger and logs), the wrap command line, request builders, and checks on JSON-RPC errors.
//!
//! Every test spawns the real binary: `mcp-idem wrap --store sqlite:<dir>/r.sqlite3 -- <upstream>`,
//! with `mcp-idem demo-server --ledger <dir>/ledger.jsonl` as the upstream (sometimes behind `sh -c`
//! to capture what it receives with `tee`, or to learn its pid).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::support::common::{meta_2026, StdioPeer, TIMEOUT};

/// The binary under test.
pub(crate) const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// One test's files: `r.sqlite3` (the store), `ledger.jsonl`, logs.
pub(crate) struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("create a temporary directory"),
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `sqlite:<dir>/r.sqlite3`.
    pub(crate) fn store(&self) -> String {
        format!("sqlite:{}", self.path("r.sqlite3").display())
    }

    /// `<dir>/ledger.jsonl`.
    pub(crate) fn ledger(&self) -> PathBuf {
        self.path("ledger.jsonl")
    }

    /// `mcp-idem demo-server --ledger <ledger>`.
    pub(crate) fn demo(&self, ledger: &Path) -> Vec<OsString> {
        vec![
            EXE.into(),
            "demo-server".into(),
            "--ledger".into(),
            ledger.into(),
        ]
    }

    /// The demo server behind `sh -c`, writing its pid to `pid_file` first (`exec` keeps the pid),
    /// so a test can kill exactly that process or check that it is gone.
    pub(crate) fn demo_with_pid_file(&self, ledger: &Path, pid_file: &Path) -> Vec<OsString> {
        let script = format!(
            "echo $$ > {}; exec {} demo-server --ledger {}",
            sh_quote(pid_file),
            sh_quote(EXE),
            sh_quote(ledger)
        );
        vec!["sh".into(), "-c".into(), script.into()]
    }

    /// The demo server behind `tee`: every line it receives is also appended to `capture`.
    pub(crate) fn demo_with_capture(&self, ledger: &Path, capture: &Path) -> Vec<OsString> {
        let script = format!(
            "tee {} | {} demo-server --ledger {}",
            sh_quote(capture),
            sh_quote(EXE),
            sh_quote(ledger)
        );
        vec!["sh".into(), "-c".into(), script.into()]
    }

    /// `mcp-idem wrap --store <store> <options> -- <upstream>` as a [`Command`].
    pub(crate) fn wrap_command(&self, options: &[&str], upstream: &[OsString]) -> Command {
        let mut command = Command::new(EXE);
        command
            .arg("wrap")
            .arg("--store")
            .arg(self.store())
            .args(options)
            .arg("--")
            .args(upstream)
            // Warnings (a dead upstream, orphaned calls) go to the stderr file: useful on failure.
            .env("MCP_IDEM_LOG", "warn")
            .env_remove("MCP_IDEM_NAMESPACE")
            .env_remove("MCP_IDEM_PRINCIPAL")
            .env_remove("MCP_IDEM_STORE");
        command
    }

    /// Spawns `wrap` around `upstream`; its stderr goes to `<dir>/wrap.<n>.stderr`.
    pub(crate) fn wrap(&self, options: &[&str], upstream: &[OsString]) -> StdioPeer {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        StdioPeer::spawn(
            self.wrap_command(options, upstream),
            &self.path(&format!("wrap.{n}.stderr")),
        )
    }

    /// `wrap` around the demo server with this sandbox's ledger.
    pub(crate) fn wrap_demo(&self, options: &[&str]) -> StdioPeer {
        self.wrap(options, &self.demo(&self.ledger()))
    }
}

/// `'text'` for `sh`, with embedded single quotes escaped.
pub(crate) fn sh_quote(text: impl AsRef<OsStr>) -> String {
    let text = text.as_ref().to_str().expect("UTF-8 text");
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A command line for `sh`, each argument quoted.
pub(crate) fn sh_join<S: AsRef<OsStr>>(args: &[S]) -> String {
    args.iter().map(sh_quote).collect::<Vec<_>>().join(" ")
}

/// A 2026-07-28 `tools/call` (with the per-request `_meta`), with `idempotencyKey` when `key` is
/// `Some` (any JSON value, so invalid keys can be sent).
pub(crate) fn call(
    id: impl Into<Value>,
    name: &str,
    arguments: Value,
    key: Option<Value>,
) -> Value {
    let mut message = json!({"jsonrpc":"2.0","id":id.into(),"method":"tools/call","params":{
        "_meta": meta_2026(), "name": name, "arguments": arguments}});
    if let Some(key) = key {
        message["params"]["idempotencyKey"] = key;
    }
    message
}

/// A keyed 2026-07-28 `charge_payment`.
pub(crate) fn charge(id: impl Into<Value>, arguments: Value, key: &str) -> Value {
    call(id, "charge_payment", arguments, Some(json!(key)))
}

/// A legacy `initialize` request (protocol 2025-06-18).
pub(crate) fn legacy_initialize(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},
        "clientInfo":{"name":"mcp-idem-wrap-tests","version":"0"}}})
}

/// A 2026-07-28 `server/discover` request.
pub(crate) fn discover(id: impl Into<Value>) -> Value {
    json!({"jsonrpc":"2.0","id":id.into(),"method":"server/discover",
        "params":{"_meta": meta_2026()}})
}

/// The charge id of a successful `charge_payment` response.
pub(crate) fn charge_id(response: &Value) -> String {
    let id = response["result"]["structuredContent"]["chargeId"]
        .as_str()
        .unwrap_or_else(|| panic!("no chargeId in {response}"));
    assert!(id.starts_with("ch_"), "{id}");
    id.to_owned()
}

/// Asserts that `response` is a JSON-RPC error with `code` and `data.type == kind` naming `key`;
/// returns the error object.
pub(crate) fn assert_rejected(response: &Value, code: i64, kind: &str, key: Option<&str>) -> Value {
    assert!(response.get("result").is_none(), "not an error: {response}");
    let error = &response["error"];
    assert_eq!(error["code"], code, "{response}");
    assert_eq!(error["data"]["type"], kind, "{response}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{response}"
    );
    if let Some(key) = key {
        assert_eq!(error["data"]["idempotencyKey"], key, "{response}");
    }
    error.clone()
}

/// The exact JSON text of the `result` (or else `error`) member of the raw line that carried the
/// response with this id (the last one, should several share it).
pub(crate) fn raw_outcome(peer: &StdioPeer, id: &Value) -> String {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        result: Option<&'a RawValue>,
        #[serde(borrow)]
        error: Option<&'a RawValue>,
    }
    let id_text = id.to_string();
    for line in peer.raw_lines().iter().rev() {
        let envelope: Envelope<'_> = serde_json::from_str(line).expect("a JSON-RPC message");
        let same_id = envelope
            .id
            .is_some_and(|raw| serde_json::from_str::<Value>(raw.get()).ok().as_ref() == Some(id));
        if let (true, Some(outcome)) = (same_id, envelope.result.or(envelope.error)) {
            return outcome.get().to_owned();
        }
    }
    panic!(
        "no raw response with id {id_text} among {:?}",
        peer.raw_lines()
    );
}

/// Sends `make(id)` with ids `first_id`, `first_id + 1`, ... until the answer is not
/// `idempotency_key_in_progress` (polling every 20 ms); returns that answer.
pub(crate) fn request_while_in_progress(
    peer: &mut StdioPeer,
    first_id: u64,
    mut make: impl FnMut(u64) -> Value,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in first_id.. {
        let response = peer.request(make(id));
        if response["error"]["data"]["type"] != "idempotency_key_in_progress" {
            return response;
        }
        assert!(Instant::now() < deadline, "still in progress: {response}");
        std::thread::sleep(Duration::from_millis(20));
    }
    unreachable!()
}

/// Polls `condition` every 10 ms until it holds; panics with `what` after `timeout`.
pub(crate) fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The lines of a capture file (`tee`), parsed; lines that are not JSON are kept as strings.
pub(crate) fn captured(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| Value::String(line.into())))
        .collect()
}

/// The pid a `sh -c 'echo $$ > FILE; exec …'` upstream wrote, once it did.
pub(crate) fn read_pid(pid_file: &Path) -> u32 {
    let mut pid = None;
    wait_until(
        "the upstream writes its pid",
        Duration::from_secs(10),
        || {
            pid = std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            pid.is_some()
        },
    );
    pid.unwrap()
}

/// Whether process `pid` exists and is not a zombie.
pub(crate) fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Sends SIGKILL to exactly `pid`.
pub(crate) fn kill_pid(pid: u32) {
    signal_pid(pid, "KILL");
}

/// Sends signal `name` (`TERM`, `INT`, `KILL`) to exactly `pid`.
pub(crate) fn signal_pid(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Sends signal `name` to every process of process group `pgid`, as some clients stop their
/// servers (the Python SDK's `os.killpg`).
pub(crate) fn signal_group(pgid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), "--", &format!("-{pgid}")])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} -- -{pgid} failed");
}

/// The process group of process `pid`.
pub(crate) fn process_group(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // `pid (comm) state ppid pgrp ...`
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .and_then(|pgrp| pgrp.parse().ok())
        .expect("the process group in /proc/PID/stat")
}

/// Waits until `peer` (a `wrap`, with its server's stderr) logged a line containing `text`.
pub(crate) fn wait_for_log(peer: &StdioPeer, text: &str) {
    wait_until(&format!("{text:?} in the log"), TIMEOUT, || {
        peer.stderr().contains(text)
    });
}

/// Kills the process on drop if it still runs and its command line still names `marker` (a path
/// unique to the test, so a recycled pid is never hit): no stray upstream when a test fails midway.
pub(crate) struct PidGuard {
    pub(crate) pid: u32,
    pub(crate) marker: PathBuf,
}

impl Drop for PidGuard {
    fn drop(&mut self) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        let marker = self.marker.to_string_lossy();
        let ours = String::from_utf8_lossy(&cmdline).contains(marker.as_ref());
        if ours && is_running(self.pid) {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
    }
}

/// A keyed `charge_payment` line (newline included) whose arguments carry a `pad` string of `pad`
/// bytes; `id_last` puts the `id` member after `params`.
pub(crate) fn padded_charge(id: u64, key: &str, pad: usize, id_last: bool) -> Vec<u8> {
    let params = format!(
        r#""params":{{"_meta":{},"name":"charge_payment","idempotencyKey":"{key}","arguments":{{"amount":1,"currency":"EUR","pad":"@"}}}}"#,
        meta_2026()
    );
    let message = if id_last {
        format!(r#"{{"jsonrpc":"2.0","method":"tools/call",{params},"id":{id}}}"#)
    } else {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call",{params}}}"#)
    };
    let (before, after) = message.split_once('@').unwrap();
    let mut line = Vec::with_capacity(message.len() + pad + 1);
    line.extend_from_slice(before.as_bytes());
    line.resize(line.len() + pad, b'x');
    line.extend_from_slice(after.as_bytes());
    line.push(b'\n');
    line
}

/// `VmHWM` (peak resident set) of process `pid`, in kB.
pub(crate) fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}
