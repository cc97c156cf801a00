//! The services of `deploy/compose/compose.yaml` run as processes on loopback, for the live test
//! (`deploy_live.rs`): each service's `command` in exec form, with the binary from the build for
//! the `mcp-idem` image (whose entrypoint is `mcp-idem`) and the command's own program otherwise
//! (`redis-server`). What a container network gives is mapped to this machine:
//!
//! - each port a service `expose`s gets a free loopback port: `0.0.0.0:PORT` in its own command
//!   becomes `127.0.0.1:HOST_PORT`, a bare `PORT` argument `HOST_PORT` (`redis-server --port`),
//!   `0.0.0.0` alone `127.0.0.1` (`--bind`), and `SERVICE:PORT` anywhere in another service's
//!   command or environment `127.0.0.1:HOST_PORT` (`http://upstream:8000/mcp`);
//! - a volume's mount point (`ledger:/data`) becomes a temporary folder of that volume.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::common::free_port;

/// How long a service may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One service of the Compose file, as a command line on this machine.
#[derive(Clone, Debug)]
pub(crate) struct Service {
    pub(crate) name: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// The loopback ports of the ports it exposes, by container port.
    pub(crate) ports: BTreeMap<u16, u16>,
    pub(crate) depends_on: Vec<String>,
}

/// The services of `compose` (the Compose file as JSON) in an order that starts each after those
/// it depends on; `dir` holds the volumes.
pub(crate) fn services(compose: &Value, dir: &Path) -> Vec<Service> {
    let declared = compose["services"].as_object().expect("services");
    let exposed = |service: &Value| -> Vec<u16> {
        service["expose"]
            .as_array()
            .map(|ports| {
                ports
                    .iter()
                    .map(|port| match port {
                        Value::String(port) => port.parse().expect("an exposed port"),
                        port => port.as_u64().expect("an exposed port") as u16,
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let ports: BTreeMap<&str, BTreeMap<u16, u16>> = declared
        .iter()
        .map(|(name, service)| {
            let map = exposed(service)
                .into_iter()
                .map(|port| (port, free_port()))
                .collect();
            (name.as_str(), map)
        })
        .collect();

    let mut plan: Vec<Service> = declared
        .iter()
        .map(|(name, service)| {
            let mounts: Vec<(String, PathBuf)> = service["volumes"]
                .as_array()
                .map(|volumes| {
                    volumes
                        .iter()
                        .map(|volume| {
                            let volume = volume.as_str().expect("short volume syntax");
                            let (source, target) = volume.split_once(':').expect("VOLUME:/PATH");
                            let folder = dir.join(source.trim_start_matches(['.', '/']));
                            std::fs::create_dir_all(&folder).unwrap();
                            (target.to_owned(), folder)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let own = &ports[name.as_str()];
            let map = |text: &str| -> String {
                if let Some(port) = text.strip_prefix("0.0.0.0:") {
                    let port: u16 = port.parse().expect("a port");
                    let host = own.get(&port).unwrap_or_else(|| {
                        panic!("{name} listens on {port}, which it does not `expose`")
                    });
                    return format!("127.0.0.1:{host}");
                }
                if text == "0.0.0.0" {
                    return "127.0.0.1".to_owned();
                }
                if let Some(host) = text.parse().ok().and_then(|port: u16| own.get(&port)) {
                    return host.to_string();
                }
                let mut text = text.to_owned();
                for (other, exposed) in &ports {
                    for (port, host) in exposed {
                        text =
                            text.replace(&format!("{other}:{port}"), &format!("127.0.0.1:{host}"));
                    }
                }
                for (target, folder) in &mounts {
                    match text.strip_prefix(target.as_str()) {
                        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                            text = format!("{}{rest}", folder.display());
                        }
                        _ => {}
                    }
                }
                text
            };
            let command: Vec<String> = service["command"]
                .as_array()
                .unwrap_or_else(|| panic!("{name}: `command` in exec form (a list)"))
                .iter()
                .map(|arg| arg.as_str().expect("a string argument").to_owned())
                .collect();
            let image = service["image"].as_str().unwrap_or_default();
            let (program, args) = if image.contains("/mcp-idem:") {
                (PathBuf::from(env!("CARGO_BIN_EXE_mcp-idem")), &command[..])
            } else {
                (PathBuf::from(&command[0]), &command[1..])
            };
            let env = service["environment"]
                .as_object()
                .map(|env| {
                    env.iter()
                        .map(|(key, value)| (key.clone(), map(value.as_str().expect("a string"))))
                        .collect()
                })
                .unwrap_or_default();
            let depends_on = match &service["depends_on"] {
                Value::Array(names) => names
                    .iter()
                    .map(|name| name.as_str().unwrap().to_owned())
                    .collect(),
                Value::Object(names) => names.keys().cloned().collect(),
                _ => Vec::new(),
            };
            Service {
                name: name.clone(),
                program,
                args: args.iter().map(|arg| map(arg)).collect(),
                env,
                ports: own.clone(),
                depends_on,
            }
        })
        .collect();

    // Dependencies first.
    let mut ordered: Vec<Service> = Vec::new();
    while !plan.is_empty() {
        let ready = plan
            .iter()
            .position(|service| {
                service
                    .depends_on
                    .iter()
                    .all(|name| ordered.iter().any(|done| &done.name == name))
            })
            .expect("a cycle in depends_on");
        ordered.push(plan.remove(ready));
    }
    ordered
}

/// A service's process, killed on drop; its output goes to `NAME.log` in the test's folder.
pub(crate) struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    /// Starts `service` and waits until it listens on each of its ports.
    pub(crate) fn start(service: &Service, dir: &Path) -> Self {
        let log = dir.join(format!("{}.log", service.name));
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(&service.program)
            .args(&service.args)
            .envs(service.env.iter().map(|(k, v)| (k, v)))
            .env("MCP_IDEM_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "start {}: {}: {err}",
                    service.name,
                    service.program.display()
                )
            });
        let mut running = Self { child, log };
        let deadline = Instant::now() + START_TIMEOUT;
        for port in service.ports.values() {
            while TcpStream::connect(("127.0.0.1", *port)).is_err() {
                let exited = running.child.try_wait().ok().flatten();
                assert!(
                    exited.is_none() && Instant::now() < deadline,
                    "{} {:?} does not listen on 127.0.0.1:{port} (exit status {exited:?}); log:\n{}",
                    service.name,
                    service.args,
                    running.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        running
    }

    /// What it printed so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
