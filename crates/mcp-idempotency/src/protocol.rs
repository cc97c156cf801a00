//! The MCP protocol as this crate's clients speak it: the revisions they name, and the two
//! handshakes that open a conversation, `server/discover` (2026-07-28, stateless) and the legacy
//! `initialize`: the requests, and what is read from their results. Sans-IO.
//!
//! Used by the retrying `client`, the `bridge`, and `mcp-idem check` and the demo of the binary.

use crate::raw_object::RawObject;
use serde_json::{json, Value};

/// The current revision: stateless, opened with `server/discover`, `_meta` on every request.
pub const V_2026_07_28: &str = "2026-07-28";
/// The last revision of the `initialize` era: what the retrying client offers to a legacy server.
pub const V_2025_11_25: &str = "2025-11-25";
/// The `initialize` revision `mcp-idem check` and the demo offer.
pub const V_2025_06_18: &str = "2025-06-18";

/// The `_meta` member that names a 2026-07-28 request's protocol revision.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// The `_meta` member that carries a 2026-07-28 request's client capabilities.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// `server/discover`: the first request of the 2026-07-28 era.
pub const DISCOVER: &str = "server/discover";
/// `initialize`: the legacy handshake's request.
pub const INITIALIZE: &str = "initialize";
/// `params.idempotencyKey` of a `tools/call`: SEP-3182's key (also the default `_meta` member a
/// client's key is read from, and the member of `error.data` that names a refused key).
pub const IDEMPOTENCY_KEY: &str = "idempotencyKey";

/// Whether `tools/call` params are an MRTR continuation (`requestState` or `inputResponses`
/// present): out of SEP-3182's scope, never keyed by a policy.
pub(crate) fn is_mrtr_continuation(params: &RawObject<'_>) -> bool {
    params.contains("requestState") || params.contains("inputResponses")
}

/// `notifications/initialized`: what a legacy client sends once `initialize` succeeded.
pub const INITIALIZED: &str = "notifications/initialized";

/// The `_meta` of a 2026-07-28 request: the revision, and no client capabilities.
pub fn request_meta() -> Value {
    json!({
        META_PROTOCOL_VERSION: V_2026_07_28,
        META_CLIENT_CAPABILITIES: {},
    })
}

/// The params of `server/discover`.
pub fn discover_params() -> Value {
    json!({"_meta": request_meta()})
}

/// The params of `initialize` offering `version`, for a client called `client_name` (no client
/// capabilities).
pub fn initialize_params(version: &str, client_name: &str) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": client_name, "version": env!("CARGO_PKG_VERSION")},
    })
}

/// A JSON-RPC request.
pub fn request(id: impl Into<Value>, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "method": method, "params": params})
}

/// The `server/discover` request with this id.
pub fn discover_request(id: impl Into<Value>) -> Value {
    request(id, DISCOVER, discover_params())
}

/// The `initialize` request with this id (see [`initialize_params`]).
pub fn initialize_request(id: impl Into<Value>, version: &str, client_name: &str) -> Value {
    request(id, INITIALIZE, initialize_params(version, client_name))
}

/// The `notifications/initialized` notification, as sent on the wire.
pub const INITIALIZED_NOTIFICATION: &str =
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// `result.capabilities` of a `server/discover` or `initialize` response, if it is an object.
pub fn capabilities(response: &Value) -> Option<&Value> {
    response
        .get("result")?
        .get("capabilities")
        .filter(|capabilities| capabilities.is_object())
}

/// `result.capabilities.tools.idempotency` of a handshake response, whatever its type (SEP-3182
/// wants an object).
pub fn idempotency_capability(response: &Value) -> Option<&Value> {
    response.pointer("/result/capabilities/tools/idempotency")
}

/// Whether a handshake response advertises `tools.idempotency` (an object); `None` when it is no
/// result with `capabilities`.
pub fn advertises_idempotency(response: &Value) -> Option<bool> {
    response.get("result")?.get("capabilities")?;
    Some(idempotency_capability(response).is_some_and(Value::is_object))
}

/// `result.protocolVersion` of an `initialize` response: the revision the server chose.
pub fn negotiated_version(response: &Value) -> Option<&str> {
    response.get("result")?.get("protocolVersion")?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_requests_name_the_revision() {
        let discover = discover_request("d");
        assert_eq!(discover["method"], DISCOVER);
        assert_eq!(
            discover["params"]["_meta"][META_PROTOCOL_VERSION],
            V_2026_07_28
        );
        let initialize = initialize_request(1, V_2025_06_18, "me");
        assert_eq!(initialize["params"]["protocolVersion"], V_2025_06_18);
        assert_eq!(initialize["params"]["clientInfo"]["name"], "me");
        let initialized: Value = serde_json::from_str(INITIALIZED_NOTIFICATION).unwrap();
        assert_eq!(initialized["method"], INITIALIZED);
    }

    #[test]
    fn results_are_read() {
        let advertised = json!({"id": 1, "result": {"capabilities": {"tools": {"idempotency": {}}},
            "protocolVersion": "2025-06-18"}});
        assert_eq!(advertises_idempotency(&advertised), Some(true));
        assert!(capabilities(&advertised).is_some());
        assert_eq!(negotiated_version(&advertised), Some("2025-06-18"));
        let not_an_object = json!({"result": {"capabilities": {"tools": {"idempotency": true}}}});
        assert_eq!(advertises_idempotency(&not_an_object), Some(false));
        assert_eq!(idempotency_capability(&not_an_object), Some(&json!(true)));
        let error = json!({"id": 1, "error": {"code": -32601, "message": "no"}});
        assert_eq!(advertises_idempotency(&error), None);
        assert_eq!(capabilities(&error), None);
    }
}

/// What a transport knows of a request beside its message: the HTTP `traceparent` and
/// `tracestate` headers (W3C Trace Context), the `Mcp-Session-Id` and `MCP-Protocol-Version`
/// headers. The HTTP layer reads them for the call's span; stdio has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TransportTrace {
    /// The `traceparent` header.
    pub(crate) traceparent: Option<String>,
    /// The `tracestate` header.
    pub(crate) tracestate: Option<String>,
    /// The session id (hashed before it goes on a span: it is a credential).
    pub(crate) session_id: Option<String>,
    /// The protocol version.
    pub(crate) protocol_version: Option<String>,
}
