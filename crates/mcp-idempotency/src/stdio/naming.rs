//! The scope a call is decided under when the records are kept under the server's own name
//! ([`StdioProxy::namespace_from_server`]): the name is learned before the call is decided, from
//! a discovery result on its way or the gateway's own `server/discover`, so that the namespace
//! never depends on what the call's connection sent before it (a client of MCP 2026-07-28 need
//! send no handshake at all).

use std::io;
use std::sync::Mutex;

use tokio::io::AsyncWrite;

use super::stopping::Stopping;
use super::{lock, write_line, StdioProxy};
use crate::default_scope::{server_namespace, SERVER_NAME_TIMEOUT};
use crate::interceptor::{Interceptor, LearnName};
use crate::record::Scope;
use crate::RunningClaim;

impl StdioProxy {
    /// The scope to decide a call under now: the configured one, or the one under the server's
    /// name, learned first if the server has not named itself yet (the gateway's own
    /// `server/discover`, written to `server_in`, when no discovery result is on its way).
    /// `None` when the server does not name itself: the call is refused, not decided elsewhere.
    pub(super) async fn scope_for_call<SW: AsyncWrite + Unpin>(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        server_in: &mut SW,
        stopping: &Stopping,
    ) -> io::Result<Option<Scope>> {
        if !self.namespace_from_server {
            return Ok(Some(self.scope.clone()));
        }
        if let Some(named) = self.named.get() {
            return Ok(Some(named.clone()));
        }
        let learned = ask_server(state, server_in, stopping, |interceptor| match interceptor
            .learn_server_name()
        {
            LearnName::Known | LearnName::Failed => Asked::Answered,
            LearnName::Send(request) => Asked::Send(request),
            LearnName::Wait => Asked::Wait,
        })
        .await?;
        if !learned {
            tracing::warn!(
                timeout_s = SERVER_NAME_TIMEOUT.as_secs(),
                "the server did not name itself in time; refusing the keyed call"
            );
        }
        let name = lock(state).server_name().map(str::to_owned);
        Ok(name.map(|name| self.named_scope(&name).clone()))
    }

    /// The scope under the server's name `name` (the first one it gave, for the whole run).
    fn named_scope(&self, name: &str) -> &Scope {
        self.named.get_or_init(|| {
            let scope = Scope::new(server_namespace(name), self.scope.principal());
            tracing::info!(namespace = scope.namespace(), "the server named itself");
            scope
        })
    }
}

/// One step of [`ask_server`]: what the interceptor says of a question to the server.
pub(super) enum Asked {
    /// Its answer is in (or it will not come: the interceptor knows what it needs to).
    Answered,
    /// Send this request of the gateway's own to the server, then wait.
    Send(String),
    /// An answer is on its way.
    Wait,
}

/// Asks the server what `step` says (the gateway's own request, whose answer the interceptor
/// absorbs) and waits for the answer, each server message waking it, up to
/// [`SERVER_NAME_TIMEOUT`]: `true` once `step` says it is answered or the server is gone,
/// `false` when the time ran out.
pub(super) async fn ask_server<SW: AsyncWrite + Unpin>(
    state: &Mutex<Interceptor<RunningClaim>>,
    server_in: &mut SW,
    stopping: &Stopping,
    mut step: impl FnMut(&mut Interceptor<RunningClaim>) -> Asked,
) -> io::Result<bool> {
    let deadline = tokio::time::sleep(SERVER_NAME_TIMEOUT);
    tokio::pin!(deadline);
    loop {
        // Registered before the state is read, so that an answer in between is not missed.
        let answered = stopping.server_answered.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        let asked = step(&mut lock(state));
        match asked {
            Asked::Answered => return Ok(true),
            Asked::Send(request) => write_line(server_in, &mut request.into_bytes()).await?,
            Asked::Wait => {}
        }
        if stopping.is_server_gone() {
            return Ok(true);
        }
        tokio::select! {
            biased;
            () = &mut answered => {}
            () = &mut deadline => return Ok(false),
        }
    }
}
