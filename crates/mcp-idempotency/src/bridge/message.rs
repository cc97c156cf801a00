//! What the bridge reads in a message, and the edits it makes: a key added to a `tools/call`, a
//! request's id swapped for a re-issue and back, the HTTP headers a POST carries. Sans-IO.
//!
//! Edits keep every other member's exact text ([`RawObject`]), so numbers and strings reach the
//! server as the client spelled them.

use base64::Engine as _;
use serde_json::Value;

use crate::protocol::{self, IDEMPOTENCY_KEY, META_PROTOCOL_VERSION};
use crate::raw_object::{json_string, RawObject};
use crate::record::TraceLink;

/// One line from the client, classified.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ClientMessage {
    /// A request: it gets an answer.
    Request(Request),
    /// A notification (`method`, no `id`).
    Notification {
        /// The method.
        method: String,
    },
    /// The client's answer to a server-to-client request.
    Response,
    /// A JSON array of JSON-RPC messages (a 2025-03-26 batch): sent as it is, never re-issued.
    Batch,
    /// Not JSON: answered `-32700`.
    NotJson,
    /// JSON, but not a JSON-RPC message: answered `-32600`.
    NotJsonRpc,
}

/// A request from the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// The message as the bridge sends it (with the key it added, if any).
    pub(crate) message: String,
    /// The client's id, as JSON text.
    pub(crate) id: String,
    /// The method.
    pub(crate) method: String,
    /// For `tools/call`: the tool and the key it carries (added by the bridge or the client's own);
    /// `None` for other methods and for MRTR continuations, which are never re-keyed.
    pub(crate) keyed_call: Option<KeyedCall>,
}

/// A `tools/call` the bridge may re-issue with the same key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyedCall {
    /// `params.name`.
    pub(crate) tool: String,
    /// The key the call carries: the client's own, or the one the bridge added.
    pub(crate) key: String,
    /// Where the key is carried, as a person reads it: `idempotencyKey` (the SEP key, in
    /// `params`) or `_meta.NAME`.
    pub(crate) carrier: String,
    /// Whether the bridge added the key (the client sent none).
    pub(crate) added: bool,
}

impl ClientMessage {
    /// Classifies `line`. A `tools/call` that carries no key of the client's own, neither
    /// `params.idempotencyKey` nor one of the `meta_keys` members of `params._meta`, gets
    /// `new_key()` as its `params.idempotencyKey`.
    pub(crate) fn parse(
        line: &str,
        meta_keys: &[String],
        new_key: impl FnOnce() -> String,
    ) -> Self {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            return if is_json_rpc(line) {
                Self::Batch
            } else if serde_json::from_str::<serde::de::IgnoredAny>(line).is_ok() {
                // An empty array, or one holding anything but JSON-RPC messages.
                Self::NotJsonRpc
            } else {
                Self::NotJson
            };
        }
        let Some(envelope) = RawObject::parse(line) else {
            return if serde_json::from_str::<serde::de::IgnoredAny>(line).is_ok() {
                Self::NotJsonRpc
            } else {
                Self::NotJson
            };
        };
        let id = envelope.get("id").map(|raw| raw.get().to_owned());
        match (envelope.get_str("method"), id) {
            (Some(method), Some(id)) => {
                let (message, keyed_call) = if method == "tools/call" {
                    keyed(line, &envelope, meta_keys, new_key)
                } else {
                    (line.to_owned(), None)
                };
                Self::Request(Request {
                    message,
                    id,
                    method,
                    keyed_call,
                })
            }
            (Some(method), None) => Self::Notification { method },
            (None, Some(_)) if envelope.contains("result") || envelope.contains("error") => {
                Self::Response
            }
            (None, _) => Self::NotJsonRpc,
        }
    }
}

/// The `tools/call` with a key: the client's own wherever it carries it, or a new one added to
/// `params`. MRTR continuations and calls without a `params` object go out as they are.
fn keyed(
    line: &str,
    envelope: &RawObject<'_>,
    meta_keys: &[String],
    new_key: impl FnOnce() -> String,
) -> (String, Option<KeyedCall>) {
    let Some(params) = envelope
        .get("params")
        .and_then(|raw| RawObject::parse(raw.get()))
    else {
        return (line.to_owned(), None);
    };
    if protocol::is_mrtr_continuation(&params) {
        return (line.to_owned(), None);
    }
    let Some(tool) = params.get_str("name") else {
        return (line.to_owned(), None);
    };
    if let Some((carrier, raw_key)) = clients_key(&params, meta_keys) {
        // The message goes out as the client wrote it: a key in `_meta` gets no SEP key beside
        // it, which would outrank it and make a retry sent without the bridge a new operation.
        // A key that is not a string is the server's to refuse; the bridge does not re-issue it.
        return match serde_json::from_str::<String>(raw_key.get()) {
            Ok(key) => (
                line.to_owned(),
                Some(KeyedCall {
                    tool,
                    key,
                    carrier,
                    added: false,
                }),
            ),
            Err(_) => (line.to_owned(), None),
        };
    }
    let key = new_key();
    let key_json = Value::String(key.clone()).to_string();
    let params = params.to_string_with(IDEMPOTENCY_KEY, &key_json);
    (
        envelope.to_string_with("params", &params),
        Some(KeyedCall {
            tool,
            key,
            carrier: IDEMPOTENCY_KEY.to_owned(),
            added: true,
        }),
    )
}

/// The client's own key and where it is carried: `params.idempotencyKey` (the SEP key, which
/// outranks the others, as in the gateways), else the first of `meta_keys` present in
/// `params._meta`.
fn clients_key<'a>(
    params: &RawObject<'a>,
    meta_keys: &[String],
) -> Option<(String, &'a serde_json::value::RawValue)> {
    if let Some(raw) = params.get(IDEMPOTENCY_KEY) {
        return Some((IDEMPOTENCY_KEY.to_owned(), raw));
    }
    let meta = RawObject::parse(params.get("_meta")?.get())?;
    meta_keys
        .iter()
        .find_map(|name| Some((format!("_meta.{name}"), meta.get(name)?)))
}

/// `message` with its `id` replaced by `id` (JSON text).
pub(crate) fn with_id(message: &str, id: &str) -> String {
    match RawObject::parse(message) {
        Some(envelope) => envelope.to_string_with("id", id),
        None => message.to_owned(),
    }
}

/// A message from the server, as far as the bridge needs to know.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ServerMessage {
    /// A response (`result` or `error`) to the request whose id is this JSON text.
    Response {
        /// The id, as JSON text.
        id: String,
    },
    /// Anything else: a notification, a server-to-client request, something unreadable.
    Other,
}

impl ServerMessage {
    pub(crate) fn parse(message: &str) -> Self {
        let Some(envelope) = RawObject::parse(message) else {
            return Self::Other;
        };
        match envelope.get("id") {
            Some(id)
                if !envelope.contains("method")
                    && (envelope.contains("result") || envelope.contains("error")) =>
            {
                Self::Response {
                    id: id.get().to_owned(),
                }
            }
            _ => Self::Other,
        }
    }
}

/// Whether `text` is a JSON-RPC message (an object with `jsonrpc`) or a batch of them: the only
/// things the bridge writes to the client's stdout.
pub(crate) fn is_json_rpc(text: &str) -> bool {
    let is_message = |raw: &str| RawObject::parse(raw).is_some_and(|o| o.contains("jsonrpc"));
    if text.trim_start().starts_with('[') {
        serde_json::from_str::<Vec<&serde_json::value::RawValue>>(text)
            .is_ok_and(|batch| !batch.is_empty() && batch.iter().all(|m| is_message(m.get())))
    } else {
        is_message(text)
    }
}

/// `error.data` of a JSON-RPC error response, if it is one.
pub(crate) fn error_data(response: &str) -> Option<Value> {
    let value: Value = serde_json::from_str(response).ok()?;
    value.get("error")?.get("data").cloned()
}

/// Whether a `server/discover` or `initialize` response advertises `tools.idempotency`; `None`
/// when it is no result with `capabilities`.
pub(crate) fn advertises_idempotency(response: &str) -> Option<bool> {
    let value: Value = serde_json::from_str(response).ok()?;
    protocol::advertises_idempotency(&value)
}

/// `result.protocolVersion` of an `initialize` response.
pub(crate) fn negotiated_version(response: &str) -> Option<String> {
    let value: Value = serde_json::from_str(response).ok()?;
    protocol::negotiated_version(&value).map(str::to_owned)
}

/// The tools of a `tools/list` response, each with whether its annotations say a second run is
/// harmless (`idempotentHint` or `readOnlyHint`).
pub(crate) fn tool_annotations(response: &str) -> Vec<(String, bool)> {
    let Ok(value) = serde_json::from_str::<Value>(response) else {
        return Vec::new();
    };
    let Some(tools) = value
        .get("result")
        .and_then(|result| result.get("tools"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    tools
        .iter()
        .filter_map(|tool| {
            let name = tool.get("name")?.as_str()?.to_owned();
            let hint = |name: &str| {
                tool.get("annotations")
                    .and_then(|annotations| annotations.get(name))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            };
            Some((name, hint("idempotentHint") || hint("readOnlyHint")))
        })
        .collect()
}

/// The headers that name a message to the server (MCP 2026-07-28, SEP-2243): `Mcp-Method`,
/// `Mcp-Name` (from `params.name`, `params.uri` or `params.taskId`) and the
/// `MCP-Protocol-Version` of its `_meta`. Values that cannot travel bare are Base64-wrapped.
/// A well-formed `_meta.traceparent` (with its `tracestate`) also goes in the `traceparent`
/// header, so that HTTP gateways on the way see the client's trace context.
pub(crate) fn routing_headers(message: &str) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    let Some(envelope) = RawObject::parse(message) else {
        return headers;
    };
    let Some(method) = envelope.get_str("method") else {
        return headers;
    };
    let params = envelope
        .get("params")
        .and_then(|raw| RawObject::parse(raw.get()));
    let name_member = match method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    let name = name_member.and_then(|member| params.as_ref()?.get_str(member));
    let meta = params
        .as_ref()
        .and_then(|params| params.get("_meta"))
        .and_then(|meta| RawObject::parse(meta.get()));
    let version = meta
        .as_ref()
        .and_then(|meta| meta.get_str(META_PROTOCOL_VERSION));
    headers.push(("mcp-method", header_value(&method)));
    if let Some(name) = name {
        headers.push(("mcp-name", header_value(&name)));
    }
    if let Some(version) = version {
        headers.push(("mcp-protocol-version", header_value(&version)));
    }
    let traceparent = meta
        .as_ref()
        .and_then(|meta| meta.get_str("traceparent"))
        .filter(|value| TraceLink::from_traceparent(value).is_some());
    if let Some(traceparent) = traceparent {
        headers.push(("traceparent", traceparent));
        let tracestate = meta.as_ref().and_then(|meta| meta.get_str("tracestate"));
        if let Some(tracestate) = tracestate.filter(|value| header_value(value) == *value) {
            headers.push(("tracestate", tracestate));
        }
    }
    headers
}

/// Whether the request `message` carries a well-formed `_meta.traceparent`.
pub(crate) fn has_trace_context(message: &str) -> bool {
    RawObject::parse(message)
        .and_then(|envelope| RawObject::parse(envelope.get("params")?.get()))
        .and_then(|params| RawObject::parse(params.get("_meta")?.get()))
        .and_then(|meta| meta.get_str("traceparent"))
        .is_some_and(|value| TraceLink::from_traceparent(&value).is_some())
}

/// The request `message` with `params._meta.traceparent` set to `traceparent` (a `_meta` made
/// when there is none); `None` when `params` is not an object.
pub(crate) fn with_traceparent(message: &str, traceparent: &str) -> Option<String> {
    let envelope = RawObject::parse(message)?;
    let params = RawObject::parse(envelope.get("params")?.get())?;
    let meta = params
        .get("_meta")
        .and_then(|meta| RawObject::parse(meta.get()))
        .unwrap_or_default();
    let meta = meta.to_string_with("traceparent", &json_string(traceparent));
    Some(envelope.to_string_with("params", &params.to_string_with("_meta", &meta)))
}

/// `value` as a header value: as it is when it is visible ASCII without surrounding blanks, else
/// `=?base64?…?=`.
fn header_value(value: &str) -> String {
    let blank_edge = value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']);
    let visible = value.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let looks_wrapped = value.starts_with("=?base64?") && value.ends_with("?=");
    let bare = visible && !blank_edge && !looks_wrapped;
    if bare {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

/// `message` on one line: JSON allows no raw line break inside a string, so every line break is
/// whitespace between tokens and becomes a space.
pub(crate) fn one_line(message: &str) -> std::borrow::Cow<'_, str> {
    if message.contains(['\n', '\r']) {
        message.replace(['\n', '\r'], " ").into()
    } else {
        message.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::DEFAULT_META_KEY;
    use serde_json::json;

    fn parse(line: &str) -> ClientMessage {
        let meta_keys = [DEFAULT_META_KEY.to_owned(), "io.example/key".to_owned()];
        ClientMessage::parse(line, &meta_keys, || "k-new".to_owned())
    }

    fn keyed_call(params: Value) -> (String, Option<KeyedCall>) {
        let line =
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":params}).to_string();
        let ClientMessage::Request(request) = parse(&line) else {
            panic!("not a request: {line}")
        };
        assert_eq!(
            request.message == line,
            !request.keyed_call.as_ref().is_some_and(|c| c.added)
        );
        (request.message, request.keyed_call)
    }

    #[test]
    fn a_call_without_a_key_gets_one_and_keeps_the_rest_as_spelled() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"charge","arguments":{"amount":1.50}}}"#;
        let ClientMessage::Request(request) = parse(line) else {
            panic!("not a request");
        };
        assert_eq!(request.id, "7");
        assert!(
            request.message.contains(r#""amount":1.50"#),
            "{}",
            request.message
        );
        let sent: Value = serde_json::from_str(&request.message).unwrap();
        assert_eq!(sent["params"]["idempotencyKey"], "k-new");
        assert_eq!(sent["params"]["name"], "charge");
        assert_eq!(
            request.keyed_call,
            Some(KeyedCall {
                tool: "charge".into(),
                key: "k-new".into(),
                carrier: "idempotencyKey".into(),
                added: true
            })
        );
    }

    #[test]
    fn a_key_in_meta_is_the_clients_own_and_gets_no_sep_key_beside_it() {
        let own = |key: &str, carrier: &str| KeyedCall {
            tool: "t".into(),
            key: key.into(),
            carrier: carrier.into(),
            added: false,
        };
        let (sent, call) = keyed_call(json!({"name": "t", "_meta": {"idempotencyKey": "m-1"}}));
        assert!(!sent.contains(r#""idempotencyKey":"k-new""#), "{sent}");
        assert_eq!(call, Some(own("m-1", "_meta.idempotencyKey")));
        let (_, call) = keyed_call(json!({"name": "t", "_meta": {"io.example/key": "m-2"}}));
        assert_eq!(call, Some(own("m-2", "_meta.io.example/key")));
        // The SEP key outranks `_meta`, as in the gateways.
        let (_, call) = keyed_call(
            json!({"name": "t", "idempotencyKey": "s-1", "_meta": {"idempotencyKey": "m-1"}}),
        );
        assert_eq!(call, Some(own("s-1", "idempotencyKey")));
        // A `_meta` key that is no string is the server's to refuse: not re-issued, none added.
        let (_, call) = keyed_call(json!({"name": "t", "_meta": {"idempotencyKey": 7}}));
        assert_eq!(call, None);
        // A `_meta` member the bridge was not told about is no key.
        let (sent, call) = keyed_call(json!({"name": "t", "_meta": {"other/key": "x"}}));
        assert_eq!(call.map(|c| (c.key, c.added)), Some(("k-new".into(), true)));
        assert!(sent.contains(r#""idempotencyKey":"k-new""#), "{sent}");
    }

    #[test]
    fn a_clients_key_is_kept_and_continuations_are_left_alone() {
        let own = r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"t","idempotencyKey":"mine"}}"#;
        let ClientMessage::Request(request) = parse(own) else {
            panic!()
        };
        assert_eq!(request.message, own);
        assert_eq!(request.keyed_call.unwrap().key, "mine");
        for params in [
            json!({"name": "t", "requestState": "s"}),
            json!({"name": "t", "inputResponses": {}}),
        ] {
            let line =
                json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":params}).to_string();
            let ClientMessage::Request(request) = parse(&line) else {
                panic!()
            };
            assert_eq!(request.message, line);
            assert_eq!(request.keyed_call, None);
        }
    }

    #[test]
    fn messages_are_classified() {
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            ClientMessage::Notification {
                method: "notifications/initialized".into()
            }
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            ClientMessage::Response
        );
        assert_eq!(
            parse(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            ClientMessage::Batch
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0","id":1,"params":{"#),
            ClientMessage::NotJson
        );
        assert_eq!(parse("[1,"), ClientMessage::NotJson);
        assert_eq!(parse("42"), ClientMessage::NotJsonRpc);
        assert_eq!(parse(r#"{"id":1}"#), ClientMessage::NotJsonRpc);
    }

    #[test]
    fn ids_are_swapped_and_responses_recognised() {
        let sent = with_id(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, r#""re-2""#);
        assert_eq!(serde_json::from_str::<Value>(&sent).unwrap()["id"], "re-2");
        assert_eq!(
            ServerMessage::parse(r#"{"jsonrpc":"2.0","id":"re-2","result":{}}"#),
            ServerMessage::Response {
                id: r#""re-2""#.into()
            }
        );
        assert_eq!(
            ServerMessage::parse(r#"{"jsonrpc":"2.0","id":5,"method":"elicitation/create"}"#),
            ServerMessage::Other
        );
        assert_eq!(
            ServerMessage::parse(r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#),
            ServerMessage::Other
        );
    }

    #[test]
    fn results_are_read_for_capabilities_versions_and_annotations() {
        let discovered = r#"{"id":1,"result":{"capabilities":{"tools":{"idempotency":{}}}}}"#;
        assert_eq!(advertises_idempotency(discovered), Some(true));
        assert_eq!(
            advertises_idempotency(r#"{"id":1,"result":{"capabilities":{"tools":{}}}}"#),
            Some(false)
        );
        assert_eq!(advertises_idempotency(r#"{"id":1,"error":{}}"#), None);
        assert_eq!(
            negotiated_version(r#"{"id":1,"result":{"protocolVersion":"2025-06-18"}}"#),
            Some("2025-06-18".into())
        );
        let listed = json!({"id": 2, "result": {"tools": [
            {"name": "charge"},
            {"name": "lookup", "annotations": {"readOnlyHint": true}},
            {"name": "put", "annotations": {"idempotentHint": true}},
        ]}})
        .to_string();
        assert_eq!(
            tool_annotations(&listed),
            [
                ("charge".into(), false),
                ("lookup".into(), true),
                ("put".into(), true)
            ]
        );
    }

    #[test]
    fn routing_headers_name_the_method_the_target_and_the_revision() {
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"charge","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})
        .to_string();
        assert_eq!(
            routing_headers(&call),
            [
                ("mcp-method", "tools/call".to_owned()),
                ("mcp-name", "charge".to_owned()),
                ("mcp-protocol-version", "2026-07-28".to_owned())
            ]
        );
        let read = json!({"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"ünï"}})
            .to_string();
        assert_eq!(
            routing_headers(&read)[1],
            ("mcp-name", "=?base64?w7xuw68=?=".to_owned())
        );
        assert!(routing_headers(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#).is_empty());
    }

    #[test]
    fn only_json_rpc_messages_count_as_such() {
        assert!(is_json_rpc(
            r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#
        ));
        assert!(is_json_rpc(r#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#));
        for text in ["this is not JSON", "42", "{}", "[]", "[1,2]", r#"{"id":1}"#] {
            assert!(!is_json_rpc(text), "{text}");
        }
    }

    #[test]
    fn line_breaks_between_tokens_become_spaces() {
        assert_eq!(one_line("{\n \"a\": 1\r\n}"), "{  \"a\": 1  }");
        assert_eq!(one_line("{}"), "{}");
    }
}
