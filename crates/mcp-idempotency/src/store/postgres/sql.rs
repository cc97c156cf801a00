//! Every statement of the store, with the schema name spliced in (quoted) once, when the store
//! is opened; the `SELECT` of [`Store::list`](crate::store::Store::list) is built per call by
//! [`list_query`](crate::store::sql_list::list_query).
//!
//! # Locks and deadlocks
//!
//! Every statement and transaction takes row locks in one global order: records first, then scope
//! shard rows in `(namespace, principal, shard)` order, then store shard rows in shard order. The
//! one-statement claim, release and delete lock one record, one scope row, one store row; the
//! exact path locks one record, then one scope row or all 16 rows of one scope in shard order, then
//! one store row or all 16 in shard order (a conditional increment that found no room may leave its
//! row locked, so the transaction is rolled back before the counter is locked exactly); purges lock
//! records, then the scope rows they decrement and then the store rows, each sorted (`ORDER BY …
//! FOR UPDATE`); dropping empty scopes locks scope rows sorted; a batch ([`BATCH_FUNCTION`])
//! locks its records sorted by `(namespace, principal, key)`, then its scope rows and its store
//! rows, each sorted. Since nobody waits for a lock that comes earlier in the order than one it
//! holds, these cannot deadlock each other (purges also take turns on an advisory lock, since the
//! records they delete are not sorted). One pair can: a purge and a batch that replaces two
//! expired records the purge is deleting, in the other order. PostgreSQL then aborts one of them
//! (after `deadlock_timeout`), and it runs again, as every statement the server aborts for a
//! deadlock does (the `pool` module).

use super::shards::SHARDS;
use crate::store::sql_row::RECORD_COLUMNS;

/// The statements, with the schema name spliced in (quoted) once.
pub(super) struct Sql {
    /// The one-statement claim: a call of [`CLAIM_FUNCTION`].
    pub(super) claim: String,
    pub(super) insert_record: String,
    pub(super) bump_scope: String,
    pub(super) bump_total: String,
    pub(super) lock_scope: String,
    pub(super) lock_total: String,
    pub(super) set_scope: String,
    pub(super) set_total: String,
    pub(super) get: String,
    /// A call of [`COMPLETE_FUNCTION`], which answers how many records it changed.
    pub(super) complete: String,
    pub(super) take_over: String,
    pub(super) renew: String,
    pub(super) release: String,
    pub(super) delete: String,
    /// The quoted `schema.idem_records`, for the statements [`list_query`](crate::store::sql_list::list_query) builds.
    pub(super) records: String,
    pub(super) purge: String,
    pub(super) drop_empty_scopes: String,
    pub(super) stats: String,
    /// A call of [`BATCH_FUNCTION`]: `(item, state, record columns…)` rows, one per claim
    /// (`item` 1, 2, … in the order of the claim arrays) and one per completion (`item` −1, −2, …).
    pub(super) batch: String,
    /// Creates (or replaces) the store's functions: [`CLAIM_FUNCTION`], [`COMPLETE_FUNCTION`] and
    /// [`BATCH_FUNCTION`].
    pub(super) functions: String,
}

/// The server-side function that runs the one-statement claim, with the parameters of
/// [`Sql::claim`]'s statement.
///
/// The two statements of every executed call (this claim and the completion) run inside PL/pgSQL
/// functions, so that the server plans them once per connection instead of once per call: plain
/// statements are sent unnamed (see the `params` module), and parsing and planning the claim's
/// statement cost about twice as much server CPU as running it. PL/pgSQL keeps the plans of a
/// function's statements for the life of the server connection, which works through PgBouncer
/// in transaction mode too (the plans belong to the server connection, not to the client). The
/// statements inside are the same, run the same way (one statement, READ COMMITTED, a fresh
/// snapshot): only where they are planned changes. Names carry a version, so that builds with
/// different bodies sharing one schema each call their own (version 2 writes the `trace` column;
/// a release calling version 1 still finds its own).
pub(super) const CLAIM_FUNCTION: &str = "idem_claim_v2";
/// The server-side function that runs the completion (see [`CLAIM_FUNCTION`]).
pub(super) const COMPLETE_FUNCTION: &str = "idem_complete_v1";
/// The argument types of the functions, as `to_regprocedure` reads them.
pub(super) const CLAIM_ARGS: &str =
    "text, text, text, bytea, text, bigint, bigint, bigint, bigint, bigint, bigint, smallint, text";
pub(super) const COMPLETE_ARGS: &str = "text, text, text, bigint, text, text, bigint, bigint";

/// The server-side function that runs several claims and completions in one statement, and so
/// in one transaction with one commit (see the `batch` module), with the parameters of
/// [`Sql::batch`]: one array per column, claims first, then completions.
pub(super) const BATCH_FUNCTION: &str = "idem_batch_v2";
/// The arguments of [`BATCH_FUNCTION`], named: the claims' columns (`c_…`, as the claim
/// function's thirteen), then the completions' (`d_…`, as the completion function's).
const BATCH_PARAMS: [(&str, &str); 21] = [
    ("c_namespace", "text[]"),
    ("c_principal", "text[]"),
    ("c_key", "text[]"),
    ("c_fingerprint", "bytea[]"),
    ("c_tool_name", "text[]"),
    ("c_owner", "bigint[]"),
    ("c_lease_expires_at", "bigint[]"),
    ("c_now", "bigint[]"),
    ("c_expires_at", "bigint[]"),
    ("c_scope_limit", "bigint[]"),
    ("c_total_limit", "bigint[]"),
    ("c_shard", "smallint[]"),
    ("c_trace", "text[]"),
    ("d_namespace", "text[]"),
    ("d_principal", "text[]"),
    ("d_key", "text[]"),
    ("d_owner", "bigint[]"),
    ("d_kind", "text[]"),
    ("d_body", "text[]"),
    ("d_completed_at", "bigint[]"),
    ("d_expires_at", "bigint[]"),
];

/// The argument types of [`BATCH_FUNCTION`], as `to_regprocedure` reads them.
pub(super) fn batch_args() -> String {
    BATCH_PARAMS.map(|(_, ty)| ty).join(", ")
}

/// The claim's columns as the parameters `$1` to `$9` of the claim statements (the order of
/// [`ClaimColumns`](crate::store::sql_row::ClaimColumns)); the trace is another parameter.
const CLAIM_PARAMS: [&str; 9] = ["$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9"];

/// The completion's values as the parameters `$1` to `$8` of [`COMPLETE_FUNCTION`]: the record
/// (namespace, principal, key), owner, outcome kind, body, completed_at, expires_at.
const COMPLETE_PARAMS: [&str; 8] = ["$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8"];

/// Inserts a record, or replaces an expired one (keeping its shard), returning whether it was a
/// fresh insert; returns nothing when a live record holds the key. `v` holds the claim's values
/// in the order of [`CLAIM_PARAMS`], `shard` the record's shard, `trace` its trace column.
fn insert_record(s: &str, v: [&str; 9], shard: &str, trace: &str) -> String {
    let [namespace, principal, key, fingerprint, tool, owner, lease, now, expires] = v;
    format!(
        "INSERT INTO {s}.idem_records AS r (namespace, principal, key, fingerprint, tool_name,
            owner, lease_expires_at, outcome_kind, outcome_body, completed_at, created_at,
            expires_at, shard, trace)
        VALUES ({namespace}, {principal}, {key}, {fingerprint}, {tool}, {owner}, {lease}, NULL,
            NULL, NULL, {now}, {expires}, {shard}, {trace})
        ON CONFLICT (namespace, principal, key) DO UPDATE SET
            fingerprint = EXCLUDED.fingerprint, tool_name = EXCLUDED.tool_name,
            owner = EXCLUDED.owner, lease_expires_at = EXCLUDED.lease_expires_at,
            outcome_kind = NULL, outcome_body = NULL, completed_at = NULL,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
            trace = EXCLUDED.trace
        WHERE r.expires_at <= {now}
        RETURNING (r.xmax = 0) AS created"
    )
}

/// Deletes the record `$1, $2, $3` if `extra` (more conditions) holds, and uncounts it; returns how
/// many records it deleted. The totals update reads `scope_count` so that it runs (and locks)
/// after it.
fn counted_delete(s: &str, extra: &str) -> String {
    format!(
        "WITH del AS (
            DELETE FROM {s}.idem_records
            WHERE namespace = $1 AND principal = $2 AND key = $3 {extra} RETURNING shard
        ),
        scope_count AS (
            UPDATE {s}.idem_scope_shards AS c SET records = c.records - 1
            FROM del
            WHERE c.namespace = $1 AND c.principal = $2 AND c.shard = del.shard
            RETURNING c.records
        ),
        total_count AS (
            UPDATE {s}.idem_total_shards AS t SET records = t.records - 1
            FROM del, (SELECT count(*) FROM scope_count) AS after_scopes
            WHERE t.shard = del.shard
        )
        SELECT count(*) FROM del"
    )
}

impl Sql {
    /// The statements on the tables of the quoted schema `s`.
    pub(super) fn new(s: &str) -> Self {
        let key = "namespace = $1 AND principal = $2 AND key = $3";
        let last = SHARDS - 1;
        Self {
            // $1 namespace, $2 principal, $3 key, $4 fingerprint, $5 tool, $6 owner,
            // $7 lease_expires_at, $8 now, $9 expires_at, $10 scope limit, $11 total limit,
            // $12 shard, $13 trace. The total update reads `scope_count` so that it runs (and
            // locks) after it, and only when the scope had room.
            claim: format!("SELECT * FROM {s}.{CLAIM_FUNCTION}({})", placeholders(13)),
            batch: format!(
                "SELECT * FROM {s}.{BATCH_FUNCTION}({})",
                placeholders(BATCH_PARAMS.len())
            ),
            functions: functions(s),
            // The exact path, statement by statement in one transaction. $1 to $9 as for
            // `claim`, $10 shard, $11 trace.
            insert_record: insert_record(s, CLAIM_PARAMS, "$10", "$11"),

            // $1 namespace, $2 principal, $3 shard, $4 limit.
            bump_scope: format!(
                "UPDATE {s}.idem_scope_shards SET records = records + 1
                 WHERE namespace = $1 AND principal = $2 AND shard = $3
                    AND capacity_limit = $4 AND records < capacity"
            ),
            // $1 shard, $2 limit.
            bump_total: format!(
                "UPDATE {s}.idem_total_shards SET records = records + 1
                 WHERE shard = $1 AND capacity_limit = $2 AND records < capacity"
            ),
            // Locks (creating any missing) all shard rows of a scope, in shard order, and returns
            // their latest committed counts. $1 namespace, $2 principal.
            lock_scope: format!(
                "INSERT INTO {s}.idem_scope_shards AS c
                    (namespace, principal, shard, records, capacity, capacity_limit)
                SELECT $1, $2, g::int2, 0, 0, NULL::int8 FROM generate_series(0, {last}) AS g
                ORDER BY g
                ON CONFLICT (namespace, principal, shard) DO UPDATE SET records = c.records
                RETURNING c.shard, c.records"
            ),
            lock_total: format!(
                "INSERT INTO {s}.idem_total_shards AS t (shard, records, capacity, capacity_limit)
                SELECT g::int2, 0, 0, NULL::int8 FROM generate_series(0, {last}) AS g
                ORDER BY g
                ON CONFLICT (shard) DO UPDATE SET records = t.records
                RETURNING t.shard, t.records"
            ),
            // Counts one more record in a shard and sets every row's capacity (by shard, from an
            // array) for a limit. $1 namespace, $2 principal, $3 shard, $4 capacities, $5 limit.
            set_scope: format!(
                "UPDATE {s}.idem_scope_shards
                 SET records = records + (shard = $3)::int, capacity = ($4::int8[])[shard + 1],
                    capacity_limit = $5
                 WHERE namespace = $1 AND principal = $2"
            ),
            // $1 shard, $2 capacities, $3 limit.
            set_total: format!(
                "UPDATE {s}.idem_total_shards
                 SET records = records + (shard = $1)::int, capacity = ($2::int8[])[shard + 1],
                    capacity_limit = $3"
            ),
            get: format!(
                "SELECT {RECORD_COLUMNS} FROM {s}.idem_records WHERE {key} AND expires_at > $4"
            ),
            complete: format!("SELECT {s}.{COMPLETE_FUNCTION}({})", placeholders(8)),
            // The second branch finds this take-over sent again, and changes nothing.
            take_over: format!(
                "UPDATE {s}.idem_records SET owner = $5,
                    lease_expires_at = CASE WHEN owner = $5 THEN lease_expires_at ELSE $6 END,
                    expires_at = CASE WHEN owner = $5 THEN expires_at ELSE $7 END,
                    trace = CASE WHEN owner = $5 THEN trace ELSE $9 || ' ' || created_at END
                 WHERE {key} AND expires_at > $8
                    AND ((owner = $4 AND lease_expires_at <= $8) OR owner = $5)"
            ),
            renew: format!(
                "UPDATE {s}.idem_records
                 SET lease_expires_at = $5, expires_at = GREATEST(expires_at, $5)
                 WHERE {key} AND owner = $4"
            ),
            release: counted_delete(s, "AND owner = $4"),
            delete: counted_delete(s, ""),
            records: format!("{s}.idem_records"),
            // $1 now, $2 advisory lock key: purges of one schema take turns, so two of them never
            // delete the same records in different orders and deadlock. $3: at most this many
            // records. Counter rows are locked sorted (scope rows, then store rows) before they
            // are decremented, in the order claims lock them.
            purge: format!(
                "WITH purge_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock($2::int8)),
                del AS (
                    DELETE FROM {s}.idem_records AS r
                    USING (
                        SELECT namespace, principal, key FROM {s}.idem_records
                        WHERE expires_at <= $1 AND EXISTS (SELECT 1 FROM purge_lock)
                        ORDER BY expires_at LIMIT $3
                    ) AS old
                    WHERE r.namespace = old.namespace AND r.principal = old.principal
                        AND r.key = old.key AND r.expires_at <= $1
                    RETURNING r.namespace, r.principal, r.shard
                ),
                per_scope AS (
                    SELECT namespace, principal, shard, count(*) AS n FROM del
                    GROUP BY namespace, principal, shard
                ),
                scope_locked AS MATERIALIZED (
                    SELECT c.namespace, c.principal, c.shard, p.n
                    FROM {s}.idem_scope_shards AS c
                    JOIN per_scope AS p ON c.namespace = p.namespace
                        AND c.principal = p.principal AND c.shard = p.shard
                    ORDER BY c.namespace, c.principal, c.shard
                    FOR UPDATE OF c
                ),
                scope_count AS (
                    UPDATE {s}.idem_scope_shards AS c SET records = c.records - l.n
                    FROM scope_locked AS l
                    WHERE c.namespace = l.namespace AND c.principal = l.principal
                        AND c.shard = l.shard
                    RETURNING c.records
                ),
                per_shard AS (SELECT shard, count(*) AS n FROM del GROUP BY shard),
                total_locked AS MATERIALIZED (
                    SELECT t.shard, p.n
                    FROM {s}.idem_total_shards AS t
                    JOIN per_shard AS p ON t.shard = p.shard,
                        (SELECT count(*) FROM scope_count) AS after_scopes
                    ORDER BY t.shard
                    FOR UPDATE OF t
                ),
                total_count AS (
                    UPDATE {s}.idem_total_shards AS t SET records = t.records - l.n
                    FROM total_locked AS l
                    WHERE t.shard = l.shard
                )
                SELECT count(*) FROM del"
            ),
            // Scopes left without records (by purges or by releases) lose their counter rows,
            // locked sorted; a row counted in since is kept (the condition is checked again on
            // its latest version), and a claim recreates missing rows.
            drop_empty_scopes: format!(
                "WITH empty AS (
                    SELECT namespace, principal FROM {s}.idem_scope_shards
                    GROUP BY namespace, principal HAVING max(records) <= 0
                ),
                locked AS MATERIALIZED (
                    SELECT c.namespace, c.principal, c.shard FROM {s}.idem_scope_shards AS c
                    JOIN empty AS e ON c.namespace = e.namespace AND c.principal = e.principal
                    WHERE c.records <= 0
                    ORDER BY c.namespace, c.principal, c.shard
                    FOR UPDATE OF c
                )
                DELETE FROM {s}.idem_scope_shards AS c USING locked AS l
                WHERE c.namespace = l.namespace AND c.principal = l.principal
                    AND c.shard = l.shard AND c.records <= 0"
            ),
            stats: format!(
                "SELECT count(*) FILTER (WHERE expires_at > $1 AND owner IS NOT NULL),
                    count(*) FILTER (WHERE expires_at > $1 AND owner IS NULL),
                    count(*) FILTER (WHERE expires_at <= $1)
                 FROM {s}.idem_records"
            ),
        }
    }
}

/// The one-statement claim (see the `quota` module), the body of [`CLAIM_FUNCTION`].
/// $1 namespace, $2 principal, $3 key, $4 fingerprint, $5 tool, $6 owner, $7 lease_expires_at,
/// $8 now, $9 expires_at, $10 scope limit, $11 total limit, $12 shard, $13 trace. The total
/// update reads
/// `scope_count` so that it runs (and locks) after it, and only when the scope had room.
fn claim_statement(s: &str) -> String {
    let key = "namespace = $1 AND principal = $2 AND key = $3";
    format!(
        "WITH ins AS ({}),
        scope_count AS (
            UPDATE {s}.idem_scope_shards AS c SET records = c.records + 1
            FROM ins
            WHERE ins.created AND c.namespace = $1 AND c.principal = $2 AND c.shard = $12
                AND c.capacity_limit = $10::int8 AND c.records < c.capacity
            RETURNING c.records
        ),
        total_count AS (
            UPDATE {s}.idem_total_shards AS t SET records = t.records + 1
            FROM (SELECT count(*) AS n FROM scope_count) AS after_scope
            WHERE after_scope.n > 0 AND t.shard = $12
                AND t.capacity_limit = $11::int8 AND t.records < t.capacity
            RETURNING t.records
        ),
        guard AS (
            INSERT INTO {s}.idem_shard_guard (scope_ok, total_ok)
            SELECT EXISTS (SELECT 1 FROM scope_count),
                EXISTS (SELECT 1 FROM total_count) OR NOT EXISTS (SELECT 1 FROM scope_count)
            FROM ins WHERE ins.created AND NOT EXISTS (SELECT 1 FROM total_count)
        )
        SELECT true AS claimed, NULL::bytea, NULL::text, NULL::int8, NULL::int8,
            NULL::text, NULL::text, NULL::int8, NULL::int8, NULL::int8, NULL::text
        FROM ins
        UNION ALL
        SELECT false, {RECORD_COLUMNS} FROM {s}.idem_records
        WHERE {key} AND expires_at > $8 AND NOT EXISTS (SELECT 1 FROM ins)",
        insert_record(s, CLAIM_PARAMS, "$12", "$13")
    )
}

/// The completion, the body of [`COMPLETE_FUNCTION`], with the values `v` in the order of
/// [`COMPLETE_PARAMS`]. The second branch finds this completion sent again, and rewrites the same
/// values.
fn complete_statement(s: &str, v: [&str; 8]) -> String {
    let [namespace, principal, key, owner, kind, body, completed, expires] = v;
    format!(
        "UPDATE {s}.idem_records SET owner = NULL, lease_expires_at = NULL,
            outcome_kind = {kind}, outcome_body = {body}, completed_at = {completed},
            expires_at = {expires}
         WHERE namespace = {namespace} AND principal = {principal} AND key = {key}
            AND (owner = {owner} OR (owner IS NULL AND outcome_kind = {kind}
                AND outcome_body = {body} AND completed_at = {completed}
                AND expires_at = {expires}))"
    )
}

/// `CREATE OR REPLACE` of the three functions. Their result columns are named `out_…` and
/// `#variable_conflict use_column` is set, so that no name in the statements can mean a variable.
fn functions(s: &str) -> String {
    let claim = claim_statement(s);
    let complete = complete_statement(s, COMPLETE_PARAMS);
    let batch = batch_function(s);
    format!(
        "CREATE OR REPLACE FUNCTION {s}.{CLAIM_FUNCTION}({CLAIM_ARGS})
        RETURNS TABLE (out_claimed boolean, out_fingerprint bytea, out_tool_name text,
            out_owner bigint, out_lease_expires_at bigint, out_outcome_kind text,
            out_outcome_body text, out_completed_at bigint, out_created_at bigint,
            out_expires_at bigint, out_trace text)
        LANGUAGE plpgsql VOLATILE AS $idem$
        #variable_conflict use_column
        BEGIN
        RETURN QUERY {claim};
        END
        $idem$;
        CREATE OR REPLACE FUNCTION {s}.{COMPLETE_FUNCTION}({COMPLETE_ARGS})
        RETURNS bigint LANGUAGE plpgsql VOLATILE AS $idem$
        #variable_conflict use_column
        DECLARE changed bigint;
        BEGIN
        {complete};
        GET DIAGNOSTICS changed = ROW_COUNT;
        RETURN changed;
        END
        $idem$;
        {batch}"
    )
}

/// `CREATE OR REPLACE` of [`BATCH_FUNCTION`]: the claims and completions of a batch in one
/// transaction, taking locks in the global order of this module's documentation.
///
/// 1. Records, sorted by `(namespace, principal, key)` (a completion before a claim of the same
///    key): each completion runs as [`COMPLETE_FUNCTION`] does, each claim's record is inserted
///    (or an expired one replaced) as the one-statement claim does.
/// 2. The scope counters of the fresh records, one conditional increment per
///    `(namespace, principal, shard)` in that order, then the store's, one per shard in order. A
///    counter row without room for all of its records refuses them all (and the store's row
///    gives back the scope rows' increments), as the one-statement claim's guard would.
/// 3. The refused claims' records are deleted again: for them the batch changed nothing.
/// 4. One row per claim: state 0, claimed; 1, a live record holds the key (its columns follow);
///    2, run it alone (refused by a counter, racing a concurrent claim, or holding the key of a
///    refused one). One row per completion: state 1 if it changed the record, 0 if not.
fn batch_function(s: &str) -> String {
    let args = BATCH_PARAMS
        .map(|(name, ty)| format!("{name} {ty}"))
        .join(", ");
    let insert = insert_record(
        s,
        [
            "c_namespace[item]",
            "c_principal[item]",
            "c_key[item]",
            "c_fingerprint[item]",
            "c_tool_name[item]",
            "c_owner[item]",
            "c_lease_expires_at[item]",
            "c_now[item]",
            "c_expires_at[item]",
        ],
        "c_shard[item]",
        "c_trace[item]",
    );
    let complete = complete_statement(
        s,
        [
            "d_namespace[-item]",
            "d_principal[-item]",
            "d_key[-item]",
            "d_owner[-item]",
            "d_kind[-item]",
            "d_body[-item]",
            "d_completed_at[-item]",
            "d_expires_at[-item]",
        ],
    );
    // Clears the record columns of the result row once a found record was returned.
    let clear = "out_fingerprint := NULL; out_tool_name := NULL; out_owner := NULL;
        out_lease_expires_at := NULL; out_outcome_kind := NULL; out_outcome_body := NULL;
        out_completed_at := NULL; out_created_at := NULL; out_expires_at := NULL;
        out_trace := NULL;";
    let record_into = "out_fingerprint, out_tool_name, out_owner, out_lease_expires_at,
        out_outcome_kind, out_outcome_body, out_completed_at, out_created_at, out_expires_at,
        out_trace";
    // Every statement run per batch costs the server its executor start-up, so the fixed part
    // is a few statements, and what can be a plain PL/pgSQL expression is one.
    format!(
        "CREATE OR REPLACE FUNCTION {s}.{BATCH_FUNCTION}({args})
        RETURNS TABLE (out_item integer, out_state smallint, out_fingerprint bytea,
            out_tool_name text, out_owner bigint, out_lease_expires_at bigint,
            out_outcome_kind text, out_outcome_body text, out_completed_at bigint,
            out_created_at bigint, out_expires_at bigint, out_trace text)
        LANGUAGE plpgsql VOLATILE AS $idem$
        #variable_conflict use_column
        DECLARE
            item integer;
            inserted boolean;
            changed bigint;
            n_claims integer := coalesce(array_length(c_key, 1), 0);
            claimed boolean[] := array_fill(false, ARRAY[n_claims]);
            fresh boolean[] := array_fill(false, ARRAY[n_claims]);
            refused boolean[] := array_fill(false, ARRAY[n_claims]);
            any_fresh boolean := false;
            any_refused boolean := false;
            grp record;
            j integer;
        BEGIN
        FOR item IN
            SELECT i FROM (
                SELECT g AS i, c_namespace[g] COLLATE \"C\" AS ns,
                    c_principal[g] COLLATE \"C\" AS pr, c_key[g] COLLATE \"C\" AS k
                FROM generate_subscripts(c_key, 1) AS g
                UNION ALL
                SELECT -g, d_namespace[g] COLLATE \"C\", d_principal[g] COLLATE \"C\",
                    d_key[g] COLLATE \"C\"
                FROM generate_subscripts(d_key, 1) AS g
            ) AS items
            ORDER BY ns, pr, k, i
        LOOP
            IF item < 0 THEN
                {complete};
                GET DIAGNOSTICS changed = ROW_COUNT;
                out_item := item;
                out_state := changed;
                RETURN NEXT;
            ELSE
                {insert} INTO inserted;
                IF FOUND THEN
                    claimed[item] := true;
                    fresh[item] := inserted;
                    any_fresh := any_fresh OR inserted;
                END IF;
            END IF;
        END LOOP;

        IF any_fresh THEN
            FOR grp IN
                SELECT ns, pr, shard, lim, count(*) AS n, array_agg(i) AS items FROM (
                    SELECT g AS i, c_namespace[g] COLLATE \"C\" AS ns,
                        c_principal[g] COLLATE \"C\" AS pr, c_shard[g] AS shard,
                        c_scope_limit[g] AS lim
                    FROM generate_subscripts(c_key, 1) AS g WHERE fresh[g]
                ) AS new_records
                GROUP BY ns, pr, shard, lim ORDER BY ns, pr, shard, lim
            LOOP
                UPDATE {s}.idem_scope_shards AS c SET records = c.records + grp.n
                WHERE c.namespace = grp.ns AND c.principal = grp.pr AND c.shard = grp.shard
                    AND c.capacity_limit = grp.lim AND c.records + grp.n <= c.capacity;
                IF NOT FOUND THEN
                    any_refused := true;
                    FOREACH j IN ARRAY grp.items LOOP
                        refused[j] := true;
                    END LOOP;
                END IF;
            END LOOP;

            FOR grp IN
                SELECT shard, lim, count(*) AS n, array_agg(i) AS items FROM (
                    SELECT g AS i, c_shard[g] AS shard, c_total_limit[g] AS lim
                    FROM generate_subscripts(c_key, 1) AS g WHERE fresh[g] AND NOT refused[g]
                ) AS counted
                GROUP BY shard, lim ORDER BY shard, lim
            LOOP
                UPDATE {s}.idem_total_shards AS t SET records = t.records + grp.n
                WHERE t.shard = grp.shard AND t.capacity_limit = grp.lim
                    AND t.records + grp.n <= t.capacity;
                IF NOT FOUND THEN
                    any_refused := true;
                    FOREACH j IN ARRAY grp.items LOOP
                        refused[j] := true;
                        UPDATE {s}.idem_scope_shards AS c SET records = c.records - 1
                        WHERE c.namespace = c_namespace[j] AND c.principal = c_principal[j]
                            AND c.shard = c_shard[j];
                    END LOOP;
                END IF;
            END LOOP;
        END IF;

        IF any_refused THEN
            FOR j IN 1..n_claims LOOP
                IF refused[j] THEN
                    DELETE FROM {s}.idem_records
                    WHERE namespace = c_namespace[j] AND principal = c_principal[j]
                        AND key = c_key[j] AND owner = c_owner[j];
                END IF;
            END LOOP;
        END IF;

        FOR item IN 1..n_claims LOOP
            out_item := item;
            IF refused[item] THEN
                out_state := 2;
                RETURN NEXT;
            ELSIF claimed[item] THEN
                out_state := 0;
                RETURN NEXT;
            ELSIF any_refused AND EXISTS (
                SELECT 1 FROM generate_subscripts(c_key, 1) AS r
                WHERE refused[r] AND c_namespace[r] = c_namespace[item]
                    AND c_principal[r] = c_principal[item] AND c_key[r] = c_key[item]
            ) THEN
                out_state := 2;
                RETURN NEXT;
            ELSE
                SELECT {RECORD_COLUMNS} INTO {record_into} FROM {s}.idem_records
                WHERE namespace = c_namespace[item] AND principal = c_principal[item]
                    AND key = c_key[item] AND expires_at > c_now[item];
                out_state := CASE WHEN FOUND THEN 1 ELSE 2 END;
                RETURN NEXT;
                {clear}
            END IF;
        END LOOP;
        END
        $idem$;"
    )
}

/// `$1, $2, …, $n`.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}
