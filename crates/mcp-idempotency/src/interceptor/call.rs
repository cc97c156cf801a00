//! A keyed `tools/call`: what the interceptor reads from it (which key decides it, by the tool's
//! policy), and the request the server gets once it is to run.

use std::ops::Range;

use serde_json::Value;

use super::{ClientAction, Interceptor, RequestId, META_KEY};
use crate::call_span::{CallSpan, SpanStart};
use crate::engine::{BypassReason, Claim, Decision, ToolCall};
use crate::jsonrpc::{error_response, INVALID_PARAMS, INVALID_REQUEST};
use crate::policy::prefilter;
use crate::policy::select::{self, Chosen};
use crate::policy::KeyTerms;
use crate::protocol::IDEMPOTENCY_KEY;
use crate::raw_object::{json_string, RawObject};

/// A keyed `tools/call` waiting for its decision.
#[derive(Clone, Debug)]
pub struct KeyedCall {
    pub(super) id: RequestId,
    pub(super) message: String,
    /// Where `params` is in `message`, when the envelope names it once: the rewrite for the
    /// server then puts the new `params` in its place without reading the envelope again.
    pub(super) params_at: Option<Range<usize>>,
    pub(super) tool_name: String,
    pub(super) arguments: Option<String>,
    pub(super) key: Option<Value>,
    pub(super) mrtr_continuation: bool,
    /// The tool policy's choice: the key's source and the terms the call is decided on.
    pub(super) terms: Box<KeyTerms>,
    /// The call's span (empty unless tracing is on or durations are recorded).
    pub(super) span: CallSpan,
}

impl KeyedCall {
    /// The facts the engine decides on.
    pub fn tool_call(&self) -> ToolCall<'_> {
        ToolCall {
            trace: self.span.link(),
            tool_name: &self.tool_name,
            arguments: self.arguments.as_deref(),
            idempotency_key: self.key.as_ref(),
            mrtr_continuation: self.mrtr_continuation,
            terms: &self.terms,
        }
    }

    /// The terms the call is decided on: where its key comes from, and how long a duplicate that
    /// finds it still running waits for its outcome ([`KeyTerms::wait`]), among others.
    pub fn terms(&self) -> &KeyTerms {
        &self.terms
    }

    /// The request's id.
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// The call's span, which the deduplicator feeds the decision and the store's operations.
    pub(crate) fn span(&self) -> &CallSpan {
        &self.span
    }
}

impl<C: AsRef<Claim>> Interceptor<C> {
    pub(super) fn on_tool_call(
        &mut self,
        message: &str,
        envelope: &RawObject<'_>,
        id: RequestId,
    ) -> ClientAction<C> {
        let policies = self.config.listing.policies(&self.config.policies);
        // Most calls carry no key and their tool has no policy: they are not parsed further.
        let params = envelope
            .get("params")
            .filter(|p| prefilter::needs_parsing(message, p, &policies))
            .and_then(|p| RawObject::parse(p.get()));
        let Some(params) = params else {
            #[cfg(feature = "metrics")]
            self.config
                .listing
                .on_unprotected(|| super::listing::tool_name(envelope.get("params")));
            unkeyed(None);
            return self.traced_unkeyed(message, envelope, None, id);
        };
        let tool = params.get_str("name").unwrap_or_default();
        let choice = match select::choose(&policies, &tool, &params) {
            Chosen::Key(choice) => choice,
            Chosen::Unkeyed { missing } => {
                #[cfg(feature = "metrics")]
                if missing.is_none() {
                    self.config
                        .listing
                        .on_unprotected(|| Some(tool.as_str().into()));
                }
                unkeyed(missing.map(|m| (tool, m)));
                return self.traced_unkeyed(message, envelope, Some(&params), id);
            }
            Chosen::Refused(message) => {
                return ClientAction::Respond(error_response(
                    id.as_json(),
                    INVALID_PARAMS,
                    &message,
                ))
            }
        };
        if self.pending.contains(&id) {
            return ClientAction::Respond(error_response(
                id.as_json(),
                INVALID_REQUEST,
                &format!(
                    "request id {} is already used by a request in flight",
                    id.as_json()
                ),
            ));
        }
        let tool_name = match params.get_str("name") {
            Some(name) => name,
            None if choice.mrtr_continuation => String::new(),
            None => {
                return ClientAction::Respond(error_response(
                    id.as_json(),
                    INVALID_PARAMS,
                    "tools/call needs `params.name`, a string",
                ))
            }
        };
        let span = self.call_span(&params, &tool_name, &id);
        ClientAction::Decide(KeyedCall {
            span,
            params_at: envelope
                .only("params")
                .and_then(|raw| span_of(message, raw.get())),
            message: message.to_owned(),
            tool_name,
            arguments: params.get("arguments").map(|raw| raw.get().to_owned()),
            key: choice.key,
            mrtr_continuation: choice.mrtr_continuation,
            terms: Box::new(choice.terms),
            id,
        })
    }

    /// The span of the call `id` to `tool_name` (empty unless tracing is on or durations are
    /// recorded): its parent from `params._meta` or the transport.
    fn call_span(&self, params: &RawObject<'_>, tool_name: &str, id: &RequestId) -> CallSpan {
        if !CallSpan::wanted() {
            return CallSpan::none();
        }
        CallSpan::start(SpanStart {
            listed: self.config.listing.lists(tool_name),
            meta: params
                .get("_meta")
                .and_then(|meta| RawObject::parse(meta.get()))
                .as_ref(),
            tool: tool_name,
            request_id: id.as_json(),
            transport: self.transport(),
            negotiated_version: self.discovery.protocol_version.as_deref(),
        })
    }

    /// A `tools/call` no key protects, forwarded: as it is, unless tracing is on; then it gets a
    /// span (decision `bypass`, reason `no_key`) that waits for the server's answer (and, with a
    /// metrics recorder, times the call), and `_meta` carries that span to the server. Durations
    /// alone do not make it read: timing it means reading the server's answer, which costs a
    /// pass-through call about a third more over HTTP (docs/benchmarks.md, "Tracing cost").
    fn traced_unkeyed(
        &mut self,
        message: &str,
        envelope: &RawObject<'_>,
        params: Option<&RawObject<'_>>,
        id: RequestId,
    ) -> ClientAction<C> {
        if !CallSpan::tracing() {
            return ClientAction::Forward;
        }
        // `params` when the policy step read it already, else read here (tracing on only).
        let parsed;
        let params = match params {
            Some(params) => params,
            None => match envelope
                .get("params")
                .and_then(|p| RawObject::parse(p.get()))
            {
                Some(read) => {
                    parsed = read;
                    &parsed
                }
                None => return ClientAction::Forward,
            },
        };
        let Some(tool_name) = params.get_str("name") else {
            return ClientAction::Forward;
        };
        let span = self.call_span(params, &tool_name, &id);
        span.decided(
            &Decision::<()>::Bypass(BypassReason::NoKey),
            NO_KEY_SOURCE,
            None,
            None,
            0,
        );
        let request = match span.forwarded() {
            Some(trace) => {
                let params_at = envelope
                    .only("params")
                    .and_then(|raw| span_of(message, raw.get()));
                self.rewrite_message(message, params_at.as_ref(), None, Some(trace))
            }
            None => message.to_owned(),
        };
        if span.is_live() {
            let tracing = self.tracing.get_or_insert_default();
            tracing.traced.insert(id.clone(), span);
        }
        ClientAction::ForwardTraced {
            id,
            message: request,
        }
    }

    /// The request for the server: without `idempotencyKey` unless configured, and with the key in
    /// `_meta` when the call was claimed.
    ///
    /// With `trace` (the forwarded request's span, as `traceparent` and `tracestate`), `_meta`
    /// carries it instead of what the client sent, so that the server's span is a child of
    /// mcp-idem's; `baggage` and every other member stay as they were.
    pub(super) fn rewrite_for_server(
        &self,
        call: &KeyedCall,
        claimed_key: Option<&str>,
        trace: Option<(String, Option<String>)>,
    ) -> String {
        self.rewrite_message(&call.message, call.params_at.as_ref(), claimed_key, trace)
    }

    /// [`rewrite_for_server`](Self::rewrite_for_server) of `message`, whose `params` is at
    /// `params_at` when known.
    fn rewrite_message(
        &self,
        message: &str,
        params_at: Option<&Range<usize>>,
        claimed_key: Option<&str>,
        trace: Option<(String, Option<String>)>,
    ) -> String {
        if self.config.forward_key && claimed_key.is_none() && trace.is_none() {
            return message.to_owned();
        }
        let rewrite_params = |params: &str| {
            let mut params = RawObject::parse(params)?;
            if !self.config.forward_key {
                params.remove(IDEMPOTENCY_KEY);
            }
            if claimed_key.is_none() && trace.is_none() {
                return Some(params.to_json());
            }
            let meta = params
                .get("_meta")
                .and_then(|m| RawObject::parse(m.get()))
                .unwrap_or_default();
            let key = claimed_key.map(|key| (META_KEY, json_string(key)));
            let (traceparent, tracestate) = match &trace {
                Some((parent, state)) => (
                    Some(("traceparent", json_string(parent))),
                    state
                        .as_deref()
                        .map(|state| ("tracestate", json_string(state))),
                ),
                None => (None, None),
            };
            let set: Vec<(&str, &str)> = [key.as_ref(), traceparent.as_ref(), tracestate.as_ref()]
                .into_iter()
                .flatten()
                .map(|(name, value)| (*name, value.as_str()))
                .collect();
            Some(params.to_string_with("_meta", &meta.to_string_with_all(&set)))
        };
        let rewritten = match params_at {
            Some(at) => message
                .get(at.clone())
                .and_then(rewrite_params)
                .map(|params| [&message[..at.start], params.as_str(), &message[at.end..]].concat()),
            // `params` named twice (or not found): every one goes, the rewritten one is written.
            None => RawObject::parse(message).and_then(|envelope| {
                let params = rewrite_params(envelope.get("params")?.get())?;
                Some(envelope.to_string_with("params", &params))
            }),
        };
        rewritten.unwrap_or_else(|| message.to_owned())
    }
}

/// The `mcp_idem.key.source` of a call no key protects.
const NO_KEY_SOURCE: &str = "none";

/// A `tools/call` no key protects: counted (with the tool and the
/// identifier it lacked, when its policy wanted one).
fn unkeyed(missing: Option<(String, String)>) {
    // Without `metrics` the `None` arm is empty.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::single_match))]
    match missing {
        Some((tool, wanted)) => {
            tracing::info!(
                tool,
                wanted,
                "a call without the identifier its tool's policy names runs unprotected"
            );
            #[cfg(feature = "metrics")]
            crate::metrics::on_missing_identifier();
        }
        None => {
            #[cfg(feature = "metrics")]
            crate::metrics::on_decision(&Decision::<()>::Bypass(BypassReason::NoKey));
        }
    }
}

/// Where `part` (a slice of `text`, as the values of a [`RawObject`] read from it are) is in
/// `text`; `None` if it is not a slice of it.
fn span_of(text: &str, part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let at = start..start.checked_add(part.len())?;
    text.get(at.clone())
        .filter(|found| found.as_ptr() == part.as_ptr())
        .map(|_| at)
}
