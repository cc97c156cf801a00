//! The MCP server behind each gateway process: it names itself, lists its tools, and runs each
//! `tools/call`, counting the execution in the world's ledger before it answers.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinSet;

use super::{lock, Execution, World};

/// The server's name: every gateway learns its namespace from it.
pub const SERVER_NAME: &str = "payments";

/// The tools it lists.
pub const TOOLS: &[&str] = &["charge", "refund", "transfer", "notify", "audit"];

/// The `_meta` member in which a simulated client names the group a call belongs to.
pub const GROUP_META: &str = "sim/group";

/// The `_meta` member in which a simulated client names the key of its own it sent beside a
/// business identifier.
pub const CLIENT_KEY_META: &str = "sim/client-key";

/// Who the server is running for.
#[derive(Clone, Debug)]
pub struct ServerOf {
    /// The host.
    pub host: usize,
    /// The process (for the history).
    pub process: u64,
    /// The principal the process runs as.
    pub principal: String,
}

/// Serves requests read from `input`, answering on `output`, until `input` ends; calls still
/// running then are dropped with the server (as a server process exits when its input closes).
pub async fn serve<R, W>(world: Arc<World>, of: ServerOf, input: R, output: W)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let output = Arc::new(AsyncMutex::new(output));
    let mut lines = BufReader::new(input).lines();
    let mut calls = JoinSet::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let (Some(id), Some(method)) = (message.get("id"), message.get("method")) else {
            continue;
        };
        let id = id.clone();
        let result = match method.as_str().unwrap_or_default() {
            "initialize" => json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": SERVER_NAME, "version": "1.0.0"},
            }),
            "server/discover" => json!({
                "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": SERVER_NAME, "version": "1.0.0"}},
            }),
            "tools/list" => json!({
                "tools": TOOLS.iter().map(|name| json!({
                    "name": name,
                    "inputSchema": {"type": "object"},
                })).collect::<Vec<_>>(),
            }),
            "tools/call" => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                calls.spawn(run_call(
                    Arc::clone(&world),
                    of.clone(),
                    id,
                    params,
                    Arc::clone(&output),
                ));
                continue;
            }
            _ => {
                let error = json!({"code": -32601, "message": "method not found"});
                write(
                    &output,
                    &json!({"jsonrpc": "2.0", "id": id, "error": error}),
                )
                .await;
                continue;
            }
        };
        write(
            &output,
            &json!({"jsonrpc": "2.0", "id": id, "result": result}),
        )
        .await;
    }
}

async fn write<W: AsyncWrite + Unpin>(output: &AsyncMutex<W>, message: &Value) {
    let mut line = message.to_string();
    line.push('\n');
    let mut output = output.lock().await;
    // The gateway may be gone: what it would have read is lost with it.
    let _ = output.write_all(line.as_bytes()).await;
    let _ = output.flush().await;
}

/// Runs one call: counts it, takes its time, answers.
async fn run_call<W: AsyncWrite + Unpin>(
    world: Arc<World>,
    of: ServerOf,
    id: Value,
    params: Value,
    output: Arc<AsyncMutex<W>>,
) {
    let tool = params["name"].as_str().unwrap_or_default().to_owned();
    let meta = &params["_meta"];
    let group = meta[GROUP_META].as_str().unwrap_or("(none)").to_owned();
    let client_key = meta[CLIENT_KEY_META].as_str().map(str::to_owned);
    let claimed_key = meta[mcp_idempotency::interceptor::META_KEY]
        .as_str()
        .map(str::to_owned);
    let slow = lock(&world.faults).take_slow_tool(of.host);
    let duration = if slow {
        world.draw_ms(35_000, 100_000)
    } else {
        world.draw_ms(10, 2_000)
    };
    let is_error = world.chance(0.15);
    let index = {
        let mut executions = lock(&world.executions);
        executions.push(Execution {
            group: group.clone(),
            process: of.process,
            principal: of.principal.clone(),
            claimed_key: claimed_key.clone(),
            client_key,
            started: world.elapsed(),
            ended: None,
            is_error,
            result: String::new(),
        });
        executions.len() - 1
    };
    world.history.note(
        format!("p{}", of.process),
        format!(
            "EXECUTES {tool} #{index} group {group} key {} ({} ms{})",
            claimed_key.as_deref().unwrap_or("-"),
            duration.as_millis(),
            if slow { ", slower than the lease" } else { "" }
        ),
    );
    tokio::time::sleep(duration).await;
    let text = format!(
        "{tool} execution #{index} of group {group} for {}",
        of.principal
    );
    let result = json!({"content": [{"type": "text", "text": text}], "isError": is_error});
    let result_text = result.to_string();
    {
        let mut executions = lock(&world.executions);
        let execution = &mut executions[index];
        execution.ended = Some(world.elapsed());
        execution.result = result_text;
    }
    write(
        &output,
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    )
    .await;
}
