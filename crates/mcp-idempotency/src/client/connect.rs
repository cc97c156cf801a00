//! Sessions and how to open them: [`Connect`], [`Session`], [`StdioConnector`], [`HttpConnector`].

use std::collections::HashMap;
use std::error::Error as StdError;
use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full, Limited};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt, RunningService, Service,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{Peer, RoleClient};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader};
use tokio::process::Child;
use tokio::sync::OnceCell;

use super::http_transport::{RmcpHttpClient, RmcpHttpError};
use super::probe::{self, Probe};
use super::tap::CapabilityTap;
use crate::http_client::{error_causes, is_certificate_error, HttpsClient, TlsSetupError};
use crate::jsonrpc::MAX_SERVER_MESSAGE_BYTES;
use crate::protocol;

/// How long a closing session waits for its server process to exit before killing it.
const CHILD_EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long a closing session waits for rmcp to shut its transport down.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a new MCP session: what a [`Client`](super::Client) calls first, and again whenever a
/// transport failure killed the session it had.
///
/// Implemented by [`StdioConnector`] (spawns the server), [`HttpConnector`] (Streamable HTTP), and
/// by any `Fn() -> impl Future<Output = Result<Session, ConnectError>>` closure, for other
/// transports: build an rmcp client on it and hand it to [`Session::new`], or hand a byte stream
/// pair to [`Session::from_io`].
pub trait Connect: Send + Sync {
    /// A new session with the server.
    fn connect(&self) -> impl Future<Output = Result<Session, ConnectError>> + Send;
}

impl<F, Fut> Connect for F
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<Session, ConnectError>> + Send,
{
    fn connect(&self) -> impl Future<Output = Result<Session, ConnectError>> + Send {
        self()
    }
}

/// Why no session could be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The server process could not be started. Not retried.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A configured HTTP header is not a valid header. Not retried.
    #[error("invalid HTTP header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP request discovering the server's capabilities failed. Retried, unless the
    /// server's certificate could not be verified.
    #[error("cannot reach {url}: {source}")]
    Http {
        /// The endpoint.
        url: String,
        /// What went wrong.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// TLS could not be set up (the CA file). Not retried.
    #[error(transparent)]
    Tls(TlsSetupError),
    /// The MCP handshake (`server/discover`, or the legacy `initialize`) failed. Retried, unless
    /// the server asked for authorization.
    #[error("MCP handshake failed: {0}")]
    Handshake(#[source] Box<ClientInitializeError>),
    /// No session within the time left.
    #[error("no session within {0:?}")]
    TimedOut(Duration),
    /// Any other failure, from a custom [`Connect`] implementation. Retried.
    #[error("{0}")]
    Other(#[source] Box<dyn StdError + Send + Sync>),
}

impl ConnectError {
    /// Wraps the error of a custom [`Connect`] implementation.
    pub fn other(error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self::Other(error.into())
    }

    /// Whether trying again may help: not for a program that cannot be started, an invalid
    /// header, a CA file that cannot be used, a server certificate that cannot be verified, or a
    /// server that wants authorization.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Spawn { .. } | Self::InvalidHeader { .. } | Self::Tls(_) => false,
            Self::Handshake(error) => !error.is_authorization_required(),
            Self::Http { source, .. } => !is_certificate_error(source.as_ref()),
            Self::TimedOut(_) | Self::Other(_) => true,
        }
    }
}

impl From<ClientInitializeError> for ConnectError {
    fn from(error: ClientInitializeError) -> Self {
        Self::Handshake(Box::new(error))
    }
}

/// One live MCP session, and what the server said about itself on the wire.
///
/// rmcp's typed capabilities have no room for `tools.idempotency`, so a session keeps the raw
/// `capabilities` object of the server's `server/discover` (or `initialize`) result:
/// [`Session::from_io`] reads it off the byte stream under rmcp, [`HttpConnector`] asks the
/// server with a raw POST.
pub struct Session {
    peer: Peer<RoleClient>,
    service: Mutex<Box<dyn ServiceHandle>>,
    capabilities: Option<Value>,
    child: Option<Child>,
    /// `idempotentHint` of each listed tool, fetched once, when first needed.
    hints: OnceCell<HashMap<String, bool>>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("capabilities", &self.capabilities)
            .field("child", &self.child.as_ref().and_then(Child::id))
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session on an rmcp client you started yourself; `capabilities` is the raw
    /// `capabilities` object of the server's discover or initialize result, if you have it
    /// (without it the server counts as not advertising `tools.idempotency`).
    pub fn new<S: Service<RoleClient>>(
        service: RunningService<RoleClient, S>,
        capabilities: Option<Value>,
    ) -> Self {
        Self {
            peer: service.peer().clone(),
            service: Mutex::new(Box::new(service)),
            capabilities,
            child: None,
            hints: OnceCell::new(),
        }
    }

    /// Starts an rmcp client on a newline-delimited JSON-RPC byte stream pair (what stdio is)
    /// and reads the server's capabilities off `read` during the handshake. The handshake tries
    /// `server/discover` (2026-07-28) first and falls back to the legacy `initialize`.
    ///
    /// It waits for the server as long as the server takes to start: bound it with a timeout of
    /// your own. A first `server/discover` goes out under an id of this client's and its answer is
    /// awaited before rmcp's handshake starts (rmcp alone gives a server 10 s, then fails the
    /// handshake on the late answer); a server that has not answered within 10 s gets the legacy
    /// handshake, as with rmcp, and its late answer is kept from rmcp.
    pub async fn from_io<R, W>(read: R, write: W) -> Result<Self, ConnectError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut read = BufReader::new(read);
        let mut write = write;
        let probed = probe::discover(&mut read, &mut write)
            .await
            .map_err(|error| {
                ConnectError::from(ClientInitializeError::ConnectionClosed(format!(
                    "while waiting for the answer to server/discover: {error}"
                )))
            })?;
        match probed {
            Probe::Answered { before } => {
                let read = std::io::Cursor::new(before).chain(read);
                Self::serve(read, write, client_info(), lifecycle()).await
            }
            Probe::Silent { before, partial } => {
                let read = probe::without_late_answer(read, before, partial);
                let legacy = client_info().with_protocol_version(ProtocolVersion::V_2025_11_25);
                Self::serve(read, write, legacy, ClientLifecycleMode::Initialize).await
            }
        }
    }

    /// Runs rmcp's handshake as `lifecycle` says on the stream pair, with the tap under its reader.
    async fn serve<R, W>(
        read: R,
        write: W,
        info: ClientConfig,
        lifecycle: ClientLifecycleMode,
    ) -> Result<Self, ConnectError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tap, seen) = CapabilityTap::new(read);
        let service = info.serve_with_lifecycle((tap, write), lifecycle).await?;
        Ok(Self::new(service, seen.finish()))
    }

    /// The rmcp peer, for other requests (`tools/list`, …).
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// The raw `capabilities` object the server sent, if it was seen.
    pub fn capabilities(&self) -> Option<&Value> {
        self.capabilities.as_ref()
    }

    /// Whether the server advertises `capabilities.tools.idempotency` (SEP-3182).
    pub fn advertises_idempotency(&self) -> bool {
        self.capabilities
            .as_ref()
            .and_then(|capabilities| capabilities.get("tools"))
            .and_then(|tools| tools.get("idempotency"))
            .is_some_and(Value::is_object)
    }

    /// Whether the session has ended (its transport closed).
    pub fn is_closed(&self) -> bool {
        self.service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_closed()
    }

    /// Whether the server's `tools/list` annotates `tool` with `idempotentHint: true`. The list
    /// is fetched once per session; a tool that is not listed, or a list that cannot be fetched,
    /// counts as not idempotent.
    pub async fn tool_is_idempotent(&self, tool: &str) -> bool {
        let hints = self
            .hints
            .get_or_init(|| async {
                match self.peer.list_all_tools().await {
                    Ok(tools) => tools
                        .into_iter()
                        .map(|tool| {
                            let hint = tool
                                .annotations
                                .and_then(|annotations| annotations.idempotent_hint)
                                .unwrap_or(false);
                            (tool.name.into_owned(), hint)
                        })
                        .collect(),
                    Err(error) => {
                        tracing::debug!(%error, "cannot list tools; no tool counts as idempotent");
                        HashMap::new()
                    }
                }
            })
            .await;
        hints.get(tool).copied().unwrap_or(false)
    }

    /// Ends the session: closes the transport and, for a spawned server, waits a few seconds
    /// for it to exit (it sees end of input) before killing it.
    pub async fn close(self) {
        let Self {
            service, mut child, ..
        } = self;
        let mut service = service.into_inner().unwrap_or_else(PoisonError::into_inner);
        service.close(CLOSE_TIMEOUT).await;
        drop(service);
        if let Some(child) = child.as_mut() {
            match tokio::time::timeout(CHILD_EXIT_GRACE, child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(
                        "the MCP server did not exit after its input closed; killing it"
                    );
                    let _ = child.kill().await;
                }
            }
        }
    }
}

/// The part of an rmcp `RunningService` a session needs, whatever its handler type.
trait ServiceHandle: Send {
    fn is_closed(&self) -> bool;
    fn close(&mut self, timeout: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

impl<S: Service<RoleClient>> ServiceHandle for RunningService<RoleClient, S> {
    fn is_closed(&self) -> bool {
        RunningService::is_closed(self)
    }

    fn close(&mut self, timeout: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(error) = self.close_with_timeout(timeout).await {
                tracing::debug!(%error, "the MCP client task failed while closing");
            }
        })
    }
}

/// What this client tells servers about itself.
fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("mcp-idempotency", env!("CARGO_PKG_VERSION")),
    )
}

/// `server/discover` (2026-07-28) first, the legacy `initialize` for older servers: rmcp's names
/// of [`protocol::V_2026_07_28`] and [`protocol::V_2025_11_25`].
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Spawns a stdio MCP server for each session.
///
/// The server's stdin and stdout carry the protocol; its stderr is inherited unless
/// [`quiet`](Self::quiet). A session that is closed shuts the server's stdin and waits for it
/// to exit; a session lost to a transport failure is replaced by a fresh process, which is how a
/// [`Client`](super::Client) retries over stdio: put SEP-3182 in front with a store the
/// processes share (`mcp-idem wrap --store sqlite:…`), and the new process replays the outcome.
#[derive(Clone, Debug)]
pub struct StdioConnector {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    current_dir: Option<PathBuf>,
    quiet: bool,
}

impl StdioConnector {
    /// Runs `program` (looked up in `PATH` when it has no slash).
    pub fn new(program: impl Into<OsString>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            current_dir: None,
            quiet: false,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the server.
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((name.into(), value.into()));
        self
    }

    /// Runs the server in `dir`.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Discards the server's stderr instead of inheriting it.
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }
}

impl Connect for StdioConnector {
    async fn connect(&self) -> Result<Session, ConnectError> {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.envs.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if self.quiet {
                Stdio::null()
            } else {
                Stdio::inherit()
            })
            .kill_on_drop(true);
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        let spawn_error = |source| ConnectError::Spawn {
            program: self.program.to_string_lossy().into_owned(),
            source,
        };
        let mut child = command.spawn().map_err(spawn_error)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(spawn_error(std::io::Error::other("no stdio pipes")));
        };
        let mut session = Session::from_io(stdout, stdin).await?;
        session.child = Some(child);
        Ok(session)
    }
}

/// Opens Streamable HTTP sessions on rmcp's transport over this crate's HTTP client
/// ([`RmcpHttpClient`]: http and https, the system's roots plus an optional CA file), with custom
/// headers on every request (`Authorization`, an API key, …).
///
/// Before each session it POSTs `server/discover` itself (and, if the server is legacy, a
/// `initialize` whose session it deletes right away) to read the raw capabilities, which rmcp
/// would drop. A stateless 2026-07-28 server has nothing to lose between sessions; a retry after
/// a failed connection simply opens a new session.
#[derive(Clone, Debug)]
pub struct HttpConnector {
    url: String,
    headers: Vec<(String, String)>,
    ca_cert: Option<PathBuf>,
    /// Built at the first connection, then shared by every session (one connection pool).
    http: OnceCell<RmcpHttpClient>,
}

impl HttpConnector {
    /// Sessions with the MCP endpoint at `url` (e.g. `http://127.0.0.1:8080/mcp`).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: Vec::new(),
            ca_cert: None,
            http: OnceCell::new(),
        }
    }

    /// Sends `name: value` with every request. Checked when connecting: an invalid header, or
    /// one the transport sets itself (`Accept`, `Mcp-Session-Id`, `Last-Event-Id`), is a
    /// [`ConnectError::InvalidHeader`].
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `Authorization: Bearer <token>`.
    pub fn bearer_token(self, token: impl fmt::Display) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// Also trusts the CA certificates of this PEM file (a private CA), besides the system's
    /// roots. Read when connecting: a missing or empty file is a [`ConnectError::Tls`].
    pub fn ca_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_cert = Some(path.into());
        self
    }

    /// The endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Connect for HttpConnector {
    async fn connect(&self) -> Result<Session, ConnectError> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url.as_str());
        let mut headers = HashMap::new();
        for (name, value) in &self.headers {
            let (name, value) = parse_header(name, value)?;
            headers.insert(name, value);
        }
        config = config.custom_headers(headers);
        let http = self
            .http
            .get_or_try_init(|| async { RmcpHttpClient::new(self.ca_cert.as_deref()) })
            .await
            .map_err(ConnectError::Tls)?;
        let capabilities = discover_over_http(http.http(), &self.url, &self.headers).await?;
        let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
        let service = client_info()
            .serve_with_lifecycle(transport, lifecycle())
            .await?;
        Ok(Session::new(service, capabilities))
    }
}

/// Headers rmcp's transport sets itself and refuses as custom headers.
const TRANSPORT_HEADERS: [&str; 3] = ["accept", "mcp-session-id", "last-event-id"];

/// A header name and value of whatever types the rmcp transport config wants.
fn parse_header<N, V>(name: &str, value: &str) -> Result<(N, V), ConnectError>
where
    N: FromStr,
    N::Err: fmt::Display,
    V: FromStr,
    V::Err: fmt::Display,
{
    let invalid = |reason: String| ConnectError::InvalidHeader {
        name: name.to_owned(),
        reason,
    };
    if TRANSPORT_HEADERS
        .iter()
        .any(|reserved| name.trim().eq_ignore_ascii_case(reserved))
    {
        return Err(invalid("the transport sets this header itself".into()));
    }
    let parsed_name = name.parse().map_err(|e: N::Err| invalid(e.to_string()))?;
    let parsed_value = value.parse().map_err(|e: V::Err| invalid(e.to_string()))?;
    Ok((parsed_name, parsed_value))
}

/// The raw `capabilities` of the server at `url`: from `server/discover`, or for a legacy
/// server from `initialize` (whose session is then deleted). `None` if neither has any.
async fn discover_over_http(
    http: &HttpsClient,
    url: &str,
    headers: &[(String, String)],
) -> Result<Option<Value>, ConnectError> {
    let http_error = |source: Box<dyn StdError + Send + Sync>| ConnectError::Http {
        url: url.to_owned(),
        source,
    };
    let request = |method: Method, extra: &[(&str, &str)], body: String| {
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| http_error(Box::new(e)))
    };
    let post = |message: Value, extra: &[(&str, &str)]| {
        let method = message["method"].as_str().unwrap_or_default().to_owned();
        let mut all = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-method", method.as_str()),
        ];
        all.extend_from_slice(extra);
        let request = request(Method::POST, &all, message.to_string());
        async move {
            let response = http
                .request(request?)
                .await
                .map_err(|e| http_error(Box::new(RmcpHttpError::Request(e))))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_SERVER_MESSAGE_BYTES)
                .collect()
                .await
                .map_err(http_error)?
                .to_bytes();
            let is_sse = is_event_stream(parts.headers.get("content-type"));
            Ok::<_, ConnectError>((parts.headers, capabilities_in(&body, is_sse)))
        }
    };

    let discover = protocol::discover_request("mcp-idempotency-discover");
    let (_, capabilities) = post(
        discover,
        &[("mcp-protocol-version", protocol::V_2026_07_28)],
    )
    .await?;
    if let Some(capabilities) = capabilities {
        return Ok(Some(capabilities));
    }

    // A legacy server: its initialize result has the capabilities.
    let initialize = protocol::initialize_request(
        "mcp-idempotency-initialize",
        protocol::V_2025_11_25,
        "mcp-idempotency",
    );
    let (answer_headers, capabilities) = post(initialize, &[]).await?;
    let session_id = answer_headers
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok());
    if let Some(session_id) = session_id {
        let deleted = match request(
            Method::DELETE,
            &[("mcp-session-id", session_id)],
            String::new(),
        ) {
            Ok(request) => http
                .request(request)
                .await
                .map(drop)
                .map_err(|e| error_causes(&e)),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = deleted {
            tracing::debug!(%error, "cannot delete the probing session");
        }
    }
    Ok(capabilities)
}

fn is_event_stream(content_type: Option<&impl AsRef<[u8]>>) -> bool {
    content_type.is_some_and(|value| value.as_ref().starts_with(b"text/event-stream"))
}

/// `result.capabilities` of the JSON-RPC response in `body` (plain JSON, or an SSE stream).
fn capabilities_in(body: &[u8], is_sse: bool) -> Option<Value> {
    let response = if is_sse {
        serde_json::from_str::<Value>(&crate::jsonrpc::sse_response(body, None)?).ok()?
    } else {
        serde_json::from_slice::<Value>(body).ok()?
    };
    protocol::capabilities(&response).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmcp_names_the_revisions_of_the_protocol_module() {
        assert_eq!(
            ProtocolVersion::V_2026_07_28.as_str(),
            protocol::V_2026_07_28
        );
        assert_eq!(
            ProtocolVersion::V_2025_11_25.as_str(),
            protocol::V_2025_11_25
        );
    }
}
