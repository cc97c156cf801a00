//! A CI-sized chaos run. 16 client tasks send keyed `charge_payment` calls (each logical call has
//! one key and a unique amount, and is retried with the same key until it gets a definitive
//! answer) to three `mcp-idem proxy` instances sharing one store (Redis, then PostgreSQL; a
//! namespace of their own) in front of one `demo-server --http`. Between the clients and each
//! proxy sits a TCP fault injector that, per connection and from a seeded RNG, drops the answer
//! after the proxy gave it, delays it past the client's timeout, or cuts the request off before
//! it is complete. One proxy is killed (SIGKILL) once mid-run and restarted on the same port with
//! the same arguments.
//!
//! At the end the demo server's ledger (one line per execution; the amount names the logical
//! call) is compared with what the clients saw: no logical call executed twice; every call the
//! client saw succeed executed exactly once, with the charge id the client got; calls answered
//! `idempotency_outcome_unknown` (possible for calls in flight at the SIGKILL) executed at most
//! once.
//!
//! `CHAOS_CALLS` sets the number of logical calls (default 500), `CHAOS_SEED` the seed (default:
//! from the clock; printed either way). Run with `--nocapture` to see the report.
#![cfg(unix)]

mod common;
mod http_support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{ledger_lines, TIMEOUT};
use http_support::{charge, ledger_in, unique_namespace, Answer, HttpDemo, Raw, SharedStore};

const INSTANCES: usize = 3;
const CLIENTS: usize = 16;
/// How long a client waits for one answer before it retries.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the injector holds back a delayed answer: past the client's timeout.
const DELAY: Duration = Duration::from_secs(6);
/// A logical call gives up after this many attempts.
const MAX_ATTEMPTS: u32 = 60;
/// Fault probabilities per connection.
const P_DROP: f64 = 0.08;
const P_DELAY: f64 = 0.02;
const P_RESET: f64 = 0.08;

/// `mcp-idem proxy` started by this test (so that it can be restarted on the same port); killed
/// with SIGKILL on drop.
struct ProxyProcess {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
}

impl ProxyProcess {
    fn spawn(listen: &str, args: &[String]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
            .args(["proxy", "--listen", listen])
            .args(args)
            .env("MCP_IDEM_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mcp-idem proxy");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                match line.strip_prefix("mcp-idem proxy: listening on http://") {
                    Some(addr) => {
                        let _ = tx.send(addr.to_owned());
                    }
                    None => eprintln!("mcp-idem proxy: {line}"),
                }
            }
        });
        match rx.recv_timeout(TIMEOUT) {
            Ok(addr) => Self { child, addr },
            Err(_) => {
                let _ = child.kill();
                panic!("mcp-idem proxy --listen {listen} did not start within {TIMEOUT:?}")
            }
        }
    }

    /// SIGKILL.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the injector does to one connection.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// Relay the request, read the whole answer, close the client side without relaying it.
    DropResponse,
    /// Relay the request, hold the answer back for [`DELAY`], then relay it.
    Delay,
    /// Relay part of the request's first chunk, then close both sides.
    Reset,
}

#[derive(Default)]
struct FaultCounts {
    connections: AtomicU64,
    dropped: AtomicU64,
    delayed: AtomicU64,
    reset: AtomicU64,
    /// Connections the injector could not relay because the proxy was down.
    refused: AtomicU64,
}

/// A TCP forwarder on loopback in front of `target`, injecting faults per connection. Returns the
/// address it listens on.
async fn start_injector(
    target: String,
    rng: Arc<Mutex<StdRng>>,
    counts: Arc<FaultCounts>,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            counts.connections.fetch_add(1, Ordering::Relaxed);
            let roll: f64 = rng.lock().unwrap().gen();
            let fault = if roll < P_DROP {
                Fault::DropResponse
            } else if roll < P_DROP + P_DELAY {
                Fault::Delay
            } else if roll < P_DROP + P_DELAY + P_RESET {
                Fault::Reset
            } else {
                Fault::None
            };
            let (target, counts) = (target.clone(), Arc::clone(&counts));
            tokio::spawn(async move {
                let _ = relay(client, &target, fault, &counts).await;
            });
        }
    });
    addr
}

async fn relay(
    client: TcpStream,
    target: &str,
    fault: Fault,
    counts: &FaultCounts,
) -> std::io::Result<()> {
    let upstream = match TcpStream::connect(target).await {
        Ok(upstream) => upstream,
        Err(err) => {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            return Err(err);
        }
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    if fault == Fault::Reset {
        let mut buf = vec![0; 64 * 1024];
        let n = client_read.read(&mut buf).await?;
        upstream_write.write_all(&buf[..n / 2]).await?;
        counts.reset.fetch_add(1, Ordering::Relaxed);
        return Ok(()); // dropping both sides closes them
    }
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
    });
    let result = async {
        match fault {
            Fault::None | Fault::Reset => {
                tokio::io::copy(&mut upstream_read, &mut client_write).await?;
            }
            Fault::DropResponse | Fault::Delay => {
                // The clients send `connection: close`, so the proxy closes after its answer.
                let mut answer = Vec::new();
                tokio::time::timeout(TIMEOUT * 3, upstream_read.read_to_end(&mut answer))
                    .await
                    .map_err(|_| std::io::Error::other("no whole answer"))??;
                if fault == Fault::Delay {
                    counts.delayed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(DELAY).await;
                    client_write.write_all(&answer).await?;
                } else {
                    counts.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }
    .await;
    requests.abort();
    result
}

/// How a logical call ended, from its client's point of view.
#[derive(Debug, Clone)]
enum Outcome {
    Charged(String),
    ToolError(String),
    Unknown,
    GaveUp(String),
}

struct CallResult {
    amount: u64,
    outcome: Outcome,
    attempts: u32,
}

/// One attempt: `None` when no whole answer came (connection error or timeout).
async fn attempt(raw: &Raw, message: &serde_json::Value) -> Option<Answer> {
    let request = raw
        .post(message)
        .header(http::header::CONNECTION, "close")
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    let exchange = async {
        let response = raw.client.request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some(Answer {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).ok()?,
        })
    };
    tokio::time::timeout(ATTEMPT_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

/// The JSON-RPC response in a body: plain JSON, or the SSE event carrying it. `None` if there is
/// none (never panics, unlike [`Answer::json`]).
fn response_of(body: &str) -> Option<serde_json::Value> {
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(body) {
        return Some(json);
    }
    let normalized = body.replace("\r\n", "\n");
    normalized.split("\n\n").find_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| data.strip_prefix(' ').unwrap_or(data))
            .collect();
        let json: serde_json::Value = serde_json::from_str(&data.join("\n")).ok()?;
        (json.get("id").is_some() && (json.get("result").is_some() || json.get("error").is_some()))
            .then_some(json)
    })
}

/// Retries one logical call with the same key until a definitive answer or [`MAX_ATTEMPTS`].
async fn logical_call(raws: &[Raw], amount: u64, key: &str, rng: &mut StdRng) -> CallResult {
    let mut attempts = 0;
    let mut last = String::from("no attempt");
    while attempts < MAX_ATTEMPTS {
        attempts += 1;
        let raw = &raws[rng.gen_range(0..raws.len())];
        let message = charge(u64::from(attempts), amount, Some(key));
        let mut pause = Duration::from_millis(50);
        match attempt(raw, &message).await {
            None => last = "no answer".into(),
            Some(answer) if answer.status != http::StatusCode::OK => {
                last = format!("HTTP {}: {}", answer.status, answer.body);
            }
            Some(answer) => {
                let Some(json) = response_of(&answer.body) else {
                    last = format!("unreadable: {}", answer.body);
                    tokio::time::sleep(pause).await;
                    continue;
                };
                if let Some(id) = json["result"]["structuredContent"]["chargeId"].as_str() {
                    let outcome = if json["result"]["isError"] == true {
                        Outcome::ToolError(answer.body.clone())
                    } else {
                        Outcome::Charged(id.to_owned())
                    };
                    return CallResult {
                        amount,
                        outcome,
                        attempts,
                    };
                }
                match json["error"]["data"]["type"].as_str() {
                    Some("idempotency_outcome_unknown") => {
                        return CallResult {
                            amount,
                            outcome: Outcome::Unknown,
                            attempts,
                        }
                    }
                    Some("idempotency_key_in_progress") => {
                        let wait = json["error"]["data"]["retryAfterMs"]
                            .as_u64()
                            .unwrap_or(100);
                        pause = Duration::from_millis(wait.clamp(10, 500));
                        last = "in progress".into();
                    }
                    Some("idempotency_store_unavailable") => last = "store unavailable".into(),
                    _ if json.get("result").is_some() => {
                        // A tool result without a charge id: definitive, but not a charge.
                        return CallResult {
                            amount,
                            outcome: Outcome::ToolError(answer.body.clone()),
                            attempts,
                        };
                    }
                    _ => last = format!("unexpected: {}", answer.body),
                }
            }
        }
        tokio::time::sleep(pause).await;
    }
    CallResult {
        amount,
        outcome: Outcome::GaveUp(last),
        attempts,
    }
}

async fn chaos_run(store_url: &str, store: &str) {
    let calls: u64 = std::env::var("CHAOS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64
        });
    eprintln!("chaos ({store}): {calls} logical calls, CHAOS_SEED={seed}");
    let started = std::time::Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace(&format!("chaos-{store}"));
    let args: Vec<String> = [
        "--upstream",
        &server.base_url(),
        "--store",
        store_url,
        "--namespace",
        &namespace,
        "--lease",
        "2s",
        // Every logical call leaves a record: lift the quotas (default 10,000 per principal) so
        // that a long run (CHAOS_CALLS) is not throttled by them; short retention keeps the shared
        // stores from holding the run's records for a day.
        "--max-records-per-scope",
        "10000000",
        "--max-records-total",
        "10000000",
        "--retention",
        "30m",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut proxies: Vec<ProxyProcess> = (0..INSTANCES)
        .map(|_| ProxyProcess::spawn("127.0.0.1:0", &args))
        .collect();

    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    let counts = Arc::new(FaultCounts::default());
    let mut fronts = Vec::new();
    for proxy in &proxies {
        let front = start_injector(proxy.addr.clone(), Arc::clone(&rng), Arc::clone(&counts)).await;
        fronts.push(format!("http://{front}/mcp"));
    }
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let raws: Arc<Vec<Raw>> = Arc::new(
        fronts
            .iter()
            .map(|url| Raw::with_client(client.clone(), url))
            .collect(),
    );

    // Logical calls 1..=calls, taken from a shared counter by the client tasks.
    let next = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicUsize::new(0));
    let run_tag = format!("{seed:x}-{}", std::process::id());
    let mut clients = tokio::task::JoinSet::new();
    for task in 0..CLIENTS {
        let (raws, next, done, tag) = (
            Arc::clone(&raws),
            Arc::clone(&next),
            Arc::clone(&done),
            run_tag.clone(),
        );
        let mut task_rng = StdRng::seed_from_u64(seed ^ (task as u64 + 1).wrapping_mul(0x9e37));
        clients.spawn(async move {
            let mut results = Vec::new();
            loop {
                let amount = next.fetch_add(1, Ordering::Relaxed);
                if amount > calls {
                    return results;
                }
                let key = format!("chaos-{tag}-{amount}");
                results.push(logical_call(&raws, amount, &key, &mut task_rng).await);
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    // Kill one proxy once a third of the calls are done; restart it on the same port.
    while (done.load(Ordering::Relaxed) as u64) < calls / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = 1;
    let addr = proxies[victim].addr.clone();
    proxies[victim].kill();
    eprintln!(
        "chaos: SIGKILLed proxy {victim} ({addr}) after {} calls",
        done.load(Ordering::Relaxed)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let restarted = tokio::task::spawn_blocking({
        let (addr, args) = (addr.clone(), args.clone());
        move || ProxyProcess::spawn(&addr, &args)
    })
    .await
    .expect("restart the proxy");
    assert_eq!(restarted.addr, addr, "restarted on the same port");
    proxies[victim] = restarted;
    eprintln!("chaos: restarted proxy {victim} on {addr}");

    let mut results = Vec::new();
    while let Some(joined) = clients.join_next().await {
        results.extend(joined.expect("a client task panicked"));
    }
    assert_eq!(results.len() as u64, calls);

    // Compare with the ledger: the amount names the logical call.
    let lines = ledger_lines(&ledger);
    let mut executions: HashMap<u64, Vec<String>> = HashMap::new();
    for line in &lines {
        let amount = line["amount"]
            .as_u64()
            .unwrap_or_else(|| panic!("ledger line without an integer amount: {line}"));
        assert!(
            (1..=calls).contains(&amount),
            "ledger line of no logical call: {line}"
        );
        let id = line["chargeId"].as_str().unwrap_or_default().to_owned();
        executions.entry(amount).or_default().push(id);
    }
    let (mut charged, mut tool_errors, mut unknown, mut gave_up, mut attempts) = (0, 0, 0, 0, 0);
    let mut problems = Vec::new();
    for result in &results {
        attempts += u64::from(result.attempts);
        let ids = executions
            .get(&result.amount)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if ids.len() > 1 {
            problems.push(format!(
                "call {} executed {} times: {ids:?} ({:?})",
                result.amount,
                ids.len(),
                result.outcome
            ));
        }
        match &result.outcome {
            Outcome::Charged(id) => {
                charged += 1;
                if ids != [id.clone()] {
                    problems.push(format!(
                        "call {} got {id} but the ledger has {ids:?}",
                        result.amount
                    ));
                }
            }
            Outcome::ToolError(body) => {
                tool_errors += 1;
                eprintln!(
                    "chaos: call {} ended in a tool error: {body}",
                    result.amount
                );
            }
            Outcome::Unknown => unknown += 1,
            Outcome::GaveUp(last) => {
                gave_up += 1;
                eprintln!(
                    "chaos: call {} gave up after {MAX_ATTEMPTS} attempts; last: {last}",
                    result.amount
                );
            }
        }
    }
    let duplicates = executions.values().filter(|ids| ids.len() > 1).count();
    let unknown_executed = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Unknown) && executions.contains_key(&r.amount))
        .count();
    eprintln!(
        "chaos report ({store}, seed {seed}, {:.1} s):\n  \
         logical calls {calls}: {charged} charged, {tool_errors} tool errors, \
         {unknown} outcome unknown ({unknown_executed} of them executed), {gave_up} gave up\n  \
         attempts {attempts}; connections {}\n  \
         faults: {} answers dropped, {} delayed past the timeout, {} requests cut off, \
         {} connections refused (proxy down), 1 proxy SIGKILLed and restarted\n  \
         executions (ledger lines) {}, duplicates {duplicates}",
        started.elapsed().as_secs_f64(),
        counts.connections.load(Ordering::Relaxed),
        counts.dropped.load(Ordering::Relaxed),
        counts.delayed.load(Ordering::Relaxed),
        counts.reset.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        lines.len(),
    );
    assert!(
        problems.is_empty(),
        "chaos ({store}, CHAOS_SEED={seed}):\n{}",
        problems.join("\n")
    );
    assert_eq!(duplicates, 0);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_proxies_sharing_redis() {
    let Some(url) = SharedStore::Redis.url() else {
        return;
    };
    chaos_run(&url, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_proxies_sharing_postgres() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    chaos_run(&url, "postgres").await;
}
