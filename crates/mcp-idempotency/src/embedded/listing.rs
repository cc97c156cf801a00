//! The server's tools, learned before a key-less call is decided under the suggested policy
//! (`tools = "suggested"`), as `wrap` learns them (the interceptor's own `tools/list`,
//! `interceptor/listing.rs`): the host runs the request on its own server, in process, and hands
//! the answer back. So a retry is decided as the first call was whether or not any client
//! listed the tools.

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::Connection;
use crate::interceptor::LearnTools;

impl Connection {
    /// Before `message` is handed over ([`from_client`](Self::from_client),
    /// [`receive`](Self::receive)): with `tools = "suggested"`, when `message` may be a
    /// `tools/call` and the server's tools are not known yet, the `tools/list` request (one page)
    /// to run on the host's own server. Its answer (result or error, with the request's id) goes
    /// to [`from_server`](Self::from_server), which absorbs it; then ask again, until `None`
    /// (every page read, the server answered with an error, or nothing to list): hand `message`
    /// over. The request carries the protocol members of `message`'s `params._meta`
    /// (`io.modelcontextprotocol/…`, which MCP 2026-07-28 requires on every request).
    ///
    /// A tool the listing did not name runs as with no policy, and is counted as unprotected.
    pub fn tools_request(&self, message: &str) -> Option<String> {
        if !self.lists_tools {
            return None;
        }
        let mut interceptor = self.lock();
        if !self.listing.load(Ordering::SeqCst) && !interceptor.needs_tools(message) {
            return None;
        }
        match interceptor.learn_tools() {
            LearnTools::Known => None,
            LearnTools::Send(request) => {
                self.listing.store(true, Ordering::SeqCst);
                Some(with_protocol_meta(request, message))
            }
            // The answer to the last request was not handed back: decide without it.
            LearnTools::Wait => {
                interceptor.give_up_tools();
                None
            }
        }
    }
}

/// `request` with the `io.modelcontextprotocol/` members of `message`'s `params._meta`, if any.
fn with_protocol_meta(request: String, message: &str) -> String {
    let Ok(call) = serde_json::from_str::<Value>(message) else {
        return request;
    };
    let Some(meta) = call.pointer("/params/_meta").and_then(Value::as_object) else {
        return request;
    };
    let protocol: serde_json::Map<String, Value> = meta
        .iter()
        .filter(|(name, _)| name.starts_with("io.modelcontextprotocol/"))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    if protocol.is_empty() {
        return request;
    }
    let Ok(mut request) = serde_json::from_str::<Value>(&request) else {
        return request;
    };
    request["params"]["_meta"] = Value::Object(protocol);
    request.to_string()
}
