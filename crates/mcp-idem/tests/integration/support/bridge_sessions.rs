//! Helpers for `bridge_sessions`: `mcp-idem bridge` as a stdio peer (or run until it exits
//! at startup), the messages of an `initialize`-era client, the sessions a stateful demo server
//! opened, a CA and a server certificate made in the test with a TLS listener in front of a demo
//! server, and a remote that answers chosen `tools/call`s with garbage.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;

use crate::support::common::{StdioPeer, TIMEOUT};
use crate::support::http::HttpDemo;

/// The binary under test.
pub(crate) const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// The bridge's environment variables, removed from every bridge the tests start so that the
/// developer's own settings cannot change what a test sees.
const BRIDGE_ENV: [&str; 4] = [
    "MCP_IDEM_HEADERS",
    "MCP_IDEM_CA_CERT",
    "MCP_IDEM_ATTEMPT_TIMEOUT",
    "MCP_IDEM_MAX_TIME",
];

/// `mcp-idem bridge [args] URL`, with a clean environment for the bridge's own variables.
pub(crate) fn bridge_command(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(EXE);
    command.arg("bridge").args(args).arg(url);
    for name in BRIDGE_ENV {
        command.env_remove(name);
    }
    command
}

/// Spawns `command` (a bridge) as a stdio peer, its stderr in `DIR/bridge.N.stderr`.
pub(crate) fn spawn(command: Command, dir: &Path) -> StdioPeer {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    StdioPeer::spawn(command, &dir.join(format!("bridge.{n}.stderr")))
}

/// `mcp-idem bridge [args] URL` as a stdio peer.
pub(crate) fn bridge(url: &str, args: &[&str], dir: &Path) -> StdioPeer {
    spawn(bridge_command(url, args), dir)
}

/// How a process that was expected to stop by itself ended.
#[derive(Debug)]
pub(crate) struct Exited {
    pub(crate) status: ExitStatus,
    /// Everything it wrote on stdout.
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: String,
}

impl Exited {
    /// Asserts the startup failure of the contract: exit status 2, nothing on stdout, a message
    /// on stderr that contains each of `words` (case-insensitive), no panic. Returns stderr.
    pub(crate) fn assert_startup_failure(&self, words: &[&str]) -> &str {
        assert_eq!(self.status.code(), Some(2), "{self:?}");
        assert!(
            self.stdout.is_empty(),
            "stdout must stay empty: {:?}",
            String::from_utf8_lossy(&self.stdout)
        );
        assert!(!self.stderr.trim().is_empty(), "no message on stderr");
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        let lower = self.stderr.to_lowercase();
        for word in words {
            assert!(
                lower.contains(&word.to_lowercase()),
                "stderr does not mention {word:?}: {}",
                self.stderr
            );
        }
        &self.stderr
    }
}

/// Runs `command` with stdin held open (so that only a startup failure can end it) until it
/// exits; kills it and panics after [`TIMEOUT`].
pub(crate) fn run_until_exit(mut command: Command) -> Exited {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the bridge");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the bridge") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the bridge did not exit within {TIMEOUT:?}; stderr:\n{}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    drop(child.stdin.take());
    Exited {
        status,
        stdout: out.join().expect("the stdout reader"),
        stderr: err.join().expect("the stderr reader"),
    }
}

/// An `initialize` request of revision `version`, declaring `capabilities`.
pub(crate) fn initialize(id: u64, version: &str, capabilities: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
        "protocolVersion":version,"capabilities":capabilities,
        "clientInfo":{"name":"mcp-idem-bridge-tests","version":"0"}}})
}

/// `notifications/initialized`.
pub(crate) fn initialized() -> Value {
    json!({"jsonrpc":"2.0","method":"notifications/initialized"})
}

/// A `tools/call` as an `initialize`-era client sends it: no `_meta`, no key.
pub(crate) fn legacy_call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
        "params":{"name":name,"arguments":arguments}})
}

/// A legacy `charge_payment` of `amount` EUR, without a key.
pub(crate) fn legacy_charge(id: u64, amount: u64) -> Value {
    legacy_call(
        id,
        "charge_payment",
        json!({"amount": amount, "currency": "EUR"}),
    )
}

/// `result.structuredContent.chargeId` of a successful charge; panics with the response otherwise.
pub(crate) fn charge_id(response: &Value) -> String {
    response["result"]["structuredContent"]["chargeId"]
        .as_str()
        .unwrap_or_else(|| panic!("not a successful charge: {response}"))
        .to_owned()
}

/// The names in a `tools/list` response, sorted.
pub(crate) fn tool_names(response: &Value) -> Vec<String> {
    let mut names: Vec<String> = response["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {response}"))
        .iter()
        .map(|tool| tool["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

/// The ids of the sessions a `demo-server --http-stateful` opened so far (its
/// `session opened: ID` lines on stderr).
pub(crate) fn sessions_opened(server: &HttpDemo) -> Vec<String> {
    ids_after(server, "session opened: ")
}

/// Waits (up to [`TIMEOUT`](crate::support::common::TIMEOUT)) until [`sessions_opened`] is `expected`: the
/// server logs a session around the time it answers, and a drain thread reads that log, so the
/// line may arrive a little after the answer.
pub(crate) fn assert_sessions_opened(server: &HttpDemo, expected: &[String]) {
    let deadline = std::time::Instant::now() + crate::support::common::TIMEOUT;
    while sessions_opened(server) != expected && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(sessions_opened(server), expected, "{}", server.stderr());
}

/// The session ids of the GET streams a `demo-server --http-stateful` opened so far (its
/// `stream opened: ID` lines on stderr).
pub(crate) fn streams_opened(server: &HttpDemo) -> Vec<String> {
    ids_after(server, "stream opened: ")
}

fn ids_after(server: &HttpDemo, prefix: &str) -> Vec<String> {
    server
        .stderr()
        .lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .map(str::to_owned)
        .collect()
}

/// Waits until the server opened `n` sessions (its stderr is read by a thread); returns them.
pub(crate) fn wait_for_sessions(server: &HttpDemo, n: usize) -> Vec<String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let sessions = sessions_opened(server);
        if sessions.len() >= n || Instant::now() > deadline {
            return sessions;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A runtime of its own for the servers a test runs in its process, so that tests stay
/// synchronous (the stdio peer blocks).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A CA made in the test, and a certificate it signed for `127.0.0.1` and `localhost`.
pub(crate) struct TestCa {
    /// The CA certificate, PEM, for `--ca-cert`.
    pub(crate) ca_pem: PathBuf,
    server: Arc<ServerConfig>,
}

impl TestCa {
    /// Makes the CA and the server certificate; writes the CA to `DIR/ca.pem`.
    pub(crate) fn new(dir: &Path) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "mcp-idem test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("a CA key"))
            .expect("the CA certificate");

        let key = KeyPair::generate().expect("a server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("server certificate parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let certificate = params.signed_by(&key, &ca).expect("the server certificate");

        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).expect("write ca.pem");
        // The provider is named explicitly: with more than one in the build, rustls has no
        // process-wide default.
        let server = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![certificate.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("the server's TLS configuration");
        Self {
            ca_pem,
            server: Arc::new(server),
        }
    }
}

/// A TLS listener on 127.0.0.1 that terminates TLS with a [`TestCa`] certificate and forwards
/// each connection to a plain-HTTP upstream; stops on drop.
pub(crate) struct TlsFront {
    /// `https://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
    handshakes: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    _runtime: tokio::runtime::Runtime,
}

impl TlsFront {
    /// Listens on a free port and forwards to `upstream` (`127.0.0.1:PORT`).
    pub(crate) fn start(ca: &TestCa, upstream: &str) -> Self {
        let runtime = runtime();
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind the TLS listener");
        let port = listener.local_addr().expect("its address").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&ca.server));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (done, failed) = (Arc::clone(&handshakes), Arc::clone(&refused));
        let upstream = upstream.to_owned();
        runtime.spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
                let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(socket).await {
                        Ok(tls) => tls,
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    };
                    done.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut plain) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        Self {
            url: format!("https://127.0.0.1:{port}/mcp"),
            handshakes,
            refused,
            _runtime: runtime,
        }
    }

    /// TLS handshakes that completed.
    pub(crate) fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// Waits until a connection's TLS handshake has failed (e.g. the client did not trust the
    /// certificate). The listener notices only after the client has hung up, so the client's
    /// error can come first.
    pub(crate) fn wait_for_a_failed_handshake(&self) {
        crate::support::wrap::wait_until(
            "a failed TLS handshake",
            crate::support::common::TIMEOUT,
            || self.refused.load(Ordering::SeqCst) >= 1,
        );
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// What [`FaultyRemote`] answers to a `tools/call` of the tool with this name, instead of
/// forwarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Fault {
    /// `200 application/json` whose body is not JSON.
    GarbageJson,
    /// `200 application/json` with a `content-length` of 400, cut off after a few bytes.
    CutJson,
    /// `200 text/event-stream`, cut off in the middle of its first event.
    CutSse,
    /// `200 text/event-stream` whose one event's data is not JSON, then the end of the stream.
    GarbageSse,
}

impl Fault {
    pub(crate) const ALL: [Self; 4] = [
        Self::GarbageJson,
        Self::CutJson,
        Self::CutSse,
        Self::GarbageSse,
    ];

    /// The tool name that triggers the fault.
    pub(crate) fn tool(self) -> &'static str {
        match self {
            Self::GarbageJson => "garbage_json",
            Self::CutJson => "cut_json",
            Self::CutSse => "cut_sse",
            Self::GarbageSse => "garbage_sse",
        }
    }

    fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|fault| fault.tool() == name)
    }

    fn response(self) -> hyper::Response<Body> {
        let (content_type, length, parts): (_, Option<usize>, Vec<Result<&str, &str>>) = match self
        {
            Self::GarbageJson => (
                "application/json",
                None,
                vec![Ok("<html><body>502 this is not JSON</body></html>")],
            ),
            Self::CutJson => (
                "application/json",
                Some(400),
                vec![Ok(r#"{"jsonrpc":"2.0","id":"#), Err("cut off")],
            ),
            Self::CutSse => (
                "text/event-stream",
                None,
                vec![Ok("data: {\"jsonrpc\":\"2.0\",\"id\":"), Err("cut off")],
            ),
            Self::GarbageSse => (
                "text/event-stream",
                None,
                vec![Ok("data: this is not JSON\n\n")],
            ),
        };
        // A pause before the break, so that the head and the first bytes go out first.
        let frames = futures_util::stream::iter(parts).then(|part| async move {
            match part {
                Ok(data) => Ok(Frame::data(Bytes::from(data.to_owned()))),
                Err(why) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(BoxError::from(why))
                }
            }
        });
        let mut response = hyper::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, content_type);
        if let Some(length) = length {
            response = response.header(http::header::CONTENT_LENGTH, length);
        }
        response
            .body(BodyExt::boxed(StreamBody::new(frames)))
            .expect("a fault response")
    }
}

/// An HTTP/1.1 remote on 127.0.0.1 that forwards every request to an upstream MCP server,
/// except a `tools/call` of a [`Fault`]'s tool, which it answers with that fault; counts the
/// faults it served. Stops on drop.
pub(crate) struct FaultyRemote {
    /// `http://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
    served: Arc<Mutex<HashMap<Fault, usize>>>,
    _runtime: tokio::runtime::Runtime,
}

impl FaultyRemote {
    /// Listens on a free port; forwards to `upstream` (`http://HOST:PORT`).
    pub(crate) fn start(upstream: &str) -> Self {
        let runtime = runtime();
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind the faulty remote");
        let port = listener.local_addr().expect("its address").port();
        let served = Arc::new(Mutex::new(HashMap::new()));
        let counts = Arc::clone(&served);
        let upstream = Arc::new(upstream.to_owned());
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        runtime.spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (client, upstream, counts) =
                    (client.clone(), Arc::clone(&upstream), Arc::clone(&counts));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle(
                            request,
                            client.clone(),
                            Arc::clone(&upstream),
                            Arc::clone(&counts),
                        )
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}/mcp"),
            served,
            _runtime: runtime,
        }
    }

    /// How many times `fault` was served.
    pub(crate) fn served(&self, fault: Fault) -> usize {
        self.served
            .lock()
            .unwrap()
            .get(&fault)
            .copied()
            .unwrap_or(0)
    }
}

async fn handle(
    request: hyper::Request<Incoming>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    upstream: Arc<String>,
    served: Arc<Mutex<HashMap<Fault, usize>>>,
) -> Result<hyper::Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if message["method"] == "tools/call" {
        if let Some(fault) = message["params"]["name"].as_str().and_then(Fault::named) {
            *served.lock().unwrap().entry(fault).or_default() += 1;
            return Ok(fault.response());
        }
    }
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut forward = hyper::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{upstream}{path}"));
    for (name, value) in &parts.headers {
        forward = forward.header(name, value);
    }
    let Ok(forward) = forward.body(Full::new(body)) else {
        return Ok(status(500));
    };
    Ok(match client.request(forward).await {
        Ok(response) => response.map(|body| body.map_err(BoxError::from).boxed()),
        Err(_) => status(502),
    })
}

fn status(code: u16) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()).map_err(BoxError::from).boxed())
        .expect("a status response")
}

/// Reads messages until the server-to-client request `method` (a message with that method and an
/// id) arrives and returns it; panics if the response to `call` comes first, or after [`TIMEOUT`].
/// Other messages (notifications) are dropped.
pub(crate) fn server_request(peer: &mut StdioPeer, method: &str, call: &Value) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = peer.next_message(left).unwrap_or_else(|| {
            panic!(
                "no {method} request within {TIMEOUT:?}; stderr:\n{}",
                peer.stderr()
            )
        });
        if message["method"] == method && message.get("id").is_some() {
            return message;
        }
        assert!(
            message.get("id") != Some(call) || message.get("method").is_some(),
            "the call was answered before any {method} request: {message}"
        );
    }
}
