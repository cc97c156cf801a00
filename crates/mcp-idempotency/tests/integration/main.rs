//! The integration tests of `mcp-idempotency`, in one test binary (one link of the crate instead
//! of one per file): the engine, the deduplicator and the interceptor through the public API, every
//! record store (SQLite, memory, Redis, PostgreSQL) against the shared store suite, the stdio and
//! HTTP drivers, the retrying client, and rmcp servers embedding the library. One module per
//! concern; `counter_server` and `at_once` are shared helpers.
//!
//! Run one concern with a filter, e.g. `cargo test -p mcp-idempotency --test integration engine::`.

// Shared helpers.
#[cfg(any(feature = "postgres", feature = "redis"))]
mod at_once;
mod counter_server;

// One module per concern.
#[cfg(feature = "client")]
mod client_retry;
mod deduplicator;
#[cfg(feature = "embedded")]
mod embedded;
mod engine;
mod fingerprint_props;
#[cfg(feature = "http")]
mod http_layer;
mod interceptor;
#[cfg(feature = "embedded")]
mod key_sources;
#[cfg(feature = "otel")]
mod otel_export;
#[cfg(feature = "http")]
mod principal;
mod rmcp_embedding;
#[cfg(feature = "http")]
mod rmcp_http_embedding;
#[cfg(feature = "embedded")]
mod rolling_upgrade;
mod sqlite_across_processes;
mod sqlite_concurrent_open;
mod sqlite_write_lock;
mod stdio_proxy;
mod store_memory;
#[cfg(feature = "postgres")]
mod store_postgres;
#[cfg(feature = "redis")]
mod store_redis;
#[cfg(feature = "redis")]
mod store_redis_cluster;
#[cfg(feature = "redis")]
mod store_redis_replicas;
#[cfg(feature = "redis")]
mod store_redis_tls;
mod store_sqlite;
