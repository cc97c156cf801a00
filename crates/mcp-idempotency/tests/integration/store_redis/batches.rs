//! On one server with `replicas=N`, claims and completions that wait at the same time share one
//! script call (and one `WAIT`). Each check runs a primary and a replica of its own, so that the
//! primary's `INFO commandstats` counts only the check's script calls.

use super::*;
use crate::at_once::{claim_all, complete_all};

/// A primary and its replica on free ports, killed when dropped, and a store on the primary that
/// waits for the replica.
struct Pair {
    primary: Option<PrivateServer>,
    _replica: PrivateServer,
    _dir: tempfile::TempDir,
    store: Arc<RedisStore>,
    /// The primary's URL, without the replica option.
    url: String,
    prefix: String,
}

/// Starts a [`Pair`] once the replica has synced, or `None` (with a note) when redis-server
/// cannot start outside CI.
async fn pair() -> Option<Pair> {
    let dir = tempfile::tempdir().expect("a directory for the servers");
    let (port, replica_port) = (free_port(), free_port());
    let primary = PrivateServer::start_in(port, dir.path(), &[])?;
    let primary_port = port.to_string();
    let replica = PrivateServer::start_in(
        replica_port,
        dir.path(),
        &["--replicaof", "127.0.0.1", &primary_port],
    )?;
    let url = format!("redis://127.0.0.1:{port}");
    wait_until_up(&url).await;
    let prefix = random_prefix();
    let store = RedisStore::open_with_prefix(
        &format!("{url}/?replicas=1&replica_timeout_ms=2000"),
        &prefix,
    )
    .await
    .expect("open");
    // Writes are acknowledged once the replica has synced.
    let deadline = Instant::now() + Duration::from_secs(20);
    let probe = record_id("probe", "p", "synced");
    loop {
        match store.claim(&claim_req(&probe, T0)).await {
            Ok(_) => break,
            Err(err) => assert!(Instant::now() < deadline, "the replica never synced: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.delete(&probe).await.expect("delete the probe"));
    Some(Pair {
        primary: Some(primary),
        _replica: replica,
        _dir: dir,
        store: Arc::new(store),
        url,
        prefix,
    })
}

/// How many `EVALSHA`s the server at `url` has run.
async fn script_calls(url: &str) -> u64 {
    let mut conn = redis::Client::open(url)
        .expect("url parses")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn done(req: &ClaimRequest, owner: FencingToken, body: &str) -> CompleteRequest {
    CompleteRequest {
        id: req.id.clone(),
        owner,
        outcome: Outcome::Success(body.into()),
        completed_at: T0,
        expires_at: later(T0, 3600),
    }
}

/// 48 claims and then their 48 completions (with a stranger's), each set sent at once: each gets
/// its own right answer, from at most half as many script calls as operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operations_that_wait_at_the_same_time_share_script_calls() {
    let Some(pair) = pair().await else {
        return;
    };
    let (store, url) = (&pair.store, &pair.url);
    let reqs: Vec<_> = (0..48)
        .map(|i| {
            claim_req(
                &record_id("batch", &format!("p{}", i % 3), &format!("k{i}")),
                T0,
            )
        })
        .collect();
    let before = script_calls(url).await;
    let answers = claim_all(store, reqs.clone()).await;
    let calls = script_calls(url).await - before;
    for answer in &answers {
        assert_eq!(*answer.as_ref().expect("claim"), ClaimOutcome::Claimed);
    }
    // Half is a bound a loaded machine keeps: the 47 that queue behind the first usually share one.
    assert!(calls <= 24, "48 claims took {calls} script calls");

    let mut completions: Vec<_> = reqs
        .iter()
        .enumerate()
        .map(|(i, req)| done(req, req.owner, &format!("{i}")))
        .collect();
    completions.push(done(&reqs[0], FencingToken::random(), "\"stranger\""));
    let before = script_calls(url).await;
    let answers = complete_all(store, completions).await;
    let calls = script_calls(url).await - before;
    let (stranger, answers) = answers.split_last().expect("49 answers");
    for answer in answers {
        assert_eq!(*answer.as_ref().expect("complete"), Fenced::Applied);
    }
    assert_eq!(*stranger.as_ref().expect("complete"), Fenced::NotOwner);
    assert!(calls <= 25, "49 completions took {calls} script calls");

    for (i, req) in reqs.iter().enumerate() {
        let record = store.get(&req.id, T0).await.expect("get").expect("kept");
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::Success(format!("{i}")),
                completed_at: T0,
            },
            "{:?}",
            req.id
        );
    }
    let stats = store.stats(T0).await.expect("stats");
    assert_eq!((stats.in_progress, stats.completed), (0, 48));
}

/// 20 owners claim one key at once, one of them twice: one owner holds it, its resend is
/// recognised as its own, and every other claimant finds that owner's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_claimed_at_once_by_many_has_one_owner() {
    let Some(pair) = pair().await else {
        return;
    };
    let store = &pair.store;
    let id = record_id("batch", "p", "contested");
    let mut reqs: Vec<_> = (0..20).map(|_| claim_req(&id, T0)).collect();
    reqs.push(reqs[7].clone());
    let answers = claim_all(store, reqs.clone()).await;
    let record = store.get(&id, T0).await.expect("get").expect("claimed");
    let RecordState::InProgress { owner, .. } = record.state else {
        panic!("not in progress: {record:?}");
    };
    for (req, answer) in reqs.iter().zip(&answers) {
        match answer.as_ref().expect("claim") {
            ClaimOutcome::Claimed => assert_eq!(req.owner, owner),
            ClaimOutcome::Existing(found) => {
                assert_ne!(req.owner, owner);
                assert_eq!(found.state, record.state);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// 60 claims at once in each of three scopes, at most 20 per scope and 45 in all: exactly 45
/// admitted, at most 20 per scope, and each refusal names the quota that was full.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_keep_quotas_exact() {
    let Some(pair) = pair().await else {
        return;
    };
    let store = &pair.store;
    let limits = RecordLimits {
        max_records_per_scope: 20,
        max_records_total: 45,
    };
    let reqs: Vec<_> = (0..180)
        .map(|i| ClaimRequest {
            limits,
            ..claim_req(
                &record_id("quota", &format!("p{}", i % 3), &format!("k{i}")),
                T0,
            )
        })
        .collect();
    let answers = claim_all(store, reqs.clone()).await;
    let mut admitted = [0; 3];
    for (i, answer) in answers.iter().enumerate() {
        match answer.as_ref().expect("claim") {
            ClaimOutcome::Claimed => admitted[i % 3] += 1,
            ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 20 })
            | ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 45 }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(admitted.iter().sum::<u32>(), 45, "{admitted:?}");
    assert!(admitted.iter().all(|&n| n <= 20), "{admitted:?}");
    assert_eq!(store.stats(T0).await.expect("stats").in_progress, 45);
}

/// Claims whose scope index is not a sorted set make the script of their batch fail: each
/// operation of such a batch runs again alone, so every other claim is claimed (once) and each of
/// those gets its own error. One claim in four is such a claim, so every batch of a few holds one,
/// and most claims end up running alone: more script calls than claims sent at once take without
/// failures (at most half, the first check).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_batch_runs_each_operation_alone() {
    let Some(pair) = pair().await else {
        return;
    };
    let (store, url, prefix) = (&pair.store, &pair.url, &pair.prefix);
    let mut conn = redis::Client::open(url.as_str())
        .expect("url parses")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let _: () = redis::cmd("SET")
        .arg(format!("{{{prefix}}}:s:broken:p"))
        .arg("not a sorted set")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let broken = |i: usize| i % 4 == 1;
    let reqs: Vec<_> = (0..40)
        .map(|i| {
            let namespace = if broken(i) { "broken" } else { "fine" };
            claim_req(&record_id(namespace, "p", &format!("k{i}")), T0)
        })
        .collect();
    let before = script_calls(url).await;
    let answers = claim_all(store, reqs.clone()).await;
    let calls = script_calls(url).await - before;
    for (i, answer) in answers.iter().enumerate() {
        if broken(i) {
            let err = answer.as_ref().expect_err("a wrong type");
            assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
        } else {
            assert_eq!(*answer.as_ref().expect("claim"), ClaimOutcome::Claimed);
        }
    }
    assert!(
        calls > 20,
        "40 claims took only {calls} script calls: no batch failed"
    );
    assert_eq!(store.stats(T0).await.expect("stats").in_progress, 30);
}

/// Claims sent at once while the server is down each fail `Unavailable` within the operation
/// bound, none of them hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_during_an_outage_answers_each_unavailable() {
    let Some(mut pair) = pair().await else {
        return;
    };
    pair.primary.take().expect("running").stop();
    let store = &pair.store;
    let reqs: Vec<_> = (0..20)
        .map(|i| claim_req(&record_id("outage", "p", &format!("k{i}")), T0))
        .collect();
    let started = Instant::now();
    let answers = claim_all(store, reqs.clone()).await;
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "took {:?}",
        started.elapsed()
    );
    for answer in answers {
        let err = answer.expect_err("server is down");
        assert!(err.is_unavailable(), "{err:?}");
    }
}
