//! Talking to the server: the connection (one node, or a Redis Cluster), the Lua scripts (one per
//! operation and one for a batch of claims and completions, each with the helpers of `common.lua`
//! in front, and those that claim or complete with `writes.lua`'s), exchanges bounded in time,
//! and the mapping of Redis errors to [`StoreError`]s that name the server, never the password.
//!
//! On a cluster the driver routes each script by its first key (every key of a script carries one
//! hash tag, so one slot), follows `MOVED` and `ASK` and retries after I/O errors; every script is
//! safe to run twice, so such a retry never applies an operation twice. `SCRIPT LOAD` goes to
//! every node, so a `NOSCRIPT` (a promoted replica, a restarted node) is answered by loading the
//! script everywhere and running it again, on a cluster as on one node.
//!
//! With `replicas=N` in the URL, each write script runs in one pipeline with `WAIT` (see
//! `replicas`), and a write that fewer than `N` replicas acknowledged in time fails closed.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Script,
    ServerErrorKind, ToRedisArgs, Value,
};

use super::keys::Shard;
use super::replicas::MARKER_TTL;
use super::RedisStore;
use crate::record::RecordId;
use crate::store::{Fenced, StoreError};

/// Upper bound on one whole operation, reconnection included: a dead server never hangs a call.
pub(super) const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

macro_rules! lua {
    ($file:literal) => {
        concat!(include_str!("common.lua"), include_str!($file))
    };
}

/// A script that claims or completes: `writes.lua`'s functions in front too.
macro_rules! lua_writes {
    ($file:literal) => {
        concat!(
            include_str!("common.lua"),
            include_str!("writes.lua"),
            include_str!($file)
        )
    };
}

/// Every script, for loading them all at startup.
pub(super) const ALL: [&str; 9] = [
    CLAIM, COMPLETE, BATCH, RENEW, RELEASE, TAKE_OVER, PURGE, LIST, DELETE,
];

const CLAIM: &str = lua_writes!("claim.lua");
const COMPLETE: &str = lua_writes!("complete.lua");
const BATCH: &str = lua_writes!("batch.lua");
const RENEW: &str = lua!("renew.lua");
const RELEASE: &str = lua!("release.lua");
const TAKE_OVER: &str = lua!("take_over.lua");
const PURGE: &str = lua!("purge.lua");
const LIST: &str = lua!("list.lua");
const DELETE: &str = lua!("delete.lua");

/// The scripts, each run with `EVALSHA` (and loaded again if the server lost it).
pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) complete: Script,
    pub(super) batch: Script,
    pub(super) renew: Script,
    pub(super) release: Script,
    pub(super) take_over: Script,
    pub(super) purge: Script,
    pub(super) list: Script,
    pub(super) delete: Script,
}

pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(CLAIM),
    complete: Script::new(COMPLETE),
    batch: Script::new(BATCH),
    renew: Script::new(RENEW),
    release: Script::new(RELEASE),
    take_over: Script::new(TAKE_OVER),
    purge: Script::new(PURGE),
    list: Script::new(LIST),
    delete: Script::new(DELETE),
});

/// The bytes of arguments a script call has room for besides what it names as more: a claim's
/// numbers (at most 20 bytes each), its fingerprint and the store's tag come to about 200.
pub(super) const ARG_ROOM: usize = 256;

/// The arguments a script call has room for (a claim has the most: 12).
const ARGS: usize = 13;

/// One run of a script: `EVALSHA` with the script's keys and arguments, written straight into
/// the command (a `redis::ScriptInvocation` holds each argument apart, then copies it in).
pub(super) struct ScriptCall {
    script: &'static Script,
    cmd: Cmd,
}

impl ScriptCall {
    /// A run of `script` on `keys`; arguments follow with [`ScriptCall::arg`]. The command is
    /// sized at once for [`ARG_ROOM`] bytes of arguments and `more_bytes` more (a tool's name, an
    /// outcome's body): growing it argument by argument cost more than writing them.
    pub(super) fn new(script: &'static Script, keys: &[&str], more_bytes: usize) -> Self {
        let key_bytes: usize = keys.iter().map(|key| key.len()).sum();
        // EVALSHA, the script's hash and the number of keys: 3 arguments of at most 57 bytes.
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + ARGS,
            57 + key_bytes + ARG_ROOM + more_bytes,
        );
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys);
        Self { script, cmd }
    }

    /// Appends an argument (`ARGV[n]` of the script).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// The connection of a store: to one server, or to a Redis Cluster.
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, reconnected after failures.
    Node(ConnectionManager),
    /// A cluster: commands go to the primary of their slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

impl RedisStore {
    /// Runs one Redis exchange, bounded by [`OPERATION_TIMEOUT`], mapping its errors.
    pub(super) async fn bounded<T>(
        &self,
        operation: &'static str,
        exchange: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let answer = tokio::time::timeout(OPERATION_TIMEOUT, exchange).await;
        let failed = match &answer {
            Ok(Ok(_)) => false,
            Ok(Err(err)) => is_unavailable(err),
            Err(_) => true,
        };
        self.conn.note(failed);
        match answer {
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

    /// Runs one script, through [`RedisStore::bounded`]; on `NOSCRIPT` (a restarted node, a
    /// promoted replica) loads it (on every node of a cluster) and runs it again.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        operation: &'static str,
        call: &ScriptCall,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.get();
        let exchange = async {
            match call.cmd.query_async(&mut conn).await {
                Err(err) if is_no_script(&err) => {
                    call.script.load_async(&mut conn).await?;
                    call.cmd.query_async(&mut conn).await
                }
                answer => answer,
            }
        };
        self.bounded(operation, exchange).await
    }

    /// Runs the write script `call` on a record of `shard`, through [`RedisStore::invoke`];
    /// with the replica option (`replicas=N`), in one pipeline with the shard's marker write and
    /// `WAIT`, failing with [`StoreError::Unavailable`] (which [may have
    /// applied](StoreError::may_have_applied)) unless `N` replicas acknowledged in time, whatever
    /// the script answered: an answer is given only on state that `N` replicas hold.
    pub(super) async fn invoke_write<T: FromRedisValue>(
        &self,
        operation: &'static str,
        shard: &Shard,
        call: &ScriptCall,
    ) -> Result<T, StoreError> {
        let Some(acks) = self.replicas else {
            return self.invoke(operation, call).await;
        };
        let mut pipe = redis::pipe();
        pipe.add_command(call.cmd.clone())
            .cmd("SET")
            .arg(&shard.ack)
            .arg(1)
            .arg("PX")
            .arg(MARKER_TTL.as_millis() as u64)
            .ignore()
            .cmd("WAIT")
            .arg(acks.replicas)
            .arg(acks.timeout_ms);
        let mut conn = self.conn.get();
        let exchange = async {
            match pipe.query_async::<(T, u32)>(&mut conn).await {
                // As `invoke` does for one script: load it (on every node of a cluster) and send
                // the pipeline again.
                Err(err) if is_no_script(&err) => {
                    call.script.load_async(&mut conn).await?;
                    pipe.query_async(&mut conn).await
                }
                answer => answer,
            }
        };
        let (reply, acked) = self.bounded(operation, exchange).await?;
        if acked < acks.replicas {
            return Err(StoreError::Unavailable {
                message: format!(
                    "the Redis store {} answered {operation} but {acked} of the {} replicas it \
                     waits for acknowledged within {} ms: failing closed, as a failover could \
                     lose the write",
                    self.url, acks.replicas, acks.timeout_ms
                ),
                source: None,
            });
        }
        Ok(reply)
    }

    /// `err` as [`StoreError::Unavailable`] when the server cannot serve, [`StoreError::Backend`]
    /// otherwise.
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

    /// A run of `script` on the four keys of `id`'s record (all in the record's shard), with the
    /// record's member first and room for `more_bytes` of arguments besides
    /// ([`ScriptCall::new`]); and that shard.
    pub(super) fn on_record(
        &self,
        script: &'static Script,
        id: &RecordId,
        more_bytes: usize,
    ) -> (ScriptCall, &Shard) {
        let keys = self.keys.of_record(id);
        let mut call = ScriptCall::new(
            script,
            &[
                &keys.record,
                &keys.scope,
                &keys.shard.all,
                &keys.shard.running,
            ],
            keys.member.len() + more_bytes,
        );
        call.arg(&keys.member);
        (call, keys.shard)
    }

    /// Runs a fenced write script on a record of `shard`, which answers 1 when it wrote.
    pub(super) async fn fenced(
        &self,
        operation: &'static str,
        shard: &Shard,
        call: &ScriptCall,
    ) -> Result<Fenced, StoreError> {
        let applied: i64 = self.invoke_write(operation, shard, call).await?;
        Ok(if applied == 1 {
            Fenced::Applied
        } else {
            Fenced::NotOwner
        })
    }
}

/// Whether the server did not have the script (`NOSCRIPT`).
fn is_no_script(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
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
