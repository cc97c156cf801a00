//! A gateway process, as `mcp-idem wrap` runs one per client connection: the library's real
//! `StdioProxy`, `Deduplicator`, interceptor and policies between the client's pipes and an MCP
//! server's, deciding under the namespace the server names and the process's principal, with
//! the store reached through its [`StoreLink`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use mcp_idempotency::default_scope::LegacyNamespaceReads;
use mcp_idempotency::interceptor::InterceptorConfig;
use mcp_idempotency::stdio::StdioProxy;
use mcp_idempotency::store::Store;
use mcp_idempotency::{Clock, Deduplicator, FencingTokens, Scope};
use rand::RngExt;
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

use super::link::StoreLink;
use super::tool::{self, ServerOf};
use super::{World, COMMAND_NAMESPACE};

/// Bytes each pipe holds.
const PIPE: usize = 64 * 1024;

/// The client's ends of a process's stdio.
pub struct ClientPipes {
    /// What the client writes (the process's stdin).
    pub to_gateway: WriteHalf<DuplexStream>,
    /// What the client reads (the process's stdout).
    pub from_gateway: ReadHalf<DuplexStream>,
}

/// Starts a gateway process on `host` for `principal`; `None` when the host is down.
pub fn spawn(world: &Arc<World>, host: usize, principal: &str) -> Option<(u64, ClientPipes)> {
    if !world.host_up(host) {
        return None;
    }
    let process = world.next_process();
    let who = format!("p{process}@h{host}");
    let (client_end, gateway_end) = tokio::io::duplex(PIPE);
    let (server_end, tool_end) = tokio::io::duplex(PIPE);
    let (from_gateway, to_gateway) = tokio::io::split(client_end);
    let cut = Arc::new(AtomicBool::new(false));
    let tokens = FencingTokens::seeded(world.rng().random::<u64>());
    let link: Arc<dyn Store> = Arc::new(StoreLink::new(
        Arc::clone(world),
        host,
        process,
        Arc::clone(&cut),
    ));
    let clock: Arc<dyn Clock> = world.hosts[host].clock.clone();
    let policies = world.gateway.policies.clone();
    let server = ServerOf {
        host,
        process,
        principal: principal.to_owned(),
    };
    let grace = world.gateway.shutdown_grace;
    let task_world = Arc::clone(world);
    let engine = world.gateway.engine.clone();
    let principal_owned = principal.to_owned();
    let task = tokio::spawn(async move {
        // As `wrap` does: records an earlier release kept under the command's namespace are
        // read too while the store holds live ones of this principal.
        let now = clock.now();
        let store =
            LegacyNamespaceReads::open(link, COMMAND_NAMESPACE, Some(&principal_owned), now).await;
        let dedup = Deduplicator::new(engine, Arc::new(store))
            .with_clock(clock)
            .with_tokens(tokens);
        let proxy = StdioProxy::new(
            dedup.clone(),
            Scope::new(COMMAND_NAMESPACE, principal_owned),
        )
        .namespace_from_server(true)
        .interceptor_config(InterceptorConfig::default().tool_policies(policies))
        .shutdown_grace(grace);
        let (gateway_in, gateway_out) = tokio::io::split(gateway_end);
        let (server_out, server_in) = tokio::io::split(server_end);
        let (tool_in, tool_out) = tokio::io::split(tool_end);
        // The server is a child of the process: it dies with it.
        let server = tokio::spawn(tool::serve(
            Arc::clone(&task_world),
            server,
            tool_in,
            tool_out,
        ));
        let _server = AbortOnDrop(server.abort_handle());
        let purge = mcp_idempotency::upkeep::purge_periodically(dedup.clone());
        let exit = tokio::select! {
            biased;
            exit = proxy.run(gateway_in, gateway_out, server_in, server_out) => exit,
            never = purge => match never {},
        };
        let pending = mcp_idempotency::upkeep::settle_completions(&dedup, grace).await;
        let releases = dedup.pending_releases();
        task_world.exited(process, releases);
        task_world.history.note(
            &who,
            format!(
                "exits ({exit:?}; {pending} completions and {releases} releases still pending)"
            ),
        );
    });
    world.register(host, process, cut, task.abort_handle());
    world.history.note(
        format!("p{process}@h{host}"),
        format!("starts for {principal}"),
    );
    Some((
        process,
        ClientPipes {
            to_gateway,
            from_gateway,
        },
    ))
}

/// Aborts a task when dropped (the process's server, with the process).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
