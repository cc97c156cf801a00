//! SEP-3182 request idempotency for the Model Context Protocol.
//!
//! An MCP client that loses a `tools/call` response cannot tell "never ran" from "ran, answer lost".
//! With SEP-3182 it sends an opaque `idempotencyKey`; a server that advertises
//! `capabilities.tools.idempotency` replays the recorded outcome of an equivalent earlier call,
//! rejects the key reused with different arguments, and rejects at once a duplicate of a call still
//! running.
//!
//! # Design
//!
//! The decision logic does no networking; thin adapters do. Its parts:
//!
//! - [`Engine`]: the sans-IO decision logic. Input: a [`Scope`], a [`ToolCall`], a fresh
//!   [`FencingToken`], the current [`Timestamp`], and the store's answers. Output: a [`Decision`]
//!   (bypass, execute, replay or reject). No clock, no I/O, no async runtime.
//! - [`fingerprint`]: the exact equivalence of `(tool name, arguments)` the SEP asks for: key order,
//!   whitespace and escapes ignored, numbers compared as exact decimals.
//! - [`store`]: the [`Store`](store::Store) trait (atomic claim, fenced complete/renew/release) and
//!   its implementations, all checked by one shared [`store::testsuite`].
//! - [`Deduplicator`]: the thin async driver that runs the engine against a store.
//! - [`Rejection`]: the JSON-RPC errors and their stable `error.data.type` values.
//! - [`jsonrpc`]: the JSON-RPC error codes, the error responses every transport answers with, and
//!   the limits on one message's size.
//! - [`protocol`]: the protocol revisions and the handshakes (`server/discover`, `initialize`)
//!   every client part of the crate speaks.
//! - [`interceptor`]: the sans-IO JSON-RPC interceptor every transport shares (which messages
//!   matter, calls in flight by id, capability injection), driven by [`stdio`] (newline-delimited
//!   JSON-RPC, for `mcp-idem wrap` and rmcp servers on stdio) and by `http` (feature `http`: a tower
//!   layer for rmcp's `StreamableHttpService` and `mcp-idem proxy`, with principal extraction).
//! - `client` (feature `client`): a client on rmcp's that retries with the same key.
//! - `bridge` (feature `bridge`): stdio to a remote Streamable HTTP server, re-issuing lost calls
//!   with their key; `http_client` (feature `http-client`): its HTTP client over rustls, also the
//!   upstream client of `mcp-idem proxy`.
//!
//! - `embedded` (feature `embedded`): the same decisions one message at a time, inside a server
//!   whose transport is another SDK's (the Python and TypeScript bindings).
//!
//! - `metrics` (feature `metrics`): counters of every decision and a store decorator that times
//!   each operation, through the `metrics` facade.
//!
//! - `telemetry` (feature `otel`): OTLP export of traces and metrics.
//!
//! Features: `sqlite` (default), `redis`, `postgres` (stores), `http`, `http-client`, `client`,
//! `bridge`, `embedded`, `metrics`, `otel`.
//!
//! # Example
//!
//! ```
//! use mcp_idempotency::{Decision, Engine, EngineConfig, FencingToken, Scope, Step, Timestamp, ToolCall};
//! use mcp_idempotency::store::ClaimOutcome;
//!
//! let engine = Engine::new(EngineConfig::default());
//! let scope = Scope::new("demo", "alice");
//! let key = serde_json::json!("k-1");
//! let call = ToolCall {
//!     tool_name: "charge_payment",
//!     arguments: Some(r#"{"amount": 1}"#),
//!     idempotency_key: Some(&key),
//!     mrtr_continuation: false,
//!     ..ToolCall::default()
//! };
//! let now = Timestamp::from_millis(1_000);
//! let (mut pending, step) = engine.begin(&scope, call, FencingToken::random(), now);
//! let Step::TryClaim(req) = step else { unreachable!() };
//! // A real caller now runs `store.claim(&req)`; here the key was free.
//! let Step::Done(Decision::Execute(claim)) = pending.on_claim(req, Ok(ClaimOutcome::Claimed)) else {
//!     unreachable!()
//! };
//! assert_eq!(claim.id().key.as_str(), "k-1");
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "bridge")]
pub mod bridge;
mod call_span;
#[cfg(not(feature = "otel"))]
mod call_span_off;
mod claims;
#[cfg(feature = "client")]
pub mod client;
mod config;
pub mod default_scope;
#[cfg(feature = "testsuite")]
pub mod derived_keys_testsuite;
#[cfg(feature = "embedded")]
pub mod embedded;
mod engine;
pub mod fingerprint;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http-client")]
pub mod http_client;
pub mod interceptor;
pub mod jsonrpc;
mod key;
mod lines;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod policy;
pub mod protocol;
mod raw_object;
mod record;
mod rejection;
// Public only to the fuzz targets (`cargo fuzz` builds with `--cfg fuzzing`).
#[cfg(feature = "simulation")]
pub mod simulation;
#[cfg(fuzzing)]
pub mod sse;
#[cfg(not(fuzzing))]
#[allow(unreachable_pub)]
// The event writer and the overflow check serve the HTTP relay and the bridge only.
#[cfg_attr(
    not(any(feature = "http", feature = "bridge", feature = "client")),
    allow(dead_code)
)]
mod sse;
pub mod stdio;
pub mod store;
#[cfg(feature = "otel")]
pub mod telemetry;
mod time;
#[cfg(any(feature = "http-client", feature = "postgres", feature = "redis"))]
mod tls;
pub mod upkeep;

pub use claims::{Deduplicator, RunningClaim};
pub use config::{AfterCrash, EngineConfig};
pub use engine::{
    BypassReason, Claim, Decision, Engine, PendingDecision, Replay, Step, ToolCall, REPLAYED_META,
};
pub use key::{IdempotencyKey, KeyError};
pub use policy::source::KeySource;
pub use policy::terms::KeyTerms;
pub use record::{
    CorruptRecord, FencingToken, FencingTokens, Outcome, OutcomeKind, Record, RecordId,
    RecordState, Scope, TraceLink,
};
pub use rejection::{Rejection, RejectionKind, UnknownRejectionKind, SHUTTING_DOWN_RETRY_AFTER};
pub use time::{backoff, Clock, ManualClock, Sleep, SystemClock, Timestamp};
