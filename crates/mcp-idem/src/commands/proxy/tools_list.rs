//! The proxy's own `tools/list` (issue 39): with `--tools suggested`, the upstream's tools are
//! listed at start (`tools/list` under MCP 2026-07-28, else on a legacy session of its own, ended
//! at once) and again whenever a `notifications/tools/list_changed` passes, so that the
//! suggestion applies to a key-less call whether or not its client listed the tools. A tool not
//! listed yet runs as with no policy, and is counted.

use std::time::Duration;

use mcp_idempotency::backoff;
use mcp_idempotency::interceptor::InterceptorConfig;
use mcp_idempotency::protocol;
use serde_json::{json, Value};

use crate::http_line_client::HttpClient;

/// Longest one request to the upstream may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a listing that failed is tried again before waiting for a change.
const ATTEMPTS: u32 = 20;

/// Lists the upstream's tools into `config` (every interceptor made from it sees them), at start
/// and after each `notifications/tools/list_changed`.
pub(crate) async fn keep_listed(client: HttpClient, config: InterceptorConfig) {
    loop {
        let changed = config.tools_changed();
        for attempt in 1..=ATTEMPTS {
            match list(&client).await {
                Ok(tools) => {
                    tracing::info!(tools = tools.len(), "listed the upstream's tools");
                    config.learn_tools(&tools);
                    break;
                }
                Err(why) => {
                    if attempt == 1 {
                        tracing::warn!(
                            "cannot list the upstream's tools yet ({why}); key-less calls run as \
                             with no suggested policy until it answers"
                        );
                    }
                    let pause =
                        backoff(attempt, Duration::from_millis(100), Duration::from_secs(5));
                    tokio::time::sleep(pause).await;
                }
            }
        }
        changed.await;
    }
}

/// Every tool the upstream lists (all pages).
async fn list(client: &HttpClient) -> Result<Vec<Value>, String> {
    match pages(client, true).await {
        Ok(tools) => Ok(tools),
        Err(_) => {
            let mut legacy = client.clone();
            let body = protocol::initialize_request(1, protocol::V_2025_06_18, "mcp-idem-proxy");
            let answer = client
                .post(
                    Some(1),
                    protocol::INITIALIZE,
                    None,
                    body.to_string(),
                    ASK_TIMEOUT,
                )
                .await
                .map_err(|err| format!("{err:#}"))?;
            let session = answer.headers.get("mcp-session-id").cloned();
            legacy.use_legacy_session(protocol::V_2025_06_18, session.clone());
            let _ = legacy
                .post(
                    None,
                    protocol::INITIALIZED,
                    None,
                    protocol::INITIALIZED_NOTIFICATION.to_owned(),
                    ASK_TIMEOUT,
                )
                .await;
            let tools = pages(&legacy, false).await;
            if let Some(session) = &session {
                legacy.end_session(session, ASK_TIMEOUT).await;
            }
            tools
        }
    }
}

/// `tools/list`, page by page; `meta` adds the per-request `_meta` of MCP 2026-07-28.
async fn pages(client: &HttpClient, meta: bool) -> Result<Vec<Value>, String> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for id in 1..=1000u64 {
        let mut params = json!({});
        if meta {
            params["_meta"] = protocol::request_meta();
        }
        if let Some(cursor) = &cursor {
            params["cursor"] = json!(cursor);
        }
        let body = protocol::request(id, "tools/list", params);
        let answer = client
            .post(Some(id), "tools/list", None, body.to_string(), ASK_TIMEOUT)
            .await
            .map_err(|err| format!("{err:#}"))?;
        let response: Value = serde_json::from_str(&answer.text)
            .map_err(|_| "a tools/list answer that is not JSON".to_owned())?;
        let result = response
            .get("result")
            .ok_or_else(|| format!("tools/list answered {}", response["error"]))?;
        let page = result["tools"]
            .as_array()
            .ok_or("a tools/list result without tools")?;
        tools.extend(page.iter().cloned());
        match result["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return Ok(tools),
        }
    }
    Err("more than 1000 pages of tools".into())
}
