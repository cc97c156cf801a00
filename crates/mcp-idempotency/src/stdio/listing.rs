//! The server's tools, learned before a key-less call is decided under the suggested policy
//! (`--tools suggested`): the gateway sends its own `tools/list` (every page) when a `tools/call`
//! comes before the tools are known, so that a retry on a new connection is decided as the first
//! call was, whether or not its client listed the tools first.

use std::io;
use std::sync::Mutex;

use tokio::io::AsyncWrite;

use super::naming::{ask_server, Asked};
use super::stopping::Stopping;
use super::{lock, StdioProxy};
use crate::default_scope::SERVER_NAME_TIMEOUT;
use crate::interceptor::{Interceptor, LearnTools};
use crate::RunningClaim;

impl StdioProxy {
    /// Learns the server's tools, if `message` is a `tools/call` that the suggested policy may
    /// decide and they are not known yet; gives up after [`SERVER_NAME_TIMEOUT`] (the call then
    /// runs as with no suggested policy, and is counted).
    pub(super) async fn tools_for_call<SW: AsyncWrite + Unpin>(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        message: &str,
        server_in: &mut SW,
        stopping: &Stopping,
    ) -> io::Result<()> {
        if !lock(state).needs_tools(message) {
            return Ok(());
        }
        let listed = ask_server(state, server_in, stopping, |interceptor| match interceptor
            .learn_tools()
        {
            LearnTools::Known => Asked::Answered,
            LearnTools::Send(request) => Asked::Send(request),
            LearnTools::Wait => Asked::Wait,
        })
        .await?;
        if !listed {
            tracing::warn!(
                timeout_s = SERVER_NAME_TIMEOUT.as_secs(),
                "the server did not list its tools in time; calls run as with no suggested \
                 policy until it does"
            );
            lock(state).give_up_tools();
        }
        Ok(())
    }
}
