//! The server's tools as the interceptor learns them (issue 39): with `--tools suggested`, a
//! key-less call is decided under the suggestion once the tools are listed, by the gateway's own
//! `tools/list` (absorbed, paged) or by a client's; a `notifications/tools/list_changed` wakes a
//! driver that lists them itself.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use mcp_idempotency::interceptor::LearnTools;
use mcp_idempotency::policy::ToolPolicies;

use super::*;

fn suggested() -> Harness {
    let policies = ToolPolicies::from_json(&json!("suggested")).unwrap();
    Harness::with(InterceptorConfig::default().tool_policies(policies))
}

const CREATE: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create","arguments":{"x":1}}}"#;

fn page(id: &str, tools: Value, next: Option<&str>) -> String {
    let mut result = json!({"tools": tools});
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    }
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

fn sent(step: LearnTools) -> Value {
    match step {
        LearnTools::Send(request) => serde_json::from_str(&request).unwrap(),
        other => panic!("expected Send, got {other:?}"),
    }
}

#[test]
fn the_gateways_own_listing_is_paged_absorbed_and_applies_the_suggestion() {
    let mut h = suggested();
    assert!(h.interceptor.needs_tools(CREATE));
    // Before the tools are known, a key-less call runs as with no policy.
    let early = CREATE.replace("\"id\":7", "\"id\":6");
    assert!(matches!(h.client(&early), ClientAction::Forward));
    let first = sent(h.interceptor.learn_tools());
    assert_eq!(first["method"], "tools/list");
    assert_eq!(h.interceptor.learn_tools(), LearnTools::Wait);
    let id = first["id"].as_str().unwrap().to_owned();
    let reader = json!([{"name": "read", "annotations": {"readOnlyHint": true}}]);
    assert!(matches!(
        h.server(&page(&id, reader, Some("p2"))),
        ServerAction::Absorb
    ));
    let second = sent(h.interceptor.learn_tools());
    assert_eq!(second["params"]["cursor"], "p2");
    let id = second["id"].as_str().unwrap().to_owned();
    assert!(matches!(
        h.server(&page(&id, json!([{"name": "create"}]), None)),
        ServerAction::Absorb
    ));
    assert_eq!(h.interceptor.learn_tools(), LearnTools::Known);
    assert!(!h.interceptor.needs_tools(CREATE));
    // `create` has no identifier: a window, so the call is now decided.
    let call = h.keyed(CREATE);
    assert_eq!(call.terms().source.as_str(), "window");
    let read = CREATE.replace("\"create\"", "\"read\"");
    assert!(matches!(h.client(&read), ClientAction::Forward));
}

#[test]
fn a_clients_listing_teaches_the_tools_too() {
    let mut h = suggested();
    assert!(matches!(
        h.client(r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#),
        ClientAction::Forward
    ));
    assert!(matches!(
        h.server(&page("l", json!([{"name": "create"}]), None)),
        ServerAction::Forward
    ));
    assert!(!h.interceptor.needs_tools(CREATE));
    assert_eq!(h.interceptor.learn_tools(), LearnTools::Known);
    assert_eq!(h.keyed(CREATE).terms().source.as_str(), "window");
}

#[test]
fn without_the_suggestion_nothing_is_listed_or_decided() {
    let mut h = Harness::new();
    assert!(!h.interceptor.needs_tools(CREATE));
    InterceptorConfig::default().learn_tools(&[json!({"name": "create"})]);
    assert!(matches!(h.client(CREATE), ClientAction::Forward));
}

#[test]
fn a_list_changed_notification_wakes_whoever_lists_the_tools() {
    let config = InterceptorConfig::default();
    let mut interceptor: Interceptor = Interceptor::new(config.clone());
    let mut changed = pin!(config.tools_changed());
    let mut cx = Context::from_waker(Waker::noop());
    assert!(changed.as_mut().poll(&mut cx).is_pending());
    let notification = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
    assert!(matches!(
        interceptor.on_server_message(notification),
        ServerAction::Forward
    ));
    assert_eq!(changed.as_mut().poll(&mut cx), Poll::Ready(()));
    // A change before the future is first polled is not missed either.
    let later = config.tools_changed();
    assert!(matches!(
        interceptor.on_server_message(notification),
        ServerAction::Forward
    ));
    assert_eq!(pin!(later).poll(&mut cx), Poll::Ready(()));
}

#[test]
fn a_listing_given_up_is_not_waited_for_and_its_late_answer_still_counts() {
    let mut h = suggested();
    let request = sent(h.interceptor.learn_tools());
    assert_eq!(h.interceptor.learn_tools(), LearnTools::Wait);
    h.interceptor.give_up_tools();
    assert_eq!(h.interceptor.learn_tools(), LearnTools::Known);
    let id = request["id"].as_str().unwrap().to_owned();
    assert!(matches!(
        h.server(&page(&id, json!([{"name": "create"}]), None)),
        ServerAction::Absorb
    ));
    assert_eq!(h.keyed(CREATE).terms().source.as_str(), "window");
}
