//! What every task of a running bridge shares: the endpoint, the retry policy, the way to the
//! client, and what the bridge learned of the server (its capability, which tools are safe to
//! run twice, the legacy session).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::exchange::{Endpoint, SESSION_ID};
use super::message::{self, ServerMessage};
use crate::client::RetryPolicy;
use crate::protocol::{DISCOVER, INITIALIZE};

/// How long the GET stream waits before it is opened again after it ended.
const GET_STREAM_PAUSE: Duration = Duration::from_secs(1);

pub(crate) struct Shared {
    pub(crate) endpoint: Endpoint,
    pub(crate) policy: RetryPolicy,
    out: mpsc::Sender<String>,
    state: Mutex<State>,
    /// Held while a legacy session is being re-initialized, so that it happens once.
    reinit: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Whether the server advertises `tools.idempotency`; `None` until a result said.
    capability: Option<bool>,
    /// Tools whose `tools/list` annotations say a second run is harmless.
    safe_tools: HashMap<String, bool>,
    /// The legacy session's id, from the `initialize` answer.
    session_id: Option<String>,
    /// The protocol revision negotiated by `initialize`.
    version: Option<String>,
    /// The client's own `initialize` and `notifications/initialized`, re-sent when the session
    /// expired.
    initialize: Option<String>,
    initialized: Option<String>,
    /// Bumped whenever the session changes.
    generation: u64,
    get_stream: Option<AbortHandle>,
}

impl Shared {
    pub(crate) fn new(
        endpoint: Endpoint,
        policy: RetryPolicy,
        out: mpsc::Sender<String>,
        capability: Option<bool>,
    ) -> Self {
        Self {
            endpoint,
            policy,
            out,
            state: Mutex::new(State {
                capability,
                ..State::default()
            }),
            reinit: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes a message to the client (on one line).
    pub(crate) async fn deliver(&self, message: &str) {
        // A closed channel means the client is gone: nobody is left to tell.
        let _ = self.out.send(message::one_line(message).into_owned()).await;
    }

    /// Passes a message from the server on to the client, if it is JSON-RPC: stdout carries
    /// nothing else.
    pub(crate) async fn deliver_from_server(&self, message: &str) {
        if message::is_json_rpc(message) {
            self.deliver(message).await;
        } else {
            let start: String = message.chars().take(120).collect();
            tracing::warn!(message = %start, "dropped a message from the server that is not JSON-RPC");
        }
    }

    /// A JSON-RPC id (JSON text) the client never uses, for re-issues and the bridge's own
    /// requests.
    pub(crate) fn fresh_id(&self, purpose: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        serde_json::Value::String(format!("mcp-idem-bridge-{purpose}-{n}")).to_string()
    }

    /// Whether a `tools/call` of `tool` may be re-issued after its answer was lost: the server
    /// replays it (`tools.idempotency`), or the tool says a second run is harmless.
    pub(crate) fn may_reissue(&self, tool: &str) -> bool {
        let state = self.state();
        state.capability == Some(true) || state.safe_tools.get(tool).copied().unwrap_or(false)
    }

    /// Learns from the answer to a request of `method`.
    pub(crate) fn observe(&self, method: &str, response: &str) {
        let mut state = self.state();
        match method {
            DISCOVER | INITIALIZE => {
                if let Some(advertised) = message::advertises_idempotency(response) {
                    state.capability = Some(advertised);
                }
                if method == INITIALIZE {
                    if let Some(version) = message::negotiated_version(response) {
                        state.version = Some(version);
                    }
                }
            }
            "tools/list" => state.safe_tools.extend(message::tool_annotations(response)),
            _ => {}
        }
    }

    /// Remembers the client's `initialize`, to re-send it if the session expires.
    pub(crate) fn remember_initialize(&self, message: &str) {
        self.state().initialize = Some(message.to_owned());
    }

    /// Remembers the client's `notifications/initialized`.
    pub(crate) fn remember_initialized(&self, message: &str) {
        self.state().initialized = Some(message.to_owned());
    }

    /// Takes the session id of an `initialize` answer.
    pub(crate) fn set_session(&self, session_id: Option<&str>) {
        let mut state = self.state();
        if let Some(id) = session_id {
            state.session_id = Some(id.to_owned());
            state.generation += 1;
        }
    }

    /// Whether a legacy session is open.
    pub(crate) fn in_session(&self) -> bool {
        self.state().session_id.is_some()
    }

    /// The headers of a POST of `message`, and the session generation they belong to.
    pub(crate) fn headers_for(&self, message: &str) -> (Vec<(&'static str, String)>, Option<u64>) {
        let mut headers = message::routing_headers(message);
        let state = self.state();
        if !headers
            .iter()
            .any(|(name, _)| *name == "mcp-protocol-version")
        {
            if let Some(version) = &state.version {
                headers.push(("mcp-protocol-version", version.clone()));
            }
        }
        let generation = state.session_id.as_ref().map(|id| {
            headers.push((SESSION_ID, id.clone()));
            state.generation
        });
        (headers, generation)
    }

    fn session_headers(&self) -> Option<(Vec<(&'static str, String)>, u64)> {
        let state = self.state();
        let id = state.session_id.clone()?;
        let mut headers = vec![(SESSION_ID, id)];
        if let Some(version) = &state.version {
            headers.push(("mcp-protocol-version", version.clone()));
        }
        Some((headers, state.generation))
    }

    /// Opens the server's GET stream for its own messages, if it offers one, replacing the
    /// stream of an earlier session.
    pub(crate) fn open_get_stream(self: &Arc<Self>) {
        let Some((_, generation)) = self.session_headers() else {
            return;
        };
        let shared = Arc::clone(self);
        let task = tokio::spawn(async move { shared.listen(generation).await });
        if let Some(old) = self.state().get_stream.replace(task.abort_handle()) {
            old.abort();
        }
    }

    async fn listen(&self, generation: u64) {
        loop {
            let Some((headers, current)) = self.session_headers() else {
                return;
            };
            if current != generation {
                return;
            }
            match self.endpoint.get_stream(&headers).await {
                Ok(mut answer) if answer.status.is_success() && answer.is_sse() => {
                    while let Ok(Some(message)) = answer.next_message().await {
                        self.deliver_from_server(&message).await;
                    }
                }
                Ok(answer) => {
                    tracing::debug!(status = %answer.status, "the server offers no GET stream");
                    return;
                }
                Err(error) => tracing::debug!(%error, "cannot open the GET stream"),
            }
            tokio::time::sleep(GET_STREAM_PAUSE).await;
        }
    }

    /// The session of `generation` expired (`404`): initializes a new one with the client's own
    /// `initialize` and `notifications/initialized`, unless another task already did.
    pub(crate) async fn reinitialize(self: &Arc<Self>, generation: u64) -> Result<(), String> {
        let _once = self.reinit.lock().await;
        let (initialize, initialized) = {
            let mut state = self.state();
            if state.generation != generation {
                return Ok(());
            }
            let Some(initialize) = state.initialize.clone() else {
                return Err("the session expired and the client never initialized one".into());
            };
            state.session_id = None;
            (initialize, state.initialized.clone())
        };
        tracing::warn!("the server's session expired (HTTP 404): initializing a new one");
        let id = self.fresh_id("initialize");
        let message = message::with_id(&initialize, &id);
        let (headers, _) = self.headers_for(&message);
        let mut answer = self
            .endpoint
            .post(&message, &headers)
            .await
            .map_err(|e| e.to_string())?;
        if !answer.status.is_success() {
            return Err(format!("initialize was answered HTTP {}", answer.status));
        }
        let session_id = answer.header(SESSION_ID).map(str::to_owned);
        loop {
            match answer.next_message().await {
                Ok(Some(response)) => {
                    if ServerMessage::parse(&response)
                        == (ServerMessage::Response { id: id.clone() })
                    {
                        self.observe(INITIALIZE, &response);
                        break;
                    }
                }
                Ok(None) => return Err("initialize got no answer".into()),
                Err(error) => return Err(error.to_string()),
            }
        }
        self.set_session(session_id.as_deref());
        if let Some(initialized) = initialized {
            let (headers, _) = self.headers_for(&initialized);
            if let Err(error) = self.endpoint.post(&initialized, &headers).await {
                tracing::warn!(%error, "cannot send notifications/initialized to the new session");
            }
        }
        self.open_get_stream();
        Ok(())
    }

    /// Ends the legacy session, if one is open.
    pub(crate) async fn end_session(&self) {
        let Some((headers, _)) = self.session_headers() else {
            return;
        };
        if let Some(stream) = self.state().get_stream.take() {
            stream.abort();
        }
        self.endpoint.delete(&headers).await;
    }
}
