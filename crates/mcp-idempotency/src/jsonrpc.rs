//! JSON-RPC 2.0 pieces every transport shares: the error codes, the builders of the responses the
//! gateway answers with itself, and the limits on the size of one message.
//!
//! Ids are passed as JSON text (`7`, `"abc"` or `null`), as the transports read them, so a
//! response carries the request's id byte for byte.

use serde_json::Value;

/// JSON-RPC "Parse error": the message is not JSON (or not UTF-8).
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC "Invalid Request": not a JSON-RPC message the gateway can take (too long, an id it
/// cannot track, no credentials).
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC "Invalid params": the client's mistakes with a key (the SEP's prototype uses it too).
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC "Internal error": failures on the server's side (the store, the upstream).
pub const INTERNAL_ERROR: i64 = -32603;

/// Default limit on one message read from a client: a stdio line (`wrap`, the bridge) and an HTTP
/// request body. 4 MiB.
pub const DEFAULT_MAX_CLIENT_MESSAGE_BYTES: usize = 4 << 20;

/// Largest message read from a server: a stdio line, an SSE event or a plain JSON answer body.
/// 64 MiB: results (a file's contents) may be far larger than requests. The stdio proxy and the
/// HTTP relay pass a longer message to the client unread (a claimed call it answered is not
/// recorded); the bridge takes it as an answer that broke off.
pub const MAX_SERVER_MESSAGE_BYTES: usize = 64 << 20;

/// A JSON-RPC error response with `code` and `message`, for the request whose id is `id_json`.
pub fn error_response(id_json: &str, code: i64, message: &str) -> String {
    error_response_with_data(id_json, code, message, None)
}

/// [`error_response`] with `error.data`, when given.
pub fn error_response_with_data(
    id_json: &str,
    code: i64,
    message: &str,
    data: Option<Value>,
) -> String {
    let mut error = serde_json::json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    raw_error_response(id_json, &error.to_string())
}

/// A JSON-RPC response whose `result` is the JSON text `result_json`, byte for byte.
pub(crate) fn raw_result_response(id_json: &str, result_json: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id_json},"result":{result_json}}}"#)
}

/// A JSON-RPC response whose `error` is the JSON text `error_json`, byte for byte.
pub(crate) fn raw_error_response(id_json: &str, error_json: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id_json},"error":{error_json}}}"#)
}

/// The text of the first JSON-RPC response (a message with a `result` or an `error`) among the
/// events of the `text/event-stream` body `stream`, and only of one answering `id` when it is
/// given. Events that are not JSON, and requests and notifications, are skipped; an event cut off
/// at the end is not read.
pub fn sse_response(stream: &[u8], id: Option<&Value>) -> Option<String> {
    crate::sse::event_data(stream).into_iter().find(|data| {
        let Ok(message) = serde_json::from_str::<Value>(data) else {
            return false;
        };
        let answers = message.get("result").is_some() || message.get("error").is_some();
        answers && id.is_none_or(|id| message.get("id") == Some(id))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_response_skips_notifications_and_other_ids() {
        let stream = b"data: not json\n\n\
            data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
            data: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":1,\"message\":\"m\"}}\n\n\
            data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n";
        let first = sse_response(stream, None).unwrap();
        assert!(first.contains("\"id\":1"), "{first}");
        let two = sse_response(stream, Some(&Value::from(2))).unwrap();
        assert_eq!(two, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
        assert_eq!(sse_response(stream, Some(&Value::from(3))), None);
    }
    use serde_json::json;

    #[test]
    fn error_responses_keep_the_id_and_carry_data_only_when_given() {
        assert_eq!(
            error_response(r#""a""#, INVALID_REQUEST, "no"),
            r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32600,"message":"no"}}"#
        );
        let with_data =
            error_response_with_data("7", INTERNAL_ERROR, "lost", Some(json!({"type": "t"})));
        assert_eq!(
            serde_json::from_str::<Value>(&with_data).unwrap(),
            json!({"jsonrpc": "2.0", "id": 7, "error": {
                "code": -32603, "message": "lost", "data": {"type": "t"}
            }})
        );
    }

    #[test]
    fn raw_responses_keep_their_member_byte_for_byte() {
        assert_eq!(
            raw_result_response("null", r#"{ "b":1.50 }"#),
            r#"{"jsonrpc":"2.0","id":null,"result":{ "b":1.50 }}"#
        );
        assert_eq!(
            raw_error_response("1", r#"{"code":-32602 }"#),
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602 }}"#
        );
    }

    #[test]
    fn codes_are_the_json_rpc_ones() {
        assert_eq!(
            [PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR],
            [-32700, -32600, -32602, -32603]
        );
    }
}
