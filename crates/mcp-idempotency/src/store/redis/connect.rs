//! Understanding a store URL (`redis://…` for one server, `redis-cluster://…` for a Redis Cluster)
//! and opening its connection.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Client, RedisError};

use super::server::{Conn, OPERATION_TIMEOUT};
use crate::store::StoreError;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server may take to answer one command.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connection attempts after the first one, before an operation fails.
const RECONNECT_RETRIES: usize = 2;
/// Retries of one command on a cluster (after `MOVED`, `ASK`, `TRYAGAIN`, I/O errors).
const CLUSTER_RETRIES: u32 = 3;
/// The shards of a store on a cluster, unless the URL's `shards=` says otherwise.
pub(super) const DEFAULT_CLUSTER_SHARDS: u16 = 8;

/// What a store URL names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// One server, at a URL the `redis` crate understands.
    Node(String),
    /// A cluster: the `redis://` URL of each seed node, and the store's shard count.
    Cluster { nodes: Vec<String>, shards: u16 },
}

impl Target {
    /// Parses `url`; the error is the reason, for [`StoreError::InvalidUrl`].
    pub(super) fn parse(url: &str) -> Result<Self, String> {
        let Some(rest) = url.strip_prefix("redis-cluster://") else {
            return Ok(Self::Node(url.to_owned()));
        };
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let base = base.strip_suffix('/').unwrap_or(base);
        let (userinfo, hosts) = match base.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, base),
        };
        if hosts.contains('/') {
            return Err("a cluster has no database number: use redis-cluster://HOST:PORT,…".into());
        }
        let mut nodes = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err("expected redis-cluster://HOST:PORT[,HOST:PORT…]".into());
            }
            nodes.push(match userinfo {
                Some(userinfo) => format!("redis://{userinfo}@{host}"),
                None => format!("redis://{host}"),
            });
        }
        let mut shards = DEFAULT_CLUSTER_SHARDS;
        for param in query.split('&').filter(|param| !param.is_empty()) {
            match param.split_once('=') {
                Some(("shards", value)) => {
                    shards = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=super::keys::Keys::MAX_SHARDS).contains(n))
                        .ok_or_else(|| {
                            format!(
                                "shards={value}: expected a number from 1 to {}",
                                super::keys::Keys::MAX_SHARDS
                            )
                        })?;
                }
                _ => {
                    let name = param.split_once('=').map_or(param, |(name, _)| name);
                    return Err(format!("unknown parameter {name:?} (expected shards=N)"));
                }
            }
        }
        Ok(Self::Cluster { nodes, shards })
    }

    /// How many shards the store's records spread over: one on a single server.
    pub(super) fn shards(&self) -> u16 {
        match self {
            Self::Node(_) => 1,
            Self::Cluster { shards, .. } => *shards,
        }
    }

    /// Opens the connection. `shown` is the URL without its password, for errors.
    pub(super) async fn connect(&self, shown: &str) -> Result<Conn, StoreError> {
        let invalid = |err: RedisError| StoreError::InvalidUrl {
            url: shown.to_owned(),
            reason: err.to_string(),
        };
        let cannot_connect = |err: RedisError| {
            StoreError::unavailable(format!("cannot connect to the Redis store {shown}"), err)
        };
        let connecting = async {
            match self {
                Self::Node(url) => {
                    let client = Client::open(url.as_str()).map_err(invalid)?;
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(CONNECT_TIMEOUT))
                        .set_response_timeout(Some(RESPONSE_TIMEOUT))
                        .set_number_of_retries(RECONNECT_RETRIES)
                        .set_min_delay(Duration::from_millis(100))
                        .set_max_delay(Duration::from_secs(1));
                    let conn = ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(cannot_connect)?;
                    Ok(Conn::Node(conn))
                }
                Self::Cluster { nodes, .. } => {
                    let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                        .connection_timeout(CONNECT_TIMEOUT)
                        .response_timeout(RESPONSE_TIMEOUT)
                        .retries(CLUSTER_RETRIES)
                        .min_retry_wait(100)
                        .max_retry_wait(1000)
                        .build()
                        .map_err(invalid)?;
                    let conn = client
                        .get_async_connection()
                        .await
                        .map_err(cannot_connect)?;
                    Ok(Conn::Cluster(conn))
                }
            }
        };
        match tokio::time::timeout(OPERATION_TIMEOUT, connecting).await {
            Ok(conn) => conn,
            Err(elapsed) => Err(StoreError::unavailable(
                format!(
                    "cannot connect to the Redis store {shown}: no answer within \
                     {OPERATION_TIMEOUT:?}"
                ),
                elapsed,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_their_seed_nodes_and_shards() {
        assert_eq!(
            Target::parse("redis://h:1/0").unwrap(),
            Target::Node("redis://h:1/0".into())
        );
        assert_eq!(
            Target::parse("redis-cluster://a:7000,b:7001").unwrap(),
            Target::Cluster {
                nodes: vec!["redis://a:7000".into(), "redis://b:7001".into()],
                shards: DEFAULT_CLUSTER_SHARDS,
            }
        );
        assert_eq!(
            Target::parse("redis-cluster://u:p@w@a:7000/?shards=32").unwrap(),
            Target::Cluster {
                nodes: vec!["redis://u:p@w@a:7000".into()],
                shards: 32,
            }
        );
        for bad in [
            "redis-cluster://",
            "redis-cluster://a:1,,b:2",
            "redis-cluster://a:1/0",
            "redis-cluster://a:1?shards=0",
            "redis-cluster://a:1?shards=x",
            "redis-cluster://a:1?db=2",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
