//! An HTTP upstream in the test's process that records every request it gets (method, path and
//! query, body) and answers each JSON-RPC request, alone or in a batch, with a result naming the
//! path it came to: for tests of what `mcp-idem proxy` forwards, and where. It runs on the test's
//! own runtime (start it inside a `#[tokio::test]`) and stops on drop.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// One request the upstream got.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    /// Path and query.
    pub(crate) path: String,
    pub(crate) body: String,
    /// The `traceparent` header, if any.
    pub(crate) traceparent: Option<String>,
}

/// The recording upstream on `127.0.0.1`.
pub(crate) struct RecordingUpstream {
    /// `http://127.0.0.1:PORT`.
    pub(crate) origin: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: tokio::task::JoinHandle<()>,
}

impl RecordingUpstream {
    /// Listens on a free port, serving on the current tokio runtime.
    pub(crate) fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        let port = listener.local_addr().expect("its address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let listener = TcpListener::from_std(listener).expect("a tokio listener");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let server = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        answer(request, Arc::clone(&log))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Self {
            origin: format!("http://127.0.0.1:{port}"),
            seen,
            server,
        }
    }

    /// Every request so far, in arrival order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `{"result": {"path": …}}` for the request `message`, if it is one (a method and an id).
fn result(message: &Value, path: &str) -> Option<Value> {
    message.get("method")?;
    let id = message.get("id")?;
    Some(json!({"jsonrpc": "2.0", "id": id, "result": {"path": path}}))
}

async fn answer(
    request: hyper::Request<Incoming>,
    log: Arc<Mutex<Vec<Seen>>>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&body).into_owned();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    log.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: path.clone(),
        body: body.clone(),
        traceparent: parts
            .headers
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned),
    });
    let answer = match serde_json::from_str::<Value>(&body) {
        Ok(Value::Array(batch)) => Some(Value::Array(
            batch.iter().filter_map(|m| result(m, &path)).collect(),
        )),
        Ok(message) => result(&message, &path),
        Err(_) => Some(json!({"path": path})),
    };
    let response = match answer {
        Some(answer) => hyper::Response::builder()
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(answer.to_string()))),
        None => hyper::Response::builder()
            .status(202)
            .body(Full::new(Bytes::new())),
    };
    Ok(response.expect("a response"))
}
