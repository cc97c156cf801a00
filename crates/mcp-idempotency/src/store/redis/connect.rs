//! Understanding a store URL (`redis://…` or `rediss://…` for one server, `redis-cluster://…` or
//! `rediss-cluster://…` for a Redis Cluster) and opening its connection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Client, RedisError, TlsCertificates};

use super::replicas::ReplicaAcks;
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
/// The URL parameter naming the PEM file of the CA certificates a TLS server's certificate must
/// chain to (the PostgreSQL store's name for the same thing).
const CA_PARAM: &str = "sslrootcert";

/// What a store URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// One server, at a URL the `redis` crate understands (without our parameters).
    Node { url: String, tls: Option<Tls> },
    /// A cluster: the `redis://` (or `rediss://`) URL of each seed node, and the store's shard
    /// count.
    Cluster {
        nodes: Vec<String>,
        shards: u16,
        tls: Option<Tls>,
    },
}

/// How a TLS URL checks the server: its certificate and host name always; against the CAs of
/// `ca_file` only when given, else against the system's roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Tls {
    pub(super) ca_file: Option<PathBuf>,
}

/// The parameters of a store URL's query, taken apart once: each of ours is taken out by name
/// ([`Query::take`]), and what is left goes to the `redis` crate (one server) or is refused (a
/// cluster).
struct Query<'a> {
    /// `(name, the whole parameter)`, in the URL's order.
    params: Vec<(&'a str, &'a str)>,
}

impl<'a> Query<'a> {
    fn parse(query: Option<&'a str>) -> Self {
        let params = query
            .into_iter()
            .flat_map(|query| query.split('&'))
            .filter(|param| !param.is_empty())
            .map(|param| (param.split_once('=').map_or(param, |(name, _)| name), param))
            .collect();
        Self { params }
    }

    /// Takes the parameter `name` out: its value (empty when it has no `=`), or an error when it
    /// is given twice.
    fn take(&mut self, name: &str) -> Result<Option<&'a str>, String> {
        let mut found = None;
        let mut error = None;
        self.params.retain(|&(param_name, param)| {
            if param_name != name {
                return true;
            }
            if found.is_some() {
                error = Some(format!("{name} is given twice"));
            }
            found = Some(param.split_once('=').map_or("", |(_, value)| value));
            false
        });
        match error {
            Some(error) => Err(error),
            None => Ok(found),
        }
    }

    /// The parameters not taken, as they were written.
    fn rest(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.params.iter().map(|&(_, param)| param)
    }
}

/// The TLS settings of a URL: `Some` for a TLS scheme, with the CA file `ca` of its
/// `sslrootcert`; an error for `sslrootcert` without TLS or for a fragment (`#insecure` would turn
/// the checks off: not offered).
fn tls_settings(
    tls_scheme: bool,
    ca: Option<&str>,
    fragment: Option<&str>,
) -> Result<Option<Tls>, String> {
    if !tls_scheme {
        if ca.is_some() {
            return Err(format!(
                "{CA_PARAM}= needs TLS: use rediss:// or rediss-cluster://"
            ));
        }
        return Ok(None);
    }
    if let Some(fragment) = fragment {
        return Err(format!(
            "unexpected #{fragment}: the server's certificate and host name are always checked \
             (give its CA with {CA_PARAM}=FILE)"
        ));
    }
    if ca.is_some_and(str::is_empty) {
        return Err(format!("{CA_PARAM}= needs a file path"));
    }
    Ok(Some(Tls {
        ca_file: ca.map(PathBuf::from),
    }))
}

/// A store URL taken apart: what to connect to, and whether writes wait for replicas.
#[derive(Debug)]
pub(super) struct RedisUrl {
    pub(super) target: Target,
    pub(super) replicas: Option<ReplicaAcks>,
}

impl RedisUrl {
    /// Parses `url`, its query once; the error is the reason, for [`StoreError::InvalidUrl`].
    pub(super) fn parse(url: &str) -> Result<Self, String> {
        let (without_fragment, fragment) = match url.split_once('#') {
            Some((before, fragment)) => (before, Some(fragment)),
            None => (url, None),
        };
        let (base, query) = match without_fragment.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (without_fragment, None),
        };
        let mut query = Query::parse(query);
        let replicas =
            ReplicaAcks::from_params(query.take("replicas")?, query.take("replica_timeout_ms")?)?;
        let ca = query.take(CA_PARAM)?;
        let target = Target::parse(base, query, ca, fragment)?;
        Ok(Self { target, replicas })
    }
}

impl Target {
    /// The target of a URL whose query is `query` (our parameters but `shards` already taken out)
    /// and `base` what comes before it.
    fn parse(
        base: &str,
        mut query: Query<'_>,
        ca: Option<&str>,
        fragment: Option<&str>,
    ) -> Result<Self, String> {
        let (rest, node_scheme) = if let Some(rest) = base.strip_prefix("redis-cluster://") {
            (rest, "redis")
        } else if let Some(rest) = base.strip_prefix("rediss-cluster://") {
            (rest, "rediss")
        } else {
            let tls = tls_settings(base.starts_with("rediss://"), ca, fragment)?;
            let params: Vec<&str> = query.rest().collect();
            let mut url = if params.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", params.join("&"))
            };
            if let (None, Some(fragment)) = (&tls, fragment) {
                url = format!("{url}#{fragment}");
            }
            return Ok(Self::Node { url, tls });
        };
        let base = rest.strip_suffix('/').unwrap_or(rest);
        let (userinfo, hosts) = match base.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, base),
        };
        let cluster_scheme = format!("{node_scheme}-cluster");
        if hosts.contains('/') {
            return Err(format!(
                "a cluster has no database number: use {cluster_scheme}://HOST:PORT,…"
            ));
        }
        let mut nodes = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(format!(
                    "expected {cluster_scheme}://HOST:PORT[,HOST:PORT…]"
                ));
            }
            nodes.push(match userinfo {
                Some(userinfo) => format!("{node_scheme}://{userinfo}@{host}"),
                None => format!("{node_scheme}://{host}"),
            });
        }
        let tls = tls_settings(node_scheme == "rediss", ca, fragment)?;
        if fragment.is_some() {
            return Err("a cluster URL takes no #fragment".into());
        }
        let shards = match query.take("shards")? {
            None => DEFAULT_CLUSTER_SHARDS,
            Some(value) => value
                .parse()
                .ok()
                .filter(|n| (1..=super::keys::Keys::MAX_SHARDS).contains(n))
                .ok_or_else(|| {
                    format!(
                        "shards={value}: expected a number from 1 to {}",
                        super::keys::Keys::MAX_SHARDS
                    )
                })?,
        };
        if let Some(&(name, _)) = query.params.first() {
            let expected = if tls.is_some() {
                format!("shards=N or {CA_PARAM}=FILE")
            } else {
                "shards=N".to_owned()
            };
            return Err(format!("unknown parameter {name:?} (expected {expected})"));
        }
        Ok(Self::Cluster { nodes, shards, tls })
    }

    /// How many shards the store's records spread over: one on a single server.
    pub(super) fn shards(&self) -> u16 {
        match self {
            Self::Node { .. } => 1,
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
            let hint = match certificate_refusal(&err) {
                Some(refusal) => format!(
                    ": the server's TLS certificate was refused ({refusal}; give the CA that \
                     issued it with {CA_PARAM}=FILE, and connect to a name it is for)"
                ),
                None => String::new(),
            };
            StoreError::unavailable(
                format!("cannot connect to the Redis store {shown}{hint}"),
                err,
            )
        };
        let connecting = async {
            match self {
                Self::Node { url, tls } => {
                    let client = match certificates(tls.as_ref(), shown)? {
                        Some(certs) => Client::build_with_tls(url.as_str(), certs),
                        None => Client::open(url.as_str()),
                    }
                    .map_err(invalid)?;
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
                Self::Cluster { nodes, tls, .. } => {
                    let mut builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                        .connection_timeout(CONNECT_TIMEOUT)
                        .response_timeout(RESPONSE_TIMEOUT)
                        .retries(CLUSTER_RETRIES)
                        .min_retry_wait(100)
                        .max_retry_wait(1000);
                    if let Some(certs) = certificates(tls.as_ref(), shown)? {
                        builder = builder.certs(certs);
                    }
                    let client = builder.build().map_err(invalid)?;
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

/// The `redis` crate's TLS settings for `tls`: `None` without TLS or without a CA file (the
/// system's roots then), else the CA file's certificates, checked here so that a bad file is a
/// clear [`StoreError::InvalidUrl`].
fn certificates(tls: Option<&Tls>, shown: &str) -> Result<Option<TlsCertificates>, StoreError> {
    let Some(tls) = tls else {
        return Ok(None);
    };
    // The `redis` crate builds its rustls configuration with the process' default provider.
    crate::tls::install_default_provider();
    let Some(path) = tls.ca_file.as_deref() else {
        return Ok(None);
    };
    let root_cert =
        crate::tls::ca_file_pem(Path::new(path)).map_err(|err| StoreError::InvalidUrl {
            url: shown.to_owned(),
            reason: err.to_string(),
        })?;
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    }))
}

/// What rustls said if `err` is the refusal of the server's TLS certificate (unknown issuer,
/// wrong name, expired…).
fn certificate_refusal(err: &RedisError) -> Option<String> {
    let refusal = |error: &(dyn std::error::Error + 'static)| match error.downcast_ref() {
        Some(tls @ rustls::Error::InvalidCertificate(_)) => Some(tls.to_string()),
        _ => None,
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(error) = source {
        let inner = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        if let Some(found) = refusal(error).or_else(|| inner.and_then(refusal)) {
            return Some(found);
        }
        source = error.source();
    }
    let text = err.to_string();
    text.find("invalid peer certificate")
        .map(|start| text[start..].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_their_seed_nodes_and_shards() {
        assert_eq!(
            RedisUrl::parse("redis://h:1/0").unwrap().target,
            Target::Node {
                url: "redis://h:1/0".into(),
                tls: None
            }
        );
        assert_eq!(
            RedisUrl::parse("redis-cluster://a:7000,b:7001")
                .unwrap()
                .target,
            Target::Cluster {
                nodes: vec!["redis://a:7000".into(), "redis://b:7001".into()],
                shards: DEFAULT_CLUSTER_SHARDS,
                tls: None,
            }
        );
        assert_eq!(
            RedisUrl::parse("redis-cluster://u:p@w@a:7000/?shards=32")
                .unwrap()
                .target,
            Target::Cluster {
                nodes: vec!["redis://u:p@w@a:7000".into()],
                shards: 32,
                tls: None,
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
            assert!(RedisUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_urls_take_a_ca_file_and_never_turn_the_checks_off() {
        let ca = Some(Tls {
            ca_file: Some("/etc/ca.pem".into()),
        });
        assert_eq!(
            RedisUrl::parse("rediss://:pw@h:6380/2").unwrap().target,
            Target::Node {
                url: "rediss://:pw@h:6380/2".into(),
                tls: Some(Tls::default())
            }
        );
        assert_eq!(
            RedisUrl::parse("rediss://h:6380/?protocol=resp3&sslrootcert=/etc/ca.pem")
                .unwrap()
                .target,
            Target::Node {
                url: "rediss://h:6380/?protocol=resp3".into(),
                tls: Some(Tls {
                    ca_file: Some("/etc/ca.pem".into())
                })
            }
        );
        assert_eq!(
            RedisUrl::parse("rediss://h:6380?sslrootcert=/etc/ca.pem")
                .unwrap()
                .target,
            Target::Node {
                url: "rediss://h:6380".into(),
                tls: Some(Tls {
                    ca_file: Some("/etc/ca.pem".into())
                })
            }
        );
        assert_eq!(
            RedisUrl::parse("rediss-cluster://u:p@a:7100,b:7101?sslrootcert=/etc/ca.pem&shards=4")
                .unwrap()
                .target,
            Target::Cluster {
                nodes: vec!["rediss://u:p@a:7100".into(), "rediss://u:p@b:7101".into()],
                shards: 4,
                tls: ca,
            }
        );
        for (bad, needle) in [
            ("rediss://h:6380/#insecure", "always checked"),
            ("rediss-cluster://a:7100#insecure", "always checked"),
            ("redis://h:6379/?sslrootcert=/etc/ca.pem", "needs TLS"),
            (
                "redis-cluster://a:7000?sslrootcert=/etc/ca.pem",
                "needs TLS",
            ),
            ("rediss://h:6380/?sslrootcert=", "file path"),
            ("rediss-cluster://a:7100?cafile=x", "sslrootcert=FILE"),
            ("rediss-cluster://", "rediss-cluster://HOST:PORT"),
        ] {
            let reason = RedisUrl::parse(bad).unwrap_err();
            assert!(reason.contains(needle), "{bad}: {reason}");
        }
    }
}
