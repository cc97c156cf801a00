//! A deterministic simulation of mcp-idempotency's claim path.
//!
//! Several gateways run the library's real [`StdioProxy`](mcp_idempotency::stdio::StdioProxy),
//! [`Deduplicator`](mcp_idempotency::Deduplicator), engine, policies and interceptor against a
//! model of a shared store; clients call tools through them, with retries; tools count their
//! executions. Everything that varies (faults, latencies, clock skews, which client retries where)
//! is drawn from one seed, and every history is checked against the invariants of at-most-once
//! execution. The same seed gives the same history, byte for byte.

pub mod model_check;
pub mod store;
