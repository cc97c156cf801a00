//! Helpers for the third-party SDK tests (`interop_*`): the TypeScript SDK v2 and Python
//! `mcp` 2.x scripts in `interop/` at the repository root, run as real processes against
//! `mcp-idem wrap` and `mcp-idem proxy`.
//!
//! The toolchains are installed by `.ci/run` (`npm ci` in `interop/`, `pip install -r
//! interop/requirements.txt`). When one is missing, [`Toolchain::require`] fails the test under
//! `CI=true` and otherwise prints a note so the test can end early.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one client script may run (it includes a 3 s slow call and process start-ups).
pub(crate) const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// `interop/` at the repository root.
pub(crate) fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop")
}

/// `interop/NAME`.
pub(crate) fn script(name: &str) -> PathBuf {
    interop_dir().join(name)
}

pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

/// A language runtime with the SDK the scripts import.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Toolchain {
    /// `node` with `interop/node_modules` (`@modelcontextprotocol/client` and `/server` 2.4.0).
    Node,
    /// `python3` with the `mcp` 2.x package.
    Python,
}

impl Toolchain {
    /// The interpreter.
    pub(crate) fn program(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Python => "python3",
        }
    }

    /// Why the toolchain cannot run the scripts, or `None` when it can.
    fn missing(self) -> Option<String> {
        let probe = match self {
            Self::Node => {
                let module = interop_dir().join("node_modules/@modelcontextprotocol/client");
                if !module.is_dir() {
                    return Some(format!(
                        "{} is missing: run `npm ci` in interop/",
                        module.display()
                    ));
                }
                Command::new("node").arg("--version").output()
            }
            Self::Python => Command::new("python3")
                .args([
                    "-c",
                    "import importlib.metadata as m, mcp.server.mcpserver; \
                     assert m.version('mcp').startswith('2.'), m.version('mcp')",
                ])
                .output(),
        };
        match probe {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(format!(
                "`{}` cannot load the SDK ({}: {}): run `pip install -r interop/requirements.txt`",
                self.program(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(err) => Some(format!("`{}` cannot be started: {err}", self.program())),
        }
    }

    /// `true` when the scripts can run. When they cannot: panics under `CI=true`, else prints a
    /// note and returns `false` (the test then ends without checking anything).
    pub(crate) fn require(self) -> bool {
        let Some(why) = self.missing() else {
            return true;
        };
        assert!(
            !in_ci(),
            "CI=true but the {self:?} interop toolchain is missing: {why}"
        );
        eprintln!("NOTE: skipping a {self:?} interop test: {why} (set CI=true to fail instead)");
        false
    }
}

/// Runs `program args` to completion (stdin closed, stderr appended to `stderr_path`) and parses
/// its stdout as one JSON document. Panics if it fails, prints no JSON, or outlives
/// [`SCRIPT_TIMEOUT`].
pub(crate) fn run_report(program: &str, args: &[OsString], stderr_path: &Path) -> Value {
    let stderr = File::create(stderr_path).expect("create the stderr file");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(interop_dir())
        .env("MCP_IDEM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|err| panic!("spawn {program}: {err}"));
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the script") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{program} {args:?} did not finish within {SCRIPT_TIMEOUT:?}; stderr:\n{}",
                read_text(stderr_path)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().expect("the stdout reader");
    assert!(
        status.success(),
        "{program} {args:?} failed ({status}); stdout:\n{text}\nstderr:\n{}",
        read_text(stderr_path)
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|err| {
        panic!(
            "{program} printed no JSON report ({err}): {text}\nstderr:\n{}",
            read_text(stderr_path)
        )
    })
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The JSON lines a fixture server appended to its executions file (none if it does not exist).
pub(crate) fn executions(path: &Path) -> Vec<Value> {
    read_text(path)
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("execution line is not JSON ({err}): {line}"))
        })
        .collect()
}

/// A fixture server serving Streamable HTTP (`ts-server.mjs --http`, `py_server.py --http`),
/// killed on drop.
pub(crate) struct HttpFixture {
    child: Child,
    log: Arc<Mutex<String>>,
    /// `http://127.0.0.1:PORT/mcp`, from the server's `listening on URL` stderr line.
    pub(crate) url: String,
}

impl HttpFixture {
    /// Spawns `program args` and waits for its `listening on URL` line.
    pub(crate) fn spawn(program: &str, args: &[OsString]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .current_dir(interop_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {program}: {err}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = Arc::clone(&log);
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("listening on ") {
                    let _ = tx.send(url.to_owned());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut fixture = Self {
            child,
            log,
            url: String::new(),
        };
        match rx.recv_timeout(SCRIPT_TIMEOUT) {
            Ok(url) => fixture.url = url,
            Err(_) => panic!(
                "{program} {args:?} did not print its URL (exit status {:?}); stderr:\n{}",
                fixture.child.try_wait().ok().flatten(),
                fixture.stderr()
            ),
        }
        assert!(
            fixture.url.starts_with("http://127.0.0.1:") && fixture.url.ends_with("/mcp"),
            "{}",
            fixture.url
        );
        fixture
    }

    /// `http://127.0.0.1:PORT`: the value for `proxy --upstream`.
    pub(crate) fn base_url(&self) -> String {
        self.url.trim_end_matches("/mcp").to_owned()
    }

    /// What the server logged so far.
    pub(crate) fn stderr(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that a raw `server/discover` (or `initialize`) result advertises
/// `capabilities.tools.idempotency` as an object.
pub(crate) fn assert_advertises_idempotency(discover: &Value) {
    assert!(
        discover["capabilities"]["tools"]["idempotency"].is_object(),
        "no capabilities.tools.idempotency in {discover}"
    );
}
