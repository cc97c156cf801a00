//! The Redis store: records shared by every instance of a server, one Lua script per operation.

use std::fmt;
use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ScriptInvocation,
    ServerErrorKind,
};

use super::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, QuotaExceeded, StateFilter,
    Store, StoreError, StoreFuture, StoreStats, TakeOverRequest,
};
use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::{CorruptRecord, FencingToken, Outcome, Record, RecordId, RecordState, Scope};
use crate::time::Timestamp;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server may take to answer one command.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connection attempts after the first one, before an operation fails.
const RECONNECT_RETRIES: usize = 2;
/// Upper bound on one whole operation, reconnection included: a dead server never hangs a call.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Records deleted per purge script, so that no script blocks the server for long.
const PURGE_BATCH: u64 = 256;
/// Index members read per list script, for the same reason.
const LIST_BATCH: usize = 256;

/// The fields of a record hash, in the order the scripts and `get` return them.
const FIELDS: [&str; 9] = [
    "fp", "tool", "owner", "lease", "kind", "body", "done", "created", "expires",
];

macro_rules! lua {
    ($file:literal) => {
        concat!(include_str!("redis/common.lua"), include_str!($file))
    };
}

const CLAIM: &str = lua!("redis/claim.lua");
const COMPLETE: &str = lua!("redis/complete.lua");
const RENEW: &str = lua!("redis/renew.lua");
const RELEASE: &str = lua!("redis/release.lua");
const TAKE_OVER: &str = lua!("redis/take_over.lua");
const PURGE: &str = lua!("redis/purge.lua");
const LIST: &str = lua!("redis/list.lua");
const DELETE: &str = lua!("redis/delete.lua");

struct Scripts {
    claim: Script,
    complete: Script,
    renew: Script,
    release: Script,
    take_over: Script,
    purge: Script,
    list: Script,
    delete: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(CLAIM),
    complete: Script::new(COMPLETE),
    renew: Script::new(RENEW),
    release: Script::new(RELEASE),
    take_over: Script::new(TAKE_OVER),
    purge: Script::new(PURGE),
    list: Script::new(LIST),
    delete: Script::new(DELETE),
});

/// Records in Redis, shared by every process that opens the same server with the same prefix.
///
/// Cloning is cheap and shares the connection. The connection is re-established by itself after a
/// failure: while the server is unreachable every operation fails within a few seconds with
/// [`StoreError::Unavailable`], and the store works again as soon as the server is back.
///
/// # Layout
///
/// Every key of one store starts with the same hash tag, `{PREFIX}:` (`PREFIX` is `mcp-idem` unless
/// set with [`RedisStore::open_with_prefix`]):
///
/// | key | type | holds |
/// | --- | --- | --- |
/// | `{PREFIX}:r:NS:PRINCIPAL:KEY` | hash | one record |
/// | `{PREFIX}:s:NS:PRINCIPAL` | sorted set | the scope's records, scored by `expires_at` |
/// | `{PREFIX}:all` | sorted set | every record, scored by `expires_at` |
/// | `{PREFIX}:run` | sorted set | records in progress, scored by `expires_at` |
///
/// [`Store::list`] reads the narrowest index that covers its filter (the scope's, the records in
/// progress, or all), latest `expires_at` first, one Lua script per batch of 256 index members.
///
/// `NS`, `PRINCIPAL` and `KEY` are percent-encoded (`%`, `:`, `{`, `}`, spaces and control
/// characters), so two different `(scope, key)` never share a Redis key and the hash tag is always
/// the prefix. A record hash has the fields `fp` (the 32 fingerprint bytes), `tool`, `owner` and
/// `lease` (in progress), `kind`, `body` (byte for byte) and `done` (completed), `created` and
/// `expires`; numbers are decimal text.
///
/// # Atomicity, time and quotas
///
/// Claim, complete, renew, release, take-over and delete are each one Lua script (`EVALSHA`, loading the
/// script if the server lost it), so each is one atomic round trip; the fencing token is checked
/// inside the script. The scripts compare the caller's `now` with the stored deadlines and never
/// read the server's clock, so the caller's clock is the only clock. Quotas count live records with
/// `ZCOUNT` over the indexes (scores after `now`), so expired records never count, even before they
/// are purged; a refused claim also purges a batch of expired records.
///
/// Each record key gets a time-to-live equal to its remaining retention by the writer's clock, plus
/// five minutes of grace for clock skew between instances; renewing extends it, and the indexes
/// always outlive their records. Redis therefore drops abandoned records by itself, while
/// [`Store::purge_expired`] keeps the indexes small. Configure the server with `maxmemory-policy
/// noeviction`: evicting a live record would let a retry run a call twice.
///
/// # Redis Cluster
///
/// Because every key of one store shares one hash tag, every script touches a single slot (no
/// `CROSSSLOT`, also for the records that purges find through the indexes) and the store-wide quota
/// is exact, but **all records of one store live on one shard**. Give stores that need to scale
/// independently different prefixes. The store talks to one node through a [`ConnectionManager`]:
/// point it at the primary serving the prefix's slot, or at a cluster-aware proxy.
///
/// # Durability
///
/// A claim is as durable as the server's persistence (`appendonly yes` with `appendfsync everysec`
/// or `always`) and replication allow: a failover to a replica that missed a claim forgets it.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    keys: Keys,
    /// The URL without its password, for error messages.
    url: String,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("tag", &self.keys.tag)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The key prefix (and hash tag) of [`RedisStore::open`].
    pub const DEFAULT_PREFIX: &'static str = "mcp-idem";

    /// Connects to the server at `url` (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`) with the
    /// default key prefix, [`RedisStore::DEFAULT_PREFIX`].
    ///
    /// Fails with [`StoreError::Unavailable`] if the server cannot be reached, and with
    /// [`StoreError::InvalidUrl`] if the URL cannot be understood; neither message shows the
    /// password.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with_prefix(url, Self::DEFAULT_PREFIX).await
    }

    /// [`RedisStore::open`] with keys under `prefix` (non-empty, without `{`, `}` or control
    /// characters), to keep several stores apart on one server. The prefix is also the Redis
    /// Cluster hash tag: one store lives in one slot.
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
        let client = Client::open(url).map_err(|err| invalid(err.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_secs(1));
        let cannot_connect = |err: RedisError| {
            StoreError::unavailable(format!("cannot connect to the Redis store {shown}"), err)
        };
        let conn = match tokio::time::timeout(
            OPERATION_TIMEOUT,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        {
            Ok(conn) => conn.map_err(cannot_connect)?,
            Err(elapsed) => {
                let message = format!(
                    "cannot connect to the Redis store {shown}: no answer within \
                     {OPERATION_TIMEOUT:?}"
                );
                return Err(StoreError::unavailable(message, elapsed));
            }
        };
        let store = Self {
            conn,
            keys: Keys::new(prefix),
            url: shown,
        };
        // PING proves the server answers (and accepted our credentials); loading the scripts now
        // makes a server without scripting a startup error rather than a failure of every call.
        let mut startup = redis::pipe();
        startup.cmd("PING");
        for source in [
            CLAIM, COMPLETE, RENEW, RELEASE, TAKE_OVER, PURGE, LIST, DELETE,
        ] {
            startup.cmd("SCRIPT").arg("LOAD").arg(source);
        }
        let mut conn = store.conn.clone();
        let replies: Vec<String> = store
            .bounded("startup", startup.query_async(&mut conn))
            .await?;
        if replies.first().map(String::as_str) != Some("PONG") {
            return Err(StoreError::Backend {
                message: format!("the Redis store {} did not answer PING", store.url),
                source: None,
            });
        }
        Ok(store)
    }

    /// Runs one Redis exchange, bounded by [`OPERATION_TIMEOUT`], mapping its errors.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        exchange: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(OPERATION_TIMEOUT, exchange).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.error(operation, err)),
            Err(elapsed) => Err(StoreError::unavailable(
                format!(
                    "the Redis store {} did not answer {operation} within {OPERATION_TIMEOUT:?}",
                    self.url
                ),
                elapsed,
            )),
        }
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        operation: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        self.bounded(operation, invocation.invoke_async(&mut conn))
            .await
    }

    fn error(&self, operation: &str, err: RedisError) -> StoreError {
        if is_unavailable(&err) {
            StoreError::unavailable(
                format!("the Redis store {} is unavailable ({operation})", self.url),
                err,
            )
        } else {
            StoreError::backend(
                format!("the Redis store {} failed {operation}", self.url),
                err,
            )
        }
    }

    /// A script invocation on the four keys of `id`'s record, with the record's member first.
    fn on_record<'s>(&self, script: &'s Script, id: &RecordId) -> ScriptInvocation<'s> {
        let member = Keys::member(id);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.keys.record(&member))
            .key(self.keys.scope(&id.scope))
            .key(&self.keys.all)
            .key(&self.keys.running)
            .arg(member);
        invocation
    }

    /// The record for `id`, expired or not.
    async fn read(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn.clone();
        let mut hmget = redis::cmd("HMGET");
        hmget
            .arg(self.keys.record(&Keys::member(id)))
            .arg(&FIELDS[..]);
        let fields: Vec<Option<Vec<u8>>> =
            self.bounded("get", hmget.query_async(&mut conn)).await?;
        Ok(decode(id, fields)?)
    }

    async fn fenced(
        &self,
        operation: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Fenced, StoreError> {
        let applied: i64 = self.invoke(operation, invocation).await?;
        Ok(if applied == 1 {
            Fenced::Applied
        } else {
            Fenced::NotOwner
        })
    }
}

/// Whether `err` means the server could not be reached or cannot serve right now.
fn is_unavailable(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_cluster_error()
        || matches!(
            err.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                )
        )
        || err.code() == Some("BUSY")
}

/// The names of one store's keys.
#[derive(Clone, Debug)]
struct Keys {
    /// `{PREFIX}:`, the start of every key.
    tag: String,
    all: String,
    running: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        let tag = format!("{{{prefix}}}:");
        Self {
            all: format!("{tag}all"),
            running: format!("{tag}run"),
            tag,
        }
    }

    /// `NS:PRINCIPAL:KEY`, each part encoded: how the indexes name a record.
    fn member(id: &RecordId) -> String {
        let mut member = Self::scope_part(&id.scope);
        member.push(':');
        encode_into(&mut member, id.key.as_str());
        member
    }

    fn scope_part(scope: &Scope) -> String {
        let mut part = String::new();
        encode_into(&mut part, scope.namespace());
        part.push(':');
        encode_into(&mut part, scope.principal());
        part
    }

    fn record(&self, member: &str) -> String {
        format!("{}r:{member}", self.tag)
    }

    fn scope(&self, scope: &Scope) -> String {
        format!("{}s:{}", self.tag, Self::scope_part(scope))
    }
}

/// Appends `part` percent-encoded: `%`, `:`, braces, spaces and control characters become `%XX`
/// (per UTF-8 byte), everything else is kept. The encoding is injective and never contains `:`.
fn encode_into(out: &mut String, part: &str) {
    for ch in part.chars() {
        if matches!(ch, '%' | ':' | '{' | '}') || ch.is_whitespace() || ch.is_control() {
            let mut buf = [0; 4];
            for byte in ch.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(ch);
        }
    }
}

/// Reverses [`encode_into`]; `None` if `part` is not something it wrote.
fn decode_part(part: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The record an index member names (`NS:PRINCIPAL:KEY`, each part encoded).
fn member_id(member: &[u8]) -> Result<RecordId, CorruptRecord> {
    let corrupt = || {
        CorruptRecord(format!(
            "Redis index member {:?}",
            String::from_utf8_lossy(member)
        ))
    };
    let member = std::str::from_utf8(member).map_err(|_| corrupt())?;
    let mut parts = member.split(':').map(decode_part);
    let (Some(Some(namespace)), Some(Some(principal)), Some(Some(key)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(corrupt());
    };
    let key = IdempotencyKey::new(&key, usize::MAX).map_err(|_| corrupt())?;
    Ok(RecordId {
        scope: Scope::new(namespace, principal),
        key,
    })
}

/// `=` and the encoded `part`, or `` for no condition: how the list script takes its filters.
fn wanted_part(part: Option<&str>) -> String {
    match part {
        Some(part) => {
            let mut wanted = String::from("=");
            encode_into(&mut wanted, part);
            wanted
        }
        None => String::new(),
    }
}

/// Rebuilds a record from its hash fields, in [`FIELDS`] order. `None` if the record does not
/// exist (no field at all).
fn decode(id: &RecordId, fields: Vec<Option<Vec<u8>>>) -> Result<Option<Record>, CorruptRecord> {
    if fields.iter().all(Option::is_none) {
        return Ok(None);
    }
    let corrupt = |what: &str| CorruptRecord(format!("{what} of Redis record {:?}", id.key));
    let Ok([fp, tool, owner, lease, kind, body, done, created, expires]) =
        <[Option<Vec<u8>>; FIELDS.len()]>::try_from(fields)
    else {
        return Err(corrupt("field count"));
    };
    let text = |field: Option<Vec<u8>>, name: &str| -> Result<String, CorruptRecord> {
        let bytes = field.ok_or_else(|| corrupt(&format!("missing {name}")))?;
        String::from_utf8(bytes).map_err(|_| corrupt(&format!("non-UTF-8 {name}")))
    };
    let number = |field: Option<Vec<u8>>, name: &str| -> Result<u64, CorruptRecord> {
        text(field, name)?
            .parse()
            .map_err(|_| corrupt(&format!("malformed {name}")))
    };
    let time = |field: Option<Vec<u8>>, name: &str| number(field, name).map(Timestamp::from_millis);
    let fingerprint = fp
        .as_deref()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .map(Fingerprint::from_bytes)
        .ok_or_else(|| corrupt("fingerprint"))?;
    let state = match (owner, kind) {
        (owner @ Some(_), None) => RecordState::InProgress {
            owner: FencingToken::from_u64(number(owner, "owner")?),
            lease_expires_at: time(lease, "lease")?,
        },
        (None, kind @ Some(_)) => RecordState::Completed {
            outcome: Outcome::from_parts(text(kind, "kind")?.parse()?, text(body, "body")?)?,
            completed_at: time(done, "completion time")?,
        },
        _ => return Err(corrupt("state fields")),
    };
    Ok(Some(Record {
        id: id.clone(),
        fingerprint,
        tool_name: text(tool, "tool")?,
        state,
        created_at: time(created, "creation time")?,
        expires_at: time(expires, "expiry")?,
    }))
}

impl Store for RedisStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            let mut invocation = self.on_record(&SCRIPTS.claim, &req.id);
            invocation
                .arg(req.now.as_millis())
                .arg(&req.fingerprint.as_bytes()[..])
                .arg(&*req.tool_name)
                .arg(req.owner.as_u64())
                .arg(req.lease_expires_at.as_millis())
                .arg(req.expires_at.as_millis())
                .arg(req.limits.max_records_per_scope)
                .arg(req.limits.max_records_total)
                .arg(&self.keys.tag)
                .arg(PURGE_BATCH);
            let reply: Vec<Option<Vec<u8>>> = self.invoke("claim", &invocation).await?;
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
                    Some(record) => Ok(ClaimOutcome::Existing(record)),
                    None => Err(CorruptRecord(format!(
                        "Redis record {:?} has no fields",
                        req.id.key
                    ))
                    .into()),
                },
                _ => Err(StoreError::Backend {
                    message: "the Redis claim script returned an unknown status".into(),
                    source: None,
                }),
            }
        })
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        Box::pin(async move {
            let mut invocation = self.on_record(&SCRIPTS.complete, &req.id);
            invocation
                .arg(req.owner.as_u64())
                .arg(req.outcome.kind().as_str())
                .arg(req.outcome.body().as_ref())
                .arg(req.completed_at.as_millis())
                .arg(req.expires_at.as_millis());
            self.fenced("complete", &invocation).await
        })
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let mut invocation = self.on_record(&SCRIPTS.take_over, &req.id);
            invocation
                .arg(req.previous_owner.as_u64())
                .arg(req.new_owner.as_u64())
                .arg(req.now.as_millis())
                .arg(req.lease_expires_at.as_millis())
                .arg(req.expires_at.as_millis());
            self.fenced("take-over", &invocation).await
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let mut invocation = self.on_record(&SCRIPTS.renew, id);
            invocation
                .arg(owner.as_u64())
                .arg(lease_expires_at.as_millis());
            self.fenced("renew", &invocation).await
        })
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let mut invocation = self.on_record(&SCRIPTS.release, id);
            invocation.arg(owner.as_u64());
            self.fenced("release", &invocation).await
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
            loop {
                let mut invocation = SCRIPTS.purge.prepare_invoke();
                invocation
                    .key(&self.keys.all)
                    .key(&self.keys.running)
                    .arg(&self.keys.tag)
                    .arg(now.as_millis())
                    .arg(PURGE_BATCH);
                let batch: u64 = self.invoke("purge", &invocation).await?;
                purged += batch;
                if batch < PURGE_BATCH {
                    return Ok(purged);
                }
            }
        })
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        Box::pin(async move {
            let live = format!("({}", now.as_millis());
            let mut counts = redis::pipe();
            counts
                .atomic()
                .cmd("ZCOUNT")
                .arg(&self.keys.all)
                .arg(&live)
                .arg("+inf")
                .cmd("ZCOUNT")
                .arg(&self.keys.running)
                .arg(&live)
                .arg("+inf")
                .cmd("ZCOUNT")
                .arg(&self.keys.all)
                .arg("-inf")
                .arg(now.as_millis());
            let mut conn = self.conn.clone();
            let (live, in_progress, expired): (u64, u64, u64) =
                self.bounded("stats", counts.query_async(&mut conn)).await?;
            Ok(StoreStats {
                in_progress,
                completed: live.saturating_sub(in_progress),
                expired,
            })
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
                let Ok(key) = IdempotencyKey::new(key, usize::MAX) else {
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
            let index = match (&filter.namespace, &filter.principal, filter.state) {
                (Some(namespace), Some(principal), _) => self
                    .keys
                    .scope(&Scope::new(namespace.as_str(), principal.as_str())),
                (_, _, Some(StateFilter::InProgress)) => self.keys.running.clone(),
                _ => self.keys.all.clone(),
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
            let bound =
                |t: Option<Timestamp>| t.map(|t| t.as_millis().to_string()).unwrap_or_default();
            let mut records = Vec::new();
            let mut offset = 0;
            while records.len() < limit {
                let mut invocation = SCRIPTS.list.prepare_invoke();
                invocation
                    .key(&index)
                    .arg(&self.keys.tag)
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
                let reply: Vec<Option<Vec<u8>>> = self.invoke("list", &invocation).await?;
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
        })
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let invocation = self.on_record(&SCRIPTS.delete, id);
            let deleted: i64 = self.invoke("delete", &invocation).await?;
            Ok(deleted == 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::IdempotencyKey;

    fn id(namespace: &str, principal: &str, key: &str) -> RecordId {
        RecordId {
            scope: Scope::new(namespace, principal),
            key: IdempotencyKey::new(key, 255).unwrap(),
        }
    }

    /// CRC16-CCITT (XMODEM), as Redis Cluster uses it.
    fn crc16(data: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &byte in data {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    /// The Redis Cluster slot of `key`, honouring `{hash tags}`.
    fn slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &rest[..len])
        });
        crc16(tagged.unwrap_or(bytes)) % 16384
    }

    #[test]
    fn slot_matches_the_cluster_specification() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn every_key_of_a_store_shares_one_slot() {
        let keys = Keys::new("mcp-idem");
        let expected = slot("{mcp-idem}");
        for id in [
            id("ns", "alice", "k"),
            id("{ns}", "}{", "{key}"),
            id("n:s", "p{x}", "ключ 🔑"),
            id("", "", "}"),
        ] {
            let member = Keys::member(&id);
            for key in [
                keys.record(&member),
                keys.scope(&id.scope),
                keys.all.clone(),
                keys.running.clone(),
            ] {
                assert!(key.starts_with("{mcp-idem}:"), "{key}");
                assert_eq!(slot(&key), expected, "{key}");
            }
        }
    }

    #[test]
    fn encoding_keeps_different_records_apart() {
        let ids = [
            id("a:b", "c", "k"),
            id("a", "b:c", "k"),
            id("a", "b", "c:k"),
            id("a%3Ab", "c", "k"),
            id("a", "b", "k "),
            id("a", "b", "k"),
            id("a", "b", "K"),
        ];
        let members: std::collections::HashSet<_> = ids.iter().map(Keys::member).collect();
        assert_eq!(members.len(), ids.len());
        for member in &members {
            assert_eq!(member.matches(':').count(), 2, "{member}");
            assert!(!member.contains(['{', '}', ' ']), "{member}");
        }
        assert_eq!(Keys::member(&id("é", "p", "{k}")), "é:p:%7Bk%7D");
        for id in &ids {
            assert_eq!(&member_id(Keys::member(id).as_bytes()).unwrap(), id);
        }
        for bad in ["a:b", "a:b:c:d", "a:b:%4", "a:b:%ZZ", "a:b:%FF"] {
            assert!(member_id(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    /// The store shows its URL through the one redactor, [`super::super::redact_password`].
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
            assert_eq!(super::super::redact_password(url), shown);
        }
    }

    #[test]
    fn records_decode_and_corruption_is_reported() {
        let id = id("ns", "p", "k");
        let field = |s: &str| Some(s.as_bytes().to_vec());
        let mut fields = vec![
            Some(vec![7; 32]),
            field("charge"),
            None,
            None,
            field("not_retained"),
            field("12"),
            field("5"),
            field("1"),
            field("9"),
        ];
        let record = decode(&id, fields.clone()).unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::NotRetained { size: 12 },
                completed_at: Timestamp::from_millis(5)
            }
        );
        assert_eq!(decode(&id, vec![None; 9]).unwrap(), None);
        fields[2] = field("3");
        assert!(decode(&id, fields.clone()).is_err(), "owner and outcome");
        fields[2] = None;
        fields[0] = Some(vec![7; 31]);
        assert!(decode(&id, fields.clone()).is_err(), "short fingerprint");
        fields[0] = Some(vec![7; 32]);
        fields[8] = field("soon");
        assert!(decode(&id, fields.clone()).is_err(), "malformed expiry");
    }
}
