//! What `bridge_latency` drives: the server processes it starts, a stdio client for the two
//! bridges (a timeout on every call), a plain HTTP MCP client, and where `mcp-remote` is.

pub(crate) mod forwarder;
pub(crate) mod loss;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader as AsyncBufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};

/// The protocol revision of `server/discover` and per-request `_meta`.
pub(crate) const MODERN: &str = "2026-07-28";
/// What the bench's `initialize` asks for (the newest `initialize` revision, as desktop clients
/// send today).
pub(crate) const LEGACY: &str = "2025-11-25";

/// `params._meta` of a 2026-07-28 request.
pub(crate) fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A `tools/call` request; `_meta` (2026-07-28) only if `modern`.
pub(crate) fn tool_call(id: u64, name: &str, arguments: Value, modern: bool) -> Value {
    let mut params = json!({"name": name, "arguments": arguments});
    if modern {
        params["_meta"] = meta_2026();
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// A 2026-07-28 `server/discover` request.
pub(crate) fn discover(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"server/discover","params":{"_meta": meta_2026()}})
}

/// A legacy `initialize` request.
pub(crate) fn initialize(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "mcp-idem-bridge-latency-bench", "version": "0"}}})
}

/// `result.capabilities.tools.idempotency` of a `server/discover` or `initialize` answer.
pub(crate) fn advertises_idempotency(answer: &Value) -> bool {
    answer["result"]["capabilities"]["tools"]
        .get("idempotency")
        .is_some()
}

// ---------------------------------------------------------------------------------------------
// Server processes.

/// A server process (demo server or proxy), killed on drop.
pub(crate) struct Server {
    child: Child,
    /// Its `http://IP:PORT/mcp` endpoint.
    pub(crate) url: String,
}

impl Server {
    /// Starts `bin args...` and waits for the `listening on URL` line it prints on stderr; later
    /// stderr lines are echoed, prefixed with `label`.
    pub(crate) fn spawn(bin: &Path, args: &[String], label: &str) -> Result<Self, String> {
        let mut command = Command::new(bin);
        clear_mcp_idem_env(&mut command);
        let mut child = command
            .args(args)
            .env("MCP_IDEM_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", bin.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let label = label.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                match line.split_once("listening on ") {
                    Some((_, url)) => {
                        let _ = tx.send(url.trim().to_owned());
                    }
                    None => eprintln!("  [{label}] {line}"),
                }
            }
        });
        let mut server = Self {
            child,
            url: String::new(),
        };
        server.url = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| format!("{args:?} did not print its address"))?;
        Ok(server)
    }

    /// `http://IP:PORT`, without the `/mcp` path.
    pub(crate) fn base_url(&self) -> &str {
        self.url.trim_end_matches("/mcp")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Settings from the environment would change what is measured.
fn clear_mcp_idem_env(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MCP_IDEM_") {
            command.env_remove(name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mcp-remote.

/// The pinned `mcp-remote` in `interop/node_modules` and the `node` that runs it.
pub(crate) struct McpRemote {
    node: PathBuf,
    script: PathBuf,
    /// `mcp-remote`'s version, from its package.json.
    pub(crate) version: String,
    /// `node --version`.
    pub(crate) node_version: String,
}

impl McpRemote {
    /// Finds `node` (`$NODE`, default `node` on the PATH) and the installed `mcp-remote`.
    pub(crate) fn find() -> Result<Self, String> {
        let interop = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop");
        let package_dir = interop.join("node_modules/mcp-remote");
        let manifest =
            std::fs::read_to_string(package_dir.join("package.json")).map_err(|err| {
                format!(
                    "mcp-remote is not installed in {} ({err}); run `npm ci` there",
                    interop.display()
                )
            })?;
        let manifest: Value = serde_json::from_str(&manifest)
            .map_err(|err| format!("mcp-remote's package.json: {err}"))?;
        let version = manifest["version"].as_str().unwrap_or("unknown").to_owned();
        let script = manifest["bin"]["mcp-remote"]
            .as_str()
            .map(|bin| package_dir.join(bin))
            .ok_or("mcp-remote's package.json names no `mcp-remote` binary")?;
        let node = std::env::var_os("NODE").map_or_else(|| PathBuf::from("node"), PathBuf::from);
        let output = Command::new(&node)
            .arg("--version")
            .output()
            .map_err(|err| format!("cannot run {} --version: {err}", node.display()))?;
        let node_version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        Ok(Self {
            node,
            script: script.canonicalize().unwrap_or(script),
            version,
            node_version,
        })
    }

    /// `node mcp-remote URL --silent`, with its credential store in `dir` (so nothing is read
    /// from or written to `~/.mcp-auth`). A plain-http loopback URL needs no `--allow-http`, and a
    /// server that never answers 401 never starts an OAuth flow.
    pub(crate) fn command(&self, url: &str, dir: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.node);
        command
            .arg(&self.script)
            .arg(url)
            .arg("--silent")
            .env("MCP_REMOTE_CONFIG_DIR", dir.join("mcp-auth"));
        command
    }
}

/// `mcp-idem bridge [extra...] URL`, with no `MCP_IDEM_*` settings from the environment.
pub(crate) fn bridge_command(bin: &Path, url: &str, extra: &[&str]) -> tokio::process::Command {
    let mut std_command = Command::new(bin);
    clear_mcp_idem_env(&mut std_command);
    let mut command = tokio::process::Command::from(std_command);
    command.arg("bridge").args(extra).arg(url);
    command
}

// ---------------------------------------------------------------------------------------------
// The stdio client.

/// A bridge process (`mcp-idem bridge` or `mcp-remote`) driven over newline-delimited JSON-RPC.
pub(crate) struct StdioPeer {
    label: &'static str,
    child: tokio::process::Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<AsyncBufReader<ChildStdout>>,
    stderr_path: PathBuf,
}

impl StdioPeer {
    /// Starts `command` with piped stdin/stdout and stderr in `stderr_path`.
    pub(crate) fn spawn(
        label: &'static str,
        mut command: tokio::process::Command,
        stderr_path: PathBuf,
    ) -> Result<Self, String> {
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|err| format!("cannot create {}: {err}", stderr_path.display()))?;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("cannot start {label}: {err}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(Self {
            label,
            child,
            stdin,
            stdout: AsyncBufReader::new(stdout).lines(),
            stderr_path,
        })
    }

    /// Writes `line` (a JSON-RPC message and its newline) and waits up to `timeout` for the
    /// response with `id`, skipping other messages (notifications, late answers to calls that
    /// timed out). `None` if none came in time; the time is from the write to the parsed answer.
    pub(crate) async fn request(
        &mut self,
        line: &str,
        id: &Value,
        timeout: Duration,
    ) -> Result<Option<(Value, Duration)>, String> {
        let start = Instant::now();
        self.write(line).await?;
        let deadline = tokio::time::Instant::from_std(start + timeout);
        loop {
            let next = match tokio::time::timeout_at(deadline, self.stdout.next_line()).await {
                Err(_) => return Ok(None),
                Ok(next) => next,
            };
            let text = match next {
                Ok(Some(text)) => text,
                Ok(None) => return Err(self.fail("the process closed its output")),
                Err(err) => return Err(self.fail(&format!("cannot read its output: {err}"))),
            };
            let message: Value = serde_json::from_str(&text)
                .map_err(|err| self.fail(&format!("a line that is not JSON ({err}): {text}")))?;
            if message.get("id") == Some(id) && message.get("method").is_none() {
                return Ok(Some((message, start.elapsed())));
            }
        }
    }

    /// [`request`](Self::request) of `message`, failing on a timeout.
    pub(crate) async fn exchange(
        &mut self,
        message: &Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        match self
            .request(&format!("{message}\n"), &message["id"], timeout)
            .await?
        {
            Some((answer, _)) => Ok(answer),
            None => Err(self.fail(&format!("no answer within {timeout:?} to {message}"))),
        }
    }

    /// The legacy handshake: `initialize` (its answer returned), `notifications/initialized`.
    pub(crate) async fn initialize(&mut self, id: u64, timeout: Duration) -> Result<Value, String> {
        let answer = self.exchange(&initialize(id), timeout).await?;
        if answer.get("result").is_none() {
            return Err(self.fail(&format!("initialize failed: {answer}")));
        }
        self.write("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
            .await?;
        Ok(answer)
    }

    async fn write(&mut self, line: &str) -> Result<(), String> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(self.fail("stdin already closed"));
        };
        let written = match stdin.write_all(line.as_bytes()).await {
            Ok(()) => stdin.flush().await,
            Err(err) => Err(err),
        };
        written.map_err(|err| self.fail(&format!("cannot write a request: {err}")))
    }

    /// The process's stderr so far.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// A message naming the process, with the tail of its stderr.
    pub(crate) fn fail(&self, what: &str) -> String {
        let stderr = self.stderr();
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "{} (pid {}): {what}\n--- stderr ({}) ---\n{}",
            self.label,
            self.child.id().unwrap_or_default(),
            self.stderr_path.display(),
            tail.join("\n")
        )
    }

    /// Closes stdin and waits up to 5 s for the exit (then it is killed on drop).
    pub(crate) async fn finish(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            eprintln!(
                "bridge_latency: {} did not exit after EOF; killing it",
                self.label
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The HTTP client.

/// A pooled keep-alive HTTP/1 client with `TCP_NODELAY`, as `mcp-idem bridge` sets it.
pub(crate) fn http_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// A keep-alive HTTP client POSTing JSON-RPC to one Streamable HTTP endpoint, as an HTTP MCP
/// client does: JSON in, plain JSON (or SSE) out.
pub(crate) struct HttpPeer {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    /// The `MCP-Protocol-Version` header: 2026-07-28, or what `initialize` negotiated.
    protocol: String,
}

impl HttpPeer {
    /// A client for `url` speaking `protocol` (sent as `MCP-Protocol-Version`).
    pub(crate) fn new(url: &str, protocol: &str) -> Self {
        Self {
            client: http_client(),
            url: url.to_owned(),
            protocol: protocol.to_owned(),
        }
    }

    /// The request for `body`, with the headers of Streamable HTTP (built before the clock
    /// starts): `MCP-Protocol-Version` (not on `initialize`), `Mcp-Method`, `Mcp-Name`.
    pub(crate) fn post(&self, message: &Value) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        if let Some(method) = message["method"].as_str() {
            request = request.header("mcp-method", method);
            if method != "initialize" {
                request = request.header("mcp-protocol-version", &self.protocol);
            }
            if let Some(name) = message["params"]["name"].as_str() {
                request = request.header("mcp-name", name);
            }
        }
        request
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap_or_else(|_| http::Request::new(Full::new(Bytes::new())))
    }

    /// Sends `request` and reads and parses the whole answer, within `timeout`; returns it and
    /// the time from the send to the parsed answer.
    pub(crate) async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<(Value, Duration), String> {
        let start = Instant::now();
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|err| format!("POST {}: {err}", self.url))?;
            let status = response.status();
            let sse = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|err| format!("reading the answer of {}: {err}", self.url))?
                .to_bytes();
            let text = String::from_utf8_lossy(&body);
            let json = if sse {
                // The final `data:` line of the stream carries the response.
                text.lines()
                    .rev()
                    .find_map(|line| line.strip_prefix("data:"))
                    .unwrap_or_default()
                    .trim()
            } else {
                text.trim()
            };
            serde_json::from_str::<Value>(json).map_err(|err| {
                format!("HTTP {status} with a body that is not JSON ({err}): {text}")
            })
        };
        let answer = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("no answer from {} within {timeout:?}", self.url))??;
        Ok((answer, start.elapsed()))
    }
}
