//! What operators see: `stats` and `list` (filters, order, limits, awkward ids).

use std::sync::Arc;

use super::{claim, claim_req, complete_req, id, keys, later, list, scope, T0};
use crate::record::{Outcome, Record, RecordState, Scope};
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, StateFilter, Store,
};

/// Stats count in-progress, completed and expired records.
pub async fn stats_count_states(store: Arc<dyn Store>) {
    let scope = scope();
    let before = store.stats(later(T0, 50)).await.unwrap();
    let running = claim_req(&id(&scope, "running"), T0);
    let done = claim_req(&id(&scope, "done"), T0);
    let gone = ClaimRequest {
        expires_at: later(T0, 5),
        ..claim_req(&id(&scope, "gone"), T0)
    };
    for req in [&running, &done, &gone] {
        claim(&*store, req).await;
    }
    store
        .complete(complete_req(
            &done,
            Outcome::Success("1".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    let after = store.stats(later(T0, 50)).await.unwrap();
    assert_eq!(after.in_progress - before.in_progress, 1);
    assert_eq!(after.completed - before.completed, 1);
    assert_eq!(after.expired - before.expired, 1);
}

/// Filters by namespace, principal, key, state and creation time each narrow the list, and
/// combine; expired records are listed until purged, completed ones with their outcome.
pub async fn list_filters_by_scope_key_state_and_age(store: Arc<dyn Store>) {
    let alice = scope();
    let bob = Scope::new(alice.namespace(), "bob");
    let namespace = Some(alice.namespace().to_owned());
    // Created at T0 + 0, 10, 20 and 30 s; "done" is completed, "gone" expired by T0 + 60 s.
    let running = claim_req(&id(&alice, "running"), T0);
    let done = claim_req(&id(&alice, "done"), later(T0, 10));
    let gone = ClaimRequest {
        expires_at: later(T0, 50),
        ..claim_req(&id(&alice, "gone"), later(T0, 20))
    };
    let other = claim_req(&id(&bob, "running"), later(T0, 30));
    for req in [&running, &done, &gone, &other] {
        assert_eq!(claim(&*store, req).await, ClaimOutcome::Claimed);
    }
    let outcome = Outcome::Error(r#"{"code":-32000,"message":"card declined"}"#.into());
    let completed = complete_req(&done, outcome.clone(), later(T0, 11));
    assert_eq!(store.complete(completed).await.unwrap(), Fenced::Applied);
    let now = later(T0, 60);
    let sorted = |records: Vec<Record>| {
        let mut keys: Vec<String> = records
            .iter()
            .map(|r| format!("{}/{}", r.id.scope.principal(), r.id.key.as_str()))
            .collect();
        keys.sort();
        keys
    };
    let by = |filter: ListFilter| ListFilter {
        namespace: namespace.clone(),
        ..filter
    };

    let all = list(&*store, &by(ListFilter::default()), now).await;
    assert_eq!(
        sorted(all.clone()),
        [
            "bob/running",
            "principal/done",
            "principal/gone",
            "principal/running"
        ]
    );
    let listed_done = all.iter().find(|r| r.id == done.id).expect("done listed");
    assert_eq!(listed_done.fingerprint, done.fingerprint);
    assert_eq!(listed_done.tool_name, "charge");
    assert_eq!(listed_done.created_at, later(T0, 10));
    assert_eq!(
        listed_done.state,
        RecordState::Completed {
            outcome,
            completed_at: later(T0, 11)
        }
    );
    let listed_running = all.iter().find(|r| r.id == running.id).expect("running");
    assert_eq!(
        listed_running.state,
        RecordState::InProgress {
            owner: running.owner,
            lease_expires_at: running.lease_expires_at
        }
    );

    let alice_only = ListFilter {
        principal: Some(alice.principal().to_owned()),
        ..by(ListFilter::default())
    };
    assert_eq!(
        sorted(list(&*store, &alice_only, now).await),
        ["principal/done", "principal/gone", "principal/running"]
    );
    let key_only = ListFilter {
        key: Some("running".into()),
        ..by(ListFilter::default())
    };
    assert_eq!(
        sorted(list(&*store, &key_only, now).await),
        ["bob/running", "principal/running"]
    );
    let exact = ListFilter {
        key: Some("running".into()),
        ..alice_only.clone()
    };
    assert_eq!(keys(&list(&*store, &exact, now).await), ["running"]);
    let missing = ListFilter {
        key: Some("missing".into()),
        ..alice_only.clone()
    };
    assert!(list(&*store, &missing, now).await.is_empty());

    for (state, expected) in [
        (
            StateFilter::InProgress,
            vec!["bob/running", "principal/running"],
        ),
        (StateFilter::Completed, vec!["principal/done"]),
        (StateFilter::Expired, vec!["principal/gone"]),
    ] {
        let filter = ListFilter {
            state: Some(state),
            ..by(ListFilter::default())
        };
        assert_eq!(
            sorted(list(&*store, &filter, now).await),
            expected,
            "{state:?}"
        );
        let scoped = ListFilter {
            state: Some(state),
            ..alice_only.clone()
        };
        let expected: Vec<_> = expected
            .into_iter()
            .filter(|k| k.starts_with("principal/"))
            .collect();
        assert_eq!(
            sorted(list(&*store, &scoped, now).await),
            expected,
            "{state:?}"
        );
    }
    // The same records at T0 + 1 s: nothing has expired yet, "gone" is still in progress.
    let early = ListFilter {
        state: Some(StateFilter::InProgress),
        ..alice_only.clone()
    };
    assert_eq!(
        sorted(list(&*store, &early, later(T0, 1)).await),
        ["principal/gone", "principal/running"]
    );

    let old = ListFilter {
        created_at_or_before: Some(later(T0, 10)),
        ..by(ListFilter::default())
    };
    assert_eq!(
        sorted(list(&*store, &old, now).await),
        ["principal/done", "principal/running"]
    );
    let recent = ListFilter {
        created_after: Some(later(T0, 10)),
        ..by(ListFilter::default())
    };
    assert_eq!(
        sorted(list(&*store, &recent, now).await),
        ["bob/running", "principal/gone"]
    );
    let window = ListFilter {
        created_after: Some(T0),
        created_at_or_before: Some(later(T0, 20)),
        state: Some(StateFilter::Completed),
        ..alice_only.clone()
    };
    assert_eq!(keys(&list(&*store, &window, now).await), ["done"]);
}

/// Records come latest expiry first, and `limit` keeps the first ones; a purge removes the expired
/// ones from the list.
pub async fn list_orders_by_expiry_and_honours_the_limit(store: Arc<dyn Store>) {
    let scope = scope();
    // Expiries T0 + 100, 300, 200, 400 s, the last one pushed there by its completion.
    for (key, expires) in [("a", 100), ("c", 300), ("b", 200)] {
        let req = ClaimRequest {
            expires_at: later(T0, expires),
            ..claim_req(&id(&scope, key), T0)
        };
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    }
    let d = ClaimRequest {
        expires_at: later(T0, 50),
        ..claim_req(&id(&scope, "d"), T0)
    };
    claim(&*store, &d).await;
    let completed = CompleteRequest {
        expires_at: later(T0, 400),
        ..complete_req(&d, Outcome::Success("{}".into()), later(T0, 1))
    };
    assert_eq!(store.complete(completed).await.unwrap(), Fenced::Applied);

    let filter = ListFilter {
        namespace: Some(scope.namespace().to_owned()),
        ..ListFilter::default()
    };
    let now = later(T0, 150);
    assert_eq!(
        keys(&list(&*store, &filter, now).await),
        ["d", "c", "b", "a"]
    );
    let first_two = store.list(&filter, now, 2).await.unwrap();
    assert_eq!(keys(&first_two), ["d", "c"]);
    assert!(store.list(&filter, now, 0).await.unwrap().is_empty());
    let scoped = ListFilter {
        principal: Some(scope.principal().to_owned()),
        ..filter.clone()
    };
    assert_eq!(
        keys(&store.list(&scoped, now, 3).await.unwrap()),
        ["d", "c", "b"]
    );

    assert!(store.purge_expired(now).await.unwrap() >= 1);
    assert_eq!(keys(&list(&*store, &filter, now).await), ["d", "c", "b"]);
}

/// Namespaces, principals and keys with separators, braces, quotes and Unicode come back exactly.
pub async fn list_returns_awkward_ids_exactly(store: Arc<dyn Store>) {
    let base = scope();
    let namespace = format!("{}:{{ns}} %3A", base.namespace());
    let ids = [
        id(&Scope::new(namespace.as_str(), "a:b"), "k:1"),
        id(&Scope::new(namespace.as_str(), "a"), "b:k"),
        id(
            &Scope::new(namespace.as_str(), "sha256:Zm9v+/="),
            "'; DROP TABLE x; --",
        ),
        id(&Scope::new(namespace.as_str(), "主体"), "ключ 🔑 %41"),
    ];
    for id in &ids {
        assert_eq!(
            claim(&*store, &claim_req(id, T0)).await,
            ClaimOutcome::Claimed
        );
    }
    let listed = list(
        &*store,
        &ListFilter {
            namespace: Some(namespace.clone()),
            ..ListFilter::default()
        },
        T0,
    )
    .await;
    assert_eq!(listed.len(), ids.len());
    for id in &ids {
        assert!(listed.iter().any(|r| &r.id == id), "{id:?} in {listed:?}");
        let exact = ListFilter {
            namespace: Some(id.scope.namespace().to_owned()),
            principal: Some(id.scope.principal().to_owned()),
            key: Some(id.key.as_str().to_owned()),
            ..ListFilter::default()
        };
        let found = list(&*store, &exact, T0).await;
        assert_eq!(found.len(), 1, "{id:?}");
        assert_eq!(&found[0].id, id);
        let by_principal = ListFilter { key: None, ..exact };
        assert_eq!(
            list(&*store, &by_principal, T0).await.len(),
            ids.iter().filter(|other| other.scope == id.scope).count(),
            "{id:?}"
        );
    }
}
