//! A 6-node Redis Cluster (3 primaries, 3 replicas) of one test's own, for the failover tests that
//! must kill or fail over nodes (never the shared cluster of `scripts/redis-cluster.sh`). Ports
//! `base..base + 5` on 127.0.0.1 (and their bus ports, + 10000), no persistence, node directories
//! in a temporary directory, and the `cluster-node-timeout` each test chooses: short where a killed
//! primary's replica must take over within seconds, longer where failovers are manual, so that
//! nodes of a loaded machine that answer late are not taken for dead. Every node is killed on drop.
//!
//! Without `redis-server` and `redis-cli` the test fails when `CI=true`; otherwise it prints a note
//! and ends without checking anything.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::common::TIMEOUT;

/// One node, as `CLUSTER NODES` shows it.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) id: String,
    pub(crate) port: u16,
    pub(crate) primary: bool,
    /// The node id of a replica's primary (`-` for a primary).
    pub(crate) primary_id: String,
    /// Flagged `fail` (or `fail?`).
    pub(crate) failed: bool,
    /// Owns slots.
    pub(crate) has_slots: bool,
}

pub(crate) struct OwnCluster {
    base: u16,
    node_timeout: Duration,
    dir: tempfile::TempDir,
    nodes: HashMap<u16, Child>,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

impl OwnCluster {
    /// Starts the cluster on `base..base + 5`, each node with `node_timeout` as its
    /// `cluster-node-timeout`, and waits until it is healthy.
    pub(crate) async fn start(base: u16, node_timeout: Duration) -> Option<Self> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(!in_ci(), "CI=true but redis-server is not installed");
            eprintln!("NOTE: skipping a failover test: redis-server is not installed");
            return None;
        }
        let mut cluster = Self {
            base,
            node_timeout,
            dir: tempfile::tempdir().unwrap(),
            nodes: HashMap::new(),
        };
        for port in cluster.ports() {
            cluster.spawn(port);
        }
        for port in cluster.ports() {
            cluster
                .wait_for(&format!("node {port} to answer"), || {
                    cluster
                        .cli(port, &["ping"])
                        .is_ok_and(|pong| pong == "PONG")
                })
                .await;
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for port in cluster.ports() {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let status = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_healthy().await;
        Some(cluster)
    }

    fn ports(&self) -> std::ops::Range<u16> {
        self.base..self.base + 6
    }

    fn spawn(&mut self, port: u16) {
        let dir = self.dir.path().join(port.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args([
                "--cluster-node-timeout",
                &self.node_timeout.as_millis().to_string(),
            ])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.nodes.insert(port, child);
    }

    /// The store URL of the cluster (its first three nodes as seeds).
    /// The lines of the nodes' logs about failure detection and failovers, for a failing test's
    /// message.
    pub(crate) fn failover_log(&self) -> String {
        let mut lines = Vec::new();
        for port in self.ports() {
            let log =
                std::fs::read_to_string(self.dir.path().join(port.to_string()).join("redis.log"))
                    .unwrap_or_default();
            lines.extend(
                log.lines()
                    .filter(|line| {
                        ["FAIL", "ailover", "as failing", "cluster state"]
                            .iter()
                            .any(|word| line.contains(word))
                    })
                    .map(|line| format!("{port}: {line}")),
            );
        }
        lines.join("\n")
    }

    pub(crate) fn url(&self) -> String {
        let seeds: Vec<String> = (self.base..self.base + 3)
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis-cluster://{}", seeds.join(","))
    }

    /// `redis-cli -p PORT ARGS…`: its output, trimmed, or why it failed.
    pub(crate) fn cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .map_err(|err| err.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if output.status.success() && !text.starts_with("ERR") && !text.is_empty() {
            Ok(text)
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&output.stderr)))
        }
    }

    /// The nodes as the live node `port` sees them.
    pub(crate) fn topology(&self, port: u16) -> Vec<Node> {
        let Ok(text) = self.cli(port, &["cluster", "nodes"]) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let port = fields.get(1)?.split('@').next()?.rsplit(':').next()?;
                Some(Node {
                    id: fields[0].to_owned(),
                    port: port.parse().ok()?,
                    primary: fields.get(2)?.contains("master"),
                    primary_id: fields.get(3)?.to_string(),
                    failed: fields.get(2)?.contains("fail"),
                    has_slots: fields.len() > 8,
                })
            })
            .collect()
    }

    /// A node that runs (the lowest port).
    fn live(&self) -> u16 {
        *self.nodes.keys().min().expect("a live node")
    }

    /// The replica of the primary on `port`.
    pub(crate) fn replica_of(&self, port: u16) -> u16 {
        let nodes = self.topology(self.live());
        let id = &nodes
            .iter()
            .find(|n| n.port == port)
            .expect("the primary")
            .id;
        nodes
            .iter()
            .find(|n| !n.primary && !n.failed && &n.primary_id == id)
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no replica of {port}: {nodes:?}"))
    }

    /// The primaries (owning slots, not failed), by port.
    pub(crate) fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .topology(self.live())
            .iter()
            .filter(|n| n.primary && n.has_slots && !n.failed)
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Whether every running node says `cluster_state:ok`, three primaries own the slots, and each
    /// has a replica whose link to it is up.
    fn healthy(&self) -> bool {
        let states_ok = self.nodes.keys().all(|&port| {
            self.cli(port, &["cluster", "info"])
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        });
        if !states_ok {
            return false;
        }
        let nodes = self.topology(self.live());
        let primaries: Vec<&Node> = nodes
            .iter()
            .filter(|n| n.primary && n.has_slots && !n.failed)
            .collect();
        primaries.len() == 3
            && primaries.iter().all(|primary| {
                nodes.iter().any(|n| {
                    !n.primary
                        && !n.failed
                        && n.primary_id == primary.id
                        && self
                            .cli(n.port, &["info", "replication"])
                            .is_ok_and(|info| info.contains("master_link_status:up"))
                })
            })
    }

    /// Waits until [`OwnCluster::healthy`]; panics after a minute.
    pub(crate) async fn wait_healthy(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !self.healthy() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cluster on {} did not become healthy: {:?}",
                self.base,
                self.topology(self.live())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `ready()`; panics after [`TIMEOUT`].
    pub(crate) async fn wait_for(&self, what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while !ready() {
            assert!(tokio::time::Instant::now() < deadline, "waited for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs the node on `port`.
    pub(crate) fn kill(&mut self, port: u16) {
        let mut child = self.nodes.remove(&port).expect("a running node");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the killed node on `port` again, with its cluster configuration: it joins as a
    /// replica of the node that took over its slots.
    pub(crate) fn restart(&mut self, port: u16) {
        self.spawn(port);
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for child in self.nodes.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
