//! A minimal MCP client over a child process's stdio, speaking raw JSON-RPC lines.
//!
//! The demo (and tests) need to do what ordinary clients cannot: drop a response on purpose, send a
//! duplicate while the first call runs, kill the server mid-session. So this client works at the
//! message level: send a request, and read the response with a given id when it is wanted.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use mcp_idempotency::protocol;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// A running MCP server and the client end of its stdio.
pub(crate) struct LineClient {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Each message as parsed, with the line that carried it (byte for byte, without the newline).
    messages: mpsc::UnboundedReceiver<(Value, String)>,
    early: HashMap<String, (Value, String)>,
    next_id: u64,
}

impl LineClient {
    /// Starts `program` with `args`; its stderr goes to ours.
    pub(crate) fn spawn(
        program: &std::path::Path,
        args: &[String],
        envs: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut child = Command::new(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, messages) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(message) = serde_json::from_str::<Value>(&line) {
                    if tx.send((message, line)).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Self {
            stdin: child.stdin.take(),
            child,
            messages,
            early: HashMap::new(),
            next_id: 1,
        })
    }

    /// The legacy handshake (at [`protocol::V_2025_06_18`]): `initialize`, then
    /// `notifications/initialized`. Returns the result.
    pub(crate) async fn initialize(&mut self) -> anyhow::Result<Value> {
        let params = protocol::initialize_params(protocol::V_2025_06_18, "mcp-idem-demo");
        let response = self.request(protocol::INITIALIZE, params).await?;
        self.notify(protocol::INITIALIZED, json!({})).await?;
        response.get("result").cloned().context("initialize failed")
    }

    /// Sends a request and returns its id without waiting for the response.
    pub(crate) async fn send(&mut self, method: &str, params: Value) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        Ok(id)
    }

    /// Sends a request whose params are given as JSON text, sent exactly as written.
    pub(crate) async fn send_raw(
        &mut self,
        method: &str,
        params_json: &str,
    ) -> anyhow::Result<u64> {
        Ok(self.send_raw_line(method, params_json).await?.0)
    }

    /// Like [`send_raw`](Self::send_raw); also returns the line sent (without the newline).
    pub(crate) async fn send_raw_line(
        &mut self,
        method: &str,
        params_json: &str,
    ) -> anyhow::Result<(u64, String)> {
        let id = self.next_id;
        self.next_id += 1;
        let method = Value::from(method);
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{params_json}}}"#);
        self.write_line(line.clone()).await?;
        Ok((id, line))
    }

    /// Sends a notification.
    pub(crate) async fn notify(&mut self, method: &str, params: Value) -> anyhow::Result<()> {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await
    }

    /// Sends a request and waits for its response (the whole JSON-RPC message).
    pub(crate) async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.send(method, params).await?;
        self.response(id, Duration::from_secs(30)).await
    }

    /// Waits for the response to request `id`.
    pub(crate) async fn response(&mut self, id: u64, wait: Duration) -> anyhow::Result<Value> {
        Ok(self.response_raw(id, wait).await?.0)
    }

    /// Waits for the response to request `id`; returns it parsed and as the line that carried it.
    pub(crate) async fn response_raw(
        &mut self,
        id: u64,
        wait: Duration,
    ) -> anyhow::Result<(Value, String)> {
        let key = id.to_string();
        if let Some(message) = self.early.remove(&key) {
            return Ok(message);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (message, line) = tokio::time::timeout_at(deadline, self.messages.recv())
                .await
                .with_context(|| format!("no response to request {id} within {wait:?}"))?
                .context("the server closed its output")?;
            match message.get("id").map(Value::to_string) {
                Some(got) if got == key => return Ok((message, line)),
                Some(got) if message.get("method").is_none() => {
                    self.early.insert(got, (message, line));
                }
                _ => {}
            }
        }
    }

    async fn write(&mut self, message: &Value) -> anyhow::Result<()> {
        self.write_line(message.to_string()).await
    }

    async fn write_line(&mut self, mut line: String) -> anyhow::Result<()> {
        let Some(stdin) = self.stdin.as_mut() else {
            bail!("the server's input is closed");
        };
        line.push('\n');
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub(crate) async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("cannot kill the server")
    }

    /// Closes the server's input and waits for it to exit.
    pub(crate) async fn close(mut self) -> anyhow::Result<std::process::ExitStatus> {
        drop(self.stdin.take());
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .context("the server did not exit after its input closed")?
            .context("cannot wait for the server")
    }
}
