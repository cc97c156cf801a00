//! Shared helpers for end-to-end tests: a child process that speaks newline-delimited JSON-RPC
//! on its stdin/stdout (MCP stdio), and a reader for the demo server's ledger.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long a test waits for one message or for the process to exit.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);

/// `_meta` that every 2026-07-28 request carries.
pub(crate) fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A child process speaking MCP over stdio. Messages that arrive while waiting for another id
/// are kept, so responses can be awaited in any order.
pub(crate) struct StdioPeer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Received but not yet taken, in arrival order.
    pending: Vec<Value>,
    /// Every line read so far, as received (for byte-level comparisons).
    raw_lines: Vec<String>,
    stderr_path: PathBuf,
}

impl StdioPeer {
    /// Spawns `command` with piped stdin/stdout; its stderr goes to `stderr_path`.
    pub(crate) fn spawn(mut command: Command, stderr_path: &Path) -> Self {
        let stderr = File::create(stderr_path).expect("create the stderr file");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn the server");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            pending: Vec::new(),
            raw_lines: Vec::new(),
            stderr_path: stderr_path.to_path_buf(),
        }
    }

    /// `mcp-idem demo-server --ledger LEDGER`, with stderr in `LEDGER.<n>.stderr`.
    pub(crate) fn demo_server(ledger: &Path) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
        command.arg("demo-server").arg("--ledger").arg(ledger);
        Self::spawn(command, &unique_stderr_path(ledger))
    }

    /// Writes one message as one line.
    pub(crate) fn send(&mut self, message: &Value) {
        self.send_raw(&message.to_string());
    }

    /// Writes `line` and a newline, as is.
    pub(crate) fn send_raw(&mut self, line: &str) {
        self.send_bytes(format!("{line}\n").as_bytes());
    }

    /// Writes `bytes` exactly (no newline added): for malformed input such as invalid UTF-8.
    pub(crate) fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        stdin
            .write_all(bytes)
            .and_then(|()| stdin.flush())
            .expect("write to the server");
    }

    /// Sends a request and returns the response with its id.
    pub(crate) fn request(&mut self, message: Value) -> Value {
        let id = message["id"].clone();
        self.send(&message);
        self.response(&id)
    }

    /// The next message, in arrival order, or `None` after `timeout`.
    pub(crate) fn next_message(&mut self, timeout: Duration) -> Option<Value> {
        if !self.pending.is_empty() {
            return Some(self.pending.remove(0));
        }
        self.read(timeout)
    }

    /// The response (result or error) whose id is `id`; panics after [`TIMEOUT`].
    pub(crate) fn response(&mut self, id: &Value) -> Value {
        self.try_response(id, TIMEOUT).unwrap_or_else(|| {
            panic!(
                "no response with id {id} within {TIMEOUT:?}; other messages: {:?}; stderr:\n{}",
                self.pending,
                self.stderr()
            )
        })
    }

    /// The response whose id is `id`, or `None` after `timeout`.
    pub(crate) fn try_response(&mut self, id: &Value, timeout: Duration) -> Option<Value> {
        let is_response = |message: &Value| {
            message.get("id") == Some(id)
                && (message.get("result").is_some() || message.get("error").is_some())
        };
        if let Some(at) = self.pending.iter().position(is_response) {
            return Some(self.pending.remove(at));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let message = self.read(deadline.saturating_duration_since(Instant::now()))?;
            if is_response(&message) {
                return Some(message);
            }
            self.pending.push(message);
        }
    }

    /// Every message received so far and not taken yet.
    pub(crate) fn pending(&self) -> &[Value] {
        &self.pending
    }

    /// Every line the process wrote and the test read so far, byte for byte (without the line
    /// ending), in arrival order; taken or not.
    pub(crate) fn raw_lines(&self) -> &[String] {
        &self.raw_lines
    }

    fn read(&mut self, timeout: Duration) -> Option<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                let message = serde_json::from_str(&line).unwrap_or_else(|err| {
                    panic!("the server wrote a line that is not JSON ({err}): {line}")
                });
                self.raw_lines.push(line);
                Some(message)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Closes the server's stdin (EOF).
    pub(crate) fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub(crate) fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the server") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {timeout:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes stdin and waits for the exit status.
    pub(crate) fn finish(mut self) -> ExitStatus {
        self.close_stdin();
        self.wait(TIMEOUT)
    }

    /// What the server logged so far.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for StdioPeer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn unique_stderr_path(ledger: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = ledger.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{n}.stderr"));
    ledger.with_file_name(name)
}

/// The ledger's lines, each parsed as JSON (`{chargeId, amount, currency, pid, unixMs}`).
/// A missing file has no lines.
pub(crate) fn ledger_lines(path: &Path) -> Vec<Value> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(err) => panic!("cannot read the ledger {}: {err}", path.display()),
    };
    text.lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("ledger line is not JSON ({err}): {line}"))
        })
        .collect()
}

/// How many ledger lines carry `charge_id`.
pub(crate) fn count_charge(path: &Path, charge_id: &str) -> usize {
    ledger_lines(path)
        .iter()
        .filter(|line| line["chargeId"] == charge_id)
        .count()
}

/// Polls until the ledger has at least `lines` lines; panics after [`TIMEOUT`].
pub(crate) fn wait_for_ledger(path: &Path, lines: usize) -> Vec<Value> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let found = ledger_lines(path);
        if found.len() >= lines {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "the ledger has {} lines, expected {lines}",
            found.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private `redis-server` on `127.0.0.1:PORT` (no persistence), killed on drop, for tests that
/// stop and restart their store.
pub(crate) struct PrivateRedis {
    child: Child,
}

impl PrivateRedis {
    /// Starts it and waits until it accepts connections; `None` if `redis-server` cannot run.
    pub(crate) fn start(port: u16) -> Option<Self> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let redis = Self { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(redis)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on (just released).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}
