//! `--loss P`: what each bridge does when a share P of the `tools/call` answers is lost on the
//! way back. Both run in front of the same chain: bridge -> [`Forwarder`] (loses answers) ->
//! `mcp-idem proxy --store memory` (advertises `tools.idempotency`) -> `demo-server --http`.
//! The client (this bench) sends `charge_payment` calls without a key, one at a time, each with a
//! fresh amount, so the ledger line of a charge names its call. A call that ends in an error or
//! times out is sent once more (same arguments, a new id), as a user or an agent would after an
//! error. At the end the ledger says, per call, how often it was charged.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::forwarder::Forwarder;
use super::{
    advertises_idempotency, bridge_command, discover, tool_call, McpRemote, Server, StdioPeer,
};

/// What `--loss` runs with.
pub(crate) struct LossOptions {
    pub(crate) calls: usize,
    /// Share of `tools/call` answers lost, 0..=1.
    pub(crate) loss: f64,
    pub(crate) seed: u64,
    /// How long the bench waits for one answer.
    pub(crate) call_timeout: Duration,
}

/// How one call (or its retry) ended, as the client saw it.
enum Outcome {
    Charged(String),
    Failed(String),
    TimedOut,
}

/// One bridge's run: per call, the first outcome and, if that was no charge, the retry's.
struct Run {
    label: &'static str,
    base: u64,
    outcomes: Vec<(Outcome, Option<Outcome>)>,
    /// How long each first attempt took, in milliseconds, sorted.
    times_ms: Vec<f64>,
    /// The first `re-issuing tools/call` line of the bridge's stderr.
    sample_reissue: Option<String>,
    /// `tools/call` POSTs the forwarder saw and answers it dropped, during this run.
    posts: u64,
    dropped: u64,
    /// `re-issuing tools/call` lines on `mcp-idem bridge`'s stderr (`None` for `mcp-remote`,
    /// which logs no such thing).
    reissues: Option<usize>,
    capability: bool,
    elapsed: Duration,
}

/// Runs both bridges through the lossy chain and prints what happened.
pub(crate) async fn run(
    bin: &Path,
    remote: &McpRemote,
    options: &LossOptions,
    dir: &Path,
) -> Result<(), String> {
    let ledger = dir.join("ledger.jsonl");
    let arg = |s: &str| s.to_owned();
    let demo = Server::spawn(
        bin,
        &[
            arg("demo-server"),
            arg("--http"),
            arg("127.0.0.1:0"),
            arg("--ledger"),
            ledger.display().to_string(),
        ],
        "demo-server",
    )?;
    let proxy = Server::spawn(
        bin,
        &[
            arg("proxy"),
            arg("--listen"),
            arg("127.0.0.1:0"),
            arg("--upstream"),
            demo.base_url().to_owned(),
            arg("--store"),
            arg("memory"),
        ],
        "proxy",
    )?;
    let forwarder = Forwarder::start(proxy.base_url(), options.loss, options.seed).await?;
    println!(
        "  chain:   bridge -> answer-losing forwarder {} (seed {}) -> mcp-idem proxy --store memory {}/mcp -> demo-server {}",
        forwarder.url, options.seed, proxy.base_url(), demo.url
    );
    println!(
        "  calls:   {} charge_payment per bridge, no key from the client, one in flight; {:?} per call; an error or timeout is retried once",
        options.calls, options.call_timeout
    );

    // The bridge gives up before the bench does, so its own answer is what the bench sees.
    let max_time = humantime::format_duration(options.call_timeout.mul_f64(0.75)).to_string();
    let command = bridge_command(
        bin,
        &forwarder.url,
        &["--attempt-timeout", "5s", "--max-time", &max_time],
    );
    let mut bridge = StdioPeer::spawn("mcp-idem bridge", command, dir.join("bridge-loss.stderr"))?;
    let answer = bridge.exchange(&discover(0), options.call_timeout).await?;
    let capability = advertises_idempotency(&answer);
    let mut runs = vec![
        drive(
            &mut bridge,
            "mcp-idem bridge",
            1_000_000,
            true,
            capability,
            &forwarder,
            options,
        )
        .await?,
    ];
    let stderr = bridge.stderr();
    runs[0].reissues = Some(stderr.matches("re-issuing tools/call").count());
    runs[0].sample_reissue = stderr
        .lines()
        .find(|line| line.contains("re-issuing tools/call"))
        .map(str::to_owned);
    bridge.finish().await;

    let command = remote.command(&forwarder.url, dir);
    let mut mcp_remote =
        StdioPeer::spawn("mcp-remote", command, dir.join("mcp-remote-loss.stderr"))?;
    let answer = mcp_remote.initialize(0, options.call_timeout).await?;
    let capability = advertises_idempotency(&answer);
    runs.push(
        drive(
            &mut mcp_remote,
            "mcp-remote",
            2_000_000,
            false,
            capability,
            &forwarder,
            options,
        )
        .await?,
    );
    mcp_remote.finish().await;

    let charged = read_ledger(&ledger)?;
    for run in &runs {
        report(run, &charged);
    }
    Ok(())
}

/// Sends `options.calls` charges through `peer`, amounts `base + i`.
async fn drive(
    peer: &mut StdioPeer,
    label: &'static str,
    base: u64,
    modern: bool,
    capability: bool,
    forwarder: &Forwarder,
    options: &LossOptions,
) -> Result<Run, String> {
    let (posts_before, dropped_before) = forwarder.counts.snapshot();
    let started = Instant::now();
    let mut progress = crate::support::Progress::new("bridge_latency", options.calls);
    let mut next_id = 1u64;
    let mut outcomes = Vec::with_capacity(options.calls);
    let mut times_ms = Vec::with_capacity(options.calls);
    for i in 0..options.calls {
        progress.step(&format!("{label}, loss run"));
        let amount = base + i as u64;
        let mut attempt = || {
            next_id += 1;
            tool_call(
                next_id,
                "charge_payment",
                json!({"amount": amount, "currency": "EUR"}),
                modern,
            )
        };
        let (first, took) = charge(peer, &attempt(), options.call_timeout).await?;
        times_ms.push(took.as_secs_f64() * 1000.0);
        let retry = match first {
            Outcome::Charged(_) => None,
            _ => Some(charge(peer, &attempt(), options.call_timeout).await?.0),
        };
        outcomes.push((first, retry));
    }
    drop(progress);
    let (posts, dropped) = forwarder.counts.snapshot();
    times_ms.sort_by(f64::total_cmp);
    Ok(Run {
        label,
        base,
        outcomes,
        times_ms,
        sample_reissue: None,
        posts: posts - posts_before,
        dropped: dropped - dropped_before,
        reissues: None,
        capability,
        elapsed: started.elapsed(),
    })
}

/// One attempt of a charge, and how long it took.
async fn charge(
    peer: &mut StdioPeer,
    message: &Value,
    timeout: Duration,
) -> Result<(Outcome, Duration), String> {
    let line = format!("{message}\n");
    let Some((answer, took)) = peer.request(&line, &message["id"], timeout).await? else {
        return Ok((Outcome::TimedOut, timeout));
    };
    let result = &answer["result"];
    if let Some(charge) = result["structuredContent"]["chargeId"].as_str() {
        if result["isError"] != Value::Bool(true) {
            return Ok((Outcome::Charged(charge.to_owned()), took));
        }
    }
    let what = match answer.get("error") {
        Some(error) => {
            let kind = error["data"]["type"]
                .as_str()
                .map(|t| format!(" [{t}]"))
                .unwrap_or_default();
            format!(
                "JSON-RPC error {}{kind}: {}",
                error["code"],
                error["message"].as_str().unwrap_or_default()
            )
        }
        None => format!(
            "tool error: {}",
            result["content"][0]["text"].as_str().unwrap_or_default()
        ),
    };
    Ok((Outcome::Failed(what), took))
}

/// Amount -> the charge ids the ledger holds for it.
fn read_ledger(path: &Path) -> Result<HashMap<u64, Vec<String>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read the ledger {}: {err}", path.display()))?;
    let mut charged: HashMap<u64, Vec<String>> = HashMap::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let entry: Value = serde_json::from_str(line)
            .map_err(|err| format!("a ledger line that is not JSON ({err}): {line}"))?;
        if let Some(amount) = entry["amount"].as_u64() {
            let id = entry["chargeId"].as_str().unwrap_or_default().to_owned();
            charged.entry(amount).or_default().push(id);
        }
    }
    Ok(charged)
}

fn report(run: &Run, charged: &HashMap<u64, Vec<String>>) {
    let n = run.outcomes.len();
    let count = |first: bool, pick: fn(&Outcome) -> bool| {
        run.outcomes
            .iter()
            .filter(|(a, b)| {
                if first {
                    pick(a)
                } else {
                    b.as_ref().map_or(pick(a), pick)
                }
            })
            .count()
    };
    let is_charged: fn(&Outcome) -> bool = |o| matches!(o, Outcome::Charged(_));
    let is_failed: fn(&Outcome) -> bool = |o| matches!(o, Outcome::Failed(_));
    let is_timeout: fn(&Outcome) -> bool = |o| matches!(o, Outcome::TimedOut);
    let percent = |k: usize| 100.0 * k as f64 / n.max(1) as f64;

    let executions = |i: usize| charged.get(&(run.base + i as u64)).map_or(0, Vec::len);
    let (mut once, mut twice_or_more, mut never, mut extra) = (0, 0, 0, 0);
    let mut failed_but_charged = 0;
    let mut wrong_id = 0;
    for (i, (first, _)) in run.outcomes.iter().enumerate() {
        let times = executions(i);
        match times {
            0 => never += 1,
            1 => once += 1,
            _ => {
                twice_or_more += 1;
                extra += times - 1;
            }
        }
        match first {
            Outcome::Charged(id) => {
                let ids = charged.get(&(run.base + i as u64));
                if !ids.is_some_and(|ids| ids.contains(id)) {
                    wrong_id += 1;
                }
            }
            _ if times > 0 => failed_but_charged += 1,
            _ => {}
        }
    }

    println!();
    println!(
        "{} ({:.1}s; capability tools.idempotency seen by the client: {})",
        run.label,
        run.elapsed.as_secs_f64(),
        if run.capability { "yes" } else { "no" }
    );
    let reissues = run
        .reissues
        .map(|n| format!("; re-issues the bridge logged: {n}"))
        .unwrap_or_default();
    println!(
        "  forwarder: {} tools/call POSTs, {} answers dropped{reissues}",
        run.posts, run.dropped
    );
    let pick = |p: f64| {
        let rank =
            ((p * run.times_ms.len() as f64).ceil() as usize).clamp(1, run.times_ms.len().max(1));
        run.times_ms.get(rank - 1).copied().unwrap_or(f64::NAN)
    };
    println!(
        "  time to the first answer: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pick(0.5),
        pick(0.9),
        pick(0.99),
        run.times_ms.last().copied().unwrap_or(f64::NAN)
    );
    if let Some(line) = &run.sample_reissue {
        println!("  a re-issue, as logged: {}", line.trim());
    }
    println!(
        "  first answer:  {}/{n} completed ({:.1}%), {} errors, {} timed out",
        count(true, is_charged),
        percent(count(true, is_charged)),
        count(true, is_failed),
        count(true, is_timeout)
    );
    println!(
        "  after one client retry of each error/timeout: {}/{n} completed ({:.1}%), {} errors, {} timed out",
        count(false, is_charged),
        percent(count(false, is_charged)),
        count(false, is_failed),
        count(false, is_timeout)
    );
    println!(
        "  ledger: {once} calls charged once, {twice_or_more} charged more than once ({extra} duplicate charges), {never} never charged"
    );
    println!(
        "  first answer an error/timeout although the call had charged: {failed_but_charged}; completed calls whose chargeId is not in the ledger: {wrong_id}"
    );
    let mut errors: Vec<&str> = run
        .outcomes
        .iter()
        .flat_map(|(a, b)| [Some(a), b.as_ref()])
        .flatten()
        .filter_map(|o| match o {
            Outcome::Failed(what) => Some(what.as_str()),
            _ => None,
        })
        .collect();
    errors.sort_unstable();
    errors.dedup();
    for what in errors.iter().take(3) {
        println!("  error seen: {what}");
    }
}
