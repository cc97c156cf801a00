//! A CI-sized chaos run over Streamable HTTP. 16 client tasks send keyed `charge_payment` calls
//! (each logical call has one key and a unique amount, and is retried with the same key until it
//! gets a definitive answer) to three `mcp-idem proxy` instances sharing one store (Redis, then
//! PostgreSQL; a namespace of their own) in front of one `demo-server --http`. Between the clients
//! and each proxy sits a TCP fault injector that, per connection and from a seeded RNG, drops the
//! answer after the proxy gave it, delays it past the client's timeout, or cuts the request off
//! before it is complete. It also knows which calls are in flight on its proxy (each request names
//! its call in an `x-chaos-call` header; the proxy's side of a connection stays open until the
//! proxy closed it). Proxies are killed (SIGKILL) mid-run and restarted on the same port with the
//! same arguments: once with `--after-crash reject`, three times with `reexecute`.
//!
//! At the end the demo server's ledger (one line per execution; the amount names the logical
//! call) is compared with what the clients saw (see `crate::support::chaos::verify`). With `reject`: no
//! logical call executed twice; every call the client saw succeed executed exactly once, with the
//! charge id the client got; calls answered `idempotency_outcome_unknown` (possible for calls in
//! flight at the SIGKILL) executed at most once. With `reexecute`: a call executed at most once
//! more per kill it was in flight at, and the charge id a client got is in the ledger.
//!
//! `CHAOS_CALLS` sets the number of logical calls (default 500), `CHAOS_SEED` the seed (default:
//! from the clock; printed either way). Run with `--nocapture` to see the report.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::chaos::{
    classify, executions, size_and_seed, unix_ms, verify, AfterCrash, AnswerMeans, CallResult,
    Outcome,
};
use crate::support::common::TIMEOUT;
use crate::support::http::{
    charge, ledger_in, unique_namespace, Answer, HttpDemo, Raw, SharedStore,
};

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

/// The connections one injector relays to its proxy, so that a kill can tell which calls were in
/// flight on the proxy.
#[derive(Default)]
struct Relayed {
    /// Set while the proxy is being killed and restarted: new connections are refused.
    down: bool,
    next: u64,
    /// Connections open to the proxy: the request bytes forwarded so far. A connection stays
    /// here until the proxy has closed it (after its whole answer), even if the client is gone.
    open: HashMap<u64, Arc<Mutex<Vec<u8>>>>,
}

/// The header naming the logical call of a request, for the injector.
const CALL_HEADER: &str = "x-chaos-call";

impl Relayed {
    /// Marks the proxy down and returns what was in flight on it: the logical calls whose request
    /// head reached it on a connection it has not closed yet. Call it before the kill and read
    /// the bytes after it ([`call_in`]), so a request forwarded meanwhile is not missed.
    fn go_down(&mut self) -> Vec<Arc<Mutex<Vec<u8>>>> {
        self.down = true;
        self.open.values().cloned().collect()
    }
}

/// The logical call named by the [`CALL_HEADER`] in forwarded request bytes, if they got that far.
fn call_in(bytes: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(bytes).to_ascii_lowercase();
    let (_, rest) = text.split_once(&format!("\r\n{CALL_HEADER}:"))?;
    let (value, _) = rest.split_once("\r\n")?;
    value.trim().parse().ok()
}

/// A TCP forwarder on loopback in front of `target`, injecting faults per connection. Returns the
/// address it listens on.
async fn start_injector(
    target: String,
    rng: Arc<Mutex<StdRng>>,
    counts: Arc<FaultCounts>,
    relayed: Arc<Mutex<Relayed>>,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            counts.connections.fetch_add(1, Ordering::Relaxed);
            let roll: f64 = rng.lock().unwrap().random();
            let fault = if roll < P_DROP {
                Fault::DropResponse
            } else if roll < P_DROP + P_DELAY {
                Fault::Delay
            } else if roll < P_DROP + P_DELAY + P_RESET {
                Fault::Reset
            } else {
                Fault::None
            };
            let registered = {
                let mut relayed = relayed.lock().unwrap();
                if relayed.down {
                    None
                } else {
                    relayed.next += 1;
                    let id = relayed.next;
                    let bytes = Arc::new(Mutex::new(Vec::new()));
                    relayed.open.insert(id, Arc::clone(&bytes));
                    Some((id, bytes))
                }
            };
            let Some((id, bytes)) = registered else {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let (target, counts, relayed) =
                (target.clone(), Arc::clone(&counts), Arc::clone(&relayed));
            tokio::spawn(async move {
                let _ = relay(client, &target, fault, &counts, bytes).await;
                relayed.lock().unwrap().open.remove(&id);
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
    forwarded: Arc<Mutex<Vec<u8>>>,
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
        forwarded.lock().unwrap().extend_from_slice(&buf[..n / 2]);
        upstream_write.write_all(&buf[..n / 2]).await?;
        counts.reset.fetch_add(1, Ordering::Relaxed);
        return Ok(()); // dropping both sides closes them
    }
    // Client to proxy. When the client is done (or gone, after its timeout) the proxy's side
    // stays open, so the proxy finishes the call as if the client still waited, and the
    // connection counts as in flight until the proxy closes it.
    let requests = tokio::spawn(async move {
        let mut buf = vec![0; 16 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    forwarded.lock().unwrap().extend_from_slice(&buf[..n]);
                    if upstream_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        std::future::pending::<()>().await;
    });
    let result = async {
        match fault {
            Fault::None | Fault::Reset => {
                // Relay the answer; a client that left stops the relaying, not the reading.
                let mut buf = vec![0; 16 * 1024];
                let mut client_there = true;
                loop {
                    let n = upstream_read.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    if client_there {
                        client_there = client_write.write_all(&buf[..n]).await.is_ok();
                    }
                }
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

/// One attempt: `None` when no whole answer came (connection error or timeout).
pub(crate) async fn attempt(raw: &Raw, amount: u64, message: &serde_json::Value) -> Option<Answer> {
    let request = raw
        .post(message)
        .header(http::header::CONNECTION, "close")
        .header(CALL_HEADER, amount)
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
pub(crate) fn response_of(body: &str) -> Option<serde_json::Value> {
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
pub(crate) async fn logical_call(
    raws: &[Raw],
    amount: u64,
    key: &str,
    rng: &mut StdRng,
) -> CallResult {
    let mut attempts = 0;
    let mut last = String::from("no attempt");
    let mut history = Vec::new();
    while attempts < MAX_ATTEMPTS {
        attempts += 1;
        let proxy = rng.random_range(0..raws.len());
        let raw = &raws[proxy];
        let message = charge(u64::from(attempts), amount, Some(key));
        let mut pause = Duration::from_millis(50);
        let answer = attempt(raw, amount, &message).await;
        history.push(format!(
            "{} proxy {proxy}: {}",
            unix_ms(),
            answer.as_ref().map_or_else(
                || "no answer".to_owned(),
                |a| format!(
                    "HTTP {} {}",
                    a.status,
                    a.body.chars().take(200).collect::<String>()
                )
            )
        ));
        match answer {
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
                match classify(&json, &answer.body) {
                    AnswerMeans::Final(outcome) => {
                        return CallResult {
                            amount,
                            outcome,
                            attempts,
                            history,
                        }
                    }
                    AnswerMeans::Retry { pause: wait, why } => {
                        if let Some(wait) = wait {
                            pause = wait;
                        }
                        last = why;
                    }
                }
            }
        }
        tokio::time::sleep(pause).await;
    }
    CallResult {
        amount,
        outcome: Outcome::GaveUp(last),
        attempts,
        history,
    }
}

async fn chaos_run(store_url: &str, store: &str, after_crash: AfterCrash, kills: usize) {
    let (calls, seed) = size_and_seed(500);
    let name = format!("{store}, {}", after_crash.arg());
    eprintln!("chaos ({name}): {calls} logical calls, CHAOS_SEED={seed}");
    let started = std::time::Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace(&format!("chaos-{store}-{}", after_crash.arg()));
    let args: Vec<String> = [
        "--upstream",
        &server.base_url(),
        "--store",
        store_url,
        "--namespace",
        &namespace,
        "--lease",
        "2s",
        "--after-crash",
        after_crash.arg(),
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
    let mut relayed = Vec::new();
    for proxy in &proxies {
        let front_relayed = Arc::new(Mutex::new(Relayed::default()));
        let front = start_injector(
            proxy.addr.clone(),
            Arc::clone(&rng),
            Arc::clone(&counts),
            Arc::clone(&front_relayed),
        )
        .await;
        fronts.push(format!("http://{front}/mcp"));
        relayed.push(front_relayed);
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

    // A line per tenth of the calls done, so that a long run shows how far it got.
    let progress = tokio::spawn({
        let done = Arc::clone(&done);
        async move {
            let mut reported = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let tenths = done.load(Ordering::Relaxed) as u64 * 10 / calls.max(1);
                if tenths > reported {
                    reported = tenths;
                    eprintln!(
                        "chaos: {} of {calls} calls done after {:.0} s",
                        done.load(Ordering::Relaxed),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        }
    });

    // Kill a proxy each time another 1/(kills + 1) of the calls are done; restart it on the same
    // port. What was in flight on it at the kill may run twice with `reexecute`.
    let mut in_flight_at_kills: HashMap<u64, u64> = HashMap::new();
    for kill in 0..kills {
        let due = calls * (kill as u64 + 1) / (kills as u64 + 1);
        while (done.load(Ordering::Relaxed) as u64) < due {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let victim = (kill + 1) % INSTANCES;
        let addr = proxies[victim].addr.clone();
        let open = relayed[victim].lock().unwrap().go_down();
        proxies[victim].kill();
        let mut in_flight: Vec<u64> = open
            .iter()
            .filter_map(|bytes| call_in(&bytes.lock().unwrap()))
            .collect();
        in_flight.sort_unstable();
        in_flight.dedup();
        eprintln!(
            "chaos: SIGKILLed proxy {victim} ({addr}) after {} calls, {} calls in flight on it",
            done.load(Ordering::Relaxed),
            in_flight.len()
        );
        for amount in in_flight {
            *in_flight_at_kills.entry(amount).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let restarted = tokio::task::spawn_blocking({
            let (addr, args) = (addr.clone(), args.clone());
            move || ProxyProcess::spawn(&addr, &args)
        })
        .await
        .expect("restart the proxy");
        assert_eq!(restarted.addr, addr, "restarted on the same port");
        proxies[victim] = restarted;
        relayed[victim].lock().unwrap().down = false;
        eprintln!("chaos: restarted proxy {victim} on {addr}");
    }

    let mut results = Vec::new();
    while let Some(joined) = clients.join_next().await {
        results.extend(joined.expect("a client task panicked"));
    }
    progress.abort();
    assert_eq!(results.len() as u64, calls);

    // Compare with the ledger: the amount names the logical call.
    let executions = executions(&ledger, calls);
    let verdict = verify(&results, &executions, after_crash, &in_flight_at_kills);
    eprintln!(
        "chaos report ({name}, seed {seed}, {:.1} s):\n  {}\n  \
         connections {}; faults: {} answers dropped, {} delayed past the timeout, \
         {} requests cut off, {} connections refused (proxy down), \
         {kills} proxy SIGKILLs and restarts ({} calls in flight on them)",
        started.elapsed().as_secs_f64(),
        verdict.summary(calls),
        counts.connections.load(Ordering::Relaxed),
        counts.dropped.load(Ordering::Relaxed),
        counts.delayed.load(Ordering::Relaxed),
        counts.reset.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        verdict.in_flight_at_kills,
    );
    verdict.assert_ok(&name, seed);
    if after_crash == AfterCrash::Reject {
        assert_eq!(verdict.duplicated_calls, 0);
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_proxies_sharing_redis() {
    let Some(url) = SharedStore::Redis.url() else {
        return;
    };
    chaos_run(&url, "redis", AfterCrash::Reject, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_proxies_sharing_postgres() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    chaos_run(&url, "postgres", AfterCrash::Reject, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_proxies_sharing_redis_reexecute() {
    let Some(url) = SharedStore::Redis.url() else {
        return;
    };
    chaos_run(&url, "redis", AfterCrash::Reexecute, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_proxies_sharing_postgres_reexecute() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    chaos_run(&url, "postgres", AfterCrash::Reexecute, 3).await;
}
