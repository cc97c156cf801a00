//! A deterministic simulation of mcp-idempotency's claim path.
//!
//! Several hosts run gateway processes as `mcp-idem wrap` does, one per client connection: the
//! library's real [`StdioProxy`](mcp_idempotency::stdio::StdioProxy),
//! [`Deduplicator`](mcp_idempotency::Deduplicator), engine, policies and interceptor, against a
//! model of a shared store. Clients call tools through them, with retries, duplicates and
//! model-style repeats; tools count their executions. Everything that varies (faults, latencies,
//! clock skews, which client retries where) is drawn from one seed, on one current-thread tokio
//! runtime whose clock is paused, and every history is checked against the invariants of
//! at-most-once execution. The same seed gives the same history, byte for byte.

pub mod faults;
pub mod history;
pub mod invariants;
pub mod model_check;
pub mod run;
pub mod store;
mod violation;
pub mod world;

pub use run::{run_seed, Options, SeedReport};
