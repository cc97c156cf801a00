//! A key source that exists only in tests ([`KeySource::Test`]: a key carried in the argument
//! `__test_key`), added in this folder alone: its variant and properties in `source.rs`, its
//! selection in `select.rs`, and this test. Everything else (the interceptor, the engine, the
//! deduplicator, the stores' key space and `list` filter, the metrics, `inspect`'s parsing) takes
//! it from its properties, unchanged.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::claims::Deduplicator;
use crate::config::EngineConfig;
use crate::engine::{Decision, Replay, REPLAYED_META};
use crate::interceptor::{ClientAction, Interceptor, InterceptorConfig, KeyedCall};
use crate::policy::select::TEST_KEY_ARGUMENT;
use crate::policy::KeySource;
use crate::record::{Outcome, Scope};
use crate::rejection::RejectionKind;
use crate::store::{ListFilter, SqliteStore, Store};

/// A `tools/call` of `charge` with these arguments, as the interceptor takes it.
fn keyed(interceptor: &mut Interceptor, id: u32, arguments: Value) -> KeyedCall {
    let line = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "charge", "arguments": arguments}
    })
    .to_string();
    match interceptor.on_client_message(&line) {
        ClientAction::Decide(call) => call,
        other => panic!("{line} is not decided: {other:?}"),
    }
}

#[test]
fn a_source_added_in_policy_alone_is_decided_stored_listed_and_named_end_to_end() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.path().join("records.db"))
                .await
                .expect("a SQLite store"),
        );
        let dedup = Deduplicator::new(EngineConfig::default(), Arc::clone(&store));
        let mut interceptor = Interceptor::new(InterceptorConfig::default());
        let scope = Scope::new("mcp-server:payments", "alice");

        // The first call runs under the new source's key, in the derived key space.
        let first = keyed(
            &mut interceptor,
            1,
            json!({"amount": 1, TEST_KEY_ARGUMENT: "t-1"}),
        );
        assert_eq!(first.terms().source, KeySource::Test);
        let Decision::Execute(claim) = dedup.begin(&scope, &first.tool_call()).await else {
            panic!("the first call runs");
        };
        let stored = claim.claim().id().key.as_str().to_owned();
        assert_eq!(stored, "\u{1F}test:charge:t-1");
        assert_eq!(claim.claim().id().key.source(), KeySource::Test);
        assert_eq!(claim.claim().id().key.for_tool(), "charge:t-1");
        assert_eq!(KeySource::Test.stored_key("charge:t-1"), stored);
        claim
            .finish(Outcome::Success(r#"{"content":[],"isError":false}"#.into()))
            .await
            .expect("recorded");

        // A retry with equivalent arguments is replayed, marked with the source's name.
        let retry = keyed(
            &mut interceptor,
            2,
            json!({TEST_KEY_ARGUMENT: "t-1", "amount": 1.0}),
        );
        let Decision::Replay(Replay::Result(result)) =
            dedup.decide(&scope, &retry.tool_call()).await
        else {
            panic!("the retry is replayed");
        };
        let result: Value = serde_json::from_str(&result).expect("a result");
        assert_eq!(result["_meta"][REPLAYED_META], "test");

        // The same key with other arguments is a conflict that names the key as the policy does.
        let other = keyed(
            &mut interceptor,
            3,
            json!({"amount": 2, TEST_KEY_ARGUMENT: "t-1"}),
        );
        let Decision::Reject(conflict) = dedup.decide(&scope, &other.tool_call()).await else {
            panic!("other arguments conflict");
        };
        assert_eq!(conflict.kind(), RejectionKind::KeyConflict);
        assert!(
            conflict
                .message()
                .starts_with("the test key `__test_key` was already used"),
            "{}",
            conflict.message()
        );
        // An invalid key is refused under that name too.
        let invalid = keyed(&mut interceptor, 4, json!({TEST_KEY_ARGUMENT: 7}));
        let Decision::Reject(refused) = dedup.decide(&scope, &invalid.tool_call()).await else {
            panic!("a number is not a key");
        };
        assert_eq!(refused.kind(), RejectionKind::KeyInvalid);
        assert!(
            refused.message().contains("the test key `__test_key`"),
            "{}",
            refused.message()
        );

        // The store lists it by its source, as `inspect --source test` asks.
        let by_source = ListFilter {
            sources: vec!["test".parse().expect("a source name")],
            ..ListFilter::default()
        };
        let listed = store
            .list(&by_source, dedup.clock().now(), 10)
            .await
            .expect("listed");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].id.key.as_str(), stored);
        let sep_only = ListFilter {
            sources: vec![KeySource::Sep],
            ..ListFilter::default()
        };
        let listed = store.list(&sep_only, dedup.clock().now(), 10).await;
        assert!(listed.expect("listed").is_empty());
    });
}
