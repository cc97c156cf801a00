//! The Redis store: records shared by every instance of a server, one Lua script per operation.
//!
//! | module | holds |
//! | --- | --- |
//! | `batch` | on one server with `replicas=N`, claims and completions that wait at the same time, sent as one script call |
//! | `connect` | store URLs (one server or a cluster, plain or TLS) and opening the connection |
//! | `healing` | replacing a cluster connection that keeps failing |
//! | `keys` | the names of a store's keys, its shards and the encoding of record names |
//! | `record` | a record as a hash, and decoding it |
//! | `server` | the Lua scripts (the `.lua` files here), bounded exchanges, errors |
//! | this file | [`RedisStore`] and its [`Store`] operations |

mod batch;
mod connect;
mod healing;
mod keys;
mod record;
mod replicas;
mod server;

use std::fmt;
use std::sync::Arc;

use self::connect::RedisUrl;
use self::healing::SharedConn;
use self::keys::{member_id, wanted_part, Keys, Shard};
use self::record::{decode, FIELDS};
use self::replicas::ReplicaAcks;
use self::server::{ScriptCall, SCRIPTS};
use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, StateFilter,
    Store, StoreError, StoreFuture, StoreStats, TakeOverRequest,
};
use crate::key::IdempotencyKey;
use crate::record::{CorruptRecord, FencingToken, Record, RecordId, Scope};
use crate::store::batch::{self as queue, Batcher};
use crate::time::Timestamp;

/// Records deleted per purge script, so that no script blocks the server for long.
const PURGE_BATCH: u64 = 256;
/// Index members read per list script, for the same reason.
const LIST_BATCH: usize = 256;

/// Records in Redis, shared by every process that opens the same server with the same prefix.
///
/// Cloning is cheap and shares the connection. The connection is re-established by itself after a
/// failure: while the server is unreachable every operation fails within a few seconds with
/// [`StoreError::Unavailable`], and the store works again as soon as the server is back.
///
/// # Layout
///
/// A store's records are split into shards by scope; each shard's keys start with its hash tag.
/// On one server (`redis://`) there is one shard whose tag is `{PREFIX}` (`PREFIX` is `mcp-idem`
/// unless set with [`RedisStore::open_with_prefix`]); on a cluster (`redis-cluster://`) there are
/// eight (or `?shards=N`), tagged `{PREFIX:J.C}` (see "Redis Cluster" below). With `TAG` the
/// tag of the scope's shard:
///
/// | key | type | holds |
/// | --- | --- | --- |
/// | `{TAG}:r:NS:PRINCIPAL:KEY` | hash | one record |
/// | `{TAG}:s:NS:PRINCIPAL` | sorted set | the scope's records, scored by `expires_at` |
/// | `{TAG}:all` | sorted set | every record of the shard, scored by `expires_at` |
/// | `{TAG}:run` | sorted set | the shard's records in progress, scored by `expires_at` |
///
/// [`Store::list`] reads the narrowest index that covers its filter (the scope's, the records in
/// progress, or all) of each shard concerned (one for a scope, else every shard), latest
/// `expires_at` first, one Lua script per batch of 256 index members, and merges the shards'
/// answers. [`Store::stats`] and [`Store::purge_expired`] go through every shard's indexes: the
/// index names are known, so no `SCAN` of the primaries is needed.
///
/// `NS`, `PRINCIPAL` and `KEY` are percent-encoded (`%`, `:`, `{`, `}`, spaces and control
/// characters), so two different `(scope, key)` never share a Redis key and the hash tag is always
/// the shard's. A record hash has the fields `fp` (the 32 fingerprint bytes), `tool`, `owner` and
/// `lease` (in progress), `kind`, `body` (byte for byte) and `done` (completed), `created` and
/// `expires`; numbers are decimal text.
///
/// # Atomicity, time and quotas
///
/// Claim, complete, renew, release, take-over and delete are each one Lua script (`EVALSHA`, loading the
/// script if the server lost it), so each is one atomic round trip; the fencing token is checked
/// inside the script. On one server (one shard) with `replicas=N` (below), claims and completions
/// that wait at the same time share one call of a script that runs each of them as its own script
/// does, one after the other, and one `WAIT` (see the `batch` module); each still answers only
/// once that call returned and the replicas acknowledged it. The scripts compare the caller's
/// `now` with the stored deadlines and never read the server's clock, so the caller's clock is the
/// only clock. Quotas count live records with `ZCOUNT` over the indexes (scores after `now`), so
/// expired records never count, even before they are purged; a refused claim also purges a batch
/// of expired records.
///
/// Each record key gets a time-to-live equal to its remaining retention by the writer's clock, plus
/// five minutes of grace for clock skew between instances; renewing extends it, and the indexes
/// always outlive their records (by at most an hour, so that a write pushes an index's expiry
/// back once an hour rather than every time). Redis therefore drops abandoned records by itself, while
/// [`Store::purge_expired`] keeps the indexes small. Configure the server with `maxmemory-policy
/// noeviction`: evicting a live record would let a retry run a call twice.
///
/// # Redis Cluster
///
/// `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?shards=N]` opens the store on a
/// cluster through the `redis` crate's cluster client, seeded by the listed nodes: each command
/// goes to the primary serving its slot, `MOVED` and `ASK` are followed, and a command is retried
/// (up to three times) after an I/O error or `TRYAGAIN`. Every script touches the keys of one
/// shard, so one slot (no `CROSSSLOT`), and stays atomic; each is safe to run twice, so a retry
/// never applies an operation twice. `NOSCRIPT` (a promoted replica that never saw the script)
/// makes the driver load the script on every node and run it again.
///
/// Scopes are spread over the shards by a hash of the scope, and each shard's tag is chosen so
/// that the `N` shards sit in `N` equal ranges of the 16384 slots, hence spread over the primaries
/// of a cluster whose slots were assigned in ranges (as `redis-cli --cluster create` does). A
/// scope's records and its per-scope quota live in one shard, so **the per-scope quota is exact**.
///
/// **The store-wide quota is bounded, not exact, on a cluster.** No script can count records in
/// other slots, so each of the `N` shards admits a new record only while it holds fewer than
/// `⌈max_records_total / N⌉` live records. Hence the store never holds more than
/// `N · ⌈max_records_total / N⌉ < max_records_total + N` live records, but a claim can be refused
/// ([`QuotaExceeded::Total`]) while other shards still have room — at worst when its shard alone
/// holds `⌈max_records_total / N⌉`. Scopes spread evenly over the shards, so this matters only when
/// a few scopes hold most records: keep `max_records_per_scope` at or below `max_records_total /
/// N` (with the defaults, 10 000 ≤ 100 000 / 8), or raise `max_records_total`. On one server
/// (one shard) both quotas are exact.
///
/// # TLS
///
/// `rediss://…` (one server) and `rediss-cluster://HOST:PORT[,HOST:PORT…]` (a cluster, every node
/// over TLS) connect over TLS with rustls. The server's certificate is always verified, chain and
/// host name (or IP address); there is no opt-out (the `redis` crate's `#insecure` is refused as
/// a bad URL). It must chain to a system root or, with `?sslrootcert=FILE` (a PEM file of CA
/// certificates, the name the PostgreSQL store uses), to one of that file's CAs, which then
/// replace the system's roots. A file that cannot be read or holds no certificate is
/// [`StoreError::InvalidUrl`]; a certificate that does not check out is
/// [`StoreError::Unavailable`], saying the certificate was refused, with rustls' reason as its
/// source. `sslrootcert` on a `redis://` URL is an invalid URL. The `redis` crate builds its TLS
/// configuration with the process' default rustls crypto provider: opening a TLS store installs
/// ring (the provider of the crate's other TLS clients) as that default, unless one is set.
///
/// # Durability and waiting for replicas
///
/// A claim is as durable as the server's persistence (`appendonly yes` with `appendfsync everysec`
/// or `always`) and replication allow. Redis replicates asynchronously: a primary that dies after
/// answering a claim, before its replica received it, loses the claim, and the promoted replica
/// lets a retry execute the call a second time.
///
/// `replicas=N` (1 to 16) in the URL's query, on `redis://` as on `redis-cluster://`, makes every
/// write that exactly-once rests on wait for `N` replicas of the primary that applied it:
/// claim, take-over, completion, renewal and release. Each runs as one pipeline on the primary
/// serving the record's slot: the script, a write of the shard's marker key `{TAG}:ack` (kept 24
/// hours), then `WAIT N T`, with `T` from `replica_timeout_ms=T` (1 to 4000, default 1000). If
/// fewer than `N` replicas acknowledged within `T` ms, the operation fails with
/// [`StoreError::Unavailable`], whatever the script answered, so it counts as [may have
/// applied](StoreError::may_have_applied): a claim is answered `idempotency_store_unavailable`
/// and not executed (and released later, as any claim whose answer was lost), a completion is
/// handled as any completion that could not be recorded (logged; the record stays as the primary
/// holds it). The marker makes the wait cover earlier writes too (a primary replicates in order),
/// such as a script sent again by the cluster driver after its first answer was lost. For example
/// `redis-cluster://h1:7000,h2:7001?replicas=1&replica_timeout_ms=500`.
///
/// Why each write waits: a lost claim or take-over lets a retry execute again; a lost completion
/// turns an answered call back into one in progress (after its lease: outcome unknown, or executed
/// again under a re-executing after-crash policy); a lost renewal shortens a running call's lease
/// on the new primary, so another instance may take it over while it runs; a lost release leaves a
/// key held by a call that never ran until its lease runs out. `delete` and purges do not wait.
///
/// The price: every keyed call pays a replica round trip, and while a primary has fewer than `N`
/// reachable replicas every keyed call on its slots fails closed (after up to `T` ms). `WAIT` does
/// not make Redis strongly consistent: it proves that `N` replicas received the write, not that a
/// failover promotes one of them (if they fail too, another replica may be promoted), nor that they
/// persisted it.
#[derive(Clone)]
pub struct RedisStore {
    conn: Arc<SharedConn>,
    keys: Arc<Keys>,
    /// The claims and completions waiting to share a script call.
    batcher: Arc<Batcher>,
    /// The URL without its password, for error messages.
    url: String,
    /// How many replicas must acknowledge each write (`replicas=N`), if any.
    replicas: Option<ReplicaAcks>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("shards", &self.keys.shards().len())
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The key prefix (and hash tag) of [`RedisStore::open`].
    pub const DEFAULT_PREFIX: &'static str = "mcp-idem";

    /// Connects to the server at `url` (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`, or over TLS
    /// `rediss://…[?sslrootcert=FILE]`), or to the Redis Cluster at
    /// `redis-cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT…][?shards=N]` (over TLS
    /// `rediss-cluster://…`, also taking `sslrootcert=FILE`), with the default key prefix,
    /// [`RedisStore::DEFAULT_PREFIX`]. See "TLS" above. Either URL may add
    /// `replicas=N[&replica_timeout_ms=T]` to its query (see "Durability and waiting for
    /// replicas").
    ///
    /// Fails with [`StoreError::Unavailable`] if the server cannot be reached, and with
    /// [`StoreError::InvalidUrl`] if the URL cannot be understood; neither message shows the
    /// password.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with_prefix(url, Self::DEFAULT_PREFIX).await
    }

    /// [`RedisStore::open`] with keys under `prefix` (non-empty, without `{`, `}` or control
    /// characters), to keep several stores apart on one server or cluster. On one server the
    /// prefix is the hash tag of every key; on a cluster each shard's tag starts with it.
    pub async fn open_with_prefix(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let shown = super::redact_password(url);
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: shown.clone(),
            reason,
        };
        if prefix.is_empty() || prefix.contains(['{', '}']) || prefix.contains(char::is_control) {
            return Err(invalid(format!(
                "invalid key prefix {prefix:?}: it must be non-empty, without braces or control \
                 characters"
            )));
        }
        let RedisUrl { target, replicas } = RedisUrl::parse(url).map_err(invalid)?;
        let conn = target.connect(&shown).await?;
        let shards = target.shards();
        let keys = Keys::new(prefix, shards);
        let store = Self {
            conn: SharedConn::new(conn, target, &shown),
            batcher: Arc::default(),
            keys: Arc::new(keys),
            url: shown,
            replicas,
        };
        // PING proves the server answers (and accepted our credentials); loading the scripts now
        // makes a server without scripting a startup error rather than a failure of every call.
        // On a cluster both go to every node (PING to every primary).
        let mut conn = store.conn.get();
        let pong: String = store
            .bounded("startup", redis::cmd("PING").query_async(&mut conn))
            .await?;
        for source in server::ALL {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            let _sha: String = store
                .bounded("startup", load.query_async(&mut conn))
                .await?;
        }
        if pong != "PONG" {
            return Err(StoreError::Backend {
                message: format!("the Redis store {} did not answer PING", store.url),
                source: None,
            });
        }
        Ok(store)
    }

    /// The record for `id`, expired or not.
    async fn read(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn.get();
        let mut hmget = redis::cmd("HMGET");
        hmget
            .arg(self.keys.shard_of(&id.scope).record(&Keys::member(id)))
            .arg(&FIELDS[..]);
        let fields: Vec<Option<Vec<u8>>> =
            self.bounded("get", hmget.query_async(&mut conn)).await?;
        Ok(decode(id, fields)?)
    }

    /// Each shard's part of the store-wide limit `total`: `total` on one shard, else `⌈total /
    /// shards⌉` (see "Redis Cluster" above for the bound this gives).
    fn total_share(&self, total: u64) -> u64 {
        total.div_ceil(self.keys.shards().len() as u64)
    }

    /// Up to `limit` records of one shard matching `filter`, latest `expires_at` first.
    async fn list_shard(
        &self,
        shard: &Shard,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let index = match (&filter.namespace, &filter.principal, filter.state) {
            (Some(namespace), Some(principal), _) => {
                shard.scope(&Scope::new(namespace.as_str(), principal.as_str()))
            }
            (_, _, Some(StateFilter::InProgress)) => shard.running.clone(),
            _ => shard.all.clone(),
        };
        let (highest, lowest) = match filter.state {
            Some(StateFilter::Expired) => (now.as_millis().to_string(), "-inf".to_owned()),
            Some(_) => ("+inf".to_owned(), format!("({}", now.as_millis())),
            None => ("+inf".to_owned(), "-inf".to_owned()),
        };
        let state = match filter.state {
            Some(StateFilter::InProgress) => "run",
            Some(StateFilter::Completed) => "done",
            _ => "",
        };
        let bound = |t: Option<Timestamp>| t.map(|t| t.as_millis().to_string()).unwrap_or_default();
        let mut records = Vec::new();
        let mut offset = 0;
        while records.len() < limit {
            let mut call = ScriptCall::new(&SCRIPTS.list, &[&index], 0);
            call.arg(&shard.tag)
                .arg(&highest)
                .arg(&lowest)
                .arg(offset)
                .arg(LIST_BATCH)
                .arg(wanted_part(filter.namespace.as_deref()))
                .arg(wanted_part(filter.principal.as_deref()))
                .arg(wanted_part(filter.key.as_deref()))
                .arg(state)
                .arg(bound(filter.created_at_or_before))
                .arg(bound(filter.created_after));
            let reply: Vec<Option<Vec<u8>>> = self.invoke("list", &call).await?;
            let mut reply = reply.into_iter();
            let scanned: usize = reply
                .next()
                .flatten()
                .and_then(|n| String::from_utf8(n).ok()?.parse().ok())
                .ok_or_else(|| StoreError::Backend {
                    message: "the Redis list script returned no count".into(),
                    source: None,
                })?;
            let found: Vec<Option<Vec<u8>>> = reply.collect();
            for chunk in found.chunks(FIELDS.len() + 1) {
                let member = chunk[0].as_deref().unwrap_or_default();
                let id = member_id(member)?;
                if let Some(record) = decode(&id, chunk[1..].to_vec())? {
                    if filter.matches(&record, now) {
                        records.push(record);
                    }
                }
            }
            if scanned < LIST_BATCH {
                break;
            }
            offset += scanned;
        }
        records.truncate(limit);
        Ok(records)
    }
}

impl RedisStore {
    /// Whether claims and completions that wait at the same time share a script call: on one
    /// shard with `replicas=N` (see the `batch` module for why only then).
    fn batched(&self) -> bool {
        self.replicas.is_some() && self.keys.shards().len() == 1
    }

    /// Claims `req` with a script call of its own.
    async fn claim_alone(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let (mut call, shard) = self.on_record(&SCRIPTS.claim, &req.id, claim_bytes(req));
        self.claim_args(&mut call, req, shard);
        let reply: Vec<Option<Vec<u8>>> = self.invoke_write("claim", shard, &call).await?;
        claim_outcome(req, reply)
    }

    /// Records `req`'s outcome with a script call of its own.
    async fn complete_alone(&self, req: &CompleteRequest) -> Result<Fenced, StoreError> {
        let (mut call, shard) = self.on_record(&SCRIPTS.complete, &req.id, complete_bytes(req));
        self.complete_args(&mut call, req);
        self.fenced("complete", shard, &call).await
    }

    /// A claim's arguments after its member (`claim` in `writes.lua`).
    fn claim_args(&self, call: &mut ScriptCall, req: &ClaimRequest, shard: &Shard) {
        call.arg(req.now.as_millis())
            .arg(&req.fingerprint.as_bytes()[..])
            .arg(&*req.tool_name)
            .arg(req.owner.as_u64())
            .arg(req.lease_expires_at.as_millis())
            .arg(req.expires_at.as_millis())
            .arg(req.limits.max_records_per_scope)
            .arg(self.total_share(req.limits.max_records_total))
            .arg(&shard.tag)
            .arg(PURGE_BATCH)
            .arg(stored_trace(req).as_deref().unwrap_or(""));
    }

    /// A completion's arguments after its member (`complete` in `writes.lua`).
    fn complete_args(&self, call: &mut ScriptCall, req: &CompleteRequest) {
        call.arg(req.owner.as_u64())
            .arg(req.outcome.kind().as_str())
            .arg(req.outcome.body().as_ref())
            .arg(req.completed_at.as_millis())
            .arg(req.expires_at.as_millis());
    }
}

/// The bytes of [`RedisStore::claim_args`] beyond [`ARG_ROOM`](server::ARG_ROOM): the tool's name
/// and the trace.
fn claim_bytes(req: &ClaimRequest) -> usize {
    req.tool_name.len() + req.trace.map_or(0, |_| TRACE_BYTES)
}

/// The length of a stored trace: a `traceparent` (55 bytes), a space and a time of up to 20 digits.
const TRACE_BYTES: usize = 76;

/// The trace a claim writes ([`TraceLink::stored`](crate::TraceLink::stored)).
fn stored_trace(req: &ClaimRequest) -> Option<String> {
    req.trace.map(|trace| trace.stored(req.now))
}

/// The bytes of [`RedisStore::complete_args`] beyond [`ARG_ROOM`](server::ARG_ROOM): the outcome's body.
fn complete_bytes(req: &CompleteRequest) -> usize {
    req.outcome.body().len()
}

/// What the claim script's `reply` to `req` means.
fn claim_outcome(
    req: &ClaimRequest,
    reply: Vec<Option<Vec<u8>>>,
) -> Result<ClaimOutcome, StoreError> {
    let mut reply = reply.into_iter();
    let status = reply.next().flatten();
    match status.as_deref() {
        Some(b"claimed") => Ok(ClaimOutcome::Claimed),
        Some(b"scope") => Ok(ClaimOutcome::QuotaExceeded(QuotaExceeded::Scope {
            limit: req.limits.max_records_per_scope,
        })),
        Some(b"total") => Ok(ClaimOutcome::QuotaExceeded(QuotaExceeded::Total {
            limit: req.limits.max_records_total,
        })),
        Some(b"existing") => match decode(&req.id, reply.collect())? {
            Some(record) => Ok(ClaimOutcome::found(req, record)),
            None => {
                Err(CorruptRecord(format!("Redis record {:?} has no fields", req.id.key)).into())
            }
        },
        _ => Err(StoreError::Backend {
            message: "the Redis claim script returned an unknown status".into(),
            source: None,
        }),
    }
}

impl Store for RedisStore {
    fn system(&self) -> Option<&'static str> {
        Some("redis")
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            if self.batched() {
                queue::claim(self, req).await
            } else {
                self.claim_alone(req).await
            }
        })
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        Box::pin(async move {
            if self.batched() {
                queue::complete(self, req).await
            } else {
                self.complete_alone(&req).await
            }
        })
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (mut call, shard) = self.on_record(&SCRIPTS.take_over, &req.id, 0);
            call.arg(req.previous_owner.as_u64())
                .arg(req.new_owner.as_u64())
                .arg(req.now.as_millis())
                .arg(req.lease_expires_at.as_millis())
                .arg(req.expires_at.as_millis())
                .arg(
                    req.trace
                        .map(|trace| trace.to_traceparent())
                        .unwrap_or_default(),
                );
            self.fenced("take-over", shard, &call).await
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (mut call, shard) = self.on_record(&SCRIPTS.renew, id, 0);
            call.arg(owner.as_u64()).arg(lease_expires_at.as_millis());
            self.fenced("renew", shard, &call).await
        })
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let (mut call, shard) = self.on_record(&SCRIPTS.release, id, 0);
            call.arg(owner.as_u64());
            self.fenced("release", shard, &call).await
        })
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            Ok(self
                .read(id)
                .await?
                .filter(|record| !record.is_expired(now)))
        })
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let mut purged = 0;
            for shard in self.keys.shards() {
                loop {
                    let mut call =
                        ScriptCall::new(&SCRIPTS.purge, &[&shard.all, &shard.running], 0);
                    call.arg(&shard.tag).arg(now.as_millis()).arg(PURGE_BATCH);
                    let batch: u64 = self.invoke("purge", &call).await?;
                    purged += batch;
                    if batch < PURGE_BATCH {
                        break;
                    }
                }
            }
            Ok(purged)
        })
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        Box::pin(async move {
            let live = format!("({}", now.as_millis());
            let mut stats = StoreStats::default();
            for shard in self.keys.shards() {
                // One shard's three counts in one round trip; on one server (one shard) they are
                // one transaction, so they always agree.
                let mut counts = redis::pipe();
                if self.keys.shards().len() == 1 {
                    counts.atomic();
                }
                counts
                    .cmd("ZCOUNT")
                    .arg(&shard.all)
                    .arg(&live)
                    .arg("+inf")
                    .cmd("ZCOUNT")
                    .arg(&shard.running)
                    .arg(&live)
                    .arg("+inf")
                    .cmd("ZCOUNT")
                    .arg(&shard.all)
                    .arg("-inf")
                    .arg(now.as_millis());
                let mut conn = self.conn.get();
                let (live, in_progress, expired): (u64, u64, u64) =
                    self.bounded("stats", counts.query_async(&mut conn)).await?;
                stats.in_progress += in_progress;
                stats.completed += live.saturating_sub(in_progress);
                stats.expired += expired;
            }
            Ok(stats)
        })
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        Box::pin(async move {
            if let (Some(namespace), Some(principal), Some(key)) =
                (&filter.namespace, &filter.principal, &filter.key)
            {
                let Ok(key) = IdempotencyKey::from_stored(key) else {
                    return Ok(Vec::new());
                };
                let id = RecordId {
                    scope: Scope::new(namespace.as_str(), principal.as_str()),
                    key,
                };
                let record = self.read(&id).await?;
                return Ok(record
                    .filter(|record| limit > 0 && filter.matches(record, now))
                    .into_iter()
                    .collect());
            }
            let shards: Vec<&Shard> = match (&filter.namespace, &filter.principal) {
                (Some(namespace), Some(principal)) => vec![self
                    .keys
                    .shard_of(&Scope::new(namespace.as_str(), principal.as_str()))],
                _ => self.keys.shards().iter().collect(),
            };
            let mut records = Vec::new();
            for shard in shards {
                records.extend(self.list_shard(shard, filter, now, limit).await?);
            }
            // Each shard's records come latest expiry first; so do all of them.
            if self.keys.shards().len() > 1 {
                records.sort_by_key(|record| std::cmp::Reverse(record.expires_at));
            }
            records.truncate(limit);
            Ok(records)
        })
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (call, _) = self.on_record(&SCRIPTS.delete, id, 0);
            let deleted: i64 = self.invoke("delete", &call).await?;
            Ok(deleted == 1)
        })
    }
}

#[cfg(test)]
mod tests {
    /// The store shows its URL through the one redactor, [`redact_password`](crate::store::redact_password).
    #[test]
    fn urls_are_shown_without_secrets() {
        for (url, shown) in [
            (
                "redis://user:s3cret@db.example:6380/2",
                "redis://user:***@db.example:6380/2",
            ),
            ("redis://:p@ss@127.0.0.1", "redis://:***@127.0.0.1"),
            (
                "redis+unix:///run/redis.sock?pass=s3cret",
                "redis+unix:///run/redis.sock?pass=***",
            ),
            ("redis://h:1/0", "redis://h:1/0"),
        ] {
            assert_eq!(crate::store::redact_password(url), shown);
        }
    }
}
