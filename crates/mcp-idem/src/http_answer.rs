//! The JSON-RPC errors the proxy answers itself over HTTP: `403` for a host it refuses, `502`
//! for an upstream it cannot reach.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use mcp_idempotency::http::ResponseBody;
use mcp_idempotency::jsonrpc::error_response;

/// A `status` response whose `application/json` body is a JSON-RPC error with `code` and
/// `message` and a `null` id (the proxy answers before it reads the request).
pub(crate) fn json_rpc_error(
    status: StatusCode,
    code: i64,
    message: &str,
) -> Response<ResponseBody> {
    let body = error_response("null", code, message);
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
