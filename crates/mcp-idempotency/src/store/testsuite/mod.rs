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

mod inspection;
mod lifecycle;
mod quotas;
mod resend;
mod round_trip;

use std::sync::Arc;
use std::time::Duration;

use super::{ClaimOutcome, ClaimRequest, CompleteRequest, ListFilter, RecordLimits, Store};
use crate::fingerprint::fingerprint;
use crate::key::IdempotencyKey;
use crate::record::{FencingToken, Outcome, Record, RecordId, Scope};
use crate::time::Timestamp;

pub use inspection::{
    list_filters_by_scope_key_state_and_age, list_orders_by_expiry_and_honours_the_limit,
    list_returns_awkward_ids_exactly, stats_count_states,
};
pub use lifecycle::{
    claim_then_existing, complete_is_fenced, complete_then_replay_exactly,
    delete_frees_the_key_in_any_state, expired_records_count_as_absent, purge_removes_only_expired,
    release_frees_the_key, renew_extends_only_the_owners_lease,
    renew_keeps_a_running_record_past_its_retention, take_over_only_after_the_lease_ran_out,
};
pub use quotas::{
    quota_per_scope, quota_total, racing_claims_have_one_winner, racing_distinct_keys_all_win,
    scopes_are_isolated,
};
pub use resend::{
    claim_sent_twice_is_claimed_once, complete_sent_twice_is_applied_once,
    release_sent_twice_changes_nothing, renew_sent_twice_is_applied_twice,
    take_over_sent_twice_is_applied_once,
};
pub use round_trip::{
    awkward_keys_are_kept_exactly, every_outcome_kind_round_trips,
    traces_are_kept_with_their_record,
};

pub(crate) const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);
pub(crate) const LEASE: Duration = Duration::from_secs(30);
pub(crate) const RETENTION: Duration = Duration::from_secs(3600);

/// Instantiates every check of [`testsuite`](crate::store::testsuite) as a `#[tokio::test]`, for
/// stores made by `$make`: an expression callable with no arguments that returns a future of
/// `Arc<dyn Store>` or of `Option<Arc<dyn Store>>` (`None`: no store to check, see the module docs).
///
/// `store_test_suite!(total_quota_bounded: $make)` instantiates every check but `quota_total`, for
/// a store whose store-wide quota is bounded rather than exact (the Redis Cluster store), which
/// must then test its own bound.
#[macro_export]
macro_rules! store_test_suite {
    ($make:expr) => {
        $crate::store_test_suite!(@common $make; quota_total);
    };
    (total_quota_bounded: $make:expr) => {
        $crate::store_test_suite!(@common $make;);
    };
    (@common $make:expr; $($extra:ident),*) => {
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
            racing_claims_have_one_winner,
            racing_distinct_keys_all_win,
            every_outcome_kind_round_trips,
            awkward_keys_are_kept_exactly,
            traces_are_kept_with_their_record,
            stats_count_states,
            list_filters_by_scope_key_state_and_age,
            list_orders_by_expiry_and_honours_the_limit,
            list_returns_awkward_ids_exactly,
            delete_frees_the_key_in_any_state,
            claim_sent_twice_is_claimed_once,
            complete_sent_twice_is_applied_once,
            release_sent_twice_changes_nothing,
            renew_sent_twice_is_applied_twice,
            take_over_sent_twice_is_applied_once,
            $($extra),*
        );
        $crate::store_test_suite!(@derived $make;
            derived_keys_round_trip_with_their_source_prefix,
            derived_keys_are_listed_by_key_and_source,
            a_client_key_equal_to_a_derived_keys_text_is_another_record,
            derived_keys_keep_principals_apart,
            quotas_count_derived_keys,
            crash_rules_hold_for_derived_keys,
            a_window_keys_record_expires_with_its_window
        );
    };
    (@derived $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store = $crate::store::testsuite::MaybeStore::into_store(($make)().await);
                if let Some(store) = store {
                    $crate::derived_keys_testsuite::$name(store).await;
                }
            }
        )*
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

pub(crate) fn scope() -> Scope {
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
        trace: None,
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

/// The keys of `records`, in order.
pub(crate) fn keys(records: &[Record]) -> Vec<&str> {
    records
        .iter()
        .map(|record| record.id.key.as_str())
        .collect()
}

pub(crate) async fn list(store: &dyn Store, filter: &ListFilter, now: Timestamp) -> Vec<Record> {
    store.list(filter, now, usize::MAX).await.expect("list")
}
