//! The native half of the `mcp-idempotency` npm package: the Node.js face of
//! [`mcp_idempotency::embedded`].
//!
//! Thin on purpose: a [`Gateway`] is an [`Embedded`] gateway opened from the user's options (as
//! JSON, `Settings::from_json`),
//! a [`Connection`] hands JSON-RPC messages (as text) to the library and answers with what to do
//! (`{action: "forward" | "rewritten" | "respond" | "drop", message?}`). Every decision, the
//! fingerprint and the store are the Rust crate's; `index.js` only carries messages between the
//! SDK's transport and here.
//!
//! A decision that needs no store round trip comes back at once; one that waits on the store
//! comes back as a promise whose I/O runs on napi's tokio runtime, never on Node's event loop, unless
//! the gateway was opened with `storeIo: 'inline'` (SQLite's transactions then run on Node's thread,
//! which waits for them: `mcp_idempotency::embedded::StoreIo`).

use std::sync::Arc;

use mcp_idempotency::embedded::{self, options, Answer, Embedded, Gateways, Settings, SetupError};
use mcp_idempotency::interceptor::META_KEY;
use mcp_idempotency::stdio::DEFAULT_SHUTDOWN_GRACE;
use napi::bindgen_prelude::{block_on, within_runtime_if_available, Either, Either3, PromiseRaw};
use napi::{Env, Result};
use napi_derive::napi;

/// What to do with a message.
#[napi(object)]
pub struct Step {
    /// `forward`, `rewritten` (send `message` instead), `respond` (send `message` back to the
    /// client; nothing reaches the server) or `drop`.
    pub action: String,
    /// The message to send, for `rewritten` and `respond`.
    pub message: Option<String>,
}

impl From<embedded::Step> for Step {
    fn from(step: embedded::Step) -> Self {
        Self {
            action: step.action.to_owned(),
            message: step.message,
        }
    }
}

/// The step of a decision of the library.
fn step(decided: impl Into<embedded::Step>) -> Step {
    decided.into().into()
}

/// Why a gateway could not be set up; `index.js` throws it as an `IdempotencyError`.
#[napi(object)]
pub struct SetupFailure {
    /// The error's stable type (`idempotency_invalid_option`, `idempotency_invalid_store_url`,
    /// `idempotency_store_unavailable`).
    pub r#type: String,
    /// The JSON-RPC code of the same failure on the wire.
    pub code: i32,
    /// What is wrong, in `wrap`'s words.
    pub message: String,
}

impl From<SetupError> for SetupFailure {
    fn from(err: SetupError) -> Self {
        Self {
            r#type: err.error_type().to_owned(),
            code: i32::try_from(err.code()).unwrap_or(i32::MIN),
            message: err.to_string(),
        }
    }
}

/// The answer now when it is ready (or, under `store-io = inline`, once run here), else a promise
/// of it run on the tokio runtime.
fn answer<'env, T>(
    env: &'env Env,
    connection: &embedded::Connection,
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<Either<T, PromiseRaw<'env, T>>>
where
    T: napi::bindgen_prelude::ToNapiValue + Send + 'static,
{
    match within_runtime_if_available(|| connection.answer(future, false)) {
        Answer::Ready(value) => Ok(Either::A(value)),
        Answer::Pending(future) => Ok(Either::B(
            env.spawn_future(async move { Ok(future.await) })?,
        )),
    }
}

/// A gateway in process: the store, the scope of its records and the interceptor's settings,
/// shared by every connection.
#[napi]
pub struct Gateway {
    inner: Embedded,
}

/// napi's tokio runtime: the bindings' one-worker runtime (`mcp_idempotency::embedded::runtime`),
/// where every store round trip of the process runs. Without it (it cannot start), napi's default
/// one is used.
#[napi_derive::module_init]
fn init() {
    // The library's logs on stderr, as `wrap`'s (`MCP_IDEM_LOG`).
    embedded::log_to_stderr();
    if let Ok(runtime) = embedded::runtime() {
        embedded::export_telemetry(runtime.handle());
        napi::bindgen_prelude::create_custom_tokio_runtime(runtime);
    }
}

/// The gateways this process opened, by namespace and options.
static GATEWAYS: Gateways = Gateways::new();

/// The gateway of the server named `serverName` with these options: the one this process opened
/// before, or a new one (the store opened, the gateway started). `options` is a JSON object of
/// option name (as the user spelled it: `afterCrash`, `maxKeyBytes`, …) to value, read by
/// `mcp_idempotency::embedded::Settings::from_json`, whose errors name each option as given.
/// Blocks until the store answers; a gateway, or why it cannot be set up.
#[napi]
pub fn open(server_name: Option<String>, options: String) -> Either<Gateway, SetupFailure> {
    let settings = match Settings::from_json(server_name.as_deref(), &options) {
        Ok(settings) => settings,
        Err(err) => return Either::B(err.into()),
    };
    match block_on(GATEWAYS.open(settings)) {
        Ok(inner) => Either::A(Gateway { inner }),
        Err(err) => Either::B(err.into()),
    }
}

#[napi]
impl Gateway {
    /// Whether the suggested policies apply (`tools: 'suggested'`): a connection's
    /// `toolsRequest` is then asked before each `tools/call`.
    #[napi(getter)]
    pub fn lists_tools(&self) -> bool {
        self.inner.lists_tools()
    }

    /// A new connection (one transport the SDK connected): `principal` overrides the gateway's
    /// for its records.
    #[napi]
    pub fn connect(&self, principal: Option<String>) -> Connection {
        Connection {
            inner: Arc::new(self.inner.connect(principal.as_deref())),
        }
    }
}

/// As the process exits: waits up to `settleGraceMs()`, in all, for the outcomes the gateways
/// still send again to their stores, so that an outcome the store failed to take at first is not
/// lost with the process; returns how many are still pending. Blocks.
#[napi]
pub fn settle_at_exit() -> u32 {
    if GATEWAYS.is_empty() {
        return 0;
    }
    u32::try_from(block_on(GATEWAYS.settle_at_exit())).unwrap_or(u32::MAX)
}

/// How long [`settle_at_exit`] waits at most, in milliseconds (`wrap`'s default
/// `--shutdown-grace`).
#[napi]
pub fn settle_grace_ms() -> u32 {
    u32::try_from(DEFAULT_SHUTDOWN_GRACE.as_millis()).unwrap_or(u32::MAX)
}

/// Where a claimed call's key reaches the tool: the `params._meta` member.
#[napi]
pub fn meta_key() -> String {
    META_KEY.to_owned()
}

/// Why option `name` (as the user spelled it) is refused with `value` (as JavaScript shows it):
/// the library's words, type and code, for `index.js` to throw.
#[napi]
pub fn invalid_option(name: String, value: String, reason: String) -> SetupFailure {
    SetupError::invalid_option(&name, Some(value), reason).into()
}

/// One connection's interceptor state (see `mcp_idempotency::embedded::Connection`).
#[napi]
pub struct Connection {
    inner: Arc<embedded::Connection>,
}

// The names of the library's `Connection` methods, which these carry.
#[allow(clippy::wrong_self_convention)]
#[napi]
impl Connection {
    /// Before `message` (from the client) is handed over, with `tools: 'suggested'`: the
    /// `tools/list` request to run on the server itself, whose answer goes to `fromServer`
    /// (which drops it), then ask again; `null`: hand `message` over
    /// (`mcp_idempotency::embedded::Connection::tools_request`).
    #[napi]
    pub fn tools_request(&self, message: String) -> Option<String> {
        self.inner.tools_request(&message)
    }

    /// What to do with a message from the client: the step, or a promise of it, or a decision
    /// that may wait for another call's outcome ([`Waiting`]): the messages after it must not
    /// wait for that one.
    #[napi(ts_return_type = "Step | Promise<Step> | Waiting")]
    pub fn from_client<'env>(
        &self,
        env: &'env Env,
        message: String,
    ) -> Result<Either3<Step, PromiseRaw<'env, Step>, Waiting>> {
        let received = self.inner.receive(&message);
        let may_wait = received.may_wait();
        let connection = Arc::clone(&self.inner);
        let decided = async move { step(connection.decide(received).await) };
        Ok(
            match within_runtime_if_available(|| self.inner.answer(decided, may_wait)) {
                Answer::Ready(step) => Either3::A(step),
                Answer::Pending(decided) if may_wait => Either3::C(Waiting {
                    decided: Some(decided),
                }),
                Answer::Pending(decided) => {
                    Either3::B(env.spawn_future(async move { Ok(decided.await) })?)
                }
            },
        )
    }

    /// What to do with a message from the server: the step, or a promise of it.
    #[napi(ts_return_type = "Step | Promise<Step>")]
    pub fn from_server<'env>(
        &self,
        env: &'env Env,
        message: String,
    ) -> Result<Either<Step, PromiseRaw<'env, Step>>> {
        let connection = Arc::clone(&self.inner);
        answer(env, &self.inner, async move {
            step(connection.from_server(&message).await)
        })
    }

    /// Ends the connection: calls still running are recorded outcome-unknown. Resolves to the
    /// responses owed to the client for them.
    #[napi]
    pub async fn close(&self) -> Vec<String> {
        self.inner.close().await
    }
}

/// The decision on a client's message that may wait for another call's outcome (a key-less
/// duplicate of a running call waits for it): `index.js` delivers the messages after it without
/// waiting for it, since the running call may be waiting for one of them (an elicitation answer).
#[napi]
pub struct Waiting {
    decided: Option<std::pin::Pin<Box<dyn std::future::Future<Output = Step> + Send>>>,
}

#[napi]
impl Waiting {
    /// The step, once decided (call it once).
    #[napi(ts_return_type = "Promise<Step>")]
    pub fn decided<'env>(&mut self, env: &'env Env) -> Result<PromiseRaw<'env, Step>> {
        let decided = self
            .decided
            .take()
            .ok_or_else(|| napi::Error::from_reason("Waiting.decided() was called twice"))?;
        env.spawn_future(async move { Ok(decided.await) })
    }
}

/// The default namespace of the server named `name`: the library's one rule
/// (`mcp_idempotency::default_scope::server_namespace`), as `wrap` applies it.
#[napi]
pub fn server_namespace(name: String) -> String {
    mcp_idempotency::default_scope::server_namespace(&name)
}

/// The default principal of a request authenticated as the OAuth client `clientId`: the
/// library's one rule (`mcp_idempotency::default_scope::client_principal`).
#[napi]
pub fn client_principal(client_id: String) -> String {
    mcp_idempotency::default_scope::client_principal(&client_id)
}

/// Every option `open` takes, by `wrap`'s names.
#[napi]
pub fn options() -> Vec<String> {
    options::every()
        .map(|option| option.name.to_owned())
        .collect()
}
