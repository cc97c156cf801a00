//! The floor for a proxy built on hyper, as `mcp-idem proxy` is: the bench binary itself started as
//! `<bench> --as-hyper-proxy http://UPSTREAM [buffered]`. One thread (as `proxy --threads 1` and
//! nginx's one worker), hyper's HTTP/1.1 server, and every request forwarded over hyper-util's pooled
//! keep-alive client, its response sent back: as they come (bodies streamed, never read), or with
//! `buffered` each body read whole first, as a proxy that must see a request's key and record its
//! answer before sending it does (still nothing parsed). It prints `hyper proxy listening on
//! http://ADDR` on stderr. What `mcp-idem proxy` does beyond this (look for the key, decide, record,
//! the tower layers) is the difference of the rows.

use std::convert::Infallible;
use std::process::ExitCode;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The argument that turns the bench binary into the proxy.
pub(crate) const HYPER_PROXY_ARG: &str = "--as-hyper-proxy";
/// The argument after the upstream that makes it read each body whole.
pub(crate) const BUFFERED_ARG: &str = "buffered";

/// A body as it comes, or read whole.
type AnyBody = Either<Incoming, Full<Bytes>>;

/// When this process was started as the proxy, serves until killed; otherwise `None`.
pub(crate) fn run_if_hyper_proxy() -> Option<ExitCode> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some(HYPER_PROXY_ARG) {
        return None;
    }
    let upstream = args.next().unwrap_or_default();
    let buffered = args.next().as_deref() == Some(BUFFERED_ARG);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(serve(upstream, buffered)),
        Err(err) => Err(err.to_string()),
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hyper proxy: {err}");
            ExitCode::FAILURE
        }
    })
}

async fn serve(upstream: String, buffered: bool) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("hyper proxy listening on http://{address}");
    let client: Client<HttpConnector, AnyBody> = Client::builder(TokioExecutor::new()).build_http();
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                forward(client.clone(), upstream.clone(), request, buffered)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: Client<HttpConnector, AnyBody>,
    upstream: String,
    request: Request<Incoming>,
    buffered: bool,
) -> Result<Response<AnyBody>, Infallible> {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    match format!("{upstream}{path}").parse() {
        Ok(uri) => parts.uri = uri,
        Err(err) => return Ok(bad_gateway(err.to_string())),
    }
    let body = if buffered {
        match body.collect().await {
            Ok(whole) => Either::Right(Full::new(whole.to_bytes())),
            Err(err) => return Ok(bad_gateway(err.to_string())),
        }
    } else {
        Either::Left(body)
    };
    let response = match client.request(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(err) => return Ok(bad_gateway(err.to_string())),
    };
    if !buffered {
        return Ok(response.map(Either::Left));
    }
    let (parts, body) = response.into_parts();
    Ok(match body.collect().await {
        Ok(whole) => Response::from_parts(parts, Either::Right(Full::new(whole.to_bytes()))),
        Err(err) => bad_gateway(err.to_string()),
    })
}

fn bad_gateway(why: String) -> Response<AnyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(why))));
    *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    response
}
