//! The client's side of [`StdioProxy`]: each message the client sends, read and acted on in
//! order, and the decisions of calls that may wait for a running call's outcome, made beside the
//! reads.
//!
//! Those decisions are polled during every await of this pump, not only while it reads: a
//! decision left unpolled can hold what another needs (a store's batch is led by the first call
//! that queued into it; PostgreSQL's and Redis's wait for that call's exchange, SQLite's takes
//! the role over only after 100 ms), so an await that let them sit could stall every call.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Mutex;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use super::stopping::{Deciding, Stopping};
use super::{lock, message_text, send, write_line, StdioProxy, ToClient};
use crate::interceptor::{ClientAction, Decided, Interceptor, KeyedCall};
use crate::jsonrpc::{error_response, INVALID_REQUEST};
use crate::lines::{id_in_prefix, read_more, skip_rest, Line};
use crate::record::Scope;
use crate::{Decision, RunningClaim};

/// A call decided, with its place among the decisions in progress.
type DecidedCall<'a> = (KeyedCall, Decision<RunningClaim>, Deciding<'a>);

/// A call to decide beside the reads: its duplicates wait for a running call's outcome.
type ToDecide<'a> = (Scope, KeyedCall, Deciding<'a>);

impl StdioProxy {
    pub(super) async fn client_to_server<CR, SW>(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        client_in: CR,
        mut server_in: SW,
        to_client: &ToClient,
        stopping: &Stopping,
    ) -> io::Result<()>
    where
        CR: AsyncRead + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let mut lines = BufReader::new(client_in);
        let mut line = Vec::new();
        // Waited for beside every read, so made once: a new waiter per line would join and leave
        // each `Notify`'s list every time.
        let server_gone = stopping.server_gone_for_pump.notified();
        let drained = stopping.drained.notified();
        tokio::pin!(server_gone, drained);
        // Calls whose duplicates wait for a running call's outcome (keys the client did not
        // send) are decided here, beside the reads: a wait never holds up the messages behind it
        // (the elicitation answer the running call itself waits for, say).
        let mut waiting = FuturesUnordered::new();
        let mut resumed = false;
        while !stopping.is_over() {
            if stopping.is_draining() {
                // A cancellation, or a refused call, may be what the drain waits for.
                stopping.progress.notify_one();
            }
            if !resumed {
                line.clear();
            }
            resumed = false;
            let read = tokio::select! {
                biased;
                // Nobody is left to read what the client sends.
                () = &mut server_gone => return Ok(()),
                // The drain is over: nothing more goes to the server.
                () = &mut drained => break,
                Some(decided) = waiting.next(), if !waiting.is_empty() => {
                    let decided = VecDeque::from([decided]);
                    self.deliver_all(state, decided, &mut server_in, to_client, &mut waiting)
                        .await?;
                    // The read this interrupted goes on with what it had read.
                    resumed = true;
                    continue;
                }
                read = read_more(&mut lines, &mut line, self.max_line_bytes) => read?,
            };
            match read {
                Line::Eof => {
                    stopping.client_ended.notify_one();
                    // The calls still being decided are decided (and sent) during the drain.
                    loop {
                        tokio::select! {
                            biased;
                            () = &mut server_gone => return Ok(()),
                            () = &mut drained => break,
                            Some(decided) = waiting.next(), if !waiting.is_empty() => {
                                let decided = VecDeque::from([decided]);
                                self.deliver_all(
                                    state, decided, &mut server_in, to_client, &mut waiting,
                                )
                                .await?;
                            }
                        }
                    }
                    break;
                }
                Line::Whole => {}
                Line::TooLong => {
                    let skipped = skip_rest(&mut lines).await?;
                    let id = id_in_prefix(&line);
                    let length = line.len() as u64 + skipped;
                    tracing::warn!(
                        length,
                        limit = self.max_line_bytes,
                        id = id.as_deref().unwrap_or("null"),
                        "discarded a client message longer than the line limit"
                    );
                    let message = format!(
                        "a line of {length} bytes is longer than the line limit of {} bytes; it was discarded, not forwarded",
                        self.max_line_bytes
                    );
                    let response =
                        error_response(id.as_deref().unwrap_or("null"), INVALID_REQUEST, &message);
                    send(to_client, &mut response.into_bytes()).await;
                    continue;
                }
            }
            let acted = match waiting.is_empty() {
                // Nothing else to poll: the message is acted on as it is read.
                true => {
                    self.on_line(state, &mut line, &mut server_in, to_client, stopping)
                        .await
                }
                false => {
                    let acting =
                        self.on_line(state, &mut line, &mut server_in, to_client, stopping);
                    let (acted, decided) = alongside(acting, &mut waiting).await;
                    self.deliver_all(state, decided, &mut server_in, to_client, &mut waiting)
                        .await?;
                    acted
                }
            };
            if let Some((scope, call, deciding)) = acted? {
                waiting.push(self.decide(scope, call, deciding));
            }
        }
        // The drain is over: a call still being decided is refused, and a claim it got released
        // (its future, dropped, would leave the key in progress with no call behind it).
        while let Some(decided) = waiting.next().await {
            let decided = VecDeque::from([decided]);
            self.deliver_all(state, decided, &mut server_in, to_client, &mut waiting)
                .await?;
        }
        server_in.shutdown().await
    }

    /// Acts on one whole message from the client; returns the call to decide beside the reads,
    /// if it is one.
    async fn on_line<'s, SW: AsyncWrite + Unpin>(
        &'s self,
        state: &Mutex<Interceptor<RunningClaim>>,
        line: &mut Vec<u8>,
        server_in: &mut SW,
        to_client: &ToClient,
        stopping: &'s Stopping,
    ) -> io::Result<Option<ToDecide<'s>>> {
        let action = match message_text(line) {
            Some(text) => {
                self.tools_for_call(state, text, server_in, stopping)
                    .await?;
                lock(state).on_client_message(text)
            }
            None => ClientAction::Forward,
        };
        match action {
            ClientAction::Forward => write_line(server_in, line).await?,
            ClientAction::ForwardTraced { message, .. } => {
                write_line(server_in, &mut message.into_bytes()).await?
            }
            ClientAction::Absorb => {}
            ClientAction::Respond(response) => send(to_client, &mut response.into_bytes()).await,
            ClientAction::Decide(call) => {
                let Some(scope) = self.scope_for_call(state, server_in, stopping).await? else {
                    let decided = lock(state).refuse_unnamed(call);
                    return self
                        .send_decided(decided, server_in, to_client)
                        .await
                        .map(|()| None);
                };
                let deciding = stopping.enter_decision();
                if call.terms().wait.is_some() {
                    return Ok(Some((scope, call, deciding)));
                }
                let decided = self.decide(scope, call, deciding).await;
                self.deliver(state, decided, server_in, to_client).await?;
            }
            ClientAction::RecordThenForward(claim, outcome) => {
                claim.record(outcome).await;
                write_line(server_in, line).await?;
            }
        }
        Ok(None)
    }

    /// Decides `call` under `scope`.
    async fn decide<'a>(
        &self,
        scope: Scope,
        call: KeyedCall,
        deciding: Deciding<'a>,
    ) -> DecidedCall<'a> {
        let decision = self
            .dedup
            .begin_guarded(&scope, &call.tool_call(), call.span(), &deciding)
            .await;
        (call, decision, deciding)
    }

    /// Delivers `decided` in order, the calls in `waiting` still being decided meanwhile (and
    /// delivered after them).
    async fn deliver_all<'a, SW, F>(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        mut decided: VecDeque<DecidedCall<'a>>,
        server_in: &mut SW,
        to_client: &ToClient,
        waiting: &mut FuturesUnordered<F>,
    ) -> io::Result<()>
    where
        SW: AsyncWrite + Unpin,
        F: Future<Output = DecidedCall<'a>>,
    {
        while let Some(next) = decided.pop_front() {
            let delivering = self.deliver(state, next, server_in, to_client);
            let (delivered, more) = alongside(delivering, waiting).await;
            decided.extend(more);
            delivered?;
        }
        Ok(())
    }

    /// Hands a decided call to the interceptor (the decision is over: its `Deciding` ends) and
    /// sends it where it goes.
    async fn deliver<SW: AsyncWrite + Unpin>(
        &self,
        state: &Mutex<Interceptor<RunningClaim>>,
        (call, decision, deciding): DecidedCall<'_>,
        server_in: &mut SW,
        to_client: &ToClient,
    ) -> io::Result<()> {
        let decided = lock(state).on_decision(call, decision);
        drop(deciding);
        self.send_decided(decided, server_in, to_client).await
    }

    /// Sends a decided call where it goes: to the server, or (answered) to the client.
    pub(super) async fn send_decided<SW: AsyncWrite + Unpin>(
        &self,
        decided: Decided,
        server_in: &mut SW,
        to_client: &ToClient,
    ) -> io::Result<()> {
        match decided {
            Decided::Forward(request) => write_line(server_in, &mut request.into_bytes()).await,
            Decided::Respond(response) => {
                send(to_client, &mut response.into_bytes()).await;
                Ok(())
            }
        }
    }
}

/// Awaits `work` while the decisions in `waiting` go on; returns its output and the decisions
/// made meanwhile, in the order they were made.
async fn alongside<T, F: Future>(
    work: impl Future<Output = T>,
    waiting: &mut FuturesUnordered<F>,
) -> (T, VecDeque<F::Output>) {
    let mut work = pin!(work);
    let mut decided = VecDeque::new();
    loop {
        tokio::select! {
            biased;
            output = &mut work => return (output, decided),
            Some(done) = waiting.next(), if !waiting.is_empty() => decided.push_back(done),
        }
    }
}
