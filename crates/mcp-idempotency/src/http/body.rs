//! Response bodies the layer produces.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

/// Errors of response bodies, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response of [`IdempotencyService`](super::IdempotencyService).
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// A JSON response (a JSON-RPC message) with `status`.
pub(crate) fn json_response(
    status: http::StatusCode,
    body: String,
) -> http::Response<ResponseBody> {
    let mut response = http::Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A whole body in one piece.
pub(crate) fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The receiving half of a body fed chunk by chunk from another task. When the client goes away the
/// body is dropped and the sender notices, but the task feeding it keeps running.
#[derive(Debug)]
pub(crate) struct ChannelBody {
    chunks: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body and the sender that feeds it.
    pub(crate) fn new() -> (mpsc::Sender<Bytes>, Self) {
        let (tx, rx) = mpsc::channel(16);
        (tx, Self { chunks: rx })
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
