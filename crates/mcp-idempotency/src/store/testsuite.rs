//! The one test suite every [`Store`] must pass.
//!
//! Each check is a public async function taking a fresh store; [`store_test_suite!`](crate::store_test_suite)
//! turns the whole list into `#[tokio::test]`s for a store factory:
//!
//! ```text
//! mcp_idempotency::store_test_suite!(|| async {
//!     std::sync::Arc::new(MyStore::connect("…").await.unwrap()) as std::sync::Arc<dyn Store>
//! });
//! ```
//!
//! The factory may also return an `Option<Arc<dyn Store>>`: `None` (for a shared server that is not
//! reachable outside CI) ends the check at once, after the factory has said why, and never runs it
//! against a stand-in store.
//!
//! Checks use a random namespace each, so they may share one database, except [`quota_total`], which
//! needs a store that no other check writes to at the same time.

use std::sync::Arc;
use std::time::Duration;

use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, RecordLimits,
    StateFilter, Store, TakeOverRequest,
};
use crate::fingerprint::fingerprint;
use crate::key::IdempotencyKey;
use crate::record::{FencingToken, Outcome, Record, RecordId, RecordState, Scope};
use crate::time::Timestamp;

const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// Instantiates every check of [`testsuite`](crate::store::testsuite) as a `#[tokio::test]`, for
/// stores made by `$make`: an expression callable with no arguments that returns a future of
/// `Arc<dyn Store>` or of `Option<Arc<dyn Store>>` (`None`: no store to check, see the module docs).
#[macro_export]
macro_rules! store_test_suite {
    ($make:expr) => {
        $crate::store_test_suite!(@tests $make;
            claim_then_existing,
            complete_then_replay_exactly,
            complete_is_fenced,
            release_frees_the_key,
            renew_extends_only_the_owners_lease,
            renew_keeps_a_running_record_past_its_retention,
            take_over_only_after_the_lease_ran_out,
            expired_records_count_as_absent,
            purge_removes_only_expired,
            scopes_are_isolated,
            quota_per_scope,
            quota_total,
            racing_claims_have_one_winner,
            racing_distinct_keys_all_win,
            every_outcome_kind_round_trips,
            awkward_keys_are_kept_exactly,
            stats_count_states,
            list_filters_by_scope_key_state_and_age,
            list_orders_by_expiry_and_honours_the_limit,
            list_returns_awkward_ids_exactly,
            delete_frees_the_key_in_any_state
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store = $crate::store::testsuite::MaybeStore::into_store(($make)().await);
                if let Some(store) = store {
                    $crate::store::testsuite::$name(store).await;
                }
            }
        )*
    };
}

/// What a suite factory may return: a store, or maybe one.
pub trait MaybeStore {
    /// The store to check, if there is one.
    fn into_store(self) -> Option<Arc<dyn Store>>;
}

impl MaybeStore for Arc<dyn Store> {
    fn into_store(self) -> Option<Arc<dyn Store>> {
        Some(self)
    }
}

impl MaybeStore for Option<Arc<dyn Store>> {
    fn into_store(self) -> Option<Arc<dyn Store>> {
        self
    }
}

fn scope() -> Scope {
    Scope::new(
        format!("testsuite-{:016x}", rand::random::<u64>()),
        "principal",
    )
}

fn id(scope: &Scope, key: &str) -> RecordId {
    RecordId {
        scope: scope.clone(),
        key: IdempotencyKey::new(key, 1024).expect("test key is valid"),
    }
}

fn claim_req(id: &RecordId, now: Timestamp) -> ClaimRequest {
    ClaimRequest {
        id: id.clone(),
        fingerprint: fingerprint("charge", Some(r#"{"amount":1}"#)).expect("valid arguments"),
        tool_name: "charge".into(),
        owner: FencingToken::random(),
        now,
        lease_expires_at: now.saturating_add(LEASE),
        expires_at: now.saturating_add(RETENTION),
        limits: RecordLimits::UNLIMITED,
    }
}

fn complete_req(req: &ClaimRequest, outcome: Outcome, now: Timestamp) -> CompleteRequest {
    CompleteRequest {
        id: req.id.clone(),
        owner: req.owner,
        outcome,
        completed_at: now,
        expires_at: now.saturating_add(RETENTION),
    }
}

fn later(t: Timestamp, secs: u64) -> Timestamp {
    t.saturating_add(Duration::from_secs(secs))
}

async fn claim(store: &dyn Store, req: &ClaimRequest) -> ClaimOutcome {
    store.claim(req).await.expect("claim")
}

/// A free key is claimed; a second claim gets the in-progress record with the first owner.
pub async fn claim_then_existing(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let first = claim_req(&id, T0);
    assert_eq!(claim(&*store, &first).await, ClaimOutcome::Claimed);
    let second = claim_req(&id, later(T0, 1));
    let ClaimOutcome::Existing(record) = claim(&*store, &second).await else {
        panic!("second claim must see the first")
    };
    assert_eq!(record.id, id);
    assert_eq!(record.fingerprint, first.fingerprint);
    assert_eq!(record.tool_name, "charge");
    assert_eq!(record.created_at, T0);
    assert_eq!(record.expires_at, first.expires_at);
    assert_eq!(
        record.state,
        RecordState::InProgress {
            owner: first.owner,
            lease_expires_at: first.lease_expires_at
        }
    );
}

/// A completed record is returned with its outcome byte for byte.
pub async fn complete_then_replay_exactly(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    let raw =
        "{ \"content\" : [{\"type\":\"text\",\"text\":\"caf\\u00e9 \u{1F600}\"}], \"n\": 1.0e0 }";
    let done = complete_req(&req, Outcome::Success(raw.into()), later(T0, 2));
    assert_eq!(store.complete(done.clone()).await.unwrap(), Fenced::Applied);

    let record = store.get(&id, later(T0, 3)).await.unwrap().expect("record");
    assert_eq!(
        record.state,
        RecordState::Completed {
            outcome: Outcome::Success(raw.into()),
            completed_at: later(T0, 2)
        }
    );
    assert_eq!(record.expires_at, done.expires_at);
    let ClaimOutcome::Existing(again) = claim(&*store, &claim_req(&id, later(T0, 4))).await else {
        panic!("completed record must be returned")
    };
    assert_eq!(again, record);
}

/// Only the current owner can complete; a completed record cannot be completed again.
pub async fn complete_is_fenced(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    let mut stale = complete_req(&req, Outcome::Error("{\"code\":1}".into()), later(T0, 1));
    stale.owner = FencingToken::random();
    assert_eq!(store.complete(stale).await.unwrap(), Fenced::NotOwner);
    assert!(matches!(
        store.get(&id, later(T0, 1)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));

    let good = complete_req(&req, Outcome::Success("1".into()), later(T0, 1));
    assert_eq!(store.complete(good).await.unwrap(), Fenced::Applied);
    let again = complete_req(&req, Outcome::Success("2".into()), later(T0, 2));
    assert_eq!(store.complete(again).await.unwrap(), Fenced::NotOwner);
    let missing = complete_req(
        &claim_req(&self::id(&id.scope, "other"), T0),
        Outcome::Success("3".into()),
        T0,
    );
    assert_eq!(store.complete(missing).await.unwrap(), Fenced::NotOwner);
    let record = store.get(&id, later(T0, 3)).await.unwrap().unwrap();
    assert!(
        matches!(record.state, RecordState::Completed { outcome: Outcome::Success(ref s), .. } if s == "1")
    );
}

/// Releasing by the owner deletes the in-progress record; nobody else can release it, and a
/// completed record cannot be released.
pub async fn release_frees_the_key(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    assert_eq!(
        store.release(&id, FencingToken::random()).await.unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store.release(&id, req.owner).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(store.get(&id, T0).await.unwrap(), None);
    assert_eq!(
        store.release(&id, req.owner).await.unwrap(),
        Fenced::NotOwner
    );

    let next = claim_req(&id, later(T0, 1));
    assert_eq!(claim(&*store, &next).await, ClaimOutcome::Claimed);
    store
        .complete(complete_req(
            &next,
            Outcome::Success("1".into()),
            later(T0, 2),
        ))
        .await
        .unwrap();
    assert_eq!(
        store.release(&id, next.owner).await.unwrap(),
        Fenced::NotOwner
    );
    assert!(store.get(&id, later(T0, 3)).await.unwrap().is_some());
}

/// Renewal moves the lease deadline for the owner only.
pub async fn renew_extends_only_the_owners_lease(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    let new_deadline = later(T0, 100);
    assert_eq!(
        store
            .renew(&id, FencingToken::random(), new_deadline)
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store.renew(&id, req.owner, new_deadline).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.get(&id, T0).await.unwrap().unwrap().state,
        RecordState::InProgress {
            owner: req.owner,
            lease_expires_at: new_deadline
        }
    );
    store
        .complete(complete_req(
            &req,
            Outcome::Success("1".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    assert_eq!(
        store.renew(&id, req.owner, later(T0, 200)).await.unwrap(),
        Fenced::NotOwner
    );
}

/// A call renewed past its retention window is still in progress: its record does not expire,
/// so a retry cannot execute it a second time.
pub async fn renew_keeps_a_running_record_past_its_retention(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = ClaimRequest {
        expires_at: later(T0, 60),
        ..claim_req(&id, T0)
    };
    claim(&*store, &req).await;
    let deadline = later(T0, 90);
    assert_eq!(
        store.renew(&id, req.owner, deadline).await.unwrap(),
        Fenced::Applied
    );
    let record = store
        .get(&id, later(T0, 70))
        .await
        .unwrap()
        .expect("still running");
    assert_eq!(record.expires_at, deadline);
    assert!(matches!(
        claim(&*store, &claim_req(&id, later(T0, 70))).await,
        ClaimOutcome::Existing(_)
    ));
    let done = complete_req(&req, Outcome::Success("1".into()), later(T0, 80));
    assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
}

/// A take-over needs the dead owner's token and a lease that has run out; afterwards the old owner
/// is fenced off and the new one completes.
pub async fn take_over_only_after_the_lease_ran_out(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let req = claim_req(&id, T0);
    claim(&*store, &req).await;
    let new_owner = FencingToken::random();
    let take_over = |now: Timestamp, previous_owner: FencingToken| TakeOverRequest {
        id: id.clone(),
        previous_owner,
        new_owner,
        now,
        lease_expires_at: now.saturating_add(LEASE),
        expires_at: now.saturating_add(RETENTION),
    };
    let before_expiry = later(T0, 10);
    assert_eq!(
        store
            .take_over(&take_over(before_expiry, req.owner))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    let after_expiry = req.lease_expires_at;
    assert_eq!(
        store
            .take_over(&take_over(after_expiry, FencingToken::random()))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store
            .take_over(&take_over(after_expiry, req.owner))
            .await
            .unwrap(),
        Fenced::Applied
    );
    let record = store.get(&id, after_expiry).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        RecordState::InProgress {
            owner: new_owner,
            lease_expires_at: after_expiry.saturating_add(LEASE)
        }
    );
    let stale = complete_req(&req, Outcome::Success("old".into()), after_expiry);
    assert_eq!(store.complete(stale).await.unwrap(), Fenced::NotOwner);
    let mut fresh = complete_req(&req, Outcome::Success("new".into()), after_expiry);
    fresh.owner = new_owner;
    assert_eq!(store.complete(fresh).await.unwrap(), Fenced::Applied);
}

/// A record past its retention window is invisible and its key can be claimed anew.
pub async fn expired_records_count_as_absent(store: Arc<dyn Store>) {
    let id = id(&scope(), "k");
    let mut req = claim_req(&id, T0);
    req.expires_at = later(T0, 10);
    claim(&*store, &req).await;
    store
        .complete(CompleteRequest {
            expires_at: later(T0, 10),
            ..complete_req(&req, Outcome::Success("1".into()), later(T0, 1))
        })
        .await
        .unwrap();
    assert!(store.get(&id, later(T0, 9)).await.unwrap().is_some());
    assert_eq!(store.get(&id, later(T0, 10)).await.unwrap(), None);
    let next = claim_req(&id, later(T0, 10));
    assert_eq!(claim(&*store, &next).await, ClaimOutcome::Claimed);
    let record = store.get(&id, later(T0, 11)).await.unwrap().unwrap();
    assert_eq!(record.created_at, later(T0, 10));
    assert!(matches!(record.state, RecordState::InProgress { owner, .. } if owner == next.owner));
}

/// Purging deletes expired records and keeps live ones.
pub async fn purge_removes_only_expired(store: Arc<dyn Store>) {
    let scope = scope();
    for i in 0..5 {
        let mut req = claim_req(&id(&scope, &format!("k{i}")), T0);
        if i < 3 {
            req.expires_at = later(T0, 10);
        }
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    }
    let purged = store.purge_expired(later(T0, 10)).await.unwrap();
    assert!(purged >= 3, "purged {purged}");
    for i in 0..5 {
        let record = store.get(&id(&scope, &format!("k{i}")), T0).await.unwrap();
        assert_eq!(record.is_some(), i >= 3, "k{i}");
    }
}

/// The same key in two scopes (other principal, or other namespace) names two records.
pub async fn scopes_are_isolated(store: Arc<dyn Store>) {
    let alice = scope();
    let bob = Scope::new(alice.namespace(), "bob");
    let other_server = Scope::new(format!("{}-other", alice.namespace()), alice.principal());
    let a = claim_req(&id(&alice, "shared"), T0);
    let b = claim_req(&id(&bob, "shared"), T0);
    let c = claim_req(&id(&other_server, "shared"), T0);
    for req in [&a, &b, &c] {
        assert_eq!(claim(&*store, req).await, ClaimOutcome::Claimed);
    }
    store
        .complete(complete_req(
            &a,
            Outcome::Success("\"alice\"".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    assert!(matches!(
        store.get(&b.id, later(T0, 1)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));
    assert_eq!(
        store.release(&c.id, a.owner).await.unwrap(),
        Fenced::NotOwner
    );
    assert_eq!(
        store.release(&c.id, c.owner).await.unwrap(),
        Fenced::Applied
    );
    assert!(store.get(&a.id, later(T0, 1)).await.unwrap().is_some());
}

/// A scope at its limit is refused new keys without affecting other scopes; releasing or expiring
/// records makes room again.
pub async fn quota_per_scope(store: Arc<dyn Store>) {
    let full = scope();
    let limits = RecordLimits {
        max_records_per_scope: 2,
        max_records_total: u64::MAX,
    };
    let with_limits = |key: &str, now: Timestamp| ClaimRequest {
        limits,
        expires_at: later(T0, 100),
        ..claim_req(&id(&full, key), now)
    };
    let first = with_limits("a", T0);
    assert_eq!(claim(&*store, &first).await, ClaimOutcome::Claimed);
    assert_eq!(
        claim(&*store, &with_limits("b", T0)).await,
        ClaimOutcome::Claimed
    );
    assert_eq!(
        claim(&*store, &with_limits("c", T0)).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 2 })
    );
    // Existing keys are still answered.
    assert!(matches!(
        claim(&*store, &with_limits("a", T0)).await,
        ClaimOutcome::Existing(_)
    ));
    let elsewhere = ClaimRequest {
        limits,
        ..claim_req(&id(&Scope::new(full.namespace(), "someone-else"), "c"), T0)
    };
    assert_eq!(claim(&*store, &elsewhere).await, ClaimOutcome::Claimed);

    assert_eq!(
        store.release(&first.id, first.owner).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        claim(&*store, &with_limits("c", T0)).await,
        ClaimOutcome::Claimed
    );
    assert!(matches!(
        claim(&*store, &with_limits("d", T0)).await,
        ClaimOutcome::QuotaExceeded(_)
    ));
    // Once the records expire they no longer count.
    assert_eq!(
        claim(&*store, &with_limits("d", later(T0, 100))).await,
        ClaimOutcome::Claimed
    );
}

/// The store-wide limit counts every scope. Needs a store no other check writes to concurrently.
pub async fn quota_total(store: Arc<dyn Store>) {
    let stats = store.stats(T0).await.unwrap();
    let present = stats.in_progress + stats.completed + stats.expired;
    let limits = RecordLimits {
        max_records_per_scope: u64::MAX,
        max_records_total: present + 2,
    };
    let a = scope();
    let b = scope();
    for (scope, key) in [(&a, "1"), (&b, "2")] {
        let req = ClaimRequest {
            limits,
            ..claim_req(&id(scope, key), T0)
        };
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed);
    }
    let req = ClaimRequest {
        limits,
        ..claim_req(&id(&scope(), "3"), T0)
    };
    assert_eq!(
        claim(&*store, &req).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: present + 2 })
    );
}

/// Many tasks claiming one key at once: exactly one wins, all others see its record.
pub async fn racing_claims_have_one_winner(store: Arc<dyn Store>) {
    let id = id(&scope(), "contended");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let store = Arc::clone(&store);
            let req = claim_req(&id, T0);
            tokio::spawn(async move { (req.owner, store.claim(&req).await.expect("claim")) })
        })
        .collect();
    let mut winners = Vec::new();
    let mut owners_seen = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            (owner, ClaimOutcome::Claimed) => winners.push(owner),
            (_, ClaimOutcome::Existing(record)) => match record.state {
                RecordState::InProgress { owner, .. } => owners_seen.push(owner),
                other => panic!("unexpected state {other:?}"),
            },
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim must win");
    assert!(owners_seen.iter().all(|owner| *owner == winners[0]));
}

/// Many tasks claiming distinct keys at once all win.
pub async fn racing_distinct_keys_all_win(store: Arc<dyn Store>) {
    let scope = scope();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = Arc::clone(&store);
            let req = claim_req(&id(&scope, &format!("k{i}")), T0);
            tokio::spawn(async move { store.claim(&req).await.expect("claim") })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task"), ClaimOutcome::Claimed);
    }
    let stats = store.stats(T0).await.unwrap();
    assert!(stats.in_progress >= 64);
}

/// Success, error, not-retained and unknown outcomes come back as they were written.
pub async fn every_outcome_kind_round_trips(store: Arc<dyn Store>) {
    let scope = scope();
    let outcomes = [
        Outcome::Success(r#"{"content":[],"isError":true}"#.into()),
        Outcome::Error(r#"{"code":-32603,"message":"card declined","data":{"x":[1,2]}}"#.into()),
        Outcome::NotRetained { size: 5_000_000 },
        Outcome::Unknown {
            reason: "upstream exited with status 137".into(),
        },
        Outcome::Success("\"".to_owned() + &"x".repeat(256 * 1024) + "\""),
    ];
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let req = claim_req(&id(&scope, &format!("k{i}")), T0);
        claim(&*store, &req).await;
        store
            .complete(complete_req(&req, outcome.clone(), later(T0, 1)))
            .await
            .unwrap();
        let record = store.get(&req.id, later(T0, 1)).await.unwrap().unwrap();
        assert!(
            matches!(record.state, RecordState::Completed { outcome: ref got, .. } if *got == outcome),
            "outcome {i}"
        );
    }
}

/// Keys with quotes, SQL, Unicode and maximal length are distinct records, kept exactly.
pub async fn awkward_keys_are_kept_exactly(store: Arc<dyn Store>) {
    let scope = scope();
    let long = "€".repeat(85);
    let keys = [
        "'; DROP TABLE idempotency_records; --",
        "{key}",
        "a\"b\\c",
        "ключ 🔑",
        "K",
        "k",
        "k ",
        long.as_str(),
        "*",
        "%",
    ];
    for key in keys {
        let req = claim_req(&id(&scope, key), T0);
        assert_eq!(claim(&*store, &req).await, ClaimOutcome::Claimed, "{key:?}");
    }
    for key in keys {
        let record = store.get(&id(&scope, key), T0).await.unwrap().expect(key);
        assert_eq!(record.id.key.as_str(), key);
    }
}

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

/// The keys of `records`, in order.
fn keys(records: &[Record]) -> Vec<&str> {
    records
        .iter()
        .map(|record| record.id.key.as_str())
        .collect()
}

async fn list(store: &dyn Store, filter: &ListFilter, now: Timestamp) -> Vec<Record> {
    store.list(filter, now, usize::MAX).await.expect("list")
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

/// Deleting removes a record whatever its state, so the key runs again; the old owner is fenced
/// off, the quotas count one record less, and deleting a missing record reports it.
pub async fn delete_frees_the_key_in_any_state(store: Arc<dyn Store>) {
    let scope = scope();
    let limits = RecordLimits {
        max_records_per_scope: 2,
        max_records_total: u64::MAX,
    };
    let running = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "running"), T0)
    };
    let done = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "done"), T0)
    };
    for req in [&running, &done] {
        assert_eq!(claim(&*store, req).await, ClaimOutcome::Claimed);
    }
    store
        .complete(complete_req(
            &done,
            Outcome::Success("1".into()),
            later(T0, 1),
        ))
        .await
        .unwrap();
    let third = ClaimRequest {
        limits,
        ..claim_req(&id(&scope, "third"), later(T0, 2))
    };
    assert!(matches!(
        claim(&*store, &third).await,
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 2 })
    ));

    assert!(store.delete(&running.id).await.unwrap());
    assert_eq!(store.get(&running.id, later(T0, 2)).await.unwrap(), None);
    let late = complete_req(&running, Outcome::Success("late".into()), later(T0, 2));
    assert_eq!(store.complete(late).await.unwrap(), Fenced::NotOwner);
    assert_eq!(
        store
            .renew(&running.id, running.owner, later(T0, 60))
            .await
            .unwrap(),
        Fenced::NotOwner
    );
    assert!(!store.delete(&running.id).await.unwrap());
    // The freed place in the quota goes to a new key.
    assert_eq!(claim(&*store, &third).await, ClaimOutcome::Claimed);

    assert!(store.delete(&done.id).await.unwrap());
    let again = ClaimRequest {
        limits,
        ..claim_req(&done.id, later(T0, 3))
    };
    assert_eq!(claim(&*store, &again).await, ClaimOutcome::Claimed);
    let record = store.get(&done.id, later(T0, 3)).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::InProgress { owner, .. } if owner == again.owner));

    // An expired record that was not purged yet can be deleted too.
    let expiring = ClaimRequest {
        expires_at: later(T0, 10),
        ..claim_req(&id(&scope, "expiring"), T0)
    };
    assert_eq!(claim(&*store, &expiring).await, ClaimOutcome::Claimed);
    let expired = ListFilter {
        namespace: Some(scope.namespace().to_owned()),
        state: Some(StateFilter::Expired),
        ..ListFilter::default()
    };
    assert_eq!(
        keys(&list(&*store, &expired, later(T0, 20)).await),
        ["expiring"]
    );
    assert!(store.delete(&expiring.id).await.unwrap());
    assert!(list(&*store, &expired, later(T0, 20)).await.is_empty());

    let before = store.stats(later(T0, 4)).await.unwrap();
    assert!(store.delete(&third.id).await.unwrap());
    let after = store.stats(later(T0, 4)).await.unwrap();
    assert_eq!(before.in_progress - after.in_progress, 1);
}
