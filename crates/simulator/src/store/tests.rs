//! The shared store suite against the model, and the model's own durability checks.

use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::fingerprint::fingerprint;
use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, RecordLimits,
    Store, StoreStats,
};
use mcp_idempotency::{
    FencingToken, IdempotencyKey, Outcome, Record, RecordId, RecordState, Scope, Timestamp,
};

use super::durability::DURABLE_HISTORY;
use super::{Answer, ModelStore, Op, WriteSeq};

mcp_idempotency::store_test_suite!(|| async { Arc::new(ModelStore::new()) as Arc<dyn Store> });

const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.saturating_add(Duration::from_secs(secs))
}

fn id(principal: &str, key: &str) -> RecordId {
    RecordId {
        scope: Scope::new("ns", principal),
        key: IdempotencyKey::new(key, 1024).expect("valid key"),
    }
}

/// A claim of `id` at `T0` by the token `owner`, retained 100 s, leased 30 s.
fn claim_req(id: &RecordId, owner: u64) -> ClaimRequest {
    ClaimRequest {
        trace: None,
        id: id.clone(),
        fingerprint: fingerprint("charge", Some(r#"{"amount":1}"#)).expect("valid arguments"),
        tool_name: "charge".into(),
        owner: FencingToken::from_u64(owner),
        now: T0,
        lease_expires_at: at(30),
        expires_at: at(100),
        limits: RecordLimits::UNLIMITED,
    }
}

fn one_per_scope(req: ClaimRequest) -> ClaimRequest {
    ClaimRequest {
        limits: RecordLimits {
            max_records_per_scope: 1,
            max_records_total: u64::MAX,
        },
        ..req
    }
}

/// Applies `op`, which must write; returns its place in the log.
fn write(store: &ModelStore, op: Op) -> (Answer, WriteSeq) {
    let (answer, seq) = store.apply(&op);
    (answer, seq.unwrap_or_else(|| panic!("{op:?} writes")))
}

fn get(store: &ModelStore, id: &RecordId, now: Timestamp) -> Option<Record> {
    match store.apply(&Op::Get {
        id: id.clone(),
        now,
    }) {
        (Answer::Record(record), None) => record,
        other => panic!("get answered {other:?}"),
    }
}

#[test]
fn an_unacknowledged_claim_is_undone_by_a_restart() {
    let store = ModelStore::new();
    let a = id("p", "a");
    let (answer, _) = write(&store, Op::Claim(claim_req(&a, 1)));
    assert_eq!(answer, Answer::Claim(ClaimOutcome::Claimed));
    assert_eq!(store.restart(0), std::slice::from_ref(&a));
    assert_eq!(get(&store, &a, T0), None);
    assert!(store.records().is_empty());
}

#[test]
fn an_acknowledged_claim_survives_a_restart() {
    let store = ModelStore::new();
    let a = id("p", "a");
    let (_, seq) = write(&store, Op::Claim(claim_req(&a, 1)));
    store.acknowledge(seq);
    assert_eq!(store.restart(0), []);
    assert!(get(&store, &a, T0).is_some());
}

#[test]
fn acknowledging_a_write_makes_every_earlier_one_durable() {
    let store = ModelStore::new();
    let ids: Vec<RecordId> = (1..=6).map(|i| id("p", &format!("k{i}"))).collect();
    let seqs: Vec<WriteSeq> = ids
        .iter()
        .zip(1..)
        .map(|(id, owner)| write(&store, Op::Claim(claim_req(id, owner))).1)
        .collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]));
    store.acknowledge(seqs[4]);
    // A late acknowledgement of an earlier write changes nothing.
    store.acknowledge(seqs[2]);
    assert_eq!(store.restart(0), [ids[5].clone()]);
    let held: Vec<RecordId> = store.records().into_iter().map(|r| r.id).collect();
    assert_eq!(held, ids[..5]);
}

#[test]
fn losing_one_acknowledged_write_undoes_the_last_one() {
    let store = ModelStore::new();
    let a = id("p", "a");
    let claim = claim_req(&a, 1);
    let (_, claimed) = write(&store, Op::Claim(claim.clone()));
    store.acknowledge(claimed);
    let done = CompleteRequest {
        id: a.clone(),
        owner: claim.owner,
        outcome: Outcome::Success("1".into()),
        completed_at: at(1),
        expires_at: at(101),
    };
    let (answer, completed) = write(&store, Op::Complete(done));
    assert_eq!(answer, Answer::Fenced(Fenced::Applied));
    store.acknowledge(completed);
    let b = id("p", "b");
    write(&store, Op::Claim(claim_req(&b, 2)));

    // The unacknowledged claim of b goes, and the completion of a with it.
    assert_eq!(store.restart(1), [a.clone(), b.clone()]);
    let record = get(&store, &a, at(2)).expect("the claim was kept");
    assert_eq!(
        record.state,
        RecordState::InProgress {
            owner: claim.owner,
            lease_expires_at: at(30)
        }
    );
    assert_eq!(get(&store, &b, at(2)), None);
    // What is left is durable.
    assert_eq!(store.restart(0), []);
}

#[test]
fn a_restart_loses_no_more_acknowledged_writes_than_it_remembers() {
    let store = ModelStore::new();
    let total = DURABLE_HISTORY + 10;
    for i in 0..total {
        let (_, seq) = write(
            &store,
            Op::Claim(claim_req(&id("p", &format!("{i:03}")), 1)),
        );
        store.acknowledge(seq);
    }
    assert_eq!(store.restart(usize::MAX).len(), DURABLE_HISTORY);
    assert_eq!(store.records().len(), total - DURABLE_HISTORY);
    assert_eq!(store.restart(usize::MAX), []);
}

#[test]
fn an_undone_delete_restores_the_record_and_its_place_in_the_quota() {
    let store = ModelStore::new();
    let a = id("p", "a");
    let (_, seq) = write(&store, Op::Claim(one_per_scope(claim_req(&a, 1))));
    store.acknowledge(seq);
    let (answer, _) = write(&store, Op::Delete { id: a.clone() });
    assert_eq!(answer, Answer::Deleted(true));
    assert_eq!(store.restart(0), std::slice::from_ref(&a));
    assert!(get(&store, &a, T0).is_some());
    let other = one_per_scope(claim_req(&id("p", "b"), 2));
    assert_eq!(
        store.apply(&Op::Claim(other)),
        (
            Answer::Claim(ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope {
                limit: 1
            })),
            None
        )
    );
}

#[test]
fn an_undone_purge_restores_the_expired_records() {
    let store = ModelStore::new();
    let a = id("p", "a");
    let (_, seq) = write(&store, Op::Claim(one_per_scope(claim_req(&a, 1))));
    store.acknowledge(seq);
    let (answer, _) = write(&store, Op::PurgeExpired { now: at(100) });
    assert_eq!(answer, Answer::Count(1));
    assert_eq!(store.restart(0), std::slice::from_ref(&a));
    let stats = store.apply(&Op::Stats { now: at(100) });
    let expired = StoreStats {
        expired: 1,
        ..StoreStats::default()
    };
    assert_eq!(stats, (Answer::Stats(expired), None));

    // A claim of another key at the limit purges the expired record again, and is admitted.
    let b = id("p", "b");
    let late = ClaimRequest {
        now: at(100),
        lease_expires_at: at(130),
        expires_at: at(200),
        ..one_per_scope(claim_req(&b, 2))
    };
    let (answer, _) = write(&store, Op::Claim(late));
    assert_eq!(answer, Answer::Claim(ClaimOutcome::Claimed));
    let held: Vec<RecordId> = store.records().into_iter().map(|r| r.id).collect();
    assert_eq!(held, std::slice::from_ref(&b));
    // Undone, the claim brings the purged record back too.
    assert_eq!(store.restart(0), [a.clone(), b]);
    assert_eq!(store.records().len(), 1);
}

#[test]
fn operations_that_change_nothing_have_no_place_in_the_log() {
    let store = ModelStore::new();
    let a = id("p", "a");
    let claim = claim_req(&a, 1);
    write(&store, Op::Claim(claim.clone()));
    let renew = Op::Renew {
        id: a.clone(),
        owner: claim.owner,
        lease_expires_at: at(40),
    };
    write(&store, renew.clone());
    for op in [
        Op::Claim(claim.clone()),
        renew,
        Op::Release {
            id: a.clone(),
            owner: FencingToken::from_u64(9),
        },
        Op::Delete { id: id("p", "b") },
        Op::PurgeExpired { now: at(1) },
        Op::List {
            filter: ListFilter::default(),
            now: T0,
            limit: 10,
        },
    ] {
        assert_eq!(store.apply(&op).1, None, "{op:?}");
    }
}

#[test]
fn records_and_lists_come_in_one_order() {
    let store = ModelStore::new();
    for (principal, key) in [("q", "b"), ("p", "z"), ("q", "a"), ("p", "c")] {
        write(&store, Op::Claim(claim_req(&id(principal, key), 1)));
    }
    let later = ClaimRequest {
        expires_at: at(200),
        ..claim_req(&id("q", "later"), 1)
    };
    write(&store, Op::Claim(later));
    let names = |records: Vec<Record>| -> Vec<String> {
        records
            .iter()
            .map(|r| format!("{}/{}", r.id.scope.principal(), r.id.key.as_str()))
            .collect()
    };
    assert_eq!(
        names(store.records()),
        ["p/c", "p/z", "q/a", "q/b", "q/later"]
    );
    let op = Op::List {
        filter: ListFilter::default(),
        now: T0,
        limit: 4,
    };
    let Answer::Records(listed) = store.apply(&op).0 else {
        panic!("list answers records")
    };
    assert_eq!(names(listed), ["q/later", "p/c", "p/z", "q/a"]);
}

/// Many operations drawn from `seed` on a few keys, scopes, tokens and times, with writes
/// acknowledged at random and restarts (`restart(0)`) now and then: after each restart the store
/// holds exactly what it held right after the last acknowledged write. Returns every answer, as
/// text.
fn seeded_mix(seed: u64, ops: usize) -> Vec<String> {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    let mut rng = StdRng::seed_from_u64(seed);
    let store = ModelStore::new();
    let mut transcript = Vec::new();
    let mut snapshots: std::collections::BTreeMap<WriteSeq, Vec<Record>> = Default::default();
    let mut durable: Vec<Record> = Vec::new();
    let mut acknowledged: Option<WriteSeq> = None;
    let mut unacknowledged: Vec<WriteSeq> = Vec::new();
    for _ in 0..ops {
        let id = id(
            ["p", "q"][rng.random_range(0..2)],
            &format!("k{}", rng.random_range(0..6)),
        );
        let owner = FencingToken::from_u64(rng.random_range(1..4));
        let now = at(rng.random_range(0..300));
        let limits = RecordLimits {
            max_records_per_scope: rng.random_range(2..6),
            max_records_total: rng.random_range(4..12),
        };
        let op = match rng.random_range(0..10) {
            0..=2 => Op::Claim(ClaimRequest {
                now,
                lease_expires_at: now.saturating_add(Duration::from_secs(30)),
                expires_at: now.saturating_add(Duration::from_secs(100)),
                limits,
                ..claim_req(&id, owner.as_u64())
            }),
            3 => Op::Complete(CompleteRequest {
                id,
                owner,
                outcome: Outcome::Success("1".into()),
                completed_at: now,
                expires_at: now.saturating_add(Duration::from_secs(100)),
            }),
            4 => Op::TakeOver(mcp_idempotency::store::TakeOverRequest {
                trace: None,
                id,
                previous_owner: owner,
                new_owner: FencingToken::from_u64(rng.random_range(1..4)),
                now,
                lease_expires_at: now.saturating_add(Duration::from_secs(30)),
                expires_at: now.saturating_add(Duration::from_secs(100)),
            }),
            5 => Op::Renew {
                id,
                owner,
                lease_expires_at: now,
            },
            6 => Op::Release { id, owner },
            7 => Op::PurgeExpired { now },
            8 => Op::Delete { id },
            _ => Op::List {
                filter: ListFilter::default(),
                now,
                limit: 5,
            },
        };
        let (answer, seq) = store.apply(&op);
        transcript.push(format!("{answer:?} {seq:?}"));
        if let Some(seq) = seq {
            snapshots.insert(seq, store.records());
            unacknowledged.push(seq);
        }
        match rng.random_range(0..8) {
            0 if !unacknowledged.is_empty() => {
                let seq = unacknowledged[rng.random_range(0..unacknowledged.len())];
                store.acknowledge(seq);
                if acknowledged < Some(seq) {
                    acknowledged = Some(seq);
                    durable = snapshots[&seq].clone();
                }
                unacknowledged.retain(|later| *later > seq);
            }
            1 => {
                let changed = store.restart(0);
                transcript.push(format!("restart {changed:?}"));
                assert_eq!(store.records(), durable, "seed {seed}");
                unacknowledged.clear();
            }
            _ => {}
        }
    }
    transcript
}

#[test]
fn a_restart_returns_to_the_last_acknowledged_write_and_runs_repeat() {
    for seed in 0..20 {
        let transcript = seeded_mix(seed, 2_000);
        assert_eq!(transcript, seeded_mix(seed, 2_000), "seed {seed}");
    }
}
