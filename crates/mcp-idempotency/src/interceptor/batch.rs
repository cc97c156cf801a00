//! JSON-RPC batches: a message that is an array of messages.
//!
//! MCP 2025-03-26 allowed batches; 2025-06-18 removed them, and later revisions have none. A batch
//! is one message to the transport, so the interceptor decides it as a whole:
//!
//! - A batch the interceptor has nothing to do with (no `tools/call` with an `idempotencyKey`, no
//!   request reusing the id of a keyed call in flight, no cancellation of one) is forwarded
//!   untouched, as any message the interceptor does not act on. Its request ids count as
//!   requests in flight until the server answers them, as for single requests.
//! - Any other batch is refused whole: nothing in it is forwarded, and each element with an id
//!   gets a `-32600` error whose `data.type` is [`BATCH_REFUSED`], all in one batch response. A
//!   batch without ids (notifications only) is dropped, since JSON-RPC answers such a batch with
//!   nothing.
//!
//! Deciding each element instead would mean splitting the batch, answering part of it here and
//! merging the server's batch response with ours; a payment gateway gains nothing from that, and a
//! client that sends keyed calls one per message loses nothing.
//!
//! ```
//! use mcp_idempotency::interceptor::{ClientAction, Interceptor, BATCH_REFUSED};
//! use serde_json::Value;
//!
//! let mut interceptor = Interceptor::<mcp_idempotency::Claim>::default();
//! let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call",
//!     "params":{"name":"charge","arguments":{},"idempotencyKey":"k-1"}},
//!     {"jsonrpc":"2.0","id":2,"method":"tools/list"}]"#;
//! let ClientAction::Respond(answer) = interceptor.on_client_message(batch) else {
//!     panic!("a batch with a keyed call is answered here");
//! };
//! let answer: Value = serde_json::from_str(&answer).unwrap();
//! assert_eq!(answer[0]["id"], 1);
//! assert_eq!(answer[1]["error"]["code"], -32600);
//! assert_eq!(answer[1]["error"]["data"]["type"], BATCH_REFUSED);
//!
//! // Without a keyed call, the batch goes to the server untouched.
//! let plain = r#"[{"jsonrpc":"2.0","id":3,"method":"tools/list"}]"#;
//! assert!(matches!(interceptor.on_client_message(plain), ClientAction::Forward));
//! ```

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{has_key, Interceptor, RequestId, MAX_PENDING};
use crate::engine::Claim;
use crate::interceptor::ClientAction;
use crate::jsonrpc::{error_response_with_data, INVALID_REQUEST};
use crate::raw_object::RawObject;

/// `error.data.type` of the errors answering a refused batch.
pub const BATCH_REFUSED: &str = "mcp_idem_batch_refused";

/// The elements of `message` if it is a JSON array.
pub(super) fn elements(message: &str) -> Option<Vec<&RawValue>> {
    if !message.trim_start().starts_with('[') {
        return None;
    }
    serde_json::from_str(message).ok()
}

/// One element of a batch, as far as the interceptor reads it.
struct Element<'a> {
    object: RawObject<'a>,
    method: Option<String>,
    id: Option<&'a RawValue>,
}

impl<C: AsRef<Claim>> Interceptor<C> {
    /// Decides a batch from the client (see the module docs).
    pub(super) fn on_client_batch(&mut self, elements: &[&RawValue]) -> ClientAction<C> {
        let elements: Vec<Element<'_>> = elements
            .iter()
            .filter_map(|raw| {
                let object = RawObject::parse(raw.get())?;
                Some(Element {
                    method: object.get_str("method"),
                    id: object.get("id"),
                    object,
                })
            })
            .collect();
        // Requests (not the client's responses to server requests) and their ids.
        let requests = || elements.iter().filter(|e| e.method.is_some());
        let Some(reason) = self.batch_refusal(&elements) else {
            for id in requests().filter_map(|e| e.id.and_then(RequestId::from_raw)) {
                if self.pending.len() < MAX_PENDING {
                    self.pending.insert(id);
                }
            }
            return ClientAction::Forward;
        };
        let data: Value = json!({"type": BATCH_REFUSED});
        let responses: Vec<String> = requests()
            .filter_map(|e| e.id)
            .map(|id| {
                let id = RequestId::from_raw(id).map_or_else(|| "null".to_owned(), |id| id.0);
                error_response_with_data(&id, INVALID_REQUEST, &reason, Some(data.clone()))
            })
            .collect();
        tracing::warn!(elements = elements.len(), %reason, "refused a JSON-RPC batch");
        if responses.is_empty() {
            return ClientAction::Absorb;
        }
        ClientAction::Respond(format!("[{}]", responses.join(",")))
    }

    /// Why the batch cannot be forwarded untouched, if it cannot.
    fn batch_refusal(&self, elements: &[Element<'_>]) -> Option<String> {
        const REFUSED: &str = "the whole batch was refused and nothing in it ran";
        let keyed = elements.iter().any(|e| {
            e.method.as_deref() == Some("tools/call") && e.id.is_some() && has_key(&e.object)
        });
        if keyed {
            return Some(format!(
                "a JSON-RPC batch cannot carry a tools/call with an idempotencyKey: {REFUSED}; \
                 send keyed tool calls one per message"
            ));
        }
        let reused = elements
            .iter()
            .filter(|e| e.method.is_some())
            .filter_map(|e| e.id.and_then(RequestId::from_raw))
            .find(|id| self.in_flight.contains_key(id));
        if let Some(id) = reused {
            return Some(format!(
                "request id {} in this batch is already used by a tools/call in flight: {REFUSED}",
                id.as_json()
            ));
        }
        let cancelled = elements
            .iter()
            .filter(|e| e.method.as_deref() == Some("notifications/cancelled"))
            .filter_map(|e| {
                let params = RawObject::parse(e.object.get("params")?.get())?;
                RequestId::from_raw(params.get("requestId")?)
            })
            .find(|id| self.in_flight.contains_key(id));
        cancelled.map(|id| {
            format!(
                "this batch cancels the keyed tools/call {} in flight: {REFUSED}; send \
                 notifications/cancelled on its own",
                id.as_json()
            )
        })
    }

    /// Notes the server's answers in a batch response: their requests are no longer in flight.
    pub(super) fn on_server_batch(&mut self, elements: &[&RawValue]) {
        for element in elements {
            let Some(object) = RawObject::parse(element.get()) else {
                continue;
            };
            if object.contains("method") {
                continue;
            }
            if let Some(id) = object.get("id").and_then(RequestId::from_raw) {
                self.pending.remove(&id);
                if self.in_flight.contains_key(&id) {
                    // Keyed calls never travel in a forwarded batch; a server that answers one
                    // inside a batch response leaves it unrecorded until the server exits.
                    tracing::warn!(
                        id = id.as_json(),
                        "the server answered a keyed call inside a batch; it is not recorded"
                    );
                }
            }
        }
    }
}
