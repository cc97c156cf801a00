//! What the gateway learns from the server's `tools/list` answers: which tools could repeat their
//! side effect under a key-less retry (logged once when no tool policy is set; their key-less
//! calls counted as unprotected), and, with `--tools suggested`, the policies that apply to them.
//! Also the gateway's own `tools/list`, sent before a key-less call is decided under the
//! suggestion while the server's tools are not known yet.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::RequestId;
use crate::policy::suggest::{self, ToolReport};
use crate::policy::ToolPolicies;
use crate::raw_object::{json_string, RawObject};

/// What the server's tools are known to be, shared by the clones of a configuration (the HTTP
/// layer makes one interceptor per request; `proxy` lists the tools itself).
#[derive(Clone, Debug, Default)]
pub(super) struct SharedListing(Arc<Mutex<Listing>>, Arc<Changes>);

/// How many times the server said its tools changed, and who waits for the next time.
#[derive(Debug, Default)]
struct Changes {
    seen: std::sync::atomic::AtomicU64,
    notify: tokio::sync::Notify,
}

impl PartialEq for SharedListing {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SharedListing {}

#[derive(Debug, Default)]
struct Listing {
    /// Each listed tool, classified as `mcp-idem tools` does.
    tools: BTreeMap<String, ToolReport>,
    /// With `--tools suggested`, the policies once tools are listed.
    policies: Option<Arc<ToolPolicies>>,
    /// Whether the tools at risk were logged.
    logged: bool,
    /// The command that prints a policy for this server, named in that log.
    command: Option<String>,
    /// The counters of unprotected calls to listed tools, by tool, made at their first call.
    #[cfg(feature = "metrics")]
    counters: BTreeMap<String, metrics::Counter>,
    /// The counter of unprotected calls to tools the server did not list.
    #[cfg(feature = "metrics")]
    unlisted: Option<metrics::Counter>,
}

#[cfg(feature = "metrics")]
/// The label of a call to a tool the server did not list (a name a client made up is never a
/// label).
const UNLISTED: &str = "(unlisted)";

impl SharedListing {
    fn lock(&self) -> MutexGuard<'_, Listing> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The server said its tools changed (`notifications/tools/list_changed`).
    pub(super) fn on_changed(&self) {
        self.1
            .seen
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.1.notify.notify_waiters();
    }

    /// Whether the server listed `tool`: only such names label a series (`gen_ai.tool.name`).
    pub(super) fn lists(&self, tool: &str) -> bool {
        self.lock().tools.contains_key(tool)
    }

    /// Whether any tool is known.
    pub(super) fn is_known(&self) -> bool {
        !self.lock().tools.is_empty()
    }

    /// The policies that apply now: `base`, or with `--tools suggested` once tools are listed,
    /// the suggestion with `base`'s tables over it.
    pub(super) fn policies(&self, base: &Arc<ToolPolicies>) -> Arc<ToolPolicies> {
        if !base.is_suggested() {
            return Arc::clone(base);
        }
        self.lock()
            .policies
            .clone()
            .unwrap_or_else(|| Arc::clone(base))
    }

    /// Takes the entries of a `tools/list` answer (one page): each is classified, the policies
    /// are derived again, and the tools at risk are logged the first time.
    pub(super) fn learn(&self, base: &ToolPolicies, entries: &[Value]) {
        let mut listing = self.lock();
        for report in suggest::classify(entries) {
            listing.tools.insert(report.name.clone(), report);
        }
        if base.is_suggested() {
            let reports: Vec<ToolReport> = listing.tools.values().cloned().collect();
            match base.with_listed_tools(&reports) {
                Ok(policies) => {
                    for (tool, policy) in policies.named_tools() {
                        if listing
                            .policies
                            .as_ref()
                            .is_none_or(|old| old.for_tool(tool) != Some(policy))
                        {
                            tracing::info!(tool, policy = %policy.to_string().trim_end().replace('\n', "; "), "suggested tool policy applied");
                        }
                    }
                    listing.policies = Some(Arc::new(policies));
                }
                // A listed tool's table cannot be wrong (the suggestion is checked by the tests
                // and the tables were checked at start), but say so rather than apply half.
                Err(err) => tracing::warn!(%err, "cannot apply the suggested tool policies"),
            }
        }
        if !listing.logged && base.is_empty() && !base.is_suggested() {
            listing.logged = true;
            let at_risk: Vec<&str> = listing
                .tools
                .values()
                .filter(|report| !report.suggestion.is_left_out())
                .map(|report| report.name.as_str())
                .collect();
            if !at_risk.is_empty() {
                let command = listing
                    .command
                    .as_deref()
                    .unwrap_or("mcp-idem tools -- SERVER COMMAND");
                tracing::warn!(
                    tools = at_risk.join(", "),
                    "no tool policy is set: a call to these tools that carries no idempotency key \
                     runs again when a client retries it. `{command}` prints a policy for them; \
                     `--tools suggested` applies it"
                );
            }
        }
    }

    /// Counts a `tools/call` that carries no key and that no policy protects, by its tool when
    /// the server listed it and it may change things; a read-only or idempotent tool is not
    /// counted. `tool` reads the call's tool name, only once some tool is listed (before, every
    /// call is `(unlisted)`).
    #[cfg(feature = "metrics")]
    pub(super) fn on_unprotected<'a>(
        &self,
        tool: impl FnOnce() -> Option<std::borrow::Cow<'a, str>>,
    ) {
        let mut listing = self.lock();
        let tool = if listing.tools.is_empty() {
            None
        } else {
            tool()
        };
        let tool = tool.as_deref();
        let Listing {
            tools,
            counters,
            unlisted,
            ..
        } = &mut *listing;
        // Each label's counter is made once (its key built and hashed then), so that a call
        // passing through costs an atomic increment, not an allocation.
        match tool.and_then(|tool| tools.get_key_value(tool)) {
            Some((_, report)) if report.suggestion.is_left_out() => {}
            Some((name, _)) => match counters.get(name) {
                Some(counter) => counter.increment(1),
                None => {
                    let counter = crate::metrics::unprotected_calls(name.clone().into());
                    counter.increment(1);
                    counters.insert(name.clone(), counter);
                }
            },
            None => unlisted
                .get_or_insert_with(|| crate::metrics::unprotected_calls(UNLISTED.into()))
                .increment(1),
        }
    }
}

/// A `tools/list` answer's entries and its `nextCursor`; `None` when it is not a result.
pub(super) fn entries(envelope: &RawObject<'_>) -> Option<(Vec<Value>, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct Listed {
        tools: Vec<Value>,
        #[serde(rename = "nextCursor")]
        next_cursor: Option<String>,
    }
    let listed: Listed = serde_json::from_str(envelope.get("result")?.get()).ok()?;
    Some((listed.tools, listed.next_cursor))
}

/// The tool a `tools/call`'s params name, when they can be read: off their text when the name
/// leads (as clients write it), else parsed.
#[cfg(feature = "metrics")]
pub(super) fn tool_name(
    params: Option<&serde_json::value::RawValue>,
) -> Option<std::borrow::Cow<'_, str>> {
    let params = params?.get();
    if !params.contains("\\u") {
        if let Some(name) = crate::policy::prefilter::leading_name(params) {
            return Some(name.into());
        }
    }
    RawObject::parse(params)?.get_str("name").map(Into::into)
}

/// What a driver that decides key-less calls under the suggested policy does before deciding a
/// call while the server's tools are not known ([`Interceptor::learn_tools`](super::Interceptor::learn_tools)).
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub enum LearnTools {
    /// The tools are known, or cannot be: decide the call.
    Known,
    /// Send this request (the gateway's own `tools/list`, or its next page) to the server, then
    /// wait as for [`Wait`](Self::Wait). Its answer never reaches the client.
    Send(String),
    /// The gateway's own `tools/list` is on its way: ask again once the server has answered.
    Wait,
}

/// The gateway's own `tools/list`, per connection.
#[derive(Debug, Default)]
pub(super) struct OwnListing {
    /// The request in flight.
    probe: Option<RequestId>,
    /// How many were sent (their ids are numbered).
    sent: u64,
    /// The cursor of the next page to ask for.
    next: Option<String>,
    /// The server answered it with an error, or went away: not asked again.
    failed: bool,
    /// Every page was read.
    done: bool,
}

impl OwnListing {
    /// The next step before a key-less call is decided under the suggestion; `in_use` tells
    /// whether an id is taken by a client request.
    pub(super) fn learn(&mut self, known: bool, in_use: impl Fn(&RequestId) -> bool) -> LearnTools {
        if self.failed || self.done {
            return LearnTools::Known;
        }
        if self.probe.is_some() {
            return LearnTools::Wait;
        }
        if known && self.next.is_none() {
            return LearnTools::Known;
        }
        let (text, id) = loop {
            self.sent += 1;
            let text = format!("mcp-idem/tools-list-{}", self.sent);
            let id = RequestId(json_string(&text));
            if !in_use(&id) {
                break (text, id);
            }
        };
        self.probe = Some(id);
        let params = match self.next.take() {
            Some(cursor) => serde_json::json!({ "cursor": cursor }),
            None => serde_json::json!({}),
        };
        let request = serde_json::json!({
            "jsonrpc": "2.0", "id": text, "method": "tools/list", "params": params,
        });
        LearnTools::Send(request.to_string())
    }

    /// Whether `id` answers the gateway's own `tools/list`; if so, what it listed is learned.
    pub(super) fn on_answer(
        &mut self,
        id: &RequestId,
        envelope: &RawObject<'_>,
        listing: &SharedListing,
        base: &ToolPolicies,
    ) -> bool {
        if self.probe.as_ref() != Some(id) {
            return false;
        }
        self.probe = None;
        match entries(envelope) {
            Some((tools, next)) => {
                listing.learn(base, &tools);
                self.done = next.is_none();
                self.next = next;
            }
            None => {
                tracing::warn!(
                    "the server did not answer mcp-idem's tools/list; key-less calls run as \
                     with no suggested policy until a client lists the tools"
                );
                self.failed = true;
            }
        }
        true
    }

    /// The answer did not come in time: calls are decided without it from now on (a late answer
    /// is still absorbed and learned).
    pub(super) fn give_up(&mut self) {
        self.failed = true;
    }

    /// The server went away: the answer will not come.
    pub(super) fn clear(&mut self) {
        if self.probe.take().is_some() {
            self.failed = true;
        }
    }
}

impl super::InterceptorConfig {
    /// The command that prints a policy for this server (`mcp-idem tools -- python server.py`),
    /// named when the tools at risk are logged.
    pub fn policy_command(self, command: impl Into<String>) -> Self {
        self.listing.lock().command = Some(command.into());
        self
    }

    /// Takes the entries of the server's `tools/list` (listed by the gateway itself, as `proxy`
    /// does at start and on `notifications/tools/list_changed`): with `--tools suggested` their
    /// policies apply from now on, in every interceptor made from this configuration.
    pub fn learn_tools(&self, entries: &[Value]) {
        self.listing.learn(&self.policies, entries);
    }

    /// Resolves at the next `notifications/tools/list_changed` an interceptor made from this
    /// configuration passes to the client (a driver that lists the tools itself lists them
    /// again). Call it before listing, so that a change in between is not missed.
    pub fn tools_changed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let changes = Arc::clone(&self.listing.1);
        let before = changes.seen.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            loop {
                let notified = changes.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if changes.seen.load(std::sync::atomic::Ordering::SeqCst) != before {
                    return;
                }
                notified.await;
            }
        }
    }
}

impl<C: AsRef<crate::Claim>> super::Interceptor<C> {
    /// Whether `message` may be a `tools/call` to decide under the suggested policy
    /// (`--tools suggested`) while the server's tools are not known yet: if so, the driver asks
    /// [`learn_tools`](Self::learn_tools) before [`on_client_message`](Self::on_client_message).
    pub fn needs_tools(&self, message: &str) -> bool {
        self.config.policies.is_suggested()
            && message.contains("tools/call")
            && !self.config.listing.is_known()
    }

    /// What to do before deciding a call under the suggested policy while the server's tools are
    /// not known: send the gateway's own `tools/list` (whose answer
    /// [`on_server_message`](Self::on_server_message) absorbs), wait for it, or decide.
    pub fn learn_tools(&mut self) -> LearnTools {
        let known = self.config.listing.is_known();
        let (in_flight, pending) = (&self.in_flight, &self.pending);
        self.own_listing.learn(known, |id| {
            in_flight.contains_key(id) || pending.contains(id)
        })
    }

    /// The server did not answer the gateway's own `tools/list` in time: later calls do not wait
    /// for it ([`learn_tools`](Self::learn_tools) says [`LearnTools::Known`]).
    pub fn give_up_tools(&mut self) {
        self.own_listing.give_up();
    }
}
