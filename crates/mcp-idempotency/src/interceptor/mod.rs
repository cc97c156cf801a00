//! The JSON-RPC interceptor every transport shares: which messages matter, calls in flight by id,
//! capability injection. Sans-IO: one message in, one action out.
//!
//! A transport adapter (the stdio line proxy, the HTTP layer) feeds each message from the client to
//! [`Interceptor::on_client_message`] and each message from the server to
//! [`Interceptor::on_server_message`], and does what the returned action says. For a keyed
//! `tools/call` the action is [`ClientAction::Decide`]: the adapter asks the
//! [`Deduplicator`](crate::Deduplicator) and hands the decision to [`Interceptor::on_decision`].
//!
//! What it does:
//! - A `tools/call` with `params.idempotencyKey` is decided by the engine. Executed calls are
//!   forwarded without the key (unless [`InterceptorConfig::forward_key`]), with the key copied to
//!   `params._meta["mcp-idem/idempotencyKey"]` ([`META_KEY`]) so tool code can pass it on. Replays and
//!   rejections are answered here and never reach the server. A request reusing the id of a claimed
//!   call in flight, or a keyed call whose id is not a string or a number, is refused with `-32600`.
//! - The server's response to a claimed call is recorded, then forwarded; responses are matched by
//!   id, in any order.
//! - Results of `initialize` and `server/discover` get `capabilities.tools.idempotency = {}` when
//!   the server has a `tools` capability and the store is usable; every other member is kept as is.
//!   The first one that names the server (its `serverInfo`) gives [`Interceptor::server_name`].
//! - `notifications/cancelled` for a claimed call is absorbed ([`CancelPolicy::Absorb`], default) so
//!   the call finishes and its outcome is recorded; or forwarded and the call recorded as
//!   outcome-unknown ([`CancelPolicy::Forward`]).
//! - A JSON-RPC batch (an array, MCP 2025-03-26) holding a keyed `tools/call` is refused whole with
//!   `-32600` errors of `data.type` [`BATCH_REFUSED`]; other batches pass through.
//! - Everything else (other methods, calls without a key, server requests and notifications, lines
//!   that are not JSON or not JSON-RPC) passes through untouched.

mod batch;
mod call;
mod discovery;
mod listing;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::call_span::CallSpan;
use crate::engine::{Claim, Decision};
use crate::jsonrpc::{error_response, raw_error_response, INVALID_REQUEST};
use crate::policy::KeySource;
use crate::policy::ToolPolicies;
use crate::protocol::TransportTrace;
use crate::protocol::IDEMPOTENCY_KEY;
use crate::raw_object::{json_string, RawObject};
use crate::record::Outcome;
use crate::rejection::{Rejection, RejectionKind};

pub use batch::BATCH_REFUSED;
pub use call::KeyedCall;
pub use discovery::LearnName;
use discovery::{inject_capability, warn_unlisted, Discovery};
pub use listing::LearnTools;

/// The `params._meta` member that carries the key to the server on executed calls.
pub const META_KEY: &str = "mcp-idem/idempotencyKey";

/// What to do with `notifications/cancelled` for a call whose key is claimed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CancelPolicy {
    /// Drop the notification: the call runs to completion and its outcome is recorded for the retry
    /// that usually follows (clients cancel on timeout, which is how a lost response looks).
    #[default]
    Absorb,
    /// Forward the notification and record the call as outcome-unknown.
    Forward,
}

impl std::str::FromStr for CancelPolicy {
    type Err = String;

    /// `absorb` or `forward`, as `mcp-idem wrap --cancel` takes them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "absorb" => Ok(Self::Absorb),
            "forward" => Ok(Self::Forward),
            other => Err(format!(
                "unknown cancel policy {other:?}; expected `absorb` or `forward`"
            )),
        }
    }
}

/// Settings of an [`Interceptor`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterceptorConfig {
    forward_key: bool,
    cancel: CancelPolicy,
    policies: Arc<ToolPolicies>,
    /// Set once a `tools/list` answer was checked against the policies, by any interceptor made
    /// from this configuration (the HTTP layer makes one per request).
    tools_checked: OnceFlag,
    /// What the server's `tools/list` answers said (`listing.rs`).
    listing: listing::SharedListing,
}

/// A flag shared by the clones of a configuration; not part of its value.
#[derive(Clone, Debug, Default)]
struct OnceFlag(Arc<std::sync::atomic::AtomicBool>);

impl OnceFlag {
    fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl PartialEq for OnceFlag {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for OnceFlag {}

impl InterceptorConfig {
    /// Keep `idempotencyKey` in the params forwarded to the server (default: removed, since a strict
    /// server may reject an unknown parameter; the key is always in `_meta`).
    pub fn forward_key(mut self, forward: bool) -> Self {
        self.forward_key = forward;
        self
    }

    /// What to do with cancellations of claimed calls.
    pub fn cancel_policy(mut self, policy: CancelPolicy) -> Self {
        self.cancel = policy;
        self
    }

    /// What is done with cancellations of claimed calls.
    pub fn cancel(&self) -> CancelPolicy {
        self.cancel
    }

    /// The tools' key policies and the `_meta` names a client's key is read from (default: no
    /// tool policy; `_meta.idempotencyKey`).
    pub fn tool_policies(mut self, policies: ToolPolicies) -> Self {
        self.policies = Arc::new(policies);
        self
    }

    /// The tools' key policies.
    pub fn policies(&self) -> &ToolPolicies {
        &self.policies
    }
}

/// A JSON-RPC request id, compared by value: `"7"` and `7` differ, escapes do not matter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    fn from_raw(raw: &RawValue) -> Option<Self> {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"') => serde_json::from_str::<String>(text)
                .ok()
                .map(|s| Self(json_string(&s))),
            Some(b'-' | b'0'..=b'9') => Some(Self(text.to_owned())),
            _ => None,
        }
    }

    /// The id as JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }
}

/// What to do with a message from the client. `C` is what the interceptor holds for a claimed
/// call: the engine's [`Claim`], or the deduplicator's [`RunningClaim`](crate::RunningClaim).
#[must_use]
#[derive(Debug)]
pub enum ClientAction<C = Claim> {
    /// Send the message to the server unchanged.
    Forward,
    /// Send this message to the server: a `tools/call` no key protects, traced (tracing is on):
    /// its `_meta` carries mcp-idem's span, and the span waits for the server's answer.
    ForwardTraced {
        /// The request's id.
        id: RequestId,
        /// What the server gets.
        message: String,
    },
    /// Ask the deduplicator about this call, then pass its decision to
    /// [`Interceptor::on_decision`].
    Decide(KeyedCall),
    /// Drop the message.
    Absorb,
    /// Send this message (a response, or a batch of responses) back to the client; nothing goes to
    /// the server.
    Respond(String),
    /// Record `outcome` for `claim`, then send the original message to the server.
    RecordThenForward(C, Outcome),
}

/// What to do with a keyed call once decided.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub enum Decided {
    /// Send this message to the server.
    Forward(String),
    /// Send this message (a response) back to the client.
    Respond(String),
}

/// What to do with a message from the server.
#[must_use]
#[derive(Debug)]
pub enum ServerAction<C = Claim> {
    /// Send the message to the client unchanged.
    Forward,
    /// Send this message to the client instead.
    ForwardRewritten(String),
    /// Drop the message: the answer to the gateway's own request
    /// ([`Interceptor::learn_server_name`]), which the client never sent.
    Absorb,
    /// Record `outcome` for `claim`; then, if `forward`, send the original message to the client
    /// (not when the client cancelled the call and the cancellation was absorbed).
    Record {
        /// The claimed call.
        claim: C,
        /// What the server answered.
        outcome: Outcome,
        /// Whether the client still wants the response.
        forward: bool,
    },
}

/// A claimed call left unanswered when the server went away.
#[derive(Debug)]
pub struct Orphan<C = Claim> {
    /// The claim, to record as outcome-unknown.
    pub claim: C,
    /// The error response for the client, unless it had cancelled the call.
    pub response: Option<String>,
}

#[derive(Debug)]
struct InFlight<C> {
    claim: C,
    cancelled: bool,
    span: CallSpan,
}

/// The interceptor's state: claimed calls in flight and discovery requests awaiting results.
///
/// `C` is what a claimed call is held as: anything that shows its [`Claim`] (the engine's claim
/// itself, or a [`RunningClaim`](crate::RunningClaim) that renews its lease). The interceptor
/// only stores it and hands it back with the call's outcome.
#[derive(Debug)]
pub struct Interceptor<C = Claim> {
    config: InterceptorConfig,
    in_flight: HashMap<RequestId, InFlight<C>>,
    discovery: Discovery,
    /// Ids of other client requests forwarded and not answered yet: a keyed call must not reuse
    /// one, or that request's response would be recorded as the call's outcome.
    pending: HashSet<RequestId>,
    store_unusable: bool,
    /// A `tools/list` request whose answer is checked against the tool policies (once).
    tools_list: Option<RequestId>,
    /// The gateway's own `tools/list` (`--tools suggested`).
    own_listing: listing::OwnListing,
    /// What tracing needs, made only when spans are live (every HTTP request has an interceptor
    /// of its own: one pointer when tracing is off).
    tracing: Option<Box<Tracing>>,
}

/// The interceptor's part in tracing.
#[derive(Debug, Default)]
struct Tracing {
    /// What the transport knows of the trace of the message being read.
    transport: TransportTrace,
    /// Calls forwarded unclaimed (bypassed) whose spans wait for the server's answer.
    traced: HashMap<RequestId, CallSpan>,
}

/// Most unanswered requests tracked in [`Interceptor::pending`]; past that (a server that never
/// answers), new ones are not tracked.
const MAX_PENDING: usize = 65_536;

impl<C> Default for Interceptor<C> {
    fn default() -> Self {
        Self::with_config(InterceptorConfig::default())
    }
}

impl<C> Interceptor<C> {
    /// An interceptor with `config` and nothing in flight (the HTTP layer makes one per request:
    /// no default configuration is built only to be dropped).
    fn with_config(config: InterceptorConfig) -> Self {
        Self {
            config,
            in_flight: HashMap::new(),
            discovery: Discovery::default(),
            pending: HashSet::new(),
            store_unusable: false,
            tools_list: None,
            own_listing: listing::OwnListing::default(),
            tracing: None,
        }
    }
}

impl<C: AsRef<Claim>> Interceptor<C> {
    /// An interceptor with the given settings.
    pub fn new(config: InterceptorConfig) -> Self {
        Self::with_config(config)
    }

    /// Classifies a message from the client.
    pub fn on_client_message(&mut self, message: &str) -> ClientAction<C> {
        let Some(envelope) = RawObject::parse(message) else {
            return match batch::elements(message) {
                Some(elements) => self.on_client_batch(&elements),
                None => ClientAction::Forward,
            };
        };
        let id = envelope.get("id").and_then(RequestId::from_raw);
        let method = envelope.get_str("method");
        let request_id = id.clone().filter(|_| method.is_some());
        let action = match (method.as_deref(), id) {
            (Some(_), Some(id)) if self.in_flight.contains_key(&id) => {
                ClientAction::Respond(error_response(
                    id.as_json(),
                    INVALID_REQUEST,
                    &format!(
                        "request id {} is already used by a tools/call in flight",
                        id.as_json()
                    ),
                ))
            }
            (Some("tools/call"), Some(id)) => self.on_tool_call(message, &envelope, id),
            // A keyed call whose id is not a string or a number (null, boolean, object, a string
            // with a lone surrogate) could not be matched to its response, so its outcome could not
            // be recorded: refuse it rather than let it run undeduplicated.
            (Some("tools/call"), None) if envelope.contains("id") && has_key(&envelope) => {
                ClientAction::Respond(error_response(
                    "null",
                    INVALID_REQUEST,
                    "a tools/call with an idempotencyKey needs a string or integer id",
                ))
            }
            (Some("initialize" | "server/discover"), Some(id)) => {
                self.discovery.requests.insert(id);
                ClientAction::Forward
            }
            (Some("tools/list"), Some(id)) => {
                self.tools_list = Some(id);
                ClientAction::Forward
            }
            (Some("notifications/cancelled"), None) => self.on_cancelled(&envelope),
            _ => ClientAction::Forward,
        };
        if let (ClientAction::Forward | ClientAction::ForwardTraced { .. }, Some(id)) =
            (&action, request_id)
        {
            if self.pending.len() < MAX_PENDING {
                self.pending.insert(id);
            }
        }
        action
    }

    fn on_cancelled(&mut self, envelope: &RawObject<'_>) -> ClientAction<C> {
        let request_id = envelope
            .get("params")
            .and_then(|p| RawObject::parse(p.get()))
            .and_then(|params| params.get("requestId").and_then(RequestId::from_raw));
        let Some(request_id) = request_id else {
            return ClientAction::Forward;
        };
        // The server may never answer a cancelled request.
        self.pending.remove(&request_id);
        match self.config.cancel {
            CancelPolicy::Absorb => match self.in_flight.get_mut(&request_id) {
                Some(call) => {
                    call.cancelled = true;
                    ClientAction::Absorb
                }
                None => ClientAction::Forward,
            },
            CancelPolicy::Forward => match self.in_flight.remove(&request_id) {
                Some(call) => ClientAction::RecordThenForward(
                    call.claim,
                    Outcome::Unknown {
                        reason: "the client cancelled the call while it ran".into(),
                    },
                ),
                None => ClientAction::Forward,
            },
        }
    }

    /// Tells the interceptor what the transport knows of the trace of the messages it reads next
    /// (the HTTP layer: the request's `traceparent` and session headers).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn set_transport(&mut self, transport: TransportTrace) {
        self.tracing.get_or_insert_default().transport = transport;
    }

    /// What the transport said of the message being read (nothing over stdio).
    pub(super) fn transport(&self) -> &TransportTrace {
        static NONE: TransportTrace = TransportTrace {
            traceparent: None,
            tracestate: None,
            session_id: None,
            protocol_version: None,
        };
        self.tracing
            .as_ref()
            .map_or(&NONE, |tracing| &tracing.transport)
    }

    /// Applies the deduplicator's decision about a keyed call.
    pub fn on_decision(&mut self, call: KeyedCall, decision: Decision<C>) -> Decided {
        match decision {
            Decision::Execute(claim) => {
                let trace = call.span.forwarded();
                let request =
                    self.rewrite_for_server(&call, Some(claim.as_ref().id().key.for_tool()), trace);
                self.in_flight.insert(
                    call.id,
                    InFlight {
                        claim,
                        cancelled: false,
                        span: call.span,
                    },
                );
                Decided::Forward(request)
            }
            Decision::Bypass(_) => {
                let request = self.rewrite_for_server(&call, None, call.span.forwarded());
                if call.span.is_live() {
                    let tracing = self.tracing.get_or_insert_default();
                    tracing.traced.insert(call.id, call.span);
                }
                Decided::Forward(request)
            }
            Decision::Replay(replay) => Decided::Respond(replay.to_response_raw(call.id.as_json())),
            Decision::Reject(rejection) => {
                Decided::Respond(rejection_response(&call.id, &rejection))
            }
        }
    }

    /// Refuses a call the driver could not decide under the server's name
    /// ([`LearnName::Failed`]): answered `idempotency_scope_unknown`, counted.
    pub fn refuse_unnamed(&mut self, call: KeyedCall) -> Decided {
        // Only the client's SEP key is named back; a derived key is the gateway's own.
        let key = call
            .key
            .as_ref()
            .filter(|_| call.terms.source == KeySource::Sep);
        let rejection = Rejection::scope_unknown(key);
        call.span.refused(&rejection);
        let decision = Decision::Reject(rejection);
        #[cfg(feature = "metrics")]
        crate::metrics::on_decision(&decision);
        self.on_decision(call, decision)
    }

    /// Classifies a message from the server.
    pub fn on_server_message(&mut self, message: &str) -> ServerAction<C> {
        let Some(envelope) = RawObject::parse(message) else {
            if let Some(elements) = batch::elements(message) {
                self.on_server_batch(&elements);
            }
            return ServerAction::Forward;
        };
        if envelope.contains("method") {
            if envelope.get_str("method").as_deref() == Some("notifications/tools/list_changed") {
                self.config.listing.on_changed();
            }
            return ServerAction::Forward;
        }
        let Some(id) = envelope.get("id").and_then(RequestId::from_raw) else {
            return ServerAction::Forward;
        };
        if self.discovery.on_probe_answer(&id, &envelope)
            || self.own_listing.on_answer(
                &id,
                &envelope,
                &self.config.listing,
                &self.config.policies,
            )
        {
            return ServerAction::Absorb;
        }
        let was_pending = self.pending.remove(&id);
        // Most responses answer neither a claimed call nor a discovery request: an empty map is
        // not hashed into.
        let claimed = if self.in_flight.is_empty() {
            None
        } else {
            self.in_flight.remove(&id)
        };
        if let Some(span) = self.tracing.as_mut().and_then(|t| t.traced.remove(&id)) {
            span.answered(&envelope);
        }
        if let Some(call) = claimed {
            call.span.answered(&envelope);
            // Some JSON-RPC libraries send the unused member as `null` next to the used one.
            let is_null = |raw: &RawValue| raw.get() == "null";
            let outcome = match (envelope.get("result"), envelope.get("error")) {
                (Some(result), None) => Outcome::Success(result.get().to_owned()),
                (None, Some(error)) => Outcome::Error(error.get().to_owned()),
                (Some(result), Some(error)) if is_null(error) && !is_null(result) => {
                    Outcome::Success(result.get().to_owned())
                }
                (Some(result), Some(error)) if is_null(result) && !is_null(error) => {
                    Outcome::Error(error.get().to_owned())
                }
                _ => Outcome::Unknown {
                    reason: "the server sent a response with neither or both of result and error"
                        .into(),
                },
            };
            return ServerAction::Record {
                claim: call.claim,
                outcome,
                forward: !call.cancelled,
            };
        }
        if self.tools_list.as_ref() == Some(&id) {
            self.tools_list = None;
            if let Some((tools, _)) = listing::entries(&envelope) {
                self.config.learn_tools(&tools);
            }
            if !self.config.tools_checked.is_set()
                && !self.config.policies.is_empty()
                && warn_unlisted(&self.config.policies, &envelope)
            {
                self.config.tools_checked.set();
            }
        }
        if !self.discovery.requests.is_empty() && self.discovery.requests.remove(&id) {
            self.discovery.on_result(&envelope);
            if let Some(rewritten) = inject_capability(&envelope).filter(|_| !self.store_unusable) {
                return ServerAction::ForwardRewritten(rewritten);
            }
        }
        if !was_pending {
            // A response to a request that was never seen, was cancelled, or went untracked past
            // `MAX_PENDING`: passed through as is.
            tracing::debug!(
                id = id.as_json(),
                "passing through a response to no known request"
            );
        }
        ServerAction::Forward
    }

    /// Claimed calls still waiting for the server, for lease renewal.
    pub fn claims_in_flight(&self) -> Vec<Claim> {
        self.in_flight
            .values()
            .map(|call| call.claim.as_ref().clone())
            .collect()
    }

    /// Whether an `initialize` or `server/discover` request was forwarded and its result, which
    /// gets the capability added, has not been seen yet; or a `tools/list` whose answer is checked
    /// against the tool policies.
    pub fn awaits_discovery_result(&self) -> bool {
        !self.discovery.requests.is_empty() || self.tools_list.is_some()
    }

    /// The server's own name (its `serverInfo.name`) from the first `initialize` or
    /// `server/discover` result that gave one; `None` until then. The default namespace of its records is
    /// [`server_namespace`](crate::default_scope::server_namespace) of it.
    pub fn server_name(&self) -> Option<&str> {
        self.discovery.server_name.as_deref()
    }

    /// What to do, before deciding a call under the server's name, while the server has not named
    /// itself: wait for a discovery result that is on its way, or send the gateway's own
    /// `server/discover` (whose answer [`on_server_message`](Self::on_server_message) absorbs),
    /// so that the namespace a call is decided under never depends on what its connection sent
    /// before it.
    pub fn learn_server_name(&mut self) -> LearnName {
        let (in_flight, pending) = (&self.in_flight, &self.pending);
        self.discovery
            .learn(|id| in_flight.contains_key(id) || pending.contains(id))
    }

    /// Whether calls are waiting for the server: claimed calls, or traced calls whose spans wait
    /// for the answer.
    pub fn has_calls_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
            || self
                .tracing
                .as_ref()
                .is_some_and(|tracing| !tracing.traced.is_empty())
    }

    /// The `traceparent` of the request forwarded for the call `id` (the span of the forwarded
    /// request), for a transport header beside `_meta`; `None` when the call is not traced.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn outgoing_traceparent(&self, id: &RequestId) -> Option<String> {
        match self.in_flight.get(id) {
            Some(call) => call.span.forwarded_traceparent(),
            None => self
                .tracing
                .as_ref()?
                .traced
                .get(id)?
                .forwarded_traceparent(),
        }
    }

    /// Whether any client request forwarded to the server is still unanswered: a claimed call,
    /// or another request the interceptor tracks (every forwarded request with an id, up to a
    /// limit, until its response or its cancellation).
    pub fn has_requests_in_flight(&self) -> bool {
        !self.in_flight.is_empty() || !self.pending.is_empty()
    }

    /// The server went away: every claimed call in flight becomes an orphan to record as
    /// outcome-unknown and to answer with `idempotency_outcome_unknown`.
    pub fn on_server_gone(&mut self, reason: &str) -> Vec<Orphan<C>> {
        self.discovery.clear();
        self.own_listing.clear();
        self.pending.clear();
        if let Some(tracing) = &mut self.tracing {
            for (_, span) in tracing.traced.drain() {
                span.unanswered();
            }
        }
        self.in_flight
            .drain()
            .map(|(id, call)| {
                call.span.unanswered();
                let response = (!call.cancelled).then(|| {
                    let rejection = Rejection::new(
                        RejectionKind::OutcomeUnknown,
                        format!(
                            "{reason} before answering; the call may or may not have taken effect"
                        ),
                    )
                    .with_key(call.claim.as_ref().id().key.for_tool());
                    rejection_response(&id, &rejection)
                });
                Orphan {
                    claim: call.claim,
                    response,
                }
            })
            .collect()
    }

    /// Tells the interceptor whether the store is usable
    /// ([`Deduplicator::store_usable`](crate::Deduplicator::store_usable)): the capability is
    /// advertised only while it is.
    pub fn set_store_usable(&mut self, usable: bool) {
        self.store_unusable = !usable;
    }
}

/// Whether the message's `params` is an object with an `idempotencyKey` member.
fn has_key(envelope: &RawObject<'_>) -> bool {
    envelope
        .get("params")
        .and_then(|p| RawObject::parse(p.get()))
        .is_some_and(|params| params.contains(IDEMPOTENCY_KEY))
}

fn rejection_response(id: &RequestId, rejection: &Rejection) -> String {
    raw_error_response(id.as_json(), &rejection.to_error_object().to_string())
}
