//! The proxy's client side: forwards each request to the upstream MCP server over HTTP/1.1.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcp_idempotency::http::{BoxError, ResponseBody};
use mcp_idempotency::jsonrpc::INTERNAL_ERROR;

use crate::http_answer::json_rpc_error;

/// Where requests go: scheme, authority and an optional path prefix.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamUrl {
    scheme: Scheme,
    authority: Authority,
    /// Path prefix without a trailing slash ("" for none).
    base_path: String,
}

impl UpstreamUrl {
    /// Parses `http://HOST:PORT[/prefix]`. Only plain HTTP: TLS is for the front proxy.
    pub(crate) fn parse(url: &str) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .map_err(|err| anyhow::anyhow!("invalid upstream URL {url:?}: {err}"))?;
        let scheme = uri.scheme().cloned();
        if scheme.as_ref() != Some(&Scheme::HTTP) {
            anyhow::bail!("invalid upstream URL {url:?}: expected http://HOST:PORT[/path]");
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("invalid upstream URL {url:?}: no host"))?;
        if uri.query().is_some() {
            anyhow::bail!("invalid upstream URL {url:?}: a query string is not supported");
        }
        Ok(Self {
            scheme: Scheme::HTTP,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    fn target(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let tail = path_and_query.map_or("/", PathAndQuery::as_str);
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{tail}", self.base_path))
            .build()
    }
}

impl std::fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

/// A connection failure: the request never reached the upstream.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {upstream}: {source}")]
pub(crate) struct Unreachable {
    upstream: String,
    #[source]
    source: hyper_util::client::legacy::Error,
}

/// Forwards requests to the upstream. Fails (`Err`) only when the upstream could not be connected
/// to, so the request certainly did not run; any later failure is answered `502 Bad Gateway`.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    url: UpstreamUrl,
}

impl Upstream {
    pub(crate) fn new(url: UpstreamUrl) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(connector);
        Self { client, url }
    }
}

/// Headers that concern one connection, not the request (RFC 9110, section 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

impl tower::Service<Request<Full<Bytes>>> for Upstream {
    type Response = Response<ResponseBody>;
    type Error = Unreachable;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Unreachable>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Unreachable>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let client = self.client.clone();
        let url = self.url.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            parts.uri = match url.target(parts.uri.path_and_query()) {
                Ok(uri) => uri,
                Err(err) => {
                    return Ok(bad_gateway(&format!(
                        "cannot build the upstream URL: {err}"
                    )))
                }
            };
            strip_hop_by_hop(&mut parts.headers);
            if let Ok(host) = HeaderValue::from_str(url.authority.as_str()) {
                parts.headers.insert(HOST, host);
            }
            match client.request(Request::from_parts(parts, body)).await {
                Ok(response) => {
                    let (mut parts, body) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    Ok(Response::from_parts(
                        parts,
                        body.map_err(BoxError::from).boxed_unsync(),
                    ))
                }
                Err(err) if err.is_connect() => Err(Unreachable {
                    upstream: url.to_string(),
                    source: err,
                }),
                Err(err) => {
                    tracing::warn!(error = %err, "upstream request failed after it was sent");
                    Ok(bad_gateway(&format!("the upstream failed: {err}")))
                }
            }
        })
    }
}

/// `502 Bad Gateway` with a JSON-RPC error body.
pub(crate) fn bad_gateway(message: &str) -> Response<ResponseBody> {
    json_rpc_error(StatusCode::BAD_GATEWAY, INTERNAL_ERROR, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_keep_the_path_under_the_base() {
        let url = UpstreamUrl::parse("http://127.0.0.1:8000/base/").unwrap();
        let pq: PathAndQuery = "/mcp?x=1".parse().unwrap();
        assert_eq!(
            url.target(Some(&pq)).unwrap().to_string(),
            "http://127.0.0.1:8000/base/mcp?x=1"
        );
        let url = UpstreamUrl::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            url.target(Some(&pq)).unwrap().to_string(),
            "http://127.0.0.1:8000/mcp?x=1"
        );
    }

    #[test]
    fn bad_upstream_urls_are_refused() {
        for url in [
            "https://x:1",
            "127.0.0.1:8000",
            "http://x/p?q=1",
            "nonsense",
        ] {
            assert!(UpstreamUrl::parse(url).is_err(), "{url}");
        }
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut headers = http::HeaderMap::new();
        headers.insert(CONNECTION, HeaderValue::from_static("close, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("5"));
        headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("mcp-method"));
    }
}
