//! A client that retries `tools/call` safely: every call carries an `idempotencyKey`, and a call
//! whose outcome was lost is retried with the same key, so a SEP-3182 server replays the outcome
//! instead of running the tool twice. Built on rmcp's client (feature `client`).
//!
//! - [`Client`] sends the calls and decides about retries, following a [`RetryPolicy`].
//! - [`Connect`] opens sessions: [`StdioConnector`] spawns a stdio server, [`HttpConnector`] speaks
//!   Streamable HTTP with custom headers, and any closure returning a [`Session`] works too. A
//!   transport failure ends a session; the next attempt opens a new one through the same
//!   [`Connect`], which is how retries work over stdio (a fresh process) and HTTP alike.
//! - A [`CallReport`] carries the [`CallOutcome`], the key and the number of attempts; a
//!   [`CallError`] carries the key, the attempts, the last [`Failure`] and why it [`GaveUp`].
//!
//! # Discovering `tools.idempotency`
//!
//! rmcp parses the server's capabilities into types that have no room for `tools.idempotency`, so
//! the client reads the raw result instead. Over a byte stream ([`Session::from_io`], used by
//! [`StdioConnector`]) it watches the handshake's result go by under rmcp's reader, whether the
//! handshake was `server/discover` (2026-07-28) or the legacy `initialize`. Over HTTP
//! ([`HttpConnector`]) it POSTs `server/discover` itself before opening the session (and, for a
//! legacy server, `initialize`, deleting that probe's session). A server whose capabilities could
//! not be read counts as not advertising it.
//!
//! # Retry rules
//!
//! An attempt sends `tools/call` with the key in `params.idempotencyKey` and waits up to
//! [`RetryPolicy::attempt_timeout`] for the answer.
//!
//! | what happened | the call ran? | retried with the same key |
//! |---|---|---|
//! | a result (`isError` or not) | yes | no: [`CallOutcome::Success`] / [`CallOutcome::ToolError`] |
//! | a JSON-RPC error that is not `idempotency_*` (the tool's error, perhaps replayed) | yes or no | no: [`CallOutcome::RpcError`] |
//! | no session could be opened (nothing was sent) | no | yes, unless the error is final ([`ConnectError::is_retryable`]) |
//! | no answer in time ([`Failure::Timeout`]) | maybe | if safe |
//! | the connection failed or closed ([`Failure::Transport`]); the session is replaced | maybe | if safe |
//! | `idempotency_key_in_progress` | running | if safe, after `data.retryAfterMs` |
//! | `idempotency_store_unavailable` (the server failed closed) | no | if safe, after `data.retryAfterMs` if given |
//! | `idempotency_shutting_down` (a gateway is stopping) | no | if safe, after `data.retryAfterMs` |
//! | `idempotency_key_conflict` | no | never: [`Failure::Conflict`] |
//! | `idempotency_outcome_unknown` | maybe | never: [`Failure::OutcomeUnknown`]; the server will not run it again for this key |
//! | any other `idempotency_*` (invalid key, arguments too large, quota, outcome not retained) | no, or its outcome is gone | never: [`Failure::Rejected`] |
//! | a result this client does not handle (MRTR `input_required`, a task) | yes | never: [`Failure::UnexpectedResponse`] |
//!
//! "If safe" means the server advertises `tools.idempotency`, or the caller opted in with
//! [`RetryPolicy::trust_idempotent_hint`] and the tool's `tools/list` entry has
//! `annotations.idempotentHint: true`. Otherwise the error says so ([`GaveUp::Unsafe`]) and
//! keeps the key, for the caller to decide. Retries stop after
//! [`RetryPolicy::max_attempts`] or [`RetryPolicy::max_elapsed`], whichever comes first; waits
//! between attempts grow exponentially, with jitter, unless the server sent `retryAfterMs`.
//!
//! The key is sent whether or not the server advertises the capability (SEP-3182 allows it; a
//! server that does not know it ignores it).
//!
//! # Example
//!
//! ```no_run
//! use mcp_idempotency::client::{CallOutcome, CallRequest, Client, RetryPolicy, StdioConnector};
//! use serde_json::json;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let server = StdioConnector::new("mcp-idem")
//!     .args(["wrap", "--store", "sqlite:records.sqlite3", "--", "my-mcp-server"]);
//! let client = Client::new(server).with_policy(RetryPolicy::default().with_max_attempts(4));
//!
//! let call = CallRequest::new("charge_payment").arguments(json!({"amount": 4200, "currency": "usd"}));
//! match client.call_tool(call).await {
//!     Ok(report) => match report.outcome() {
//!         CallOutcome::Success(result) => println!("charged: {:?}", result.structured_content),
//!         other => println!("the tool failed: {}", other.to_json()),
//!     },
//!     // No outcome: keep the key, to retry later without charging twice.
//!     Err(error) => eprintln!("{error} (key {}, {} attempts)", error.key(), error.attempts()),
//! }
//! client.close().await;
//! # Ok(())
//! # }
//! ```

mod call;
mod connect;
mod error;
mod http_transport;
mod policy;
mod probe;
pub(crate) mod retry;
mod tap;

pub use call::{CallOutcome, CallReport, CallRequest, Client};
pub use connect::{Connect, ConnectError, HttpConnector, Session, StdioConnector};
pub use error::{CallError, Failure, GaveUp};
pub use http_transport::{RmcpHttpClient, RmcpHttpError};
pub use policy::RetryPolicy;
