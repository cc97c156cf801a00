//! The proxy's default namespace: its upstream's own name, `mcp-server:<name>` as every other
//! form keys a server's records, so that instances naming one server by other URLs
//! (`http://127.0.0.1:P/mcp`, `http://localhost:P/mcp`) share its records. The proxy asks the
//! upstream itself, in the background from the start: `server/discover` (MCP 2026-07-28), else
//! the legacy `initialize` (on a session of its own, ended at once). Until the upstream answers,
//! keyed calls wait for the name (the layer's [`LearnedNamespace`]); an upstream that answers
//! without giving it (one that wants credentials from the proxy) gets the namespace of earlier
//! versions, `http:<upstream URL>`, with a warning.

use std::time::Duration;

use mcp_idempotency::backoff;
use mcp_idempotency::default_scope::{server_namespace, upstream_namespace, NamespaceLearner};
use mcp_idempotency::protocol;
use serde_json::Value;

use crate::http_line_client::{HttpClient, NotJsonRpc};

/// Longest one question to the upstream may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the upstream's answer to one question said.
enum Answer {
    /// It named itself.
    Named(String),
    /// It answered, and will not name itself to the proxy: why.
    Unnamed(String),
    /// It did not answer (down, starting, 5xx): ask again later. Why.
    Silent(String),
    /// It does not speak `server/discover`: ask with `initialize`.
    Legacy,
}

/// Asks the upstream its name until it answers, then sets `learner`: `mcp-server:<name>`, or
/// `fallback` (`http:<upstream URL>`) for an upstream that will not say.
pub(crate) async fn learn(client: HttpClient, fallback_url: String, learner: NamespaceLearner) {
    let mut failures = 0;
    loop {
        let mut answer = ask(&client, protocol::DISCOVER).await;
        if let Answer::Legacy = answer {
            answer = ask(&client, protocol::INITIALIZE).await;
        }
        match answer {
            Answer::Named(name) => {
                let namespace = server_namespace(&name);
                tracing::info!(%namespace, "the upstream named itself");
                learner.set(namespace);
                return;
            }
            Answer::Unnamed(why) => {
                let namespace = upstream_namespace(&fallback_url);
                tracing::warn!(
                    %namespace,
                    "the upstream does not give the proxy its name ({why}): records are kept \
                     under its URL as written, so proxies naming it by another URL keep others; \
                     set --namespace on every instance to share them"
                );
                learner.set(namespace);
                return;
            }
            Answer::Silent(why) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(
                        "cannot ask the upstream its name yet ({why}); keyed calls wait for it"
                    );
                }
                let pause = backoff(failures, Duration::from_millis(100), Duration::from_secs(5));
                tokio::time::sleep(pause).await;
            }
            Answer::Legacy => {
                let namespace = upstream_namespace(&fallback_url);
                tracing::warn!(
                    %namespace,
                    "the upstream answered neither server/discover nor initialize with a \
                     result: records are kept under its URL as written; set --namespace on every \
                     instance to share them"
                );
                learner.set(namespace);
                return;
            }
        }
    }
}

/// One question: `method` (`server/discover` or `initialize`) to the upstream.
async fn ask(client: &HttpClient, method: &str) -> Answer {
    let body = match method {
        protocol::DISCOVER => protocol::discover_request(1),
        _ => protocol::initialize_request(1, protocol::V_2025_06_18, "mcp-idem-proxy"),
    };
    let answer = match client
        .post(Some(1), method, None, body.to_string(), ASK_TIMEOUT)
        .await
    {
        Ok(answer) => answer,
        Err(err) => {
            return match err.downcast_ref::<NotJsonRpc>().map(|e| e.status.as_u16()) {
                Some(401 | 403) => Answer::Unnamed(format!("{err:#}")),
                Some(status) if (400..500).contains(&status) => Answer::Legacy,
                _ => Answer::Silent(format!("{err:#}")),
            };
        }
    };
    if method == protocol::INITIALIZE {
        if let Some(session) = answer.headers.get("mcp-session-id") {
            client.end_session(session, ASK_TIMEOUT).await;
        }
    }
    let Ok(response) = serde_json::from_str::<Value>(&answer.text) else {
        return Answer::Silent(format!("a {method} answer that is not JSON"));
    };
    if response.get("result").is_none() {
        return Answer::Legacy;
    }
    match server_name(&response) {
        Some(name) => Answer::Named(name.to_owned()),
        None => Answer::Unnamed(format!("its {method} result has no serverInfo.name")),
    }
}

/// `serverInfo.name` of an `initialize` result, or of a `server/discover` result's `_meta`.
fn server_name(response: &Value) -> Option<&str> {
    let result = &response["result"];
    result["serverInfo"]["name"]
        .as_str()
        .or_else(|| result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"].as_str())
}
