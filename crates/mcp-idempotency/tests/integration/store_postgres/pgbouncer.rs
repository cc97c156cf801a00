//! Through PgBouncer in transaction pooling mode (`PGBOUNCER_URL`, default
//! `postgres://postgres@127.0.0.1:6432/test`; `scripts/pgbouncer.sh start` starts one): the
//! shared suite passes, claims from many tasks at once agree, and the pooler really pools
//! transactions. Under `CI=true` the tests fail when PgBouncer is unreachable.
//!
//! Consecutive statements of one client connection may run on different server connections
//! there, so a store relying on named prepared statements fails ("prepared statement … does not
//! exist") as soon as two clients share a server connection.

use super::*;

const DEFAULT_PGBOUNCER_URL: &str = "postgres://postgres@127.0.0.1:6432/test";

fn pgbouncer_url() -> String {
    std::env::var("PGBOUNCER_URL").unwrap_or_else(|_| DEFAULT_PGBOUNCER_URL.to_owned())
}

async fn reachable_pgbouncer() -> Option<String> {
    reachable(
        "PGBOUNCER_URL",
        &pgbouncer_url(),
        "start PgBouncer with scripts/pgbouncer.sh start or point PGBOUNCER_URL at one",
    )
    .await
}

mcp_idempotency::store_test_suite!(|| async {
    match reachable_pgbouncer().await {
        Some(url) => Some(Arc::new(TestStore::open(&url).await) as Arc<dyn Store>),
        None => None,
    }
});

/// The pooler behind `PGBOUNCER_URL` pools transactions: its admin console (database
/// `pgbouncer`) says `pool_mode = transaction`. Otherwise the suite above would prove nothing.
#[tokio::test]
async fn pgbouncer_pools_transactions() {
    let Some(url) = reachable_pgbouncer().await else {
        return;
    };
    let mut config = tokio_postgres::Config::from_str(&url).unwrap();
    config.dbname("pgbouncer");
    let (client, connection) = config
        .connect(NoTls)
        .await
        .expect("PgBouncer's admin console (the script makes the user postgres an admin)");
    tokio::spawn(connection);
    let messages = client.simple_query("SHOW CONFIG").await.unwrap();
    let mode = messages.iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("pool_mode") => {
            row.get(1).map(str::to_owned)
        }
        _ => None,
    });
    assert_eq!(mode.as_deref(), Some("transaction"));
}

/// Many stores (one per simulated gateway instance) claim, complete and read many keys at once
/// through the pooler, which multiplexes them over a few server connections: every claim gets a
/// clear answer, each key is claimed once, and the counters agree with the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_share_few_server_connections() {
    let Some(url) = reachable_pgbouncer().await else {
        return;
    };
    let schema = fresh_schema();
    let first = TestStore::open_via(&url, &url, &schema).await;
    let mut stores = vec![first.inner().clone()];
    for _ in 0..3 {
        stores.push(PostgresStore::open_in_schema(&url, &schema).await.unwrap());
    }
    let scope = scope();
    let limits = RecordLimits {
        max_records_per_scope: 1_000,
        max_records_total: 10_000,
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = stores[i % stores.len()].clone();
        let id = record_id(&scope, &format!("key-{}", i % 50));
        tasks.push(tokio::spawn(async move {
            let req = claim_req(&id, T0, limits);
            let claimed = matches!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
            if claimed {
                let done = store
                    .complete(CompleteRequest {
                        id: id.clone(),
                        owner: req.owner,
                        outcome: Outcome::Success(r#"{"ok":true}"#.into()),
                        completed_at: T0,
                        expires_at: later(T0, 3600),
                    })
                    .await
                    .unwrap();
                assert_eq!(done, Fenced::Applied);
            }
            store.get(&id, T0).await.unwrap().expect("the record");
            claimed
        }));
    }
    let mut claimed = 0;
    for task in tasks {
        claimed += usize::from(task.await.unwrap());
    }
    assert_eq!(claimed, 50, "each of the 50 keys is claimed exactly once");
    let stats = stores[1].stats(T0).await.unwrap();
    assert_eq!(stats.completed, 50);
    // Checked on a direct connection: the checks use named prepared statements (tokio-postgres'
    // `query`), which fail through the pooler ("prepared statement \"s10\" does not exist").
    assert_counters_consistent(&database_url(), &schema).await;
}
