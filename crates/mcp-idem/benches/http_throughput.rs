//! Requests per second, latency and CPU per request of `tools/call` over Streamable HTTP: the demo
//! server on its own, behind nginx (the plain reverse proxy a user without us would run), and
//! behind a bare hyper proxy (the floor for any proxy built on hyper, streaming bodies or reading
//! them whole: `support/hyper_proxy.rs`), and
//! behind `mcp-idem proxy`: without a key (pass-through) and keyed on each store (memory, SQLite,
//! Redis, PostgreSQL).
//!
//! ```text
//! cargo build --release -p mcp-idem
//! cargo bench -p mcp-idem --bench http_throughput -- [--concurrency N] [--seconds S] [--rounds R] [--tool work_1ms|noop] [--tenants N] [--stores memory,sqlite,redis,redis-cluster,postgresql]
//! ```
//!
//! One `mcp-idem demo-server --http` (plain JSON answers) serves every configuration; each proxy is a
//! process of its own in front of it. The load generator keeps `--concurrency` requests in flight on
//! keep-alive connections, each a `tools/call` with a fresh `idempotencyKey` (so every call executes
//! and is recorded; direct calls carry the key too, which the server ignores), spread over
//! `--tenants` tenants (64 by default) by an `x-tenant` header that the proxies scope records by
//! (`--scope-by header:x-tenant`). Configurations run in
//! `--rounds` rounds of `--seconds` each, in a different order every round, so machine noise hits them
//! alike; the ratio of a proxy to direct is the median over rounds of (proxy rps / direct rps) of the
//! same round. Redis, a Redis Cluster and PostgreSQL come from `REDIS_URL`, `REDIS_CLUSTER_URL` and
//! `DATABASE_URL` (defaults: the local servers, the cluster of `scripts/redis-cluster.sh`) and are
//! skipped with a note when unreachable; after a cluster row, the bench prints how its records
//! spread over the primaries. Store round trips per call are counted on
//! the servers: Redis `total_commands_processed` and PostgreSQL `xact_commit` before and after.
//!
//! CPU per request is read from `/proc` before and after each measured window, for each process
//! involved: the proxy (nginx: its master and worker), the upstream demo server, `redis-server`
//! (the pid Redis reports) and PostgreSQL (the postmaster and all its children, from the data
//! directory's `postmaster.pid`; needs root or the server's user). nginx comes from the Debian
//! package `nginx-light` and is skipped with a note when it is not installed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

mod support;
use support::{load_average, mcp_idem_bin, modified_ago, percentile_us, Progress};
#[path = "support/cpu.rs"]
mod cpu;
use cpu::Processes;
#[path = "support/hyper_proxy.rs"]
mod hyper_proxy;
#[path = "support/nginx.rs"]
mod nginx;
#[path = "support/stores.rs"]
mod stores;
use stores::{key_distribution, postgres_reachable, redis_reachable, DropSchema, StoreCounter};

struct Options {
    concurrency: usize,
    seconds: f64,
    rounds: usize,
    tool: String,
    /// Calls spread over this many tenants (`x-tenant`, the proxies' scope): one scope's records
    /// share one shard of a Redis Cluster, so a single tenant would load one primary only.
    tenants: u64,
    /// `--threads` of every proxy (0: the proxy's default, one per core). 1 by default, as nginx
    /// runs one worker here.
    proxy_threads: u16,
    /// Lower-case store labels to measure (all when empty).
    stores: Vec<String>,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        concurrency: 16,
        seconds: 3.0,
        rounds: 5,
        tool: "work_1ms".into(),
        tenants: 64,
        proxy_threads: 1,
        stores: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--concurrency" => {
                options.concurrency = value("--concurrency")?
                    .parse()
                    .map_err(|_| "--concurrency needs a number")?
            }
            "--seconds" => {
                options.seconds = value("--seconds")?
                    .parse()
                    .map_err(|_| "--seconds needs a number")?
            }
            "--rounds" => {
                options.rounds = value("--rounds")?
                    .parse()
                    .map_err(|_| "--rounds needs a number")?
            }
            "--tool" => options.tool = value("--tool")?,
            "--proxy-threads" => {
                options.proxy_threads = value("--proxy-threads")?
                    .parse()
                    .map_err(|_| "--proxy-threads needs a number")?
            }
            "--tenants" => {
                options.tenants = value("--tenants")?
                    .parse()
                    .map_err(|_| "--tenants needs a number")?
            }
            "--stores" => {
                options.stores = value("--stores")?
                    .split(',')
                    .map(|s| s.trim().to_lowercase())
                    .collect()
            }
            "--bench" => {}
            other if other.starts_with('-') => eprintln!("http_throughput: ignoring {other:?}"),
            _ => {}
        }
    }
    options.concurrency = options.concurrency.max(1);
    options.rounds = options.rounds.max(1);
    options.tenants = options.tenants.max(1);
    Ok(options)
}

/// A child process stopped on drop: `SIGTERM` first, so that nginx's master stops its worker
/// (`SIGKILL` would leave the worker running, holding its port), then `SIGKILL` after 2 s.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `bin args...` and returns it with the `http://...` address it prints after `marker`.
fn spawn(bin: &Path, args: &[String], marker: &str) -> Result<(Process, String), String> {
    let mut child = Command::new(bin)
        .args(args)
        .env("MCP_IDEM_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot start {}: {err}", bin.display()))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let process = Process(child);
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = marker.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            match line.split_once(&marker) {
                Some((_, url)) => {
                    let _ = tx.send(url.trim().to_owned());
                }
                None => eprintln!("  [{}] {line}", marker.trim()),
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| format!("{args:?} did not print its address"))?;
    Ok((process, url))
}

struct Config {
    label: String,
    url: String,
    /// Calls carry a fresh `idempotencyKey` each (else none: the proxy passes them through).
    keyed: bool,
    store: StoreCounter,
    _process: Option<Process>,
    /// The processes whose CPU is reported: the proxy, the upstream, the store's server.
    cpu: [Processes; 3],
    rps: Vec<f64>,
    round_trips: Vec<f64>,
    /// CPU microseconds per call of each of `cpu`, one entry per round.
    cpu_us: [Vec<f64>; 3],
    /// The part of the proxy's CPU spent in the kernel, microseconds per call, one entry per round.
    proxy_kernel_us: Vec<f64>,
    /// Latency of every measured call, in nanoseconds.
    latencies: Vec<u64>,
}

impl Config {
    fn new(label: &str, url: String, keyed: bool, cpu: [Processes; 3]) -> Self {
        Self {
            label: label.into(),
            url,
            keyed,
            store: StoreCounter::None,
            _process: None,
            cpu,
            rps: Vec::new(),
            round_trips: Vec::new(),
            cpu_us: Default::default(),
            proxy_kernel_us: Vec::new(),
            latencies: Vec::new(),
        }
    }
}

fn main() -> ExitCode {
    if let Some(code) = hyper_proxy::run_if_hyper_proxy() {
        return code;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("http_throughput: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let options = parse_args()?;
    let bin = mcp_idem_bin()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ledger = dir.path().join("ledger.jsonl");
    let (_server, server_url) = spawn(
        &bin,
        &[
            "demo-server".into(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--ledger".into(),
            ledger.display().to_string(),
        ],
        "listening on ",
    )?;
    let upstream = server_url.trim_end_matches("/mcp").to_owned();
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let pg_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let namespace = format!("bench-{}", std::process::id());

    let mut stores = vec![
        (
            "memory".to_owned(),
            "memory".to_owned(),
            StoreCounter::None,
            Processes::None,
        ),
        (
            "SQLite".to_owned(),
            format!("sqlite:{}", dir.path().join("bench.sqlite3").display()),
            StoreCounter::None,
            Processes::None,
        ),
    ];
    if redis_reachable(&redis_url) {
        let server = cpu::redis_pid(&redis_url).map_or(Processes::None, Processes::Pid);
        stores.push((
            "Redis".into(),
            redis_url.clone(),
            StoreCounter::Redis(vec![redis_url.clone()]),
            server,
        ));
    } else {
        println!("note: Redis at {redis_url} unreachable, skipped");
    }
    // A Redis Cluster (scripts/redis-cluster.sh): the store CPU is that of every node, primaries
    // and replicas.
    let cluster_url = std::env::var("REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002".into());
    let seed = cluster_url
        .trim_start_matches("redis-cluster://")
        .split([',', '?', '/'])
        .next()
        .unwrap_or_default()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_owned();
    let nodes = cpu::cluster_nodes(&seed);
    let primaries: Vec<String> = nodes
        .iter()
        .filter(|(_, primary)| *primary)
        .map(|(address, _)| address.clone())
        .collect();
    if primaries.is_empty() {
        println!("note: no Redis Cluster at {cluster_url}, skipped");
    } else {
        let pids = nodes
            .iter()
            .filter_map(|(address, _)| cpu::redis_pid(&format!("redis://{address}")))
            .collect();
        stores.push((
            "Redis Cluster".into(),
            cluster_url.clone(),
            StoreCounter::Redis(primaries.iter().map(|a| format!("redis://{a}")).collect()),
            Processes::Pids(pids),
        ));
    }
    let pg_schema = format!("mcp_idem_bench_{}", std::process::id());
    let _drop_schema = DropSchema(pg_url.clone(), pg_schema.clone());
    if postgres_reachable(&pg_url) {
        let separator = if pg_url.contains('?') { '&' } else { '?' };
        let store = format!("{pg_url}{separator}schema={pg_schema}");
        let server = cpu::postmaster_pid(&pg_url).map_or(Processes::None, Processes::Tree);
        stores.push((
            "PostgreSQL".into(),
            store,
            StoreCounter::Postgres(pg_url.clone()),
            server,
        ));
    } else {
        println!("note: PostgreSQL at {pg_url} unreachable, skipped");
    }

    let upstream_cpu = Processes::Pid(_server.0.id());
    let mut configs = vec![Config::new(
        "direct",
        server_url.clone(),
        true,
        [Processes::None, upstream_cpu.clone(), Processes::None],
    )];
    match nginx::start(upstream.trim_start_matches("http://"), dir.path()) {
        Ok((child, url)) => {
            let mut config = Config::new(
                "nginx",
                url,
                true,
                [
                    Processes::Tree(child.id()),
                    upstream_cpu.clone(),
                    Processes::None,
                ],
            );
            config._process = Some(Process(child));
            configs.push(config);
        }
        Err(err) => println!("note: {err}; the nginx row is skipped"),
    }
    // The floors for a proxy on hyper: forwarding bodies as they come, and read whole
    // (support/hyper_proxy.rs).
    let bench = std::env::current_exe().map_err(|e| format!("cannot find the bench: {e}"))?;
    for (label, buffered) in [("bare hyper proxy", false), ("bare hyper, buffered", true)] {
        let mut args = vec![hyper_proxy::HYPER_PROXY_ARG.to_owned(), upstream.clone()];
        if buffered {
            args.push(hyper_proxy::BUFFERED_ARG.into());
        }
        let (process, url) = spawn(&bench, &args, "hyper proxy listening on ")?;
        let mut config = Config::new(
            label,
            format!("{url}/mcp"),
            true,
            [
                Processes::Pid(process.0.id()),
                upstream_cpu.clone(),
                Processes::None,
            ],
        );
        config._process = Some(process);
        configs.push(config);
    }
    stores.retain(|(label, ..)| {
        options.stores.is_empty()
            || options
                .stores
                .contains(&label.to_lowercase().replace(' ', "-"))
    });
    let cluster_measured = stores.iter().any(|(label, ..)| label == "Redis Cluster");
    for (label, store, counter, server) in stores {
        let mut args: Vec<String> = vec![
            "proxy".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--upstream".into(),
            upstream.clone(),
            "--store".into(),
            store,
            "--namespace".into(),
            namespace.clone(),
            "--scope-by".into(),
            "header:x-tenant".into(),
            // Every call makes a record: lift the quotas, and keep the shared stores from
            // holding the bench's records for long.
            "--max-records-per-scope".into(),
            "1000000000".into(),
            "--max-records-total".into(),
            "1000000000".into(),
            "--retention".into(),
            "10m".into(),
        ];
        if options.proxy_threads > 0 {
            args.extend(["--threads".into(), options.proxy_threads.to_string()]);
        }
        let (process, url) = spawn(&bin, &args, "listening on ")?;
        let proxy = Processes::Pid(process.0.id());
        if label == "memory" {
            // The same proxy, calls without a key: what the interceptor costs when it only looks.
            configs.push(Config::new(
                "proxy, no key",
                format!("{url}/mcp"),
                false,
                [proxy.clone(), upstream_cpu.clone(), Processes::None],
            ));
        }
        let mut config = Config::new(
            &format!("proxy, {label}"),
            format!("{url}/mcp"),
            true,
            [proxy, upstream_cpu.clone(), server],
        );
        config.store = counter;
        config._process = Some(process);
        configs.push(config);
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "http_throughput: tools/call {} over Streamable HTTP (keyed: a fresh key per call), {} in flight, {} rounds of {}s",
        options.tool, options.concurrency, options.rounds, options.seconds
    );
    println!("  binary:  {} ({})", bin.display(), modified_ago(&bin));
    println!("  machine: {cores} cores, load average {}", load_average());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let started = Instant::now();
    let mut progress = Progress::new("http_throughput", options.rounds * configs.len());
    for round in 0..options.rounds {
        let n = configs.len();
        for i in 0..n {
            let config = &mut configs[(i + round) % n];
            progress.step(&format!("round {}: {}", round + 1, config.label));
            // A short warm-up fills the connection pool and the proxy's caches.
            let keyed = config.keyed;
            runtime.block_on(load(&client, &config.url, keyed, &options, 0.3, round))?;
            let before = config.store.read();
            let cpu_before = config.cpu.clone().map(|p| p.cpu_seconds());
            let (calls, latencies) = runtime.block_on(load(
                &client,
                &config.url,
                keyed,
                &options,
                options.seconds,
                round,
            ))?;
            let cpu_after = config.cpu.clone().map(|p| p.cpu_seconds());
            let per_call = |seconds: f64| seconds * 1e6 / calls.max(1) as f64;
            for (i, (b, a)) in cpu_before.iter().zip(&cpu_after).enumerate() {
                if let (Some(b), Some(a)) = (b, a) {
                    config.cpu_us[i].push(per_call(a.total() - b.total()));
                    if i == 0 {
                        config.proxy_kernel_us.push(per_call(a.system - b.system));
                    }
                }
            }
            config.latencies.extend(latencies);
            config.rps.push(calls as f64 / options.seconds);
            if let Some(before) = before {
                // PostgreSQL publishes its counters lazily.
                std::thread::sleep(Duration::from_millis(1200));
                if let Some(after) = config.store.read() {
                    let ops = after.saturating_sub(before);
                    config.round_trips.push(ops as f64 / calls.max(1) as f64);
                }
            }
        }
    }
    drop(progress);
    print_table(&mut configs, started.elapsed());
    if cluster_measured {
        let spread = key_distribution(&primaries, &namespace);
        let total: usize = spread.iter().map(|(_, n)| n).sum();
        println!("Redis Cluster: the bench's records on each primary");
        for (address, keys) in spread {
            println!(
                "  {address}: {keys} ({:.1}%)",
                keys as f64 * 100.0 / total.max(1) as f64
            );
        }
    }
    Ok(())
}

/// Keeps `concurrency` calls in flight for `seconds` (`keyed`: each with a fresh key); returns how
/// many completed in that time and the latency of each, in nanoseconds.
async fn load(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    keyed: bool,
    options: &Options,
    seconds: f64,
    round: usize,
) -> Result<(u64, Vec<u64>), String> {
    static NEXT_KEY: AtomicU64 = AtomicU64::new(0);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(std::sync::Mutex::new(None::<String>));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let mut workers = Vec::new();
    let tenants = options.tenants;
    for _ in 0..options.concurrency {
        let (client, url, tool) = (client.clone(), url.to_owned(), options.tool.clone());
        let (done, stop, failed) = (Arc::clone(&done), Arc::clone(&stop), Arc::clone(&failed));
        let latencies = Arc::clone(&latencies);
        workers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
                let key = format!("r{round}-{}-{n}", std::process::id());
                let tenant = format!("t{}", n % tenants);
                let mut message = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
                    "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},
                    "name": tool, "arguments": {}}});
                if keyed {
                    message["params"]["idempotencyKey"] = key.into();
                }
                let sent = Instant::now();
                let request = http::Request::post(&url)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", &tool)
                    .header("x-tenant", tenant)
                    .body(Full::new(Bytes::from(message.to_string())))
                    .expect("valid request");
                let outcome = match client.request(request).await {
                    Ok(response) if response.status().is_success() => {
                        match response.into_body().collect().await {
                            Ok(body) => {
                                let body = body.to_bytes();
                                if body.windows(8).any(|w| w == b"\"result\"") {
                                    Ok(())
                                } else {
                                    Err(format!("not a result: {}", String::from_utf8_lossy(&body)))
                                }
                            }
                            Err(err) => Err(err.to_string()),
                        }
                    }
                    Ok(response) => Err(format!("HTTP {}", response.status())),
                    Err(err) => Err(err.to_string()),
                };
                match outcome {
                    Ok(()) => {
                        if !stop.load(Ordering::Relaxed) {
                            done.fetch_add(1, Ordering::Relaxed);
                            mine.push(sent.elapsed().as_nanos() as u64);
                        }
                    }
                    Err(err) => {
                        failed.lock().expect("lock").get_or_insert(err);
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            latencies.lock().expect("lock").extend(mine);
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let counted = done.load(Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    if let Some(err) = failed.lock().expect("lock").take() {
        return Err(format!("a call through {url} failed: {err}"));
    }
    let latencies = std::mem::take(&mut *latencies.lock().expect("lock"));
    Ok((counted, latencies))
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn print_table(configs: &mut [Config], elapsed: Duration) {
    let direct = configs[0].rps.clone();
    let nginx = configs
        .iter()
        .find(|c| c.label == "nginx")
        .map(|c| c.rps.clone());
    println!();
    println!(
        "{:<20} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "configuration",
        "rps",
        "p50 ms",
        "p99 ms",
        "/direct",
        "/nginx",
        "proxy us",
        "kernel us",
        "server us",
        "store us",
        "store ops"
    );
    let us = |values: &[f64]| {
        if values.is_empty() {
            String::new()
        } else {
            format!("{:.1}", median(values))
        }
    };
    for config in configs.iter_mut() {
        let ratio = |base: &[f64]| {
            let ratios: Vec<f64> = config.rps.iter().zip(base).map(|(p, d)| p / d).collect();
            format!("{:.3}", median(&ratios))
        };
        let to_direct = if config.label == "direct" {
            "1".to_owned()
        } else {
            ratio(&direct)
        };
        let to_nginx = nginx.as_deref().map(ratio).unwrap_or_default();
        config.latencies.sort_unstable();
        let p50_ms = percentile_us(&config.latencies, 50.0) / 1000.0;
        let p99_ms = percentile_us(&config.latencies, 99.0) / 1000.0;
        let trips = if config.round_trips.is_empty() {
            String::new()
        } else {
            format!("{:.2}", median(&config.round_trips))
        };
        println!(
            "{:<20} {:>8.0} {:>8.2} {:>8.2} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9}",
            config.label,
            median(&config.rps),
            p50_ms,
            p99_ms,
            to_direct,
            to_nginx,
            us(&config.cpu_us[0]),
            us(&config.proxy_kernel_us),
            us(&config.cpu_us[1]),
            us(&config.cpu_us[2]),
            trips
        );
    }
    println!("\nrps: median over rounds; /direct, /nginx: median over rounds of rps / that row's rps in the same round");
    println!("proxy us, server us, store us: CPU microseconds per completed call (median over rounds) of the proxy (nginx: master + worker), the upstream demo server, and redis-server or PostgreSQL (postmaster and all its children); kernel us: the part of the proxy's spent in the kernel");
    println!("took {:.0}s", elapsed.as_secs_f64());
}
