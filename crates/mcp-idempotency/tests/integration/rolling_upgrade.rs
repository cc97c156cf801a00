//! A rolling upgrade: instances without tool policies (the behaviour of the versions before key
//! sources: only a SEP key protects a call) and instances with them share one store. Records did
//! not change in format (a derived key is a key that begins with U+001F, which no client's key
//! holds), so the same statements and scripts serve both: SEP records and derived records live
//! side by side, an instance without policies never reads nor overwrites a derived record, and an
//! instance with policies reads the SEP records as before.
//!
//! The instance without policies stands for an older version: it keys calls by their SEP key
//! only. (It does read `_meta.idempotencyKey`, recognised by default since key sources, which an
//! older version passes unprotected; the scenario sends `_meta` calls to the new instance only.)
//! The store code an older version runs is the same: key sources changed no statement, script
//! or key layout.
//!
//! [`old_and_new_instances_share`] is the scenario; each shared store runs it as its
//! `old_and_new_instances_share_a_store` test (`store_redis::upgrade`, `store_redis_cluster`,
//! `store_postgres`, `store_sqlite`).

use std::sync::Arc;

use mcp_idempotency::embedded::{Embedded, FromClient, FromServer};
use mcp_idempotency::interceptor::{InterceptorConfig, META_KEY};
use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::store::{ListFilter, Store};
use mcp_idempotency::{Deduplicator, EngineConfig, KeySource, Scope, REPLAYED_META};
use serde_json::{json, Value};

const NAMESPACE: &str = "upgrade";

/// One instance on `store` (its own connection to the shared store), with `policies` or none.
fn instance(store: &Arc<dyn Store>, policies: Option<Value>) -> Embedded {
    let mut config = InterceptorConfig::default();
    if let Some(policies) = policies {
        config = config.tool_policies(ToolPolicies::from_json(&policies).expect("policies"));
    }
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::clone(store));
    Embedded::new(dedup, Scope::new(NAMESPACE, "p"), config)
}

fn call(id: u64, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

fn answer(id: u64, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
        .to_string()
}

/// Sends `params` through `gateway` as request `id`; a call that reaches the server is answered
/// `text`. Returns the key the server saw (none for a call forwarded untouched), or the answer
/// the client got instead of the server's.
async fn send(gateway: &Embedded, id: u64, params: Value, text: &str) -> Sent {
    let connection = gateway.connect(None);
    match connection.from_client(&call(id, params)).await {
        FromClient::Respond(response) => Sent::Answered(serde_json::from_str(&response).unwrap()),
        route => {
            let key = match route {
                FromClient::ForwardRewritten(message) => {
                    let sent: Value = serde_json::from_str(&message).unwrap();
                    sent["params"]["_meta"][META_KEY]
                        .as_str()
                        .map(str::to_owned)
                }
                FromClient::Forward => None,
                other => panic!("unexpected route {other:?}"),
            };
            assert_eq!(
                connection.from_server(&answer(id, text)).await,
                FromServer::Forward
            );
            Sent::Ran { key }
        }
    }
}

#[derive(Debug)]
enum Sent {
    /// The call reached the server, which saw this key (`None`: the call was not keyed).
    Ran { key: Option<String> },
    /// The client got this answer and nothing ran.
    Answered(Value),
}

impl Sent {
    fn ran_with_key(self) -> String {
        match self {
            Self::Ran { key: Some(key) } => key,
            other => panic!("expected a keyed call to run, got {other:?}"),
        }
    }

    fn ran_unkeyed(self) {
        assert!(matches!(self, Self::Ran { key: None }), "{self:?}");
    }

    fn replayed(self) -> (String, Option<String>) {
        match self {
            Self::Answered(response) => (
                response["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("not a replayed result: {response}"))
                    .to_owned(),
                response["result"]["_meta"][REPLAYED_META]
                    .as_str()
                    .map(str::to_owned),
            ),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
}

/// The text of each record of the store, by key source and key, sorted.
async fn records(store: &dyn Store) -> Vec<(KeySource, String, String)> {
    let filter = ListFilter {
        namespace: Some(NAMESPACE.to_owned()),
        ..ListFilter::default()
    };
    let mut found: Vec<_> = store
        .list(&filter, mcp_idempotency::Timestamp::now(), usize::MAX)
        .await
        .expect("list")
        .into_iter()
        .map(|record| {
            let text = match record.state {
                mcp_idempotency::RecordState::Completed {
                    outcome: mcp_idempotency::Outcome::Success(raw),
                    ..
                } => serde_json::from_str::<Value>(&raw).unwrap()["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                other => panic!("expected completed records, got {other:?}"),
            };
            (
                record.id.key.source(),
                record.id.key.for_tool().to_owned(),
                text,
            )
        })
        .collect();
    found.sort();
    found
}

/// The rolling upgrade on one store, opened twice: `old_store` for an instance without policies,
/// `new_store` for one with a policy of each derived source. Leaves four derived records and two
/// SEP records in the namespace `upgrade`.
pub(crate) async fn old_and_new_instances_share(
    old_store: Arc<dyn Store>,
    new_store: Arc<dyn Store>,
) {
    let old = instance(&old_store, None);
    let new = instance(
        &new_store,
        Some(json!({
            "charge": {"key-from": ["/order_id"]},
            "refund": {"key-argument": "idempotency_key"},
            "ping": {"window": "60s"},
        })),
    );
    let charge = json!({"name": "charge", "arguments": {"order_id": "ord_1", "amount": 5}});
    let refund = json!({"name": "refund", "arguments": {"idempotency_key": "k-1", "amount": 2}});
    let ping = json!({"name": "ping", "arguments": {"host": "a"}});
    let sep = |key: &str| json!({"name": "send", "arguments": {"to": "a"}, "idempotencyKey": key});

    // The old instance writes a SEP record; the new one a record of every derived source, one
    // of them (the `_meta` key) with the same text as the SEP key.
    assert_eq!(
        send(&old, 1, sep("k-1"), "old sep").await.ran_with_key(),
        "k-1"
    );
    let key_from = send(&new, 2, charge.clone(), "new key-from")
        .await
        .ran_with_key();
    let meta =
        json!({"name": "send", "arguments": {"to": "a"}, "_meta": {"idempotencyKey": "k-1"}});
    assert_eq!(
        send(&new, 3, meta.clone(), "new meta").await.ran_with_key(),
        "k-1"
    );
    let argument = send(&new, 4, refund.clone(), "new argument")
        .await
        .ran_with_key();
    let window = send(&new, 5, ping.clone(), "new window")
        .await
        .ran_with_key();

    // An instance without policies passes the calls only a policy keys, as it always did: it
    // neither replays their records nor writes over them.
    send(&old, 6, charge.clone(), "old unprotected")
        .await
        .ran_unkeyed();
    send(&old, 7, refund.clone(), "old unprotected")
        .await
        .ran_unkeyed();
    send(&old, 8, ping.clone(), "old unprotected")
        .await
        .ran_unkeyed();
    // Its SEP key of the same text as the `_meta` key replays its own record, byte for byte.
    assert_eq!(
        send(&old, 9, sep("k-1"), "never").await.replayed(),
        ("old sep".to_owned(), None)
    );
    // A SEP key spelled as a derived key is shown to the tool is a record of its own.
    assert_eq!(
        send(&old, 10, sep(&key_from), "old sep 2")
            .await
            .ran_with_key(),
        key_from
    );

    // The instance with policies replays its derived records, marked, and the SEP record as
    // before, unmarked.
    for (id, params, text, marker) in [
        (11, charge, "new key-from", Some("key-from")),
        (12, meta, "new meta", None),
        (13, refund, "new argument", Some("argument")),
        (14, ping, "new window", Some("window")),
        (15, sep("k-1"), "old sep", None),
        (16, sep(&key_from), "old sep 2", None),
    ] {
        let (got, marked) = send(&new, id, params, "never").await.replayed();
        assert_eq!(got, text, "request {id}");
        assert_eq!(marked.as_deref(), marker, "request {id}");
    }
    let conflict = send(
        &new,
        17,
        json!({"name": "send", "arguments": {"to": "b"}, "idempotencyKey": "k-1"}),
        "never",
    )
    .await;
    assert!(
        matches!(&conflict, Sent::Answered(r) if r["error"]["data"]["type"] == "idempotency_key_conflict"),
        "{conflict:?}"
    );

    // Both instances see the same six records, each under its own key.
    let mut expected = vec![
        (
            KeySource::KeyFrom,
            key_from.clone(),
            "new key-from".to_owned(),
        ),
        (KeySource::Sep, key_from.clone(), "old sep 2".to_owned()),
        (KeySource::Sep, "k-1".to_owned(), "old sep".to_owned()),
        (KeySource::Meta, "k-1".to_owned(), "new meta".to_owned()),
        (KeySource::Argument, argument, "new argument".to_owned()),
        (KeySource::Window, window, "new window".to_owned()),
    ];
    expected.sort();
    assert_eq!(records(&*old_store).await, expected);
    assert_eq!(records(&*new_store).await, expected);
}
