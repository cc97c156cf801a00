//! The proxy's defence against DNS rebinding: `Host` and `Origin` must name this server.
//!
//! The proxy rewrites `Host` to the upstream's authority, so the upstream's own allow-list (rmcp
//! keeps one) can no longer see what the browser asked for: the proxy must check it itself. A web
//! page that rebinds its own name to 127.0.0.1 sends `Host: evil.example` and is refused here.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HOST, ORIGIN};
use http::{HeaderMap, Request, Response, StatusCode};
use mcp_idempotency::http::ResponseBody;
use mcp_idempotency::jsonrpc::INVALID_REQUEST;
use tower::Service;

use crate::http_answer::json_rpc_error;

/// The host names a request may address, without ports.
#[derive(Debug, Clone)]
pub(crate) struct AllowedHosts {
    /// `None`: any host (the operator turned the check off).
    names: Option<Vec<String>>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostRefusal {
    MissingHost,
    Host(String),
    Origin(String),
}

impl std::fmt::Display for HostRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingHost => f.write_str("the request has no Host header"),
            Self::Host(host) => write!(
                f,
                "Host {host:?} is not allowed (see --allowed-host); refused to prevent DNS rebinding"
            ),
            Self::Origin(origin) => write!(
                f,
                "Origin {origin:?} is not allowed (see --allowed-host); refused to prevent DNS rebinding"
            ),
        }
    }
}

impl AllowedHosts {
    /// Loopback names, the listen address when it is a specific IP, and `extra`.
    pub(crate) fn new(listen: SocketAddr, extra: &[String]) -> Self {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        if !listen.ip().is_unspecified() {
            names.push(listen.ip().to_string());
        }
        names.extend(extra.iter().map(|name| normalize(name)));
        Self { names: Some(names) }
    }

    /// Allows every host.
    pub(crate) fn any() -> Self {
        Self { names: None }
    }

    /// Checks `Host` (required) and `Origin` (when present).
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), HostRefusal> {
        let Some(names) = &self.names else {
            return Ok(());
        };
        // `names` are normalized: compare without allocating, as this runs on every request.
        let allowed = |authority: &str| {
            let host = host_of(authority);
            names.iter().any(|name| name.eq_ignore_ascii_case(host))
        };
        let host = headers
            .get(HOST)
            .ok_or(HostRefusal::MissingHost)?
            .to_str()
            .map_err(|_| HostRefusal::Host("(not text)".into()))?;
        if !allowed(host) {
            return Err(HostRefusal::Host(host.to_owned()));
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let text = origin
                .to_str()
                .map_err(|_| HostRefusal::Origin("(not text)".into()))?;
            let origin_host = text
                .split_once("://")
                .map(|(_, rest)| rest.split('/').next().unwrap_or(rest));
            if !origin_host.is_some_and(allowed) {
                return Err(HostRefusal::Origin(text.to_owned()));
            }
        }
        Ok(())
    }
}

/// Answers `403 Forbidden` to requests whose `Host` or `Origin` is not allowed, before `S` sees
/// them (so before any record is read or anything is forwarded).
#[derive(Debug, Clone)]
pub(crate) struct GuardHosts<S> {
    inner: S,
    hosts: Arc<AllowedHosts>,
}

impl<S> GuardHosts<S> {
    pub(crate) fn new(inner: S, hosts: AllowedHosts) -> Self {
        Self {
            inner,
            hosts: Arc::new(hosts),
        }
    }
}

impl<S, B> Service<Request<B>> for GuardHosts<S>
where
    S: Service<Request<B>, Response = Response<ResponseBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if let Err(refusal) = self.hosts.check(request.headers()) {
            tracing::warn!(%refusal, "request refused");
            return Box::pin(std::future::ready(Ok(forbidden(&refusal.to_string()))));
        }
        Box::pin(self.inner.call(request))
    }
}

fn forbidden(message: &str) -> Response<ResponseBody> {
    json_rpc_error(StatusCode::FORBIDDEN, INVALID_REQUEST, message)
}

/// `example.com:8080` → `example.com`, `[::1]:8080` → `::1`, `::1` → `::1`.
fn strip_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    if authority.parse::<IpAddr>().is_ok() {
        return authority;
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _port)| host)
}

/// The host of an authority, without its port and a trailing dot, case kept.
fn host_of(authority: &str) -> &str {
    strip_port(authority.trim()).trim_end_matches('.')
}

fn normalize(host: &str) -> String {
    host_of(host).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    fn loopback() -> AllowedHosts {
        AllowedHosts::new("127.0.0.1:8080".parse().unwrap(), &[])
    }

    #[test]
    fn loopback_names_pass_with_any_port() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:8080",
            "LOCALHOST.",
        ] {
            assert_eq!(
                loopback().check(&headers(&[("host", host)])),
                Ok(()),
                "{host}"
            );
        }
    }

    #[test]
    fn a_foreign_host_or_origin_is_refused() {
        let refused = loopback().check(&headers(&[("host", "evil.example.com")]));
        assert_eq!(refused, Err(HostRefusal::Host("evil.example.com".into())));
        let refused = loopback().check(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example.com"),
        ]));
        assert_eq!(
            refused,
            Err(HostRefusal::Origin("http://evil.example.com".into()))
        );
        let refused = loopback().check(&headers(&[("host", "localhost"), ("origin", "null")]));
        assert!(matches!(refused, Err(HostRefusal::Origin(_))));
        assert_eq!(
            loopback().check(&HeaderMap::new()),
            Err(HostRefusal::MissingHost)
        );
    }

    #[test]
    fn a_loopback_origin_passes() {
        let ok = loopback().check(&headers(&[
            ("host", "localhost:8080"),
            ("origin", "http://localhost:3000"),
        ]));
        assert_eq!(ok, Ok(()));
    }

    #[test]
    fn configured_and_listen_hosts_pass() {
        let hosts = AllowedHosts::new(
            "10.0.0.5:8080".parse().unwrap(),
            &["mcp.example.com".into()],
        );
        assert_eq!(hosts.check(&headers(&[("host", "10.0.0.5:8080")])), Ok(()));
        assert_eq!(
            hosts.check(&headers(&[
                ("host", "MCP.example.com:443"),
                ("origin", "https://mcp.example.com")
            ])),
            Ok(())
        );
        assert!(hosts
            .check(&headers(&[("host", "other.example.com")]))
            .is_err());
        assert_eq!(
            AllowedHosts::any().check(&headers(&[("host", "anything")])),
            Ok(())
        );
    }
}
