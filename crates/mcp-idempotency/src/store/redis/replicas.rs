//! Waiting for replicas: the `replicas=N` and `replica_timeout_ms=T` parameters of a store URL,
//! and the `WAIT` that follows each write script when they are given.
//!
//! A write script runs in one pipeline with a marker write to its shard and `WAIT N T`:
//! `EVALSHA …; SET {TAG}:ack 1 PX …; WAIT N T`. The pipeline is routed by its first key (the
//! record's), so on a cluster all three reach the primary that ran the script, on the same
//! connection, one after the other. The marker makes `WAIT` meaningful whatever the script did:
//! `WAIT` counts the replicas that acknowledged the connection's last write, and a primary
//! replicates its writes in order, so an acknowledged marker proves that everything the primary
//! had applied before it (the script's writes, or those of an earlier attempt of the same script
//! whose answer was lost, which the retry finds and reports without writing) is on `N` replicas.

use std::fmt;
use std::time::Duration;

/// `replica_timeout_ms` when the URL gives `replicas` alone.
pub(super) const DEFAULT_REPLICA_TIMEOUT_MS: u64 = 1000;
/// The longest `replica_timeout_ms`: below the 5 s a command may take to answer.
pub(super) const MAX_REPLICA_TIMEOUT_MS: u64 = 4000;
/// The most replicas a write may wait for.
pub(super) const MAX_REPLICAS: u32 = 16;
/// How long the marker key lives after its last write.
pub(super) const MARKER_TTL: Duration = Duration::from_secs(24 * 3600);

/// How many replicas must acknowledge each write, and how long to wait for them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct ReplicaAcks {
    /// Replicas that must acknowledge (at least one).
    pub(super) replicas: u32,
    /// How long `WAIT` waits for them, in milliseconds (at least one).
    pub(super) timeout_ms: u64,
}

impl fmt::Debug for ReplicaAcks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} within {} ms", self.replicas, self.timeout_ms)
    }
}

impl ReplicaAcks {
    /// The option of a URL whose `replicas` and `replica_timeout_ms` parameters have these values
    /// (`None`: not given); `None` when `replicas` is not given. The error is the reason, for
    /// [`StoreError::InvalidUrl`](crate::store::StoreError::InvalidUrl).
    pub(super) fn from_params(
        replicas: Option<&str>,
        timeout_ms: Option<&str>,
    ) -> Result<Option<Self>, String> {
        let replicas = replicas
            .map(|value| {
                value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_REPLICAS).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "replicas={value}: expected a number from 1 to {MAX_REPLICAS} (leave \
                             the parameter out not to wait for replicas)"
                        )
                    })
            })
            .transpose()?;
        let timeout_ms = timeout_ms
            .map(|value| {
                value
                    .parse()
                    .ok()
                    .filter(|t| (1..=MAX_REPLICA_TIMEOUT_MS).contains(t))
                    .ok_or_else(|| {
                        format!(
                            "replica_timeout_ms={value}: expected milliseconds from 1 to \
                             {MAX_REPLICA_TIMEOUT_MS}"
                        )
                    })
            })
            .transpose()?;
        match (replicas, timeout_ms) {
            (None, None) => Ok(None),
            (None, Some(_)) => {
                Err("replica_timeout_ms needs replicas=N (how many replicas to wait for)".into())
            }
            (Some(replicas), timeout_ms) => Ok(Some(Self {
                replicas,
                timeout_ms: timeout_ms.unwrap_or(DEFAULT_REPLICA_TIMEOUT_MS),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::connect::{RedisUrl, Target};
    use super::*;

    fn acks(replicas: u32, timeout_ms: u64) -> Option<ReplicaAcks> {
        Some(ReplicaAcks {
            replicas,
            timeout_ms,
        })
    }

    #[test]
    fn replica_parameters_are_taken_out_of_the_url() {
        for (url, rest, option) in [
            ("redis://h:1/0", "redis://h:1/0", None),
            (
                "redis://h:1/0?protocol=resp3",
                "redis://h:1/0?protocol=resp3",
                None,
            ),
            (
                "redis://h:1/0?replicas=1",
                "redis://h:1/0",
                acks(1, DEFAULT_REPLICA_TIMEOUT_MS),
            ),
            (
                "redis://h:1?protocol=resp3&replicas=2&replica_timeout_ms=250",
                "redis://h:1?protocol=resp3",
                acks(2, 250),
            ),
        ] {
            let parsed = RedisUrl::parse(url).unwrap();
            assert_eq!(parsed.replicas, option, "{url}");
            assert!(
                matches!(&parsed.target, Target::Node { url, .. } if url == rest),
                "{url}: {:?}",
                parsed.target
            );
        }
        let cluster =
            RedisUrl::parse("redis-cluster://a:1,b:2?replica_timeout_ms=4000&shards=4&replicas=1")
                .unwrap();
        assert_eq!(cluster.replicas, acks(1, 4000));
        assert_eq!(cluster.target.shards(), 4);
    }

    #[test]
    fn bad_replica_parameters_are_refused_with_the_reason() {
        for (url, reason) in [
            (
                "redis://h?replicas=0",
                "replicas=0: expected a number from 1 to 16",
            ),
            ("redis://h?replicas=17", "replicas=17: expected a number"),
            ("redis://h?replicas=", "replicas=: expected a number"),
            ("redis://h?replicas", "replicas=: expected a number"),
            ("redis://h?replicas=x", "replicas=x: expected a number"),
            (
                "redis://h?replicas=1&replica_timeout_ms=0",
                "replica_timeout_ms=0: expected milliseconds from 1 to 4000",
            ),
            (
                "redis://h?replicas=1&replica_timeout_ms=4001",
                "replica_timeout_ms=4001: expected milliseconds",
            ),
            (
                "redis://h?replica_timeout_ms=10",
                "replica_timeout_ms needs replicas=N",
            ),
            ("redis://h?replicas=1&replicas=2", "replicas is given twice"),
            (
                "rediss://h?sslrootcert=a.pem&sslrootcert=b.pem",
                "sslrootcert is given twice",
            ),
            (
                "redis-cluster://a:1?shards=2&shards=3",
                "shards is given twice",
            ),
        ] {
            let err = RedisUrl::parse(url).unwrap_err();
            assert!(err.contains(reason), "{url}: {err}");
        }
    }
}
