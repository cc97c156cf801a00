//! Side-by-side latency of sequential `tools/call` over stdio: the demo server on its own, and behind
//! `mcp-idem wrap` (memory and SQLite stores), executed and replayed.
//!
//! ```text
//! cargo build --release -p mcp-idem
//! cargo bench -p mcp-idem --bench stdio_latency -- [--calls N] [--quick] [--warmup N] [--rounds N]
//! ```
//!
//! It measures the release binary at `$MCP_IDEM_BIN`, default `target/release/mcp-idem` in the
//! workspace, so build it first. One client thread sends one call at a time and waits for the
//! response (legacy `initialize` handshake, one JSON-RPC message per line); a sample is the time from
//! writing the request line to reading the response line. Every configuration gets its warm-up calls,
//! then the measured calls run in rounds, each round visiting every configuration (starting at a
//! different one each round), so machine noise hits them alike. Each process (the direct server and
//! the two gateways, each with its own server) is spawned once and serves its configurations for
//! the whole run.
//!
//! Configurations, per tool (`noop` answers at once, `work_1ms` sleeps 1 ms):
//! - direct: client <-> `mcp-idem demo-server`, no `idempotencyKey`;
//! - wrap memory / wrap sqlite, exec: through `mcp-idem wrap`, a fresh key per call (executes);
//! - wrap memory / wrap sqlite, replay: through `mcp-idem wrap`, one key executed once, then repeated
//!   (answered by the gateway from its store; checked first with `charge_payment`);
//! - wrap memory, no key (pass-through): diagnostic, the gateway forwards the call untouched, so the
//!   difference to direct is the extra process hop alone, and exec minus it is the store's share;
//! - poll relay, no key: the floor for any stdio gateway, a minimal relay process (the bench binary
//!   itself, `support/relay.rs`: one `poll(2)` loop copying bytes both ways) in front of the server;
//! - tokio relay, no key: the same relay on tokio's current-thread runtime, reading and writing
//!   whole lines as `wrap` does, parsing nothing: the floor of a line gateway on tokio;
//! - reading relay, no key: the tokio relay handing each message to `wrap`'s interceptor (its id
//!   tracked until answered): the floor of a gateway that reads every message, as `wrap` must.
//!
//! Each row also reports the CPU time per call of the process the client talks to: the server
//! (direct), or the relay or the gateway (its server not counted), from `/proc/PID/task/*/schedstat`.
//!
//! Targets (reported, not enforced): wrap p50/p99 <= 1.05x direct for `work_1ms`, <= 2x for `noop`;
//! replays faster than direct execution; the pass-through within 5 µs of the relay (p50); an
//! executed call on SQLite at most 25 µs over the pass-through (p50).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

mod support;
use support::{load_average, mcp_idem_bin, modified_ago, percentile_us, Progress};
#[path = "support/latency.rs"]
mod latency;
use latency::stats;
#[path = "support/relay.rs"]
mod relay;

const DEFAULT_CALLS: usize = 2000;
const QUICK_CALLS: usize = 200;
const DEFAULT_WARMUP: usize = 200;
const DEFAULT_ROUNDS: usize = 10;
/// Longest a call may keep receiving other messages (notifications) before the bench gives up. A
/// process that goes silent is not timed out: the read blocks (Ctrl-C), and its exit is an error.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

const TOOLS: [Tool; 2] = [
    Tool {
        name: "noop",
        max_wrap_ratio: 2.0,
    },
    Tool {
        name: "work_1ms",
        max_wrap_ratio: 1.05,
    },
];

#[derive(Clone, Copy)]
struct Tool {
    name: &'static str,
    /// Target for wrap (executed) / direct, on p50 and on p99.
    max_wrap_ratio: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Direct,
    /// The minimal relay process in front of the server (`support/relay.rs`).
    Relay,
    /// The same relay on tokio, line by line, as `wrap` reads (`support/relay.rs`).
    TokioRelay,
    /// The tokio relay reading each message with `wrap`'s interceptor (`support/relay.rs`).
    ReadingRelay,
    WrapMemory,
    WrapSqlite,
}

impl Transport {
    const ALL: [Transport; 6] = [
        Self::Direct,
        Self::Relay,
        Self::TokioRelay,
        Self::ReadingRelay,
        Self::WrapMemory,
        Self::WrapSqlite,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Relay => "poll relay",
            Self::TokioRelay => "tokio relay",
            Self::ReadingRelay => "reading relay",
            Self::WrapMemory => "wrap memory",
            Self::WrapSqlite => "wrap sqlite",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Relay => "relay",
            Self::TokioRelay => "tokio-relay",
            Self::ReadingRelay => "reading-relay",
            Self::WrapMemory => "memory",
            Self::WrapSqlite => "sqlite",
        }
    }

    /// Whether a gateway is in front, so that the server offers SEP-3182.
    fn idempotent(self) -> bool {
        matches!(self, Self::WrapMemory | Self::WrapSqlite)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No `idempotencyKey`: the baseline directly, a pass-through through a gateway.
    Plain,
    /// A fresh key per call.
    Execute,
    /// The same key every call, executed once before the warm-up.
    Replay,
}

struct Options {
    calls: usize,
    warmup: usize,
    rounds: usize,
}

/// One row of the table: a tool through a transport in a mode, and its samples.
struct Config {
    tool: Tool,
    transport: Transport,
    mode: Mode,
    /// Nanoseconds per measured call.
    samples: Vec<u64>,
    /// CPU nanoseconds the process the client talks to (the server directly, else the relay or
    /// the gateway, without its server) spent on the measured calls.
    cpu_ns: u64,
}

impl Config {
    fn label(&self) -> String {
        match self.mode {
            Mode::Plain if self.transport == Transport::Direct => {
                format!("{}, no key", self.transport.label())
            }
            Mode::Plain => format!("{}, no key (pass-through)", self.transport.label()),
            Mode::Execute => format!("{}, exec (fresh key)", self.transport.label()),
            Mode::Replay => format!("{}, replay (same key)", self.transport.label()),
        }
    }
}

fn main() -> ExitCode {
    if let Some(code) = relay::run_if_relay() {
        return code;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("stdio_latency: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let Some(options) = parse_args()? else {
        return Ok(());
    };
    let bin = mcp_idem_bin()?;
    let dir =
        tempfile::tempdir().map_err(|err| format!("cannot create a temporary directory: {err}"))?;
    let nonce = format!(
        "{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default()
    );

    print_header(&bin, &options, dir.path());

    let mut peers: Vec<Peer> = Vec::new();
    for transport in Transport::ALL {
        let mut peer = Peer::spawn(&bin, transport, dir.path())?;
        peer.handshake()?;
        if transport.idempotent() {
            peer.check_replays(&nonce)?;
        }
        peers.push(peer);
    }

    let mut configs = Vec::new();
    for tool in TOOLS {
        configs.push(Config {
            tool,
            transport: Transport::Direct,
            mode: Mode::Plain,
            samples: Vec::with_capacity(options.calls),
            cpu_ns: 0,
        });
        // The floor for any stdio gateway: a process that only copies bytes; that process on
        // tokio, reading lines as `wrap` does, the floor of a gateway on tokio; and that one
        // reading each message as `wrap` must.
        for transport in [
            Transport::Relay,
            Transport::TokioRelay,
            Transport::ReadingRelay,
        ] {
            configs.push(Config {
                tool,
                transport,
                mode: Mode::Plain,
                samples: Vec::with_capacity(options.calls),
                cpu_ns: 0,
            });
        }
        // Diagnostic: an unkeyed call through the gateway is forwarded untouched, so this row is
        // the cost of the extra process hop alone, without the store.
        configs.push(Config {
            tool,
            transport: Transport::WrapMemory,
            mode: Mode::Plain,
            samples: Vec::with_capacity(options.calls),
            cpu_ns: 0,
        });
        for transport in [Transport::WrapMemory, Transport::WrapSqlite] {
            for mode in [Mode::Execute, Mode::Replay] {
                configs.push(Config {
                    tool,
                    transport,
                    mode,
                    samples: Vec::with_capacity(options.calls),
                    cpu_ns: 0,
                });
            }
        }
    }

    let mut key_counter = 0u64;
    // The one execution behind every replay, then the warm-up.
    for config in &configs {
        let peer = peer_for(&mut peers, config.transport);
        if config.mode == Mode::Replay {
            let line = peer.call_line(config.tool.name, Some(&replay_key(&nonce, config)));
            peer.call(&line)?;
        }
        for _ in 0..options.warmup {
            let line = request_line(peer, config, &nonce, &mut key_counter);
            peer.call(&line)?;
        }
    }

    let started = Instant::now();
    let rounds = options.rounds.clamp(1, options.calls.max(1));
    let mut progress = Progress::new("stdio_latency", rounds * configs.len());
    for round in 0..rounds {
        // Split the calls evenly over the rounds (the first rounds take the remainder).
        let chunk = options.calls / rounds + usize::from(round < options.calls % rounds);
        let count = configs.len();
        for offset in 0..count {
            let config = &mut configs[(round + offset) % count];
            progress.step(&format!("round {}", round + 1));
            let peer = peer_for(&mut peers, config.transport);
            let cpu_before = cpu_ns(peer.child.id());
            for _ in 0..chunk {
                let line = request_line(peer, config, &nonce, &mut key_counter);
                let sample = peer.call(&line)?;
                config
                    .samples
                    .push(u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX));
            }
            config.cpu_ns += cpu_ns(peer.child.id()).saturating_sub(cpu_before);
        }
    }
    let elapsed = started.elapsed();
    drop(progress);

    for peer in peers {
        peer.finish();
    }
    print_table(&mut configs, elapsed);
    Ok(())
}

fn peer_for(peers: &mut [Peer], transport: Transport) -> &mut Peer {
    peers
        .iter_mut()
        .find(|peer| peer.transport == transport)
        .expect("a peer per transport")
}

fn replay_key(nonce: &str, config: &Config) -> String {
    format!(
        "bench-replay-{}-{}-{nonce}",
        config.tool.name,
        config.transport.slug()
    )
}

/// The next request line for `config` (built before the clock starts).
fn request_line(peer: &mut Peer, config: &Config, nonce: &str, counter: &mut u64) -> String {
    match config.mode {
        Mode::Plain => peer.call_line(config.tool.name, None),
        Mode::Execute => {
            *counter += 1;
            let key = format!("bench-{}-{counter}-{nonce}", config.transport.slug());
            peer.call_line(config.tool.name, Some(&key))
        }
        Mode::Replay => peer.call_line(config.tool.name, Some(&replay_key(nonce, config))),
    }
}

// ---------------------------------------------------------------------------------------------
// The stdio client.

/// A child process speaking newline-delimited JSON-RPC, driven synchronously.
struct Peer {
    transport: Transport,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr_path: PathBuf,
    next_id: u64,
    line: String,
}

impl Peer {
    fn spawn(bin: &Path, transport: Transport, dir: &Path) -> Result<Self, String> {
        let ledger = dir.join(format!("ledger-{}.jsonl", transport.slug()));
        let stderr_path = dir.join(format!("{}.stderr", transport.slug()));
        let mut command = Command::new(bin);
        let store = match transport {
            Transport::Direct => None,
            Transport::Relay | Transport::TokioRelay | Transport::ReadingRelay => {
                let bench = std::env::current_exe()
                    .map_err(|err| format!("cannot find the bench binary: {err}"))?;
                command = Command::new(bench);
                let arg = match transport {
                    Transport::Relay => relay::RELAY_ARG,
                    Transport::TokioRelay => relay::TOKIO_RELAY_ARG,
                    _ => relay::READING_RELAY_ARG,
                };
                command.arg(arg).arg(bin);
                None
            }
            Transport::WrapMemory => Some("memory".to_owned()),
            Transport::WrapSqlite => {
                Some(format!("sqlite:{}", dir.join("bench.sqlite3").display()))
            }
        };
        if let Some(store) = store {
            command
                .arg("wrap")
                .arg("--store")
                .arg(store)
                .arg("--")
                .arg(bin);
        }
        command.arg("demo-server").arg("--ledger").arg(&ledger);
        // Settings from the environment would change what is measured.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("MCP_IDEM_") {
                command.env_remove(name);
            }
        }
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|err| format!("cannot create {}: {err}", stderr_path.display()))?;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", bin.display()))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(Self {
            transport,
            child,
            stdin,
            stdout,
            stderr_path,
            next_id: 1,
            line: String::with_capacity(1024),
        })
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A `tools/call` line (with its newline) for `tool`, keyed if `key` is given.
    fn call_line(&mut self, tool: &str, key: Option<&str>) -> String {
        let id = self.take_id();
        let key = key
            .map(|key| format!(r#","idempotencyKey":{}"#, json!(key)))
            .unwrap_or_default();
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}{key}}}}}"#
        ) + "\n"
    }

    /// Writes `line` and reads up to the response with the same id; returns the time from the
    /// start of the write to the end of the read, after checking the response is a success.
    fn call(&mut self, line: &str) -> Result<Duration, String> {
        let id = request_id(line)?;
        let start = Instant::now();
        self.write(line)?;
        loop {
            self.read_line()?;
            let elapsed = start.elapsed();
            let response: Value = serde_json::from_str(&self.line).map_err(|err| {
                self.fail(&format!("a line that is not JSON ({err}): {}", self.line))
            })?;
            if response.get("id") != Some(&id) {
                // A notification or a server request: not ours; keep waiting.
                if elapsed > RESPONSE_TIMEOUT {
                    return Err(self.fail(&format!("no response to id {id} in time")));
                }
                continue;
            }
            let failed = response.get("result").is_none()
                || response["result"]["isError"] == Value::Bool(true);
            if failed {
                return Err(self.fail(&format!("the call failed: {}", self.line.trim_end())));
            }
            return Ok(elapsed);
        }
    }

    fn request(&mut self, message: &Value) -> Result<Value, String> {
        let id = message["id"].clone();
        self.write(&format!("{message}\n"))?;
        loop {
            self.read_line()?;
            let response: Value = serde_json::from_str(&self.line).map_err(|err| {
                self.fail(&format!("a line that is not JSON ({err}): {}", self.line))
            })?;
            if response.get("id") == Some(&id) {
                return Ok(response);
            }
        }
    }

    fn write(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().expect("stdin open until finish");
        let written = stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush());
        written.map_err(|err| self.fail(&format!("cannot write a request: {err}")))
    }

    fn read_line(&mut self) -> Result<(), String> {
        self.line.clear();
        match self.stdout.read_line(&mut self.line) {
            Ok(0) => Err(self.fail("the process closed its output")),
            Ok(_) => Ok(()),
            Err(err) => Err(self.fail(&format!("cannot read a response: {err}"))),
        }
    }

    /// Legacy handshake: `initialize`, then `notifications/initialized`.
    fn handshake(&mut self) -> Result<(), String> {
        let id = self.take_id();
        let init = self.request(
            &json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},
            "clientInfo":{"name":"mcp-idem-stdio-latency-bench","version":"0"}}}),
        )?;
        let tools = &init["result"]["capabilities"]["tools"];
        if !tools.is_object() {
            return Err(self.fail(&format!("initialize did not offer tools: {init}")));
        }
        let idempotent = tools.get("idempotency").is_some();
        if idempotent != self.transport.idempotent() {
            return Err(self.fail(&format!(
                "unexpected capabilities.tools.idempotency (present: {idempotent}): {init}"
            )));
        }
        self.write("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
    }

    /// Checks that a repeated key is answered from the store: the same `charge_payment` twice
    /// under one key must return the same charge id.
    fn check_replays(&mut self, nonce: &str) -> Result<(), String> {
        let key = format!("bench-check-{}-{nonce}", self.transport.slug());
        let mut charge_ids = Vec::new();
        for _ in 0..2 {
            let id = self.take_id();
            let response = self.request(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                "params":{"name":"charge_payment","arguments":{"amount":1,"currency":"EUR"},
                "idempotencyKey":key}}))?;
            let charge = response["result"]["structuredContent"]["chargeId"].clone();
            if !charge.is_string() {
                return Err(self.fail(&format!("charge_payment failed: {response}")));
            }
            charge_ids.push(charge);
        }
        if charge_ids[0] != charge_ids[1] {
            return Err(self.fail(&format!(
                "a repeated key charged twice ({} and {}): replays are not replays",
                charge_ids[0], charge_ids[1]
            )));
        }
        Ok(())
    }

    /// A message naming the process, with the tail of its stderr.
    fn fail(&self, what: &str) -> String {
        let stderr = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "{} (pid {}): {what}\n--- stderr ({}) ---\n{}",
            self.transport.label(),
            self.child.id(),
            self.stderr_path.display(),
            tail.join("\n")
        )
    }

    /// Closes stdin (the gateway then closes its server's) and waits a little for the exit.
    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "stdio_latency: {} (pid {}) did not exit after EOF; killing it",
            self.transport.label(),
            self.child.id()
        );
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn request_id(line: &str) -> Result<Value, String> {
    let message: Value =
        serde_json::from_str(line).map_err(|err| format!("bad request line ({err}): {line}"))?;
    Ok(message["id"].clone())
}

// ---------------------------------------------------------------------------------------------
// Arguments, binary, report.

fn parse_args() -> Result<Option<Options>, String> {
    let mut options = Options {
        calls: DEFAULT_CALLS,
        warmup: DEFAULT_WARMUP,
        rounds: DEFAULT_ROUNDS,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut number = |what: &str| -> Result<usize, String> {
            let value = inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{what} needs a number"))?;
            value
                .parse()
                .map_err(|_| format!("{what} needs a number, not {value:?}"))
        };
        match name.as_str() {
            "--calls" => options.calls = number("--calls")?.max(1),
            "--warmup" => options.warmup = number("--warmup")?,
            "--rounds" => options.rounds = number("--rounds")?.max(1),
            "--quick" => options.calls = QUICK_CALLS,
            "-h" | "--help" => {
                println!(
                    "stdio_latency [--calls N (default {DEFAULT_CALLS})] [--quick ({QUICK_CALLS} calls)] \
                     [--warmup N (default {DEFAULT_WARMUP})] [--rounds N (default {DEFAULT_ROUNDS})]\n\
                     Measures $MCP_IDEM_BIN, default target/release/mcp-idem in the workspace."
                );
                return Ok(None);
            }
            // Passed by `cargo bench` (and criterion-style filters and flags): not ours.
            "--bench" => {}
            other if other.starts_with('-') => {
                eprintln!("stdio_latency: ignoring unknown argument {other:?}");
            }
            _ => {}
        }
    }
    Ok(Some(options))
}

fn print_header(bin: &Path, options: &Options, dir: &Path) {
    let built = modified_ago(bin);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("stdio_latency: sequential tools/call over stdio, one call in flight at a time");
    println!("  binary:  {} ({built})", bin.display());
    println!(
        "  calls:   {} measured per configuration in {} interleaved rounds, after {} warm-up calls",
        options.calls,
        options.rounds.clamp(1, options.calls),
        options.warmup
    );
    println!(
        "  stores:  memory; sqlite:{}",
        dir.join("bench.sqlite3").display()
    );
    println!("  machine: {cores} cores, load average {}", load_average());
}

/// PASS when `ratio` is at most `max` (or, if `strict`, below it).
fn verdict(ratio: f64, max: f64, strict: bool) -> &'static str {
    if ratio < max || (!strict && ratio == max) {
        "PASS"
    } else {
        "MISS"
    }
}

/// CPU time so far of process `pid`, all its threads, in nanoseconds (`/proc/PID/task/*/schedstat`,
/// which counts nanoseconds where `/proc/PID/stat` counts 10 ms ticks); 0 where unreadable.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn cpu_us_per_call(config: &Config) -> f64 {
    config.cpu_ns as f64 / 1000.0 / config.samples.len().max(1) as f64
}

fn print_table(configs: &mut [Config], elapsed: Duration) {
    println!(
        "  measured in {:.1}s; load average after: {}",
        elapsed.as_secs_f64(),
        load_average()
    );
    println!();
    println!(
        "{:<9} {:<36} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7}   {:<13} {:<13} target",
        "tool",
        "configuration",
        "n",
        "min µs",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "cpu µs",
        "p50 ratio",
        "p99 ratio"
    );
    let mut summary = Vec::new();
    for tool in TOOLS {
        let mut direct = None;
        for config in configs.iter_mut().filter(|c| c.tool.name == tool.name) {
            let s = stats(&mut config.samples);
            let mut row = format!(
                "{:<9} {:<36} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.1}",
                tool.name,
                config.label(),
                config.samples.len(),
                s.min,
                s.mean,
                s.p50,
                s.p99,
                cpu_us_per_call(config)
            );
            match (config.mode, &direct) {
                (Mode::Plain, None) if config.transport == Transport::Direct => {
                    let _ = write!(row, "   {:<13} {:<13} baseline", "", "");
                    direct = Some((s.p50, s.p99));
                }
                (Mode::Plain, Some((d50, d99))) => {
                    let (r50, r99) = (s.p50 / d50, s.p99 / d99);
                    let _ = write!(
                        row,
                        "   {:<13} {:<13} (diagnostic: hop cost, no target)",
                        format!("{r50:.3}x"),
                        format!("{r99:.3}x")
                    );
                }
                (mode, Some((d50, d99))) => {
                    let (r50, r99) = (s.p50 / d50, s.p99 / d99);
                    let (max, strict, target) = match mode {
                        Mode::Execute => (
                            tool.max_wrap_ratio,
                            false,
                            format!("wrap/direct <= {}x", tool.max_wrap_ratio),
                        ),
                        _ => (1.0, true, "replay/direct exec < 1x".to_owned()),
                    };
                    let (v50, v99) = (verdict(r50, max, strict), verdict(r99, max, strict));
                    let _ = write!(
                        row,
                        "   {:<13} {:<13} {target}",
                        format!("{r50:.3}x {v50}"),
                        format!("{r99:.3}x {v99}")
                    );
                    summary.push((tool.name, config.label(), target, v50, v99));
                }
                (_, None) => {}
            }
            println!("{row}");
        }
    }
    println!();
    println!(
        "ratios: against the direct row of the same tool (exec and pass-through rows: \
         wrap/direct; replay rows: replay/direct execution)"
    );
    println!("differences of p50 (samples are sorted by now):");
    for tool in TOOLS {
        let row = |transport: Transport, mode: Mode| {
            configs
                .iter()
                .find(|c| c.tool.name == tool.name && c.transport == transport && c.mode == mode)
        };
        let p50 = |transport, mode| {
            row(transport, mode).map_or(f64::NAN, |c| percentile_us(&c.samples, 50.0))
        };
        let cpu = |transport, mode| row(transport, mode).map_or(f64::NAN, cpu_us_per_call);
        let relay = p50(Transport::Relay, Mode::Plain);
        let pass = p50(Transport::WrapMemory, Mode::Plain);
        let sqlite = p50(Transport::WrapSqlite, Mode::Execute);
        println!(
            "  {:<15} CPU per call: wrap pass-through - poll relay = {:+.1} µs; wrap sqlite exec - wrap pass-through = {:+.1} µs",
            tool.name,
            cpu(Transport::WrapMemory, Mode::Plain) - cpu(Transport::Relay, Mode::Plain),
            cpu(Transport::WrapSqlite, Mode::Execute) - cpu(Transport::WrapMemory, Mode::Plain),
        );
        println!(
            "  {:<15} p50 (CPU per call): tokio relay - poll relay = {:+.1} µs ({:+.1} µs); wrap pass-through - tokio relay = {:+.1} µs ({:+.1} µs)",
            tool.name,
            p50(Transport::TokioRelay, Mode::Plain) - relay,
            cpu(Transport::TokioRelay, Mode::Plain) - cpu(Transport::Relay, Mode::Plain),
            pass - p50(Transport::TokioRelay, Mode::Plain),
            cpu(Transport::WrapMemory, Mode::Plain) - cpu(Transport::TokioRelay, Mode::Plain),
        );
        println!(
            "  {:<15} p50 (CPU per call): reading relay - poll relay = {:+.1} µs ({:+.1} µs); wrap pass-through - reading relay = {:+.1} µs ({:+.1} µs)",
            tool.name,
            p50(Transport::ReadingRelay, Mode::Plain) - relay,
            cpu(Transport::ReadingRelay, Mode::Plain) - cpu(Transport::Relay, Mode::Plain),
            pass - p50(Transport::ReadingRelay, Mode::Plain),
            cpu(Transport::WrapMemory, Mode::Plain) - cpu(Transport::ReadingRelay, Mode::Plain),
        );
        for (label, extra, max) in [
            ("wrap pass-through - poll relay", pass - relay, 5.0),
            ("wrap sqlite exec - wrap pass-through", sqlite - pass, 25.0),
        ] {
            let label = format!("{label} = {extra:+.1} µs");
            let v = verdict(extra, max, false);
            println!("  {v}  {:<9} {label:<46} target <= {max} µs", tool.name);
            summary.push((tool.name, label, format!("<= {max} µs"), v, "-   "));
        }
    }
    let misses = summary
        .iter()
        .filter(|(.., v50, v99)| *v50 == "MISS" || *v99 == "MISS")
        .count();
    println!(
        "targets: {} of {} rows PASS on both p50 and p99",
        summary.len() - misses,
        summary.len()
    );
    for (tool, label, target, v50, v99) in &summary {
        println!("  {v50}/{v99} (p50/p99)  {tool:<9} {label:<36} {target}");
    }
}
