//! An HTTP forwarder that loses answers: it sits between a bridge and the server, and for a
//! share of the `tools/call` POSTs (drawn from a seeded RNG) it forwards the request, waits for
//! the whole answer, then closes the client's connection without sending it. The call has run;
//! only its answer is lost, which is the case a re-issue with the same key is for.
//!
//! It speaks HTTP (hyper server towards the bridge, a keep-alive hyper client towards the
//! server), because both bridges keep their connections alive: a TCP-level injector could not
//! tell one request on a connection from the next. Everything else (discovery, `initialize`,
//! GET streams, notifications) passes through untouched, streamed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;

type Body = BoxBody<Bytes, hyper::Error>;

/// What the forwarder has seen, for the report.
#[derive(Default)]
pub(crate) struct Counts {
    /// `tools/call` POSTs forwarded (each attempt counts).
    pub(crate) tool_calls: AtomicU64,
    /// Of those, answers dropped after the server gave them.
    pub(crate) dropped: AtomicU64,
}

impl Counts {
    /// (tool calls, dropped) so far.
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        (
            self.tool_calls.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

struct State {
    /// `http://IP:PORT` of the server.
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    loss: f64,
    rng: Mutex<StdRng>,
    counts: Arc<Counts>,
}

/// A running forwarder; stops when dropped.
pub(crate) struct Forwarder {
    /// `http://IP:PORT/mcp`.
    pub(crate) url: String,
    pub(crate) counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Forwarder {
    /// Listens on a free loopback port and forwards to `upstream` (`http://IP:PORT`), losing the
    /// answers of a share `loss` of the `tools/call` POSTs, drawn from an RNG seeded with `seed`.
    pub(crate) async fn start(upstream: &str, loss: f64, seed: u64) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| format!("the forwarder cannot listen: {err}"))?;
        let addr: SocketAddr = listener
            .local_addr()
            .map_err(|err| format!("the forwarder's address: {err}"))?;
        let counts = Arc::new(Counts::default());
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: super::http_client(),
            loss,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            counts: Arc::clone(&counts),
        });
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(Arc::clone(&state), stream));
            }
        });
        Ok(Self {
            url: format!("http://{addr}/mcp"),
            counts,
            task,
        })
    }
}

/// Serves one client connection until it ends, or until a lost answer closes it.
async fn serve_connection(state: Arc<State>, stream: tokio::net::TcpStream) {
    let hang_up = Arc::new(Notify::new());
    let service = {
        let hang_up = Arc::clone(&hang_up);
        service_fn(move |request| forward(Arc::clone(&state), Arc::clone(&hang_up), request))
    };
    let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        // Dropping the connection closes the socket, with the answer unsent.
        () = hang_up.notified() => {}
    }
}

/// Headers that describe one hop, not the message.
fn hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host" | "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "upgrade"
    )
}

async fn forward(
    state: Arc<State>,
    hang_up: Arc<Notify>,
    request: http::Request<Incoming>,
) -> Result<http::Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Ok(status(http::StatusCode::BAD_REQUEST)),
    };
    let is_call = parts.method == http::Method::POST
        && serde_json::from_slice::<Value>(&body)
            .ok()
            .is_some_and(|message| message["method"] == "tools/call");
    let lose = is_call && {
        state.counts.tool_calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = state.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.random_bool(state.loss)
    };

    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut upstream = http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{path}", state.upstream));
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            upstream = upstream.header(name, value);
        }
    }
    let Ok(upstream) = upstream.body(Full::new(body)) else {
        return Ok(status(http::StatusCode::BAD_REQUEST));
    };
    let response = match state.client.request(upstream).await {
        Ok(response) => response,
        Err(_) => return Ok(status(http::StatusCode::BAD_GATEWAY)),
    };
    if lose {
        // The server has answered; read all of it, then hang up instead of passing it on.
        let _ = response.into_body().collect().await;
        state.counts.dropped.fetch_add(1, Ordering::Relaxed);
        hang_up.notify_one();
        return std::future::pending().await;
    }
    let (mut parts, body) = response.into_parts();
    // The body is re-framed by this hop (content-length stays: the body is passed on as is).
    for name in ["connection", "keep-alive", "transfer-encoding", "upgrade"] {
        parts.headers.remove(name);
    }
    Ok(http::Response::from_parts(parts, body.boxed()))
}

fn status(code: http::StatusCode) -> http::Response<Body> {
    let mut response = http::Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = code;
    response
}
