//! The helpers the test modules share: spawning `mcp-idem` and its demo server, MCP peers over
//! stdio and HTTP, stores and their faults, TLS in front of a server.

#[cfg(unix)]
pub(crate) mod bridge;
#[cfg(unix)]
pub(crate) mod bridge_sessions;
#[cfg(unix)]
pub(crate) mod chaos;
pub(crate) mod common;
#[cfg(unix)]
pub(crate) mod compose;
#[cfg(unix)]
pub(crate) mod deploy;
pub(crate) mod http;
#[cfg(unix)]
pub(crate) mod install;
#[cfg(unix)]
pub(crate) mod interop;
#[cfg(unix)]
pub(crate) mod pg_restart;
#[cfg(unix)]
pub(crate) mod redis_own_cluster;
#[cfg(unix)]
pub(crate) mod store_faults;
pub(crate) mod upstream;
#[cfg(unix)]
pub(crate) mod wrap;
