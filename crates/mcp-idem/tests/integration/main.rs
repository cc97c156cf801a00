//! The end-to-end tests of `mcp-idem`, in one test binary (one link of the crate instead of one
//! per file): the real `mcp-idem` binary (`CARGO_BIN_EXE_mcp-idem`) driven over stdio and
//! Streamable HTTP, real SDK clients and servers, the demo server's ledger counting side effects.
//! One module per concern; the helpers they share are under `support/`.
//!
//! Run one concern with a filter, e.g. `cargo test -p mcp-idem --test integration proxy_scope::`.

// Shared helpers: `support/`, one module per helper.
mod support;

// One module per concern.
#[cfg(unix)]
mod bad_input_http;
#[cfg(unix)]
mod bad_input_stdio;
#[cfg(unix)]
mod batches;
#[cfg(unix)]
mod binding_scenarios;
mod bridge_retries;
#[cfg(unix)]
mod bridge_sdk_clients;
#[cfg(unix)]
mod bridge_sessions;
#[cfg(unix)]
mod call;
#[cfg(unix)]
mod chaos;
#[cfg(unix)]
mod chaos_stdio;
#[cfg(unix)]
mod check;
#[cfg(unix)]
mod check_progress;
mod cli_help;
#[cfg(unix)]
mod config_file;
#[cfg(unix)]
mod default_scope;
mod demo;
mod demo_server;
#[cfg(unix)]
mod demo_server_http;
#[cfg(unix)]
mod demo_server_stateful;
// deploy/: the manifests, the alerts, the dashboard, and a live Prometheus.
#[cfg(unix)]
mod deploy_live;
#[cfg(unix)]
mod deploy_manifests;
#[cfg(unix)]
mod deploy_monitoring;
#[cfg(target_os = "linux")]
mod exhaustion;
#[cfg(unix)]
mod failover_chaos;
#[cfg(unix)]
mod failover_storm;
// The container image of scripts/image.sh, unpacked with umoci and run with chroot.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod image;
#[cfg(unix)]
mod inspect;
mod inspect_cluster;
// The artifacts of scripts/dist.sh, installed without a Rust toolchain.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod install_artifacts;
// The README's install commands, from a fresh clone.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod install_readme;
#[cfg(unix)]
mod interop_clients;
#[cfg(unix)]
mod interop_servers;
#[cfg(unix)]
mod interop_ts_mrtr;
#[cfg(unix)]
mod key_sources;
#[cfg(unix)]
mod limits_http;
#[cfg(unix)]
mod limits_stdio;
#[cfg(unix)]
mod limits_wrap_store_outage;
#[cfg(unix)]
mod log_format;
#[cfg(unix)]
mod lost_claim_answer;
#[cfg(unix)]
mod ops;
#[cfg(unix)]
mod otel_traces;
#[cfg(unix)]
mod pg_restart;
#[cfg(unix)]
mod pg_restart_in_flight;
#[cfg(unix)]
mod proxy;
#[cfg(unix)]
mod proxy_disconnect;
#[cfg(unix)]
mod proxy_multi_instance;
#[cfg(unix)]
mod proxy_namespace;
#[cfg(unix)]
mod proxy_scope;
#[cfg(unix)]
mod proxy_shutdown;
#[cfg(unix)]
mod proxy_store_outage;
#[cfg(unix)]
mod proxy_upstream;
// The README's Python and TypeScript snippets, run with the bindings.
mod readme_bindings;
#[cfg(unix)]
mod scope_handshakes;
#[cfg(target_os = "linux")]
mod store_faults;
#[cfg(unix)]
mod tls_clients;
#[cfg(unix)]
mod tools_command;
#[cfg(unix)]
mod tools_suggested;
#[cfg(unix)]
mod wrap_command_line;
mod wrap_concurrency;
#[cfg(unix)]
mod wrap_discovery;
#[cfg(unix)]
mod wrap_faults;
#[cfg(unix)]
mod wrap_keys;
#[cfg(unix)]
mod wrap_namespaces;
#[cfg(unix)]
mod wrap_rmcp_client;
#[cfg(target_os = "linux")]
mod wrap_shutdown;
