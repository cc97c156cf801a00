//! OTLP/HTTP on the crate's one HTTP client ([`crate::http_client`]): `opentelemetry-http`'s
//! [`HttpClient`] for a thin wrapper around [`HttpsClient`], so that exporting adds neither reqwest
//! nor a second TLS stack.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

use crate::http_client::HttpsClient;

/// The largest collector answer read (as `opentelemetry-http`'s own clients).
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// [`HttpsClient`] as an OTLP/HTTP client: each request, its answer's body included, within the
/// export timeout. It must be polled on a tokio runtime (the export pipeline runs every export on
/// one, `export::OnRuntime`).
#[derive(Clone)]
pub(crate) struct OtlpHttpClient {
    client: HttpsClient,
    timeout: Duration,
}

impl OtlpHttpClient {
    pub(crate) fn new(client: HttpsClient, timeout: Duration) -> OtlpHttpClient {
        OtlpHttpClient { client, timeout }
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer from the collector within {:?}", self.timeout).into()),
        }
    }
}

impl std::fmt::Debug for OtlpHttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpHttpClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

// The trait is declared with `async_trait`; this is its expansion, without the macro crate.
impl HttpClient for OtlpHttpClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.send(request))
    }
}
