//! One client request through the bridge: its attempts, each a POST whose answer is read to the
//! final response, and the decision after each lost answer, taken by the client's one retry
//! loop ([`Retries`]).

use std::sync::{Arc, Mutex, PoisonError};

use http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use super::exchange::{SendError, SESSION_ID};
use super::message::{self, Request, ServerMessage};
use super::shared::Shared;
use crate::call_span::OutgoingSpan;
use crate::client::retry::{Refusal, Retries, Retry};
use crate::client::GaveUp;
use crate::jsonrpc::{error_response_with_data, INTERNAL_ERROR, INVALID_REQUEST};
use crate::protocol::{IDEMPOTENCY_KEY, INITIALIZE};
use crate::RejectionKind;

/// `error.data.type` of the error a client gets when the answer to its request was lost and the
/// bridge could not, or may not, get it by re-issuing the request.
pub const ANSWER_LOST: &str = "mcp_idem_answer_lost";

/// How one attempt ended.
enum AttemptEnd {
    /// The final response, under the attempt's wire id.
    Answered(String),
    /// No readable answer: `sent` when the server may have got the request.
    Lost { reason: String, sent: bool },
    /// `404` for the session of this generation: it expired.
    SessionExpired(u64),
    /// An answer to pass on as it is, not retried (an HTTP error the server explained, or the
    /// bridge's own error for a request it cannot send).
    Final(String),
}

/// Sends `request` until it gets an answer or may not be re-issued, then answers the client.
/// `wire_id` holds the id of the attempt in flight, for a cancellation to name.
pub(crate) async fn serve(shared: Arc<Shared>, request: Request, wire_id: Arc<Mutex<String>>) {
    let (request, mut span) = traced(request);
    let mut retries = Retries::new(&shared.policy, Instant::now());
    let mut may_have_run = false;
    loop {
        let attempt = retries.start_attempt();
        let id = if attempt == 1 {
            request.id.clone()
        } else {
            shared.fresh_id("reissue")
        };
        *wire_id.lock().unwrap_or_else(PoisonError::into_inner) = id.clone();
        let message = if attempt == 1 {
            request.message.clone()
        } else {
            message::with_id(&request.message, &id)
        };
        let reissuable = match &request.keyed_call {
            Some(call) => shared.may_reissue(&call.tool),
            None => request.method != "tools/call",
        };
        let end = if reissuable {
            let deadline = retries.attempt_deadline(Instant::now());
            let timeout = shared.policy.attempt_timeout();
            tokio::time::timeout_at(deadline, send(&shared, &request.method, &message, &id))
                .await
                .unwrap_or_else(|_| AttemptEnd::Lost {
                    reason: format!("no answer within {timeout:?}"),
                    sent: true,
                })
        } else {
            send(&shared, &request.method, &message, &id).await
        };
        let (retry, reason) = match end {
            AttemptEnd::Answered(response) => {
                let refusal = request
                    .keyed_call
                    .as_ref()
                    .and_then(|_| Refusal::of(message::error_data(&response).as_ref()));
                match refusal {
                    Some((
                        refusal @ Refusal::Known(
                            RejectionKind::KeyInProgress
                            | RejectionKind::StoreUnavailable
                            | RejectionKind::ShuttingDown,
                        ),
                        after,
                    )) => {
                        may_have_run |= refusal == Refusal::Known(RejectionKind::KeyInProgress);
                        let reason = refusal.type_name().to_owned();
                        (refusal.retry(reissuable, after), reason)
                    }
                    _ => {
                        if let Some(span) = &mut span {
                            span.answered(&response);
                        }
                        shared.observe(&request.method, &response);
                        shared
                            .deliver(&message::with_id(&response, &request.id))
                            .await;
                        return;
                    }
                }
            }
            AttemptEnd::Lost { reason, sent } => {
                may_have_run |= sent;
                let retry = if sent {
                    Retry::IfSafe {
                        safe: reissuable,
                        after: None,
                    }
                } else {
                    Retry::NotSent
                };
                (retry, reason)
            }
            AttemptEnd::SessionExpired(generation) => match shared.reinitialize(generation).await {
                Ok(()) => (Retry::NotSent, "the session expired (HTTP 404)".to_owned()),
                Err(error) => (
                    Retry::NotSent,
                    format!("the session expired and a new one failed: {error}"),
                ),
            },
            AttemptEnd::Final(response) => {
                shared
                    .deliver(&message::with_id(&response, &request.id))
                    .await;
                return;
            }
        };
        match retries.after_failure(retry, Instant::now()) {
            Ok(delay) => {
                match &request.keyed_call {
                    Some(call) => tracing::warn!(
                        tool = %call.tool,
                        key = %call.key,
                        carrier = %call.carrier,
                        attempt = attempt + 1,
                        reason = %reason,
                        "re-issuing tools/call"
                    ),
                    None => tracing::warn!(
                        method = %request.method,
                        attempt = attempt + 1,
                        reason = %reason,
                        "re-issuing the request"
                    ),
                }
                tokio::time::sleep(delay).await;
            }
            Err(gave_up) => {
                let answer = answer_lost(&request, &reason, gave_up, &retries, may_have_run);
                shared.deliver(&answer).await;
                return;
            }
        }
    }
}

/// A `tools/call` its client sent without a trace context, with tracing on: the span the bridge
/// starts for it, its `traceparent` put in `_meta` (and so in the header); else as it came (a
/// client's context goes on as it is, and in the header).
fn traced(mut request: Request) -> (Request, Option<OutgoingSpan>) {
    let Some(call) = request
        .keyed_call
        .as_ref()
        .filter(|_| !message::has_trace_context(&request.message))
    else {
        return (request, None);
    };
    let Some((span, traceparent)) = OutgoingSpan::start(&call.tool) else {
        return (request, None);
    };
    if let Some(message) = message::with_traceparent(&request.message, &traceparent) {
        request.message = message;
    }
    (request, Some(span))
}

/// One POST of `message` (whose id is `id`) and its answer, read to the final response;
/// everything else on the stream goes to the client as it comes.
async fn send(shared: &Arc<Shared>, method: &str, message: &str, id: &str) -> AttemptEnd {
    let (headers, generation) = shared.headers_for(message);
    let mut answer = match shared.endpoint.post(message, &headers).await {
        Ok(answer) => answer,
        Err(error @ SendError::NotSent(_)) => {
            return AttemptEnd::Lost {
                reason: error.to_string(),
                sent: false,
            }
        }
        Err(error @ SendError::Failed(_)) => {
            return AttemptEnd::Lost {
                reason: error.to_string(),
                sent: true,
            }
        }
        Err(error @ SendError::Build(_)) => {
            return AttemptEnd::Final(error_response_with_data(
                id,
                INTERNAL_ERROR,
                &format!("the bridge cannot send this request: {error}"),
                None,
            ))
        }
    };
    if method == INITIALIZE && answer.status.is_success() {
        shared.set_session(answer.header(SESSION_ID));
    }
    let status = answer.status;
    if let (StatusCode::NOT_FOUND, Some(generation)) = (status, generation) {
        return AttemptEnd::SessionExpired(generation);
    }
    if matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    ) {
        return AttemptEnd::Lost {
            reason: format!("HTTP {status}"),
            sent: true,
        };
    }
    if !status.is_success() {
        // The server refused the request (4xx: it did not run) or failed (5xx: it may have run);
        // its JSON-RPC error, if it sent one, says why.
        let body = answer.next_message().await.ok().flatten();
        if let Some(response) = body
            .as_deref()
            .filter(|b| matches!(ServerMessage::parse(b), ServerMessage::Response { .. }))
        {
            return AttemptEnd::Final(response.to_owned());
        }
        let (code, what) = if status.is_client_error() {
            (INVALID_REQUEST, "the server refused the request")
        } else {
            (INTERNAL_ERROR, "the server failed")
        };
        let detail = body
            .map(|b| format!(": {}", b.chars().take(200).collect::<String>()))
            .unwrap_or_default();
        return AttemptEnd::Final(error_response_with_data(
            id,
            code,
            &format!("{what} (HTTP {status}){detail}"),
            Some(json!({"httpStatus": status.as_u16(), "mayHaveRun": status.is_server_error()})),
        ));
    }
    loop {
        match answer.next_message().await {
            Ok(Some(received)) => match ServerMessage::parse(&received) {
                ServerMessage::Response { id: answered } if answered == id => {
                    return AttemptEnd::Answered(received)
                }
                _ if !answer.is_sse() => {
                    return AttemptEnd::Lost {
                        reason: "the answer is not the JSON-RPC response to the request".into(),
                        sent: true,
                    }
                }
                _ => shared.deliver_from_server(&received).await,
            },
            Ok(None) => {
                return AttemptEnd::Lost {
                    reason: if answer.is_sse() {
                        "the event stream ended before the response".into()
                    } else {
                        "the answer was empty".into()
                    },
                    sent: true,
                }
            }
            Err(error) => {
                return AttemptEnd::Lost {
                    reason: error.to_string(),
                    sent: true,
                }
            }
        }
    }
}

/// The error for a request whose answer was lost for good.
fn answer_lost(
    request: &Request,
    reason: &str,
    gave_up: GaveUp,
    retries: &Retries,
    may_have_run: bool,
) -> String {
    let attempts = retries.attempts();
    let reissued = attempts > 1;
    let what = match &request.keyed_call {
        Some(call) => format!("tools/call {}", call.tool),
        None => request.method.clone(),
    };
    let mut text = if may_have_run {
        format!("the answer to {what} was lost ({reason}); the call may have run")
    } else {
        format!("{what} could not be sent ({reason}); it did not run")
    };
    match (gave_up, &request.keyed_call) {
        (GaveUp::Unsafe, _) => text.push_str(
            ". Not re-issued: the server does not advertise tools.idempotency and the tool is \
             not annotated idempotent, so a second attempt could run it twice; check its effect \
             before calling again",
        ),
        (_, Some(call)) => text.push_str(&format!(
            ". Re-issued with {} {} for {:.1} s ({attempts} attempts) without getting an answer: \
             the outcome is unknown; call again with the same {} to get it",
            call.carrier,
            call.key,
            retries.elapsed(Instant::now()).as_secs_f64(),
            call.carrier,
        )),
        (_, None) => text.push_str(&format!(" (after {attempts} attempts)")),
    }
    let mut data = json!({
        "type": ANSWER_LOST,
        "attempts": attempts,
        "mayHaveRun": may_have_run,
        "reissued": reissued,
    });
    if let Some(call) = &request.keyed_call {
        data[IDEMPOTENCY_KEY] = json!(call.key);
    }
    error_response_with_data(&request.id, INTERNAL_ERROR, &text, Some(data))
}
