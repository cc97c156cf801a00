//! The schema: a version 1 schema migrated on open, values round-tripped bit for bit, concurrent
//! opens of a new schema, a newer schema refused, and a schema chosen in the store URL.

use super::*;

/// The version 1 tables, as the previous build created them.
fn v1_ddl(s: &str) -> String {
    format!(
        "CREATE SCHEMA {s};
        CREATE TABLE {s}.idem_schema_version (
            id      smallint PRIMARY KEY CHECK (id = 1),
            version integer  NOT NULL
        );
        INSERT INTO {s}.idem_schema_version (id, version) VALUES (1, 1);
        CREATE TABLE IF NOT EXISTS {s}.idem_records (
            namespace        text COLLATE \"C\" NOT NULL,
            principal        text COLLATE \"C\" NOT NULL,
            key              text COLLATE \"C\" NOT NULL,
            fingerprint      bytea  NOT NULL CHECK (octet_length(fingerprint) = 32),
            tool_name        text   NOT NULL,
            owner            bigint,
            lease_expires_at bigint,
            outcome_kind     text,
            outcome_body     text,
            completed_at     bigint,
            created_at       bigint NOT NULL,
            expires_at       bigint NOT NULL,
            PRIMARY KEY (namespace, principal, key),
            CHECK ((owner IS NULL) = (outcome_kind IS NOT NULL))
        );
        CREATE INDEX IF NOT EXISTS idem_records_expires_at ON {s}.idem_records (expires_at);
        CREATE TABLE IF NOT EXISTS {s}.idem_scope_counts (
            namespace text COLLATE \"C\" NOT NULL,
            principal text COLLATE \"C\" NOT NULL,
            records   bigint NOT NULL,
            PRIMARY KEY (namespace, principal)
        );
        CREATE TABLE IF NOT EXISTS {s}.idem_totals (
            id      smallint PRIMARY KEY CHECK (id = 1),
            records bigint NOT NULL
        );
        INSERT INTO {s}.idem_totals (id, records) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
        CREATE TABLE IF NOT EXISTS {s}.idem_quota_guard (
            total_ok boolean CONSTRAINT idem_total_quota_exceeded CHECK (total_ok),
            scope_ok boolean CONSTRAINT idem_scope_quota_exceeded CHECK (scope_ok)
        );"
    )
}

/// A version 1 schema with records in it is migrated on open: the records are kept (in shard 0),
/// the counts carried over, quotas hold across old and new records, and releasing and purging old
/// records uncounts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_a_version_1_schema() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let schema = fresh_schema();
    let client = admin(&url).await;
    let s = format!("\"{schema}\"");
    client.batch_execute(&v1_ddl(&s)).await.unwrap();
    let scope = scope();
    let other = self::scope();
    let (ns, pr) = (scope.namespace(), scope.principal());
    let ms = |t: Timestamp| t.as_millis() as i64;
    let fp = "decode(repeat('ab', 32), 'hex')";
    // In the scope: "a" in progress (owner 42), "b" completed, "c" expired; "d" elsewhere.
    for (ns, pr, key, owner, kind, expires) in [
        (ns, pr, "a", Some(42_i64), None, later(T0, 3600)),
        (ns, pr, "b", None, Some("success"), later(T0, 3600)),
        (ns, pr, "c", Some(7), None, T0),
        (
            other.namespace(),
            other.principal(),
            "d",
            Some(8),
            None,
            later(T0, 3600),
        ),
    ] {
        client
            .execute(
                &format!(
                    "INSERT INTO {s}.idem_records VALUES ($1, $2, $3, {fp}, 'charge', $4, $5, $6,
                        CASE WHEN $6::text IS NULL THEN NULL ELSE '{{}}' END,
                        CASE WHEN $6::text IS NULL THEN NULL ELSE $7::int8 END, $7, $8)"
                ),
                &[
                    &ns,
                    &pr,
                    &key,
                    &owner,
                    &owner.map(|_| ms(later(T0, 30))),
                    &kind,
                    &ms(T0),
                    &ms(expires),
                ],
            )
            .await
            .unwrap();
    }
    client
        .execute(
            &format!("INSERT INTO {s}.idem_scope_counts VALUES ($1, $2, 3), ($3, $4, 1)"),
            &[&ns, &pr, &other.namespace(), &other.principal()],
        )
        .await
        .unwrap();
    client
        .batch_execute(&format!("UPDATE {s}.idem_totals SET records = 4"))
        .await
        .unwrap();

    let store = TestStore::open_via(&url, &url, &schema).await;
    assert_eq!(
        count(
            &client,
            &format!("SELECT version::int8 FROM {s}.idem_schema_version")
        )
        .await,
        2
    );
    for old in ["idem_scope_counts", "idem_totals", "idem_quota_guard"] {
        let gone: bool = client
            .query_one("SELECT to_regclass($1) IS NULL", &[&format!("{s}.{old}")])
            .await
            .unwrap()
            .get(0);
        assert!(gone, "{old} was dropped");
    }
    assert_counters_consistent(&url, &schema).await;
    let a = record_id(&scope, "a");
    assert!(matches!(
        store.get(&a, T0).await.unwrap().unwrap().state,
        RecordState::InProgress { owner, .. } if owner.as_u64() == 42
    ));
    assert!(matches!(
        store
            .get(&record_id(&scope, "b"), T0)
            .await
            .unwrap()
            .unwrap()
            .state,
        RecordState::Completed { .. }
    ));
    assert_eq!(store.get(&record_id(&scope, "c"), T0).await.unwrap(), None);

    // Three records (one expired) count against a limit of 4.
    let four = RecordLimits {
        max_records_per_scope: 4,
        max_records_total: 5,
    };
    let claim = |key: &str| claim_req(&record_id(&scope, key), T0, four);
    assert_eq!(
        store.claim(&claim("new1")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    // Full: purging the expired "c" makes room.
    assert_eq!(
        store.claim(&claim("new2")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store
            .get(&record_id(&scope, "c"), later(T0, 1))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.claim(&claim("new3")).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope { limit: 4 })
    );
    // The store holds five (with "d"): the store-wide limit refuses elsewhere.
    let elsewhere = claim_req(&record_id(&self::scope(), "x"), T0, four);
    assert_eq!(
        store.claim(&elsewhere).await.unwrap(),
        ClaimOutcome::QuotaExceeded(QuotaExceeded::Total { limit: 5 })
    );
    assert_eq!(
        store.release(&a, FencingToken::from_u64(42)).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store.claim(&claim("new3")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_counters_consistent(&url, &schema).await;

    // Purging everything brings every counter back to zero.
    assert_eq!(store.purge_expired(later(T0, 100_000)).await.unwrap(), 5);
    assert_counters_consistent(&url, &schema).await;
    assert_eq!(
        count(
            &client,
            &format!(
                "SELECT ((SELECT coalesce(sum(records), 0) FROM {s}.idem_scope_shards)
                    + (SELECT coalesce(sum(records), 0) FROM {s}.idem_total_shards))::int8"
            )
        )
        .await,
        0
    );
}

/// Outcome bodies, keys and tokens come back exactly, including tokens above `i64::MAX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_bodies_round_trip_bit_for_bit() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let scope = scope();
    for (i, owner) in [1, u64::MAX, 1 << 63, i64::MAX as u64]
        .into_iter()
        .enumerate()
    {
        let req = ClaimRequest {
            owner: FencingToken::from_u64(owner),
            ..claim_req(
                &record_id(&scope, &format!("k{i}")),
                T0,
                RecordLimits::UNLIMITED,
            )
        };
        assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
        let record = store.get(&req.id, T0).await.unwrap().unwrap();
        assert!(
            matches!(record.state, RecordState::InProgress { owner: got, .. } if got.as_u64() == owner)
        );
        let body = format!("{{\"n\": {i}, \"s\": \"\\u0000 \u{1F600} \\\"x\\\" \r\n\"}}");
        let done = CompleteRequest {
            id: req.id.clone(),
            owner: req.owner,
            outcome: Outcome::Error(body.clone()),
            completed_at: T0,
            expires_at: later(T0, 60),
        };
        assert_eq!(store.complete(done).await.unwrap(), Fenced::Applied);
        let record = store.get(&req.id, T0).await.unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::Error(body),
                completed_at: T0
            }
        );
    }
}

/// Several processes opening a new schema at once: the advisory lock makes them take turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_opens_of_a_new_schema() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let schema = fresh_schema();
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let (url, schema) = (url.clone(), schema.clone());
            tokio::spawn(async move { PostgresStore::open_in_schema(&url, &schema).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().expect("concurrent open"));
    }
    // Adopt the schema so that it is dropped at the end.
    let owner = TestStore::open_via(&url, &url, &schema).await;
    let req = claim_req(&record_id(&scope(), "k"), T0, RecordLimits::UNLIMITED);
    assert_eq!(stores[3].claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    assert!(owner.get(&req.id, T0).await.unwrap().is_some());
}

/// A version 2 table made before the `trace` column (by the previous release) gets the column
/// when a store opens it, with no version change, so that the previous release still opens the
/// schema; the records it holds stay readable, without a trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_the_trace_column_gets_it_in_place() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let req = claim_req(&record_id(&scope(), "k"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    let client = admin(&url).await;
    let s = format!("\"{}\"", store.schema);
    client
        .batch_execute(&format!(
            "ALTER TABLE {s}.idem_records DROP COLUMN trace CASCADE"
        ))
        .await
        .unwrap();
    let reopened = PostgresStore::open_in_schema(&url, &store.schema)
        .await
        .unwrap();
    let record = reopened.get(&req.id, T0).await.unwrap().expect("kept");
    assert_eq!(record.trace, None);
    let version = format!("SELECT version::int8 FROM {s}.idem_schema_version");
    assert_eq!(count(&client, &version).await, 2, "no version change");
    let traced = ClaimRequest {
        trace: mcp_idempotency::TraceLink::new([7; 16], [7; 8], 1),
        ..claim_req(&record_id(&scope(), "traced"), T0, RecordLimits::UNLIMITED)
    };
    assert_eq!(
        reopened.claim(&traced).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let record = reopened
        .get(&traced.id, T0)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(record.trace, traced.trace);
}

/// A schema written by a newer build is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_version_is_refused() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "UPDATE \"{}\".idem_schema_version SET version = 99",
            store.schema
        ))
        .await
        .unwrap();
    let err = PostgresStore::open_in_schema(&url, &store.schema)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("version 99"), "{message}");
    assert!(message.contains("newer"), "{message}");
}

/// The three functions that run claims and completions are created when a schema whose tables
/// are up to date lacks them (a schema made by an earlier build), and a role that may not create
/// anything uses a schema that has them, alone and in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_functions_are_created_and_a_restricted_role_uses_them() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let store = TestStore::open(&url).await;
    let client = admin(&url).await;
    let s = format!("\"{}\"", store.schema);
    let functions = format!(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = '{s}'::regnamespace \
         AND proname IN ('idem_claim_v2', 'idem_complete_v1', 'idem_batch_v2')"
    );
    assert_eq!(count(&client, &functions).await, 3);
    client
        .batch_execute(&format!(
            "DROP FUNCTION {s}.idem_claim_v2, {s}.idem_complete_v1, {s}.idem_batch_v2"
        ))
        .await
        .unwrap();
    let reopened = PostgresStore::open_in_schema(&url, &store.schema)
        .await
        .unwrap();
    assert_eq!(count(&client, &functions).await, 3);

    // A role with only the rights to use the tables and call the functions.
    let role = format!("{}_user", store.schema);
    client
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN;
             GRANT USAGE ON SCHEMA {s} TO \"{role}\";
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO \"{role}\";
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO \"{role}\";"
        ))
        .await
        .unwrap();
    let role_url = url.replacen("postgres@", &format!("{role}@"), 1);
    let restricted = PostgresStore::open_in_schema(&role_url, &store.schema).await;
    let outcome = async {
        let restricted = restricted?;
        let req = claim_req(&record_id(&scope(), "k"), T0, RecordLimits::UNLIMITED);
        // The first claim of a scope takes the exact path; the second is the function's.
        assert_eq!(restricted.claim(&req).await?, ClaimOutcome::Claimed);
        let second = claim_req(&record_id(&scope(), "k2"), T0, RecordLimits::UNLIMITED);
        assert_eq!(restricted.claim(&second).await?, ClaimOutcome::Claimed);
        let done = CompleteRequest {
            id: second.id.clone(),
            owner: second.owner,
            outcome: Outcome::Success("{}".into()),
            completed_at: T0,
            expires_at: later(T0, 60),
        };
        assert_eq!(restricted.complete(done).await?, Fenced::Applied);
        assert!(matches!(
            reopened.get(&second.id, T0).await?.map(|r| r.state),
            Some(RecordState::Completed { .. })
        ));
        // Claims sent at once into a scope with counter rows: the batch function's.
        let many: Vec<_> = (0..10)
            .map(|i| {
                let store = restricted.clone();
                let req = claim_req(
                    &record_id(&req.id.scope, &format!("many-{i}")),
                    T0,
                    RecordLimits::UNLIMITED,
                );
                tokio::spawn(async move { store.claim(&req).await })
            })
            .collect();
        for task in many {
            assert_eq!(task.await.unwrap()?, ClaimOutcome::Claimed);
        }
        let transactions = count(
            &client,
            &format!(
                "SELECT count(DISTINCT xmin::text) FROM {s}.idem_records WHERE key LIKE 'many-%'"
            ),
        )
        .await;
        assert!(
            transactions <= 5,
            "10 claims in {transactions} transactions"
        );
        Ok::<_, StoreError>(())
    }
    .await;
    client
        .batch_execute(&format!(
            "REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM \"{role}\";
             REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {s} FROM \"{role}\";
             REVOKE ALL ON SCHEMA {s} FROM \"{role}\";
             DROP ROLE \"{role}\";"
        ))
        .await
        .unwrap();
    outcome.unwrap();
}

/// `store::open` takes `postgres://…?schema=NAME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_from_a_store_url_with_a_schema_parameter() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let owner = TestStore::open(&url).await;
    let separator = if url.contains('?') { '&' } else { '?' };
    let store_url: StoreUrl = format!("{url}{separator}schema={}", owner.schema)
        .parse()
        .unwrap();
    let store = mcp_idempotency::store::open(&store_url).await.unwrap();
    let req = claim_req(&record_id(&scope(), "k"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&req).await.unwrap(), ClaimOutcome::Claimed);
    assert!(owner.get(&req.id, T0).await.unwrap().is_some());
}
