//! The proxy's client side: forwards each request to the upstream MCP server over HTTP/1.1,
//! `http://` or `https://`, with the library's one HTTP client
//! ([`mcp_idempotency::http_client`]: rustls, the system's roots plus `--upstream-ca-cert`).
//!
//! The upstream is named by its MCP endpoint URL, as MCP clients name a server
//! (`http://127.0.0.1:8000/mcp`). The proxy's own endpoint is `/mcp`: a request for `/mcp` goes to
//! the upstream's endpoint path; a request for any other path (the upstream's endpoint path
//! itself, OAuth metadata under `/.well-known/`) goes to that path on the upstream's origin. A URL
//! without a path (`http://127.0.0.1:8000`) sends every path as it is.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CONNECTION, HOST, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE,
    TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use mcp_idempotency::http::{BoxError, ResponseBody};
use mcp_idempotency::http_client::{error_causes, https_client, HttpsClient, TlsSetupError};
use mcp_idempotency::jsonrpc::INTERNAL_ERROR;

use crate::http_answer::json_rpc_error;

/// The path clients use for the proxy's MCP endpoint.
const PROXY_ENDPOINT: &str = "/mcp";

/// Where requests go: the upstream's origin and its MCP endpoint path.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamUrl {
    scheme: Scheme,
    authority: Authority,
    /// The endpoint's path as given, or `None` for a URL without a path (or with `/` alone).
    endpoint: Option<String>,
    /// Where a request for `/mcp` without a query goes (most requests), built once: the
    /// endpoint's URL, or `/mcp` on the origin for a URL without a path.
    endpoint_uri: Option<Uri>,
}

impl UpstreamUrl {
    /// Parses `http[s]://HOST[:PORT][/endpoint]`.
    pub(crate) fn parse(url: &str) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .map_err(|err| anyhow::anyhow!("invalid upstream URL {url:?}: {err}"))?;
        let scheme = match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP || *scheme == Scheme::HTTPS => scheme.clone(),
            _ => anyhow::bail!(
                "invalid upstream URL {url:?}: expected the server's endpoint, \
                 http[s]://HOST[:PORT][/path], e.g. http://127.0.0.1:8000/mcp"
            ),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("invalid upstream URL {url:?}: no host"))?;
        if uri.query().is_some() {
            anyhow::bail!("invalid upstream URL {url:?}: a query string is not supported");
        }
        let endpoint = Some(uri.path()).filter(|path| !path.is_empty() && *path != "/");
        let endpoint_uri = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(endpoint.unwrap_or(PROXY_ENDPOINT))
            .build()
            .ok();
        Ok(Self {
            scheme,
            authority,
            endpoint: endpoint.map(str::to_owned),
            endpoint_uri,
        })
    }

    /// Where the proxy's own requests to the server go (those for its `/mcp`).
    pub(crate) fn endpoint(&self) -> String {
        match &self.endpoint_uri {
            Some(uri) => uri.to_string(),
            None => format!("{}://{}{PROXY_ENDPOINT}", self.scheme, self.authority),
        }
    }

    /// The upstream URL for a request to the proxy for `path_and_query`.
    fn target(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let path = path_and_query.map_or("/", PathAndQuery::path);
        let query = path_and_query.and_then(PathAndQuery::query);
        if let (PROXY_ENDPOINT, None, Some(uri)) = (path, query, &self.endpoint_uri) {
            return Ok(uri.clone());
        }
        let target = match (&self.endpoint, query) {
            (Some(endpoint), query) if path == PROXY_ENDPOINT => match query {
                Some(query) => format!("{endpoint}?{query}"),
                None => endpoint.clone(),
            },
            _ => path_and_query.map_or("/", PathAndQuery::as_str).to_owned(),
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(target)
            .build()
    }
}

impl std::fmt::Display for UpstreamUrl {
    /// The URL without a trailing slash: namespaces derived from it stay those of earlier
    /// versions.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.endpoint.as_deref().unwrap_or("");
        write!(
            f,
            "{}://{}{}",
            self.scheme,
            self.authority,
            path.trim_end_matches('/')
        )
    }
}

/// A connection failure (TCP or TLS): the request never reached the upstream.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {upstream}: {}", error_causes(.source))]
pub(crate) struct Unreachable {
    upstream: String,
    #[source]
    source: hyper_util::client::legacy::Error,
}

/// Forwards requests to the upstream. Fails (`Err`) only when the upstream could not be connected
/// to, so the request certainly did not run; any later failure is answered `502 Bad Gateway`.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    client: HttpsClient,
    url: Arc<UpstreamUrl>,
    /// The `Host` every forwarded request carries: the upstream's authority.
    host: Option<HeaderValue>,
}

impl Upstream {
    /// An upstream at `url`, trusting the system's CA roots and those in `ca_file`, if given.
    pub(crate) fn new(url: UpstreamUrl, ca_file: Option<&Path>) -> Result<Self, TlsSetupError> {
        Ok(Self {
            client: https_client(ca_file)?,
            host: HeaderValue::from_str(url.authority.as_str()).ok(),
            url: Arc::new(url),
        })
    }
}

/// Headers that concern one connection, not the request (RFC 9110, section 7.6.1), besides
/// `Connection` itself. Names, not strings: removing by a string parses it on every call.
const HOP_BY_HOP: [HeaderName; 7] = [
    HeaderName::from_static("keep-alive"),
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
];

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    // Most messages carry none: one pass over the names they have costs less than a lookup of
    // each hop-by-hop name.
    let hop_by_hop = |name: &HeaderName| name == CONNECTION || HOP_BY_HOP.contains(name);
    if !headers.keys().any(hop_by_hop) {
        return;
    }
    if headers.contains_key(CONNECTION) {
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
        headers.remove(CONNECTION);
    }
    for name in &HOP_BY_HOP {
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
        let url = Arc::clone(&self.url);
        let host = self.host.clone();
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
            if let Some(host) = host {
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
                    let causes = error_causes(&err);
                    tracing::warn!(error = %causes, "upstream request failed after it was sent");
                    Ok(bad_gateway(&format!("the upstream failed: {causes}")))
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

    fn target(upstream: &str, request: &str) -> String {
        let url = UpstreamUrl::parse(upstream).unwrap();
        let pq: PathAndQuery = request.parse().unwrap();
        url.target(Some(&pq)).unwrap().to_string()
    }

    #[test]
    fn the_proxy_endpoint_goes_to_the_upstream_endpoint() {
        let up = "http://127.0.0.1:8000/mcp";
        assert_eq!(target(up, "/mcp"), "http://127.0.0.1:8000/mcp");
        assert_eq!(target(up, "/mcp?x=1"), "http://127.0.0.1:8000/mcp?x=1");
        let up = "https://api.example.com/v1/tools/mcp/";
        assert_eq!(target(up, "/mcp"), "https://api.example.com/v1/tools/mcp/");
        // The upstream's own endpoint path reaches it too.
        assert_eq!(
            target(up, "/v1/tools/mcp/"),
            "https://api.example.com/v1/tools/mcp/"
        );
    }

    #[test]
    fn other_paths_go_to_the_upstream_origin_as_they_are() {
        let up = "http://127.0.0.1:8000/api/mcp";
        assert_eq!(
            target(up, "/.well-known/oauth-protected-resource/api/mcp"),
            "http://127.0.0.1:8000/.well-known/oauth-protected-resource/api/mcp"
        );
        assert_eq!(target(up, "/mcp/x"), "http://127.0.0.1:8000/mcp/x");
        assert_eq!(target(up, "/"), "http://127.0.0.1:8000/");
    }

    #[test]
    fn a_url_without_a_path_sends_every_path_as_it_is() {
        for up in ["http://127.0.0.1:8000", "http://127.0.0.1:8000/"] {
            assert_eq!(target(up, "/mcp"), "http://127.0.0.1:8000/mcp");
            assert_eq!(target(up, "/mcp?x=1"), "http://127.0.0.1:8000/mcp?x=1");
            assert_eq!(
                target(up, "/.well-known/x"),
                "http://127.0.0.1:8000/.well-known/x"
            );
        }
    }

    #[test]
    fn the_displayed_url_keeps_earlier_namespaces() {
        for (url, shown) in [
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
            ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
            ("http://127.0.0.1:8000/mcp/", "http://127.0.0.1:8000/mcp"),
            ("https://h/mcp", "https://h/mcp"),
        ] {
            assert_eq!(UpstreamUrl::parse(url).unwrap().to_string(), shown);
        }
    }

    #[test]
    fn bad_upstream_urls_are_refused() {
        for url in [
            "ftp://x:1",
            "127.0.0.1:8000",
            "http://x/p?q=1",
            "nonsense",
            "/mcp",
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

    #[test]
    fn each_hop_by_hop_header_alone_is_removed_and_others_are_kept() {
        for name in HOP_BY_HOP.iter().chain([&CONNECTION]) {
            let mut headers = http::HeaderMap::new();
            headers.insert(name.clone(), HeaderValue::from_static("1"));
            headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
            strip_hop_by_hop(&mut headers);
            assert!(!headers.contains_key(name), "{name}");
            assert!(headers.contains_key("mcp-method"), "{name}");
        }
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-tenant", HeaderValue::from_static("a"));
        headers.append("x-tenant", HeaderValue::from_static("b"));
        let before = headers.clone();
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers, before);
    }
}
