//! [`Client`]: keyed `tools/call` with safe retries.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ClientRequest, CustomRequest, ErrorData, ServerResult};
use rmcp::service::PeerRequestOptions;
use rmcp::ServiceError;
use serde_json::{json, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::connect::{Connect, ConnectError, Session};
use super::error::{CallError, Failure};
use super::policy::RetryPolicy;
use super::retry::{Refusal, Retries, Retry};
use crate::protocol::IDEMPOTENCY_KEY;
use crate::RejectionKind;

/// A `tools/call` to make: the tool, its arguments, and optionally the idempotency key.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRequest {
    name: String,
    arguments: Option<Value>,
    key: Option<String>,
}

impl CallRequest {
    /// A call of `tool`, without arguments, with a fresh random key.
    pub fn new(tool: impl Into<String>) -> Self {
        Self {
            name: tool.into(),
            arguments: None,
            key: None,
        }
    }

    /// The `arguments` object.
    pub fn arguments(mut self, arguments: Value) -> Self {
        self.arguments = Some(arguments);
        self
    }

    /// Use this idempotency key instead of a fresh UUID v4: to retry, later, an operation whose
    /// outcome is unknown (a previous [`CallError::key`]), or to derive the key from the
    /// operation's own identity (an order number, …).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.name
    }

    fn params(&self, key: &str) -> Value {
        let mut params = json!({"name": self.name});
        params[IDEMPOTENCY_KEY] = json!(key);
        if let Some(arguments) = &self.arguments {
            params["arguments"] = arguments.clone();
        }
        params
    }
}

/// What the call produced: the server's answer, replayed or not.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CallOutcome {
    /// A result without `isError: true`.
    Success(CallToolResult),
    /// A result with `isError: true`: the tool ran and reported a failure.
    ToolError(CallToolResult),
    /// A JSON-RPC error that is not an `idempotency_*` refusal: the tool's own error (an unknown
    /// tool, invalid arguments, a failure the tool raised), possibly replayed from the original
    /// call. Not retried: a replayed error is the outcome of the operation.
    RpcError(ErrorData),
}

impl CallOutcome {
    /// Whether this is a [`Success`](Self::Success).
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Success(_))
    }

    /// The JSON-RPC response member: `{"result": …}` or `{"error": …}`.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Success(result) | Self::ToolError(result) => {
                json!({"result": serde_json::to_value(result).unwrap_or(Value::Null)})
            }
            Self::RpcError(error) => {
                json!({"error": serde_json::to_value(error).unwrap_or(Value::Null)})
            }
        }
    }
}

/// A call's outcome, with the key it used and the number of attempts it took.
#[derive(Clone, Debug, PartialEq)]
pub struct CallReport {
    outcome: CallOutcome,
    key: String,
    attempts: u32,
}

impl CallReport {
    /// What the call produced.
    pub fn outcome(&self) -> &CallOutcome {
        &self.outcome
    }

    /// The idempotency key every attempt carried.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many attempts it took (1 when the first request was answered).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The outcome, by value.
    pub fn into_outcome(self) -> CallOutcome {
        self.outcome
    }
}

/// An MCP client that sends every `tools/call` with an idempotency key and retries it safely.
///
/// It holds at most one [`Session`], opened by its [`Connect`] on first use and replaced when a
/// transport failure ends it. Calls may run concurrently (`&self`). See the
/// [module docs](super) for the retry rules.
pub struct Client<C> {
    connector: C,
    policy: RetryPolicy,
    session: Mutex<Option<Arc<Session>>>,
}

impl<C> std::fmt::Debug for Client<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// How one attempt ended.
enum Attempt {
    Done(CallOutcome),
    Failed { failure: Failure, retry: Retry },
}

impl<C: Connect> Client<C> {
    /// A client opening its sessions with `connector`, with the default [`RetryPolicy`].
    pub fn new(connector: C) -> Self {
        Self {
            connector,
            policy: RetryPolicy::default(),
            session: Mutex::new(None),
        }
    }

    /// Uses `policy` for every call.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The retry policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The current session, opening one if there is none or it has closed.
    pub async fn session(&self) -> Result<Arc<Session>, ConnectError> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref() {
            if !session.is_closed() {
                return Ok(Arc::clone(session));
            }
            retire(slot.take());
        }
        let session = Arc::new(self.connector.connect().await?);
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Whether the server advertises `tools.idempotency` (connects if needed).
    pub async fn advertises_idempotency(&self) -> Result<bool, ConnectError> {
        Ok(self.session().await?.advertises_idempotency())
    }

    /// Calls a tool with an idempotency key (the request's, or a fresh UUID v4), retrying with
    /// the same key as the [policy](RetryPolicy) and the [retry rules](super#retry-rules) allow.
    ///
    /// `Ok` carries the outcome, including a tool error or a JSON-RPC error (the tool's, perhaps
    /// replayed); `Err` means no outcome: a conflict, an unknown outcome, or retries that did
    /// not get one. Either way the key and the number of attempts come along.
    pub async fn call_tool(&self, request: CallRequest) -> Result<CallReport, CallError> {
        let key = request
            .key
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut retries = Retries::new(&self.policy, Instant::now());
        loop {
            let attempts = retries.start_attempt();
            let (failure, retry) = match self.attempt(&request, &key, &retries).await {
                Attempt::Done(outcome) => {
                    return Ok(CallReport {
                        outcome,
                        key,
                        attempts,
                    })
                }
                Attempt::Failed { failure, retry } => (failure, retry),
            };
            let now = Instant::now();
            let delay = match retries.after_failure(retry, now) {
                Ok(delay) => delay,
                Err(gave_up) => {
                    return Err(CallError {
                        key,
                        attempts,
                        elapsed: retries.elapsed(now),
                        failure,
                        gave_up,
                    })
                }
            };
            tracing::debug!(
                key = %key,
                attempt = attempts,
                failure = %failure,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "retrying the call with the same key"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// One attempt, over by the call's deadline at the latest: get a session (within the connect
    /// timeout), send the call and wait for the answer (within the attempt timeout), classify it.
    async fn attempt(&self, request: &CallRequest, key: &str, retries: &Retries) -> Attempt {
        let started = Instant::now();
        let deadline = retries.deadline();
        let connect_deadline = deadline.min(started + self.policy.connect_timeout());
        let session = match tokio::time::timeout_at(connect_deadline, self.session()).await {
            Ok(Ok(session)) => session,
            Ok(Err(error)) => {
                let retry = if error.is_retryable() {
                    Retry::NotSent
                } else {
                    Retry::Never
                };
                return Attempt::Failed {
                    failure: Failure::Connect(error),
                    retry,
                };
            }
            Err(_) => {
                return Attempt::Failed {
                    failure: Failure::Connect(ConnectError::TimedOut(connect_deadline - started)),
                    retry: Retry::NotSent,
                }
            }
        };
        let deadline = retries.attempt_deadline(Instant::now());
        // Decided before sending: after a transport failure the session cannot list tools.
        let safe = session.advertises_idempotency()
            || (self.policy.trust_idempotent_hint()
                && tokio::time::timeout_at(deadline, session.tool_is_idempotent(&request.name))
                    .await
                    .unwrap_or(false));
        let timeout = deadline.saturating_duration_since(Instant::now());
        if timeout.is_zero() {
            // The session came too late to wait for anything: do not send a call nobody awaits.
            return Attempt::Failed {
                failure: Failure::Connect(ConnectError::TimedOut(started.elapsed())),
                retry: Retry::NotSent,
            };
        }
        let call = ClientRequest::CustomRequest(CustomRequest::new(
            "tools/call",
            Some(request.params(key)),
        ));
        let answer = match session
            .peer()
            .send_request_with_option(call, PeerRequestOptions::with_timeout(timeout))
            .await
        {
            Ok(handle) => handle.await_response().await,
            Err(error) => Err(error),
        };
        match answer {
            Ok(result) => classify_result(result),
            Err(ServiceError::McpError(error)) => classify_error(error, safe),
            Err(ServiceError::Timeout { timeout }) => Attempt::Failed {
                failure: Failure::Timeout(timeout),
                retry: Retry::IfSafe { safe, after: None },
            },
            Err(
                error @ (ServiceError::TransportClosed
                | ServiceError::TransportSend(_)
                | ServiceError::Cancelled { .. }),
            ) => {
                self.discard(&session).await;
                Attempt::Failed {
                    failure: Failure::Transport(error),
                    retry: Retry::IfSafe { safe, after: None },
                }
            }
            Err(error) => Attempt::Failed {
                failure: Failure::UnexpectedResponse(error.to_string()),
                retry: Retry::Never,
            },
        }
    }

    /// Forgets `failed` (if it is still the current session) so the next attempt reconnects.
    async fn discard(&self, failed: &Arc<Session>) {
        let mut slot = self.session.lock().await;
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, failed))
        {
            retire(slot.take());
        }
    }

    /// Closes the session, if any: a spawned server sees end of input and exits.
    pub async fn close(self) {
        if let Some(session) = self.session.into_inner().and_then(Arc::into_inner) {
            session.close().await;
        }
    }
}

/// Closes a session that is no longer used, in the background, once nobody else holds it.
fn retire(session: Option<Arc<Session>>) {
    if let Some(session) = session.and_then(Arc::into_inner) {
        tokio::spawn(session.close());
    }
}

fn classify_result(result: ServerResult) -> Attempt {
    let result =
        match result {
            ServerResult::CallToolResult(result) => result,
            ServerResult::EmptyResult(_) => CallToolResult::default(),
            ServerResult::CustomResult(custom) => {
                match serde_json::from_value::<CallToolResult>(custom.0.clone()) {
                    Ok(result) => result,
                    Err(_) => return unexpected(format!("not a tools/call result: {}", custom.0)),
                }
            }
            ServerResult::InputRequiredResult(_) => return unexpected(
                "the tool asked for input (MRTR input_required), which this client does not answer"
                    .into(),
            ),
            other => {
                let json = serde_json::to_string(&other).unwrap_or_default();
                return unexpected(format!("not a tools/call result: {json}"));
            }
        };
    if result.is_error == Some(true) {
        Attempt::Done(CallOutcome::ToolError(result))
    } else {
        Attempt::Done(CallOutcome::Success(result))
    }
}

fn unexpected(what: String) -> Attempt {
    Attempt::Failed {
        failure: Failure::UnexpectedResponse(what),
        retry: Retry::Never,
    }
}

fn classify_error(error: ErrorData, safe: bool) -> Attempt {
    let Some((refusal, after)) = Refusal::of(error.data.as_ref()) else {
        return Attempt::Done(CallOutcome::RpcError(error));
    };
    let retry = refusal.retry(safe, after);
    let failure = match refusal {
        Refusal::Known(RejectionKind::KeyInProgress) => Failure::InProgress(error),
        Refusal::Known(RejectionKind::StoreUnavailable) => Failure::StoreUnavailable(error),
        Refusal::Known(RejectionKind::ShuttingDown) => Failure::ShuttingDown(error),
        Refusal::Known(RejectionKind::KeyConflict) => Failure::Conflict(error),
        Refusal::Known(RejectionKind::OutcomeUnknown) => Failure::OutcomeUnknown(error),
        other => Failure::Rejected {
            kind: other.type_name().to_owned(),
            error,
        },
    };
    Attempt::Failed { failure, retry }
}
