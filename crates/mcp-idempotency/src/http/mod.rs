//! Streamable HTTP: SEP-3182 as a tower layer, for rmcp's `StreamableHttpService` and for the
//! `mcp-idem proxy` gateway in front of any MCP server.
//!
//! [`IdempotencyLayer`] reads each POSTed JSON-RPC message and hands it to the same
//! [`Interceptor`](crate::interceptor::Interceptor) the stdio proxy uses; only reading bodies and
//! relaying JSON or SSE answers is HTTP-specific. [`ScopeBy`](principal::ScopeBy) says whose
//! records a request may see. [`idempotent_layer`] builds a layer from a store URL in one statement.

mod body;
mod future;
mod layer;
pub mod principal;
mod relay;
mod service;
mod shutdown;

pub use body::{BoxError, ResponseBody};
pub use layer::{idempotent_layer, IdempotencyLayer, DEFAULT_BODY_TIMEOUT};
pub use service::IdempotencyService;
pub use shutdown::{Shutdown, CUT_OFF_WAIT};
