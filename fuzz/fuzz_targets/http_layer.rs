//! The HTTP layer (`IdempotencyLayer`) on an arbitrary POST body and an arbitrary upstream answer:
//! the body is read and classified as the gateway does, forwarded to an in-process upstream that
//! answers 200 with the input's bytes as JSON or as an SSE stream, in chunks, and relayed back.
//!
//! Input: a flags byte (bit 0: the upstream answers `text/event-stream`; bits 1-3: how many
//! chunks), two bytes of POST body length (big-endian), the POST body, then the upstream's body.
//!
//! Asserts: no panic (also in the relay task: libFuzzer's panic hook aborts); unless the request
//! is a discovery request (whose result the layer rewrites), whatever the upstream sent reaches
//! the client byte for byte; and a keyed call never runs twice: sent again, it is replayed or
//! refused, never forwarded again.
#![no_main]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use mcp_idempotency::http::IdempotencyLayer;
use mcp_idempotency::interceptor::{ClientAction, Interceptor, InterceptorConfig};
use mcp_idempotency::store::MemoryStore;
use mcp_idempotency::{Deduplicator, EngineConfig};
use tower_layer::Layer;
use tower_service::Service;

/// The upstream's body: the chunks, one frame each.
struct Chunks(VecDeque<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }
}

#[derive(Clone)]
struct Upstream {
    calls: Arc<AtomicUsize>,
    sse: bool,
    chunks: Arc<Vec<Bytes>>,
}

impl Service<Request<Full<Bytes>>> for Upstream {
    type Response = Response<Chunks>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Chunks>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let content_type = if self.sse {
            "text/event-stream"
        } else {
            "application/json"
        };
        let body = Chunks(self.chunks.iter().cloned().collect());
        let response = Response::builder()
            .header(http::header::CONTENT_TYPE, content_type)
            .body(body)
            .expect("a valid response");
        Box::pin(async move { Ok(response) })
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|input: &[u8]| {
    let [flags, len_hi, len_lo, rest @ ..] = input else {
        return;
    };
    let post_len = usize::from(u16::from_be_bytes([*len_hi, *len_lo])).min(rest.len());
    let (post, upstream_body) = rest.split_at(post_len);
    let sse = flags & 1 == 1;
    let pieces = usize::from((flags >> 1) & 7) + 1;
    let size = upstream_body.len().div_ceil(pieces).max(1);
    let chunks: Vec<Bytes> = upstream_body
        .chunks(size)
        .map(Bytes::copy_from_slice)
        .collect();

    let mut classify: Interceptor = Interceptor::new(InterceptorConfig::default());
    let action = std::str::from_utf8(post).map(|text| classify.on_client_message(text));
    let keyed = matches!(action, Ok(ClientAction::Decide(_)));
    let discovery = matches!(action, Ok(ClientAction::Forward)) && classify.awaits_discovery_result();

    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = Upstream {
        calls: Arc::clone(&calls),
        sse,
        chunks: Arc::new(chunks),
    };
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    let mut service = IdempotencyLayer::new(dedup).layer(upstream);
    let post = Bytes::copy_from_slice(post);

    runtime().block_on(async {
        let send = |service: &mut mcp_idempotency::http::IdempotencyService<Upstream>| {
            let request = Request::post("/mcp")
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json, text/event-stream")
                .body(Full::new(post.clone()))
                .expect("a valid request");
            service.call(request)
        };
        let response = send(&mut service).await.expect("the layer never fails here");
        let status = response.status();
        let received = response
            .into_body()
            .collect()
            .await
            .expect("the relayed body")
            .to_bytes();
        let forwarded = calls.load(Ordering::SeqCst);
        assert!(forwarded <= 1);
        if forwarded == 1 && !discovery {
            assert_eq!(status, 200);
            assert_eq!(received, upstream_body, "the upstream's answer changed on the way");
        }

        if keyed {
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            let again = send(&mut service).await.expect("the layer never fails here");
            let _ = again.into_body().collect().await;
            assert_eq!(
                calls.load(Ordering::SeqCst),
                forwarded,
                "a keyed call was forwarded twice"
            );
        }
    });
});
