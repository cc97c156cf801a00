//! A fault-injecting HTTP forwarder for the `mcp-idem bridge` tests (`bridge_*`).
//!
//! [`Forwarder`] listens on `127.0.0.1` in the test's own process and sits between the bridge and
//! the next hop (a `mcp-idem proxy` or a `demo-server --http`). Unlike the TCP injector of
//! `chaos` it speaks HTTP/1.1 itself (a hyper server towards the bridge, a hyper client
//! towards the upstream), so it handles the bridge's keep-alive connections request by request.
//!
//! Every `tools/call` POST is first forwarded and its WHOLE upstream answer read (so the upstream
//! has executed it); then the [`Plan`] decides, from the call's params and how many times its key
//! (`idempotencyKey`, else one in `_meta`) was seen before, what the bridge gets: the answer ([`Fault::Forward`]),
//! nothing (the connection is closed: [`Fault::Drop`]), half of a JSON body ([`Fault::CutJson`]),
//! the SSE events before the final response and half of that one ([`Fault::CutSse`], sent to the
//! SSE upstream when there is one), or the answer after [`Forwarder`]'s delay ([`Fault::Delay`],
//! meant to be longer than the bridge's `--attempt-timeout`). Cut answers keep their status and
//! headers (a JSON body its full `content-length`), so the bridge sees a response head and then a
//! connection closed mid-body. Every other request (the bridge's `server/discover`, `initialize`,
//! `tools/list`, a GET stream) is passed through untouched. Each `tools/call` is recorded as an
//! [`Exchange`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use http::{Request, Response, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

/// What the forwarder does with one `tools/call` POST, after the upstream answered it in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Relay the answer.
    Forward,
    /// Close the bridge's connection without answering (the upstream executed the call).
    Drop,
    /// Relay the head and half of the body, then close the connection.
    CutJson,
    /// Like [`Fault::CutJson`], but sent to the SSE upstream, and cut inside the event that
    /// carries the final response (the events before it are relayed whole).
    CutSse,
    /// Relay the answer after the forwarder's delay.
    Delay,
}

/// What actually happened to one `tools/call` POST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Done {
    Forwarded,
    Dropped,
    /// The answer was `application/json` and was cut.
    CutJson,
    /// The answer was `text/event-stream` and was cut.
    CutSse,
    Delayed,
    /// The upstream gave no whole answer; the bridge got a 502.
    UpstreamFailed,
}

impl Done {
    /// `true` for the faults that make the bridge lose an answer.
    pub(crate) fn is_fault(self) -> bool {
        !matches!(self, Self::Forwarded | Self::UpstreamFailed)
    }
}

/// One `tools/call` POST the forwarder handled.
#[derive(Clone, Debug)]
pub(crate) struct Exchange {
    /// The JSON-RPC id on the wire.
    pub(crate) id: Value,
    /// `params.idempotencyKey`.
    pub(crate) key: Option<String>,
    /// A key in `params._meta`: the first string member whose name says `idempotency`
    /// (`idempotencyKey`, `io.example/idempotency-key`).
    pub(crate) meta_key: Option<String>,
    /// `params.arguments`.
    pub(crate) arguments: Value,
    /// How many POSTs with this key (the SEP key, else [`Exchange::meta_key`], else the id) came
    /// before.
    pub(crate) attempt: u32,
    pub(crate) planned: Fault,
    pub(crate) done: Done,
    /// The upstream's status (0 if it gave no answer).
    pub(crate) status: u16,
    /// The upstream's `Content-Type`.
    pub(crate) content_type: String,
    /// The upstream's whole body.
    pub(crate) body: String,
    /// `params._meta.traceparent` of the request.
    pub(crate) meta_traceparent: Option<String>,
    /// The request's `traceparent` header.
    pub(crate) traceparent: Option<String>,
}

/// A `tools/call` the plan decides on.
pub(crate) struct ToolCall<'a> {
    /// The request's `params`.
    pub(crate) params: &'a Value,
    /// How many POSTs with the same key (or, without one, the same id) came before.
    pub(crate) attempt: u32,
}

type Decide = dyn Fn(&ToolCall<'_>) -> Fault + Send + Sync;

/// Which [`Fault`] each `tools/call` POST gets.
#[derive(Clone)]
pub(crate) struct Plan(Arc<Decide>);

impl Plan {
    /// A plan from a function of the call.
    pub(crate) fn new(decide: impl Fn(&ToolCall<'_>) -> Fault + Send + Sync + 'static) -> Self {
        Self(Arc::new(decide))
    }

    /// For charges whose `arguments.amount` is `base + i`: attempt `a` of call `i` gets
    /// `script[i][a]`; attempts beyond the script, and other calls, are forwarded.
    pub(crate) fn by_amount(base: u64, script: Vec<Vec<Fault>>) -> Self {
        Self::new(move |call| {
            let Some(index) = call.params["arguments"]["amount"]
                .as_u64()
                .and_then(|amount| amount.checked_sub(base))
            else {
                return Fault::Forward;
            };
            usize::try_from(index)
                .ok()
                .and_then(|index| script.get(index))
                .and_then(|faults| faults.get(call.attempt as usize))
                .copied()
                .unwrap_or(Fault::Forward)
        })
    }
}

/// The forwarder's answer body: whole, streamed, or cut.
type AnswerBody = BoxBody<Bytes, std::io::Error>;

struct State {
    json: Uri,
    sse: Option<Uri>,
    plan: Plan,
    delay: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    /// POSTs seen per key (or id).
    attempts: HashMap<String, u32>,
    exchanges: Vec<Exchange>,
}

/// The fault-injecting forwarder (see the module documentation); stopped on drop.
pub(crate) struct Forwarder {
    runtime: Option<tokio::runtime::Runtime>,
    state: Arc<State>,
    /// `http://127.0.0.1:PORT/mcp`: the URL to give the bridge.
    pub(crate) url: String,
}

impl Forwarder {
    /// Starts a forwarder to `upstream` (`http://HOST:PORT/mcp`) on a runtime of its own (so it
    /// can be started from a plain test as well as from inside another runtime). A
    /// [`Fault::CutSse`] call goes to `sse_upstream` instead when given; a [`Fault::Delay`]
    /// holds the answer back for `delay`.
    pub(crate) fn start(
        upstream: &str,
        sse_upstream: Option<&str>,
        plan: Plan,
        delay: Duration,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the forwarder");
        let parse = |url: &str| -> Uri { url.parse().unwrap_or_else(|err| panic!("{url}: {err}")) };
        let state = Arc::new(State {
            json: parse(upstream),
            sse: sse_upstream.map(parse),
            plan,
            delay,
            client: Client::builder(TokioExecutor::new()).build_http(),
            log: Mutex::default(),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the forwarder");
        let address = listener.local_addr().expect("the forwarder's address");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let serving = Arc::clone(&state);
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&serving);
                tokio::spawn(async move {
                    let service = service_fn(move |request| handle(Arc::clone(&state), request));
                    // A dropped or cut answer ends the connection with an error: expected.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            runtime: Some(runtime),
            state,
            url: format!("http://{address}/mcp"),
        }
    }

    /// Every `tools/call` handled so far, in arrival order.
    pub(crate) fn exchanges(&self) -> Vec<Exchange> {
        self.state.log.lock().unwrap().exchanges.clone()
    }

    /// How many `tools/call` POSTs ended as `done`.
    pub(crate) fn count(&self, done: Done) -> usize {
        self.exchanges().iter().filter(|e| e.done == done).count()
    }

    /// How many `tools/call` POSTs got a fault.
    pub(crate) fn faults(&self) -> usize {
        self.exchanges()
            .iter()
            .filter(|e| e.done.is_fault())
            .count()
    }

    /// A one-line summary of what was done, for messages.
    pub(crate) fn summary(&self) -> String {
        let exchanges = self.exchanges();
        let count = |done| exchanges.iter().filter(|e| e.done == done).count();
        format!(
            "{} tools/call POSTs: {} forwarded, {} dropped, {} cut JSON, {} cut SSE, {} delayed, {} upstream failures",
            exchanges.len(),
            count(Done::Forwarded),
            count(Done::Dropped),
            count(Done::CutJson),
            count(Done::CutSse),
            count(Done::Delayed),
            count(Done::UpstreamFailed)
        )
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The error that makes hyper close the bridge's connection without an answer.
fn hang_up(why: &str) -> std::io::Error {
    std::io::Error::other(format!("fault injector: {why}"))
}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<AnswerBody>, std::io::Error> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|_| hang_up("the request body did not arrive"))?
        .to_bytes();
    let call = (parts.method == http::Method::POST)
        .then(|| serde_json::from_slice::<Value>(&body).ok())
        .flatten()
        .filter(|message| message["method"] == "tools/call");
    let Some(call) = call else {
        return pass_through(&state, parts, body).await;
    };

    let params = &call["params"];
    let key = params["idempotencyKey"].as_str().map(str::to_owned);
    let meta_key = params["_meta"].as_object().and_then(|meta| {
        meta.iter()
            .filter(|(name, _)| name.to_lowercase().contains("idempotency"))
            .find_map(|(_, key)| key.as_str().map(str::to_owned))
    });
    let attempt = {
        let mut log = state.log.lock().unwrap();
        let seen = log
            .attempts
            .entry(
                key.clone()
                    .or_else(|| meta_key.clone())
                    .unwrap_or_else(|| call["id"].to_string()),
            )
            .or_insert(0);
        *seen += 1;
        *seen - 1
    };
    let planned = (state.plan.0)(&ToolCall { params, attempt });
    let upstream = match (planned, &state.sse) {
        (Fault::CutSse, Some(sse)) => sse,
        _ => &state.json,
    };
    let mut exchange = Exchange {
        id: call["id"].clone(),
        key,
        meta_key,
        arguments: params["arguments"].clone(),
        attempt,
        planned,
        done: Done::UpstreamFailed,
        status: 0,
        content_type: String::new(),
        body: String::new(),
        meta_traceparent: params["_meta"]["traceparent"].as_str().map(str::to_owned),
        traceparent: parts
            .headers
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned),
    };
    let answer = whole_answer(&state, upstream, parts, body).await;
    let Some((head, body)) = answer else {
        state.log.lock().unwrap().exchanges.push(exchange);
        return Ok(Response::builder()
            .status(http::StatusCode::BAD_GATEWAY)
            .body(whole(Bytes::new()))
            .unwrap());
    };
    exchange.status = head.status.as_u16();
    exchange.content_type = header_text(&head.headers, CONTENT_TYPE);
    exchange.body = String::from_utf8_lossy(&body).into_owned();
    let is_sse = exchange.content_type.starts_with("text/event-stream");
    exchange.done = match planned {
        Fault::Forward => Done::Forwarded,
        Fault::Drop => Done::Dropped,
        Fault::CutJson | Fault::CutSse if is_sse => Done::CutSse,
        Fault::CutJson | Fault::CutSse => Done::CutJson,
        Fault::Delay => Done::Delayed,
    };
    let done = exchange.done;
    state.log.lock().unwrap().exchanges.push(exchange);

    let mut response = Response::from_parts(head, ());
    strip_hop_by_hop(response.headers_mut());
    match done {
        Done::Dropped => Err(hang_up("answer dropped after the upstream executed")),
        Done::CutJson | Done::CutSse => {
            let at = if is_sse {
                sse_cut_point(&body)
            } else {
                body.len() / 2
            };
            if is_sse {
                // Chunked, so the bridge cannot tell the stream is short before it ends.
                response.headers_mut().remove(CONTENT_LENGTH);
            }
            Ok(response.map(|()| CutBody::new(body.slice(..at)).boxed()))
        }
        Done::Delayed => {
            tokio::time::sleep(state.delay).await;
            Ok(response.map(|()| whole(body)))
        }
        Done::Forwarded | Done::UpstreamFailed => Ok(response.map(|()| whole(body))),
    }
}

/// Sends the request to `upstream` (the request's own path and query on the upstream's
/// authority) and reads the whole answer; `None` if there is no whole answer.
async fn whole_answer(
    state: &State,
    upstream: &Uri,
    parts: http::request::Parts,
    body: Bytes,
) -> Option<(http::response::Parts, Bytes)> {
    let response = state
        .client
        .request(upstream_request(upstream, parts, body))
        .await
        .ok()?;
    let (head, body) = response.into_parts();
    let body = tokio::time::timeout(Duration::from_secs(60), body.collect())
        .await
        .ok()?
        .ok()?
        .to_bytes();
    Some((head, body))
}

/// Relays a request that is not a `tools/call` POST, streaming the answer.
async fn pass_through(
    state: &State,
    parts: http::request::Parts,
    body: Bytes,
) -> Result<Response<AnswerBody>, std::io::Error> {
    let response = state
        .client
        .request(upstream_request(&state.json, parts, body))
        .await
        .map_err(|_| hang_up("the upstream gave no answer"))?;
    let mut response = response.map(|body| body.map_err(std::io::Error::other).boxed());
    strip_hop_by_hop(response.headers_mut());
    Ok(response)
}

fn upstream_request(
    upstream: &Uri,
    parts: http::request::Parts,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let authority = upstream
        .authority()
        .expect("the upstream URL has an authority");
    let uri: Uri = format!("http://{authority}{path}")
        .parse()
        .expect("a valid upstream URI");
    let mut request = Request::from_parts(parts, Full::new(body));
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers);
    headers.remove(HOST);
    headers.remove(CONTENT_LENGTH);
    request
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in [CONNECTION, TRANSFER_ENCODING] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

fn header_text(headers: &HeaderMap, name: http::header::HeaderName) -> String {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn whole(body: Bytes) -> AnswerBody {
    Full::new(body).map_err(|never| match never {}).boxed()
}

/// Where to cut an SSE stream: halfway into the first event that carries a JSON-RPC response
/// (an id with a result or an error), so every event before it is relayed whole; halfway into
/// the stream if no event does.
fn sse_cut_point(stream: &[u8]) -> usize {
    let mut start = 0;
    while start < stream.len() {
        let end = stream[start..]
            .windows(2)
            .position(|pair| pair == b"\n\n")
            .map_or(stream.len(), |at| start + at + 2);
        if event_is_response(&stream[start..end]) {
            return start + (end - start) / 2;
        }
        start = end;
    }
    stream.len() / 2
}

fn event_is_response(event: &[u8]) -> bool {
    let text = String::from_utf8_lossy(event);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data))
        .collect();
    serde_json::from_str::<Value>(&data.join("\n")).is_ok_and(|message| {
        message.get("id").is_some()
            && (message.get("result").is_some() || message.get("error").is_some())
    })
}

/// A body that yields its bytes, waits a moment (so hyper flushes them to the socket), then
/// fails, which makes hyper close the connection mid-body.
struct CutBody {
    head: Option<Bytes>,
    pause: Pin<Box<tokio::time::Sleep>>,
}

impl CutBody {
    fn new(head: Bytes) -> Self {
        Self {
            head: Some(head).filter(|head| !head.is_empty()),
            pause: Box::pin(tokio::time::sleep(Duration::from_millis(50))),
        }
    }
}

impl Body for CutBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        ready!(self.pause.as_mut().poll(cx));
        Poll::Ready(Some(Err(hang_up("answer cut in the middle"))))
    }
}
