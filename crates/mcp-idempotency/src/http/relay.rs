//! Relaying the upstream's answer to a forwarded request: plain JSON or an SSE stream, recording
//! the outcome of a claimed call before the client sees it.

use std::future::Future;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{response, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};

use super::body::{full, json_response, BoxError, ChannelBody, ResponseBody};
use super::shutdown::CallGuard;
use crate::interceptor::{Interceptor, ServerAction};
use crate::jsonrpc::{error_response, INTERNAL_ERROR, MAX_SERVER_MESSAGE_BYTES};
use crate::sse::{Event, EventSplitter};
use crate::RunningClaim;

/// One forwarded request whose answer the layer needs to see: an `initialize` / `server/discover`
/// (its result gets the capability) or a claimed `tools/call` (its outcome is recorded), as the
/// interceptor's state says.
pub(super) struct Exchange {
    pub(super) interceptor: Interceptor<RunningClaim>,
    /// The request's id as JSON, for error responses.
    pub(super) request_id: String,
    /// A claimed call's place in the layer's [`Shutdown`](super::Shutdown): the exchange is cut
    /// off when the shutdown grace ends.
    pub(super) call: Option<CallGuard>,
}

/// Why a call still running when the shutdown grace ended is answered outcome-unknown (the
/// interceptor adds "before answering; the call may or may not have taken effect").
const GRACE_ENDED: &str =
    "the gateway shut down with the call still running: it stopped waiting for the upstream";

/// Sends the request (the `upstream` future) and relays its answer from a task of its own, which
/// runs to the end even if the client goes away; returns the response for the client as soon as its
/// head is known.
pub(super) async fn start<F, ResBody, E>(exchange: Exchange, upstream: F) -> Response<ResponseBody>
where
    F: Future<Output = Result<Response<ResBody>, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let (head_tx, head_rx) = oneshot::channel();
    let upstream = async move { upstream.await.map(|response| response.map(box_body)) };
    // Boxed, so that the task moves a pointer: the future holds the upstream client's whole
    // exchange, and spawning copied it several times over.
    tokio::spawn(Box::pin(
        Relaying {
            exchange,
            head: Some(head_tx),
            client: Client { tx: None },
        }
        .run(upstream),
    ));
    head_rx.await.unwrap_or_else(|_| {
        json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_body("null", "the gateway failed while relaying the response"),
        )
    })
}

type Head = oneshot::Sender<Response<ResponseBody>>;

/// An exchange being relayed: the response head until it is sent, then the client's stream.
struct Relaying {
    exchange: Exchange,
    head: Option<Head>,
    client: Client,
}

impl Relaying {
    async fn run<F, E>(mut self, upstream: F)
    where
        F: Future<Output = Result<Response<ResponseBody>, E>>,
        E: std::fmt::Display,
    {
        // A claimed call's lease is renewed by its RunningClaim while this runs.
        self.relay(upstream).await;
    }

    /// `future` (a wait for the upstream), unless the shutdown grace ends first: then `None`. Only
    /// a claimed call is cut off, and only while it waits for the upstream, never while its
    /// outcome is being recorded.
    async fn unless_cut_off<T>(&self, future: impl Future<Output = T>) -> Option<T> {
        let Some(call) = &self.exchange.call else {
            return Some(future.await);
        };
        let shutdown = call.shutdown().clone();
        tokio::select! {
            biased;
            value = future => Some(value),
            () = shutdown.grace_ended() => None,
        }
    }

    /// The shutdown grace ended before the upstream's answer: records the call as outcome-unknown
    /// and answers the client so, in its stream if that has begun.
    async fn cut_off(&mut self) {
        let Some(response) = self.exchange.record_unknown(GRACE_ENDED).await else {
            return;
        };
        match self.head.take() {
            Some(head) => {
                let _ = head.send(json_response(StatusCode::OK, response));
            }
            None => {
                let event = format!("event: message\ndata: {response}\n\n");
                self.client.send(Bytes::from(event)).await;
            }
        }
    }

    /// Sends the response head, once.
    fn send_head(&mut self, response: Response<ResponseBody>) -> bool {
        match self.head.take() {
            Some(head) => head.send(response).is_ok(),
            None => false,
        }
    }

    async fn relay<F, E>(&mut self, upstream: F)
    where
        F: Future<Output = Result<Response<ResponseBody>, E>>,
        E: std::fmt::Display,
    {
        let Some(answer) = self.unless_cut_off(upstream).await else {
            return self.cut_off().await;
        };
        let response = match answer {
            Ok(response) => response,
            Err(err) => {
                // No HTTP answer at all: the upstream did not take the request, so the call did
                // not run and a retry may run it.
                tracing::warn!(error = %err, "upstream MCP server unreachable");
                self.exchange
                    .release("the upstream could not be reached")
                    .await;
                let _ = self.send_head(json_response(
                    StatusCode::BAD_GATEWAY,
                    error_body(
                        &self.exchange.request_id,
                        &format!("the upstream MCP server could not be reached ({err}); nothing was executed, so retrying is safe"),
                    ),
                ));
                return;
            }
        };
        let (parts, body) = response.into_parts();
        if parts.status.is_client_error() {
            // The upstream refused the request itself (bad headers, authentication, routing): it
            // did not run the tool.
            self.exchange
                .release("the upstream refused the request")
                .await;
            let _ = self.send_head(Response::from_parts(parts, body));
            return;
        }
        if !parts.status.is_success() {
            self.exchange
                .record_unknown(&format!("the upstream answered HTTP {}", parts.status))
                .await;
            let _ = self.send_head(Response::from_parts(parts, body));
            return;
        }
        let is_sse = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if is_sse {
            self.relay_stream(parts, body).await;
        } else {
            self.relay_whole(parts, body).await;
        }
    }

    /// A plain body: read it all, record, then answer.
    async fn relay_whole(&mut self, mut parts: response::Parts, body: ResponseBody) {
        let Some(collected) = self.unless_cut_off(body.collect()).await else {
            return self.cut_off().await;
        };
        let bytes = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(err) => {
                tracing::warn!(error = %err, "the upstream's response broke off");
                let reason = "the upstream's response broke off";
                let response = self.exchange.record_unknown(reason).await;
                let body =
                    response.unwrap_or_else(|| error_body(&self.exchange.request_id, reason));
                let _ = self.send_head(json_response(StatusCode::BAD_GATEWAY, body));
                return;
            }
        };
        let body = match std::str::from_utf8(&bytes) {
            Ok(text) => match self.exchange.interceptor.on_server_message(text) {
                // The layer sends no request of its own: nothing is absorbed.
                ServerAction::Forward | ServerAction::Absorb => bytes,
                ServerAction::ForwardRewritten(rewritten) => Bytes::from(rewritten),
                ServerAction::Record { claim, outcome, .. } => {
                    claim.record(outcome).await;
                    bytes
                }
            },
            Err(_) => bytes,
        };
        self.exchange
            .record_unknown("the upstream's response did not answer the call")
            .await;
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        let _ = self.send_head(Response::from_parts(parts, full(body)));
    }

    /// An SSE stream: forward each event as it comes, recording the call's response before
    /// forwarding the event that carries it.
    async fn relay_stream(&mut self, mut parts: response::Parts, body: ResponseBody) {
        let (tx, client_body) = ChannelBody::new();
        parts.headers.remove(CONTENT_LENGTH);
        self.client.tx = self
            .send_head(Response::from_parts(parts, client_body.boxed_unsync()))
            .then_some(tx);
        let mut splitter = EventSplitter::new(MAX_SERVER_MESSAGE_BYTES);
        let mut body = std::pin::pin!(body);
        loop {
            let Some(frame) = self.unless_cut_off(body.frame()).await else {
                return self.cut_off().await;
            };
            let Some(frame) = frame else {
                break;
            };
            let frame = match frame {
                Ok(frame) => frame,
                Err(err) => {
                    tracing::warn!(error = %err, "the upstream's event stream broke off");
                    break;
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let fed = splitter.feed(&data);
            for event in fed.events {
                let bytes = self.exchange.on_event(event).await;
                self.client.send(bytes).await;
            }
            if !self.exchange.interceptor.has_calls_in_flight() {
                // Recorded: what follows in the stream is no longer the shutdown's business.
                self.exchange.call = None;
            }
            if !fed.passthrough.is_empty() {
                self.client.send(Bytes::from(fed.passthrough)).await;
            }
        }
        if splitter.overflowed() {
            tracing::warn!("an event of the upstream's stream was too large to read");
        }
        let rest = splitter.finish();
        for event in rest.events {
            let bytes = self.exchange.on_event(event).await;
            self.client.send(bytes).await;
        }
        if !rest.passthrough.is_empty() {
            self.client.send(Bytes::from(rest.passthrough)).await;
        }
        self.exchange
            .record_unknown("the upstream's event stream ended without the call's response")
            .await;
    }
}

impl Exchange {
    async fn on_event(&mut self, event: Event) -> Bytes {
        let Some(data) = &event.data else {
            return Bytes::from(event.raw);
        };
        match self.interceptor.on_server_message(data) {
            ServerAction::Forward | ServerAction::Absorb => Bytes::from(event.raw),
            ServerAction::ForwardRewritten(rewritten) => Bytes::from(event.with_data(&rewritten)),
            ServerAction::Record { claim, outcome, .. } => {
                claim.record(outcome).await;
                Bytes::from(event.raw)
            }
        }
    }

    /// Records a claimed call still in flight as outcome-unknown; returns the error response for
    /// its client.
    async fn record_unknown(&mut self, reason: &str) -> Option<String> {
        let mut response = None;
        for orphan in self.interceptor.on_server_gone(reason) {
            orphan.claim.abandon(reason).await;
            response = orphan.response;
        }
        response
    }

    /// Gives up the claim of a call that certainly did not run.
    async fn release(&mut self, reason: &str) {
        for orphan in self.interceptor.on_server_gone(reason) {
            orphan.claim.release(reason).await;
        }
    }
}

/// The client's end of a streamed response; once the client is gone, chunks are dropped.
struct Client {
    tx: Option<mpsc::Sender<Bytes>>,
}

impl Client {
    async fn send(&mut self, bytes: Bytes) {
        if let Some(tx) = &self.tx {
            if tx.send(bytes).await.is_err() {
                tracing::debug!("the client went away; relaying on to record the outcome");
                self.tx = None;
            }
        }
    }
}

fn box_body<B>(body: B) -> ResponseBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

fn error_body(id: &str, message: &str) -> String {
    error_response(id, INTERNAL_ERROR, message)
}
