//! Latency of sequential `tools/call` against one Streamable HTTP server: directly over HTTP,
//! through `mcp-idem bridge`, and through `mcp-remote` (npm, the stdio bridge desktop users run
//! today); with `--loss P`, what each bridge does when a share P of the answers is lost.
//!
//! ```text
//! (cd interop && npm ci)
//! cargo bench -p mcp-idem --bench bridge_latency -- [--calls N] [--quick] [--warmup N] [--rounds N] [--rows direct,legacy,bridge,mcp-remote]
//! cargo bench -p mcp-idem --bench bridge_latency -- --loss 0.1 [--calls N] [--seed S] [--call-timeout 20s]
//! ```
//!
//! It measures the binary at `$MCP_IDEM_BIN` (default `target/release/mcp-idem`, which `cargo
//! bench` builds) and the `mcp-remote` pinned in `interop/package-lock.json` (installed in
//! `interop/node_modules`), run by `$NODE` (default `node`). One `mcp-idem demo-server --http` (stateless, plain JSON answers)
//! serves every row; the tool is `noop`, which answers at once, so the rows differ only in the
//! path a call takes. One call is in flight at a time; a sample is the time from sending the
//! request to the parsed response. All clients run in this process on one current-thread Tokio
//! runtime (no thread hand-offs on the client side): one HTTP exchange for the direct rows, a line
//! written to the bridge's stdin and one read from its stdout (both epoll-driven) for the bridges. Every row gets its warm-up calls, then the measured calls
//! run in rounds, each visiting every row (starting at a different one), so machine noise hits
//! them alike.
//!
//! Rows:
//! - direct: a keep-alive HTTP client POSTs each call with the 2026-07-28 headers and `_meta`;
//! - direct, legacy (diagnostic): the same after an `initialize`, with the negotiated version in
//!   `MCP-Protocol-Version` and no `_meta`: what `mcp-remote` sends the server;
//! - mcp-idem bridge: `mcp-idem bridge URL`; the client sends `server/discover` first, then
//!   2026-07-28 calls (the bridge adds an `idempotencyKey` to each);
//! - mcp-remote: `node mcp-remote URL --silent` (its default `--protocol legacy`); the client does
//!   the `initialize` handshake that mode expects, then sends plain calls.
//!
//! Targets (reported, not enforced): the bridge adds <= 100 µs over direct at p50, and at most half
//! of what `mcp-remote` adds (p50 and p99).

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;
use support::{load_average, mcp_idem_bin, modified_ago, Progress};
#[path = "support/latency.rs"]
mod latency;
use latency::{stats, Stats};
mod bridge_support;
use bridge_support::loss::LossOptions;
use bridge_support::{
    bridge_command, discover, initialize, tool_call, HttpPeer, McpRemote, Server, StdioPeer,
    LEGACY, MODERN,
};

const DEFAULT_CALLS: usize = 2000;
const QUICK_CALLS: usize = 200;
const DEFAULT_LOSS_CALLS: usize = 200;
const DEFAULT_WARMUP: usize = 200;
const DEFAULT_ROUNDS: usize = 10;
const DEFAULT_SEED: u64 = 12;
/// How long a latency call may take before the run fails (a hang is an error, not a sample).
const LATENCY_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Targets: the bridge's added latency at p50, and its share of what `mcp-remote` adds.
const MAX_ADDED_P50_US: f64 = 100.0;
const MAX_ADDED_SHARE: f64 = 0.5;

struct Options {
    /// The rows to measure (`--rows`; all by default).
    rows: Vec<Row>,
    calls: Option<usize>,
    warmup: usize,
    rounds: usize,
    loss: Option<f64>,
    seed: u64,
    call_timeout: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Direct,
    DirectLegacy,
    Bridge,
    McpRemote,
}

impl Row {
    const ALL: [Row; 4] = [
        Self::Direct,
        Self::DirectLegacy,
        Self::Bridge,
        Self::McpRemote,
    ];

    /// The name `--rows` takes.
    fn slug(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::DirectLegacy => "legacy",
            Self::Bridge => "bridge",
            Self::McpRemote => "mcp-remote",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Direct => "direct HTTP (2026-07-28)",
            Self::DirectLegacy => "direct HTTP, legacy (diagnostic)",
            Self::Bridge => "mcp-idem bridge",
            Self::McpRemote => "mcp-remote",
        }
    }
}

/// How a row's calls travel.
enum Client {
    Http(Box<HttpPeer>),
    Stdio(Box<StdioPeer>),
}

struct Config {
    row: Row,
    client: Client,
    next_id: u64,
    /// Nanoseconds per measured call.
    samples: Vec<u64>,
}

impl Config {
    /// One `noop` call, built before the clock starts; returns its time.
    async fn call(&mut self) -> Result<Duration, String> {
        self.next_id += 1;
        let modern = matches!(self.row, Row::Direct | Row::Bridge);
        let message = tool_call(self.next_id, "noop", json!({}), modern);
        let (answer, elapsed) = match &mut self.client {
            Client::Http(peer) => {
                let request = peer.post(&message);
                peer.send(request, LATENCY_TIMEOUT).await?
            }
            Client::Stdio(peer) => {
                let line = format!("{message}\n");
                match peer.request(&line, &message["id"], LATENCY_TIMEOUT).await? {
                    Some(answer) => answer,
                    None => return Err(peer.fail(&format!("no answer within {LATENCY_TIMEOUT:?}"))),
                }
            }
        };
        if answer.get("result").is_none() || answer["result"]["isError"] == Value::Bool(true) {
            return Err(format!("{}: the call failed: {answer}", self.row.label()));
        }
        Ok(elapsed)
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("bridge_latency: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let Some(options) = parse_args()? else {
        return Ok(());
    };
    let bin = mcp_idem_bin()?;
    let remote = McpRemote::find()?;
    let dir =
        tempfile::tempdir().map_err(|err| format!("cannot create a temporary directory: {err}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| format!("cannot start the Tokio runtime: {err}"))?;
    print_header(&bin, &remote, &options);
    match options.loss {
        Some(loss) => {
            let loss = LossOptions {
                calls: options.calls.unwrap_or(DEFAULT_LOSS_CALLS),
                loss,
                seed: options.seed,
                call_timeout: options.call_timeout,
            };
            runtime.block_on(bridge_support::loss::run(&bin, &remote, &loss, dir.path()))
        }
        None => runtime.block_on(latency_run(&bin, &remote, &options, dir.path())),
    }
}

async fn latency_run(
    bin: &Path,
    remote: &McpRemote,
    options: &Options,
    dir: &Path,
) -> Result<(), String> {
    let calls = options.calls.unwrap_or(DEFAULT_CALLS);
    let ledger = dir.join("ledger.jsonl");
    let server = Server::spawn(
        bin,
        &[
            "demo-server".into(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--ledger".into(),
            ledger.display().to_string(),
        ],
        "demo-server",
    )?;
    println!("  server:  {} (noop)", server.url);

    let mut configs = Vec::new();
    for &row in &options.rows {
        let client = match row {
            Row::Direct => Client::Http(Box::new(HttpPeer::new(&server.url, MODERN))),
            Row::DirectLegacy => {
                // The handshake an `initialize`-era HTTP client does, for the negotiated version.
                let peer = HttpPeer::new(&server.url, LEGACY);
                let (answer, _) = peer
                    .send(peer.post(&initialize(0)), LATENCY_TIMEOUT)
                    .await?;
                let version = answer["result"]["protocolVersion"]
                    .as_str()
                    .ok_or_else(|| format!("initialize over HTTP failed: {answer}"))?;
                let peer = HttpPeer::new(&server.url, version);
                let initialized = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
                let _ = peer.send(peer.post(&initialized), LATENCY_TIMEOUT).await;
                Client::Http(Box::new(peer))
            }
            Row::Bridge => {
                let command = bridge_command(bin, &server.url, &[]);
                let mut peer =
                    StdioPeer::spawn("mcp-idem bridge", command, dir.join("bridge.stderr"))?;
                let answer = peer.exchange(&discover(0), LATENCY_TIMEOUT).await?;
                if answer.get("result").is_none() {
                    return Err(peer.fail(&format!("server/discover failed: {answer}")));
                }
                Client::Stdio(Box::new(peer))
            }
            Row::McpRemote => {
                let command = remote.command(&server.url, dir);
                let mut peer =
                    StdioPeer::spawn("mcp-remote", command, dir.join("mcp-remote.stderr"))?;
                // mcp-remote connects (and tests the connection) before it reads stdin.
                peer.initialize(0, Duration::from_secs(30)).await?;
                Client::Stdio(Box::new(peer))
            }
        };
        configs.push(Config {
            row,
            client,
            next_id: 0,
            samples: Vec::with_capacity(calls),
        });
    }

    for config in &mut configs {
        for _ in 0..options.warmup {
            config.call().await?;
        }
    }

    let started = Instant::now();
    let rounds = options.rounds.clamp(1, calls.max(1));
    let mut progress = Progress::new("bridge_latency", rounds * configs.len());
    for round in 0..rounds {
        // Split the calls evenly over the rounds (the first rounds take the remainder).
        let chunk = calls / rounds + usize::from(round < calls % rounds);
        let count = configs.len();
        for offset in 0..count {
            let config = &mut configs[(round + offset) % count];
            progress.step(&format!("round {}: {}", round + 1, config.row.label()));
            for _ in 0..chunk {
                let sample = config.call().await?;
                config
                    .samples
                    .push(u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX));
            }
        }
    }
    let elapsed = started.elapsed();
    drop(progress);

    let mut results = Vec::new();
    for config in configs {
        if let Client::Stdio(peer) = config.client {
            peer.finish().await;
        }
        results.push((config.row, config.samples));
    }
    print_table(&mut results, elapsed);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Arguments and report.

fn parse_args() -> Result<Option<Options>, String> {
    let mut options = Options {
        rows: Row::ALL.to_vec(),
        calls: None,
        warmup: DEFAULT_WARMUP,
        rounds: DEFAULT_ROUNDS,
        loss: None,
        seed: DEFAULT_SEED,
        call_timeout: DEFAULT_CALL_TIMEOUT,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{what} needs a value"))
        };
        let bad = |what: &str, value: &str| format!("{what}: bad value {value:?}");
        match name.as_str() {
            "--calls" => {
                let v = value("--calls")?;
                options.calls = Some(v.parse::<usize>().map_err(|_| bad("--calls", &v))?.max(1));
            }
            "--quick" => options.calls = Some(QUICK_CALLS),
            "--warmup" => {
                let v = value("--warmup")?;
                options.warmup = v.parse().map_err(|_| bad("--warmup", &v))?;
            }
            "--rounds" => {
                let v = value("--rounds")?;
                options.rounds = v.parse::<usize>().map_err(|_| bad("--rounds", &v))?.max(1);
            }
            "--loss" => {
                let v = value("--loss")?;
                let loss: f64 = v.parse().map_err(|_| bad("--loss", &v))?;
                if !(0.0..=1.0).contains(&loss) {
                    return Err(bad("--loss (a share, 0 to 1)", &v));
                }
                options.loss = Some(loss);
            }
            "--rows" => {
                let v = value("--rows")?;
                options.rows = Vec::new();
                for slug in v.split(',').map(str::trim) {
                    let row = Row::ALL.into_iter().find(|row| row.slug() == slug);
                    options.rows.push(row.ok_or_else(|| bad("--rows", slug))?);
                }
            }
            "--seed" => {
                let v = value("--seed")?;
                options.seed = v.parse().map_err(|_| bad("--seed", &v))?;
            }
            "--call-timeout" => {
                let v = value("--call-timeout")?;
                options.call_timeout = humantime::parse_duration(&v)
                    .map_err(|_| bad("--call-timeout", &v))?
                    .max(Duration::from_secs(1));
            }
            "-h" | "--help" => {
                println!(
                    "bridge_latency [--calls N (default {DEFAULT_CALLS}; {DEFAULT_LOSS_CALLS} with --loss)] \
                     [--quick ({QUICK_CALLS} calls)] [--warmup N (default {DEFAULT_WARMUP})] \
                     [--rounds N (default {DEFAULT_ROUNDS})] [--rows direct,legacy,bridge,mcp-remote (default all)]\n\
                     bridge_latency --loss P [--calls N] [--seed S (default {DEFAULT_SEED})] \
                     [--call-timeout DUR (default {})]\n\
                     Latency of tools/call directly over HTTP, through `mcp-idem bridge` and through \
                     `mcp-remote`; with --loss, what each bridge does when a share P of the answers is \
                     lost. Measures $MCP_IDEM_BIN, default target/release/mcp-idem in the workspace, \
                     and interop/node_modules/mcp-remote run by $NODE (default node).",
                    humantime::format_duration(DEFAULT_CALL_TIMEOUT)
                );
                return Ok(None);
            }
            // Passed by `cargo bench`: not ours.
            "--bench" => {}
            other if other.starts_with('-') => {
                eprintln!("bridge_latency: ignoring unknown argument {other:?}");
            }
            _ => {}
        }
    }
    Ok(Some(options))
}

fn print_header(bin: &Path, remote: &McpRemote, options: &Options) {
    let built = modified_ago(bin);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    match options.loss {
        None => {
            println!("bridge_latency: sequential tools/call noop, one call in flight at a time")
        }
        Some(loss) => println!(
            "bridge_latency: {:.0}% of tools/call answers lost, capability on",
            loss * 100.0
        ),
    }
    println!("  binary:  {} ({built})", bin.display());
    println!(
        "  mcp-remote {} on node {}",
        remote.version, remote.node_version
    );
    if options.loss.is_none() {
        let calls = options.calls.unwrap_or(DEFAULT_CALLS);
        println!(
            "  calls:   {calls} measured per row in {} interleaved rounds, after {} warm-up calls",
            options.rounds.clamp(1, calls),
            options.warmup
        );
    }
    println!("  machine: {cores} cores, load average {}", load_average());
}

fn print_table(results: &mut [(Row, Vec<u64>)], elapsed: Duration) {
    println!(
        "  measured in {:.1}s; load average after: {}",
        elapsed.as_secs_f64(),
        load_average()
    );
    println!();
    println!(
        "{:<34} {:>6} {:>9} {:>9} {:>9} {:>9} {:>13} {:>13}",
        "row", "n", "min µs", "mean µs", "p50 µs", "p99 µs", "added p50 µs", "added p99 µs"
    );
    let summaries: Vec<(Row, usize, Stats)> = results
        .iter_mut()
        .map(|(row, samples)| (*row, samples.len(), stats(samples)))
        .collect();
    let of = |row: Row| {
        summaries
            .iter()
            .find(|(r, ..)| *r == row)
            .map(|(.., s)| (s.p50, s.p99))
            .unwrap_or((f64::NAN, f64::NAN))
    };
    let direct = of(Row::Direct);
    for (row, n, s) in &summaries {
        let mut line = format!(
            "{:<34} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            row.label(),
            n,
            s.min,
            s.mean,
            s.p50,
            s.p99
        );
        if *row == Row::Direct {
            let _ = write!(line, " {:>13} {:>13}", "baseline", "");
        } else {
            let _ = write!(
                line,
                " {:>13.1} {:>13.1}",
                s.p50 - direct.0,
                s.p99 - direct.1
            );
        }
        println!("{line}");
    }
    let has = |row: Row| summaries.iter().any(|(r, ..)| *r == row);
    if !(has(Row::Direct) && has(Row::Bridge) && has(Row::McpRemote)) {
        println!("\n(the targets need the direct, bridge and mcp-remote rows)");
        return;
    }
    let bridge = of(Row::Bridge);
    let remote = of(Row::McpRemote);
    let legacy = of(Row::DirectLegacy);
    let added = |row: (f64, f64), base: (f64, f64)| (row.0 - base.0, row.1 - base.1);
    let (b50, b99) = added(bridge, direct);
    let (r50, r99) = added(remote, direct);
    let (rl50, rl99) = added(remote, legacy);
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!();
    println!("added latency over direct HTTP (2026-07-28), µs:");
    println!("  mcp-idem bridge: p50 {b50:.1}, p99 {b99:.1}");
    println!("  mcp-remote:      p50 {r50:.1}, p99 {r99:.1} (over direct legacy: p50 {rl50:.1}, p99 {rl99:.1})");
    println!(
        "  bridge-added / mcp-remote-added: p50 {:.3}, p99 {:.3}",
        b50 / r50,
        b99 / r99
    );
    println!("targets:");
    println!(
        "  {}  bridge adds <= {MAX_ADDED_P50_US} µs at p50 ({b50:.1} µs)",
        verdict(b50 <= MAX_ADDED_P50_US)
    );
    println!(
        "  {}/{}  (p50/p99) bridge adds <= {MAX_ADDED_SHARE} x what mcp-remote adds",
        verdict(b50 <= MAX_ADDED_SHARE * r50),
        verdict(b99 <= MAX_ADDED_SHARE * r99)
    );
}
