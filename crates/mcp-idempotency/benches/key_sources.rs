//! What a `tools/call` costs by where its key comes from (issue 34), through the embedded driver
//! (`Connection::from_client`, then `from_server` with the answer) on the memory store, as a
//! ratio to a baseline measured in the same run:
//!
//! - (a) a call no policy matches, on a gateway with policies for other tools (the interceptor
//!   reads the params to find the tool's name), against the same call on a gateway without any
//!   policy (today's pass-through: a substring check, nothing parsed further); with small (about
//!   200 bytes) and 10 KB arguments;
//! - (b) a call keyed by a business identifier (`key-from`), by `_meta.idempotencyKey`, by a key
//!   argument and by a duplicate window, against the same call keyed by a SEP `idempotencyKey`.
//!
//! Every keyed call has a fresh key (identifier, arguments), so each is claimed, forwarded and its
//! answer recorded, as a first call is. Messages are built before they are counted.
//!
//! ```sh
//! cargo bench -p mcp-idempotency --features embedded --bench key_sources [-- --rounds N]
//! cargo bench -p mcp-idempotency --features embedded --bench key_sources -- --instructions [CALLS]
//! ... -- --rows 0,2,4   # only these rows (0 is the first printed) and their baselines
//! ```
//!
//! Timed (the default): the rows run in short batches (about 0.5 ms) in a rotating order, many
//! rounds, and each row's fastest and median batch are compared with its baseline's, as the
//! `fingerprint` bench does on this shared machine. `--instructions`: the bench runs itself under
//! valgrind's callgrind once per row (300 calls to warm up, then CALLS counted, default 2000) and
//! prints user-space instructions per call, the same figure on every run of one build (needs the
//! Debian package `valgrind`). Valgrind's CPU has no SHA extensions, so there SHA-256 runs in
//! software, about 20 times the instructions of SHA-NI: the keyed rows' counts weigh hashing far
//! above its share of their time; the timed ratios are the ones to read for them.

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

mod timing;
use timing::{fastest, median};

use mcp_idempotency::embedded::{Connection, Embedded, FromClient, FromServer, Settings};
use tokio::runtime::Runtime;

/// The policies of the gateways that have some: none of them names `lookup`.
const POLICIES: &str = r#"{
    "charge": {"key-from": ["/order_id"]},
    "refund": {"key-argument": "idempotency_key"},
    "notify": {"window": "30s"}
}"#;

/// One configuration measured: a gateway and the calls it is given.
#[derive(Clone, Copy)]
struct Row {
    name: &'static str,
    /// The row whose cost this one is compared with (itself for a baseline).
    baseline: usize,
    /// Whether the gateway has [`POLICIES`].
    policies: bool,
    /// What the call carries (and so what decides it).
    call: Call,
}

#[derive(Clone, Copy, PartialEq)]
enum Call {
    /// `lookup`, no key: forwarded untouched; `true` for 10 KB arguments.
    PassThrough { large: bool },
    /// `charge` with `params.idempotencyKey`.
    Sep,
    /// `charge` without a key, its `order_id` the identifier.
    KeyFrom,
    /// `charge` with `params._meta.idempotencyKey`.
    Meta,
    /// `refund` with an `idempotency_key` argument.
    Argument,
    /// `notify` without a key, under a 30 s window.
    Window,
}

const ROWS: [Row; 9] = [
    Row {
        name: "pass-through, no policy at all",
        baseline: 0,
        policies: false,
        call: Call::PassThrough { large: false },
    },
    Row {
        name: "pass-through, policies for other tools",
        baseline: 0,
        policies: true,
        call: Call::PassThrough { large: false },
    },
    Row {
        name: "pass-through 10 KB, no policy at all",
        baseline: 2,
        policies: false,
        call: Call::PassThrough { large: true },
    },
    Row {
        name: "pass-through 10 KB, policies for other tools",
        baseline: 2,
        policies: true,
        call: Call::PassThrough { large: true },
    },
    Row {
        name: "SEP idempotencyKey",
        baseline: 4,
        policies: false,
        call: Call::Sep,
    },
    Row {
        name: "key-from /order_id",
        baseline: 4,
        policies: true,
        call: Call::KeyFrom,
    },
    Row {
        name: "_meta.idempotencyKey",
        baseline: 4,
        policies: false,
        call: Call::Meta,
    },
    Row {
        name: "key-argument idempotency_key",
        baseline: 4,
        policies: true,
        call: Call::Argument,
    },
    Row {
        name: "window 30s",
        baseline: 4,
        policies: true,
        call: Call::Window,
    },
];

/// About 200 bytes of arguments, as a payment tool takes them; `n` makes each call new.
fn arguments(n: u64, extra: &str) -> String {
    format!(
        r#"{{"order_id":"ord_{n:010}","customer_id":"cus_9f8e7d6c","amount":1999,"currency":"usd","description":"Order #1042 – rush","items":[{{"sku":"A-17","qty":2,"price":9.995}}],"metadata":{{"source":"web","retry":false}}{extra}}}"#
    )
}

/// About 10 KB of search filters, for the large pass-through rows (non-ASCII text as UTF-8, as
/// most encoders write it: a `\u` escape anywhere sends a call down the parsing path).
fn large_extra() -> String {
    let mut extra = String::from(r#","filters":["#);
    let mut i = 0;
    while extra.len() < 10_000 {
        if i > 0 {
            extra.push(',');
        }
        extra.push_str(&format!(
            r#"{{"field":"line_items.{i}.sku","op":"in","values":["A-{i}","B-{i}","C-{i}"],"note":"an escaped \"quote\", and café"}}"#
        ));
        i += 1;
    }
    extra.push(']');
    extra
}

/// The request and the server's answer of call `n` of `call`.
fn messages(call: Call, n: u64, large: &str) -> (String, String) {
    let params = match call {
        Call::PassThrough { large: is_large } => format!(
            r#"{{"name":"lookup","arguments":{}}}"#,
            arguments(n, if is_large { large } else { "" })
        ),
        Call::Sep => format!(
            r#"{{"name":"charge","arguments":{},"idempotencyKey":"k-{n:016}"}}"#,
            arguments(n, "")
        ),
        Call::KeyFrom => format!(r#"{{"name":"charge","arguments":{}}}"#, arguments(n, "")),
        Call::Meta => format!(
            r#"{{"name":"charge","arguments":{},"_meta":{{"idempotencyKey":"k-{n:016}"}}}}"#,
            arguments(n, "")
        ),
        Call::Argument => format!(
            r#"{{"name":"refund","arguments":{}}}"#,
            arguments(n, &format!(r#","idempotency_key":"k-{n:016}""#))
        ),
        Call::Window => format!(r#"{{"name":"notify","arguments":{}}}"#, arguments(n, "")),
    };
    (
        format!(r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{params}}}"#),
        format!(
            r#"{{"jsonrpc":"2.0","id":{n},"result":{{"content":[{{"type":"text","text":"done {n}"}}]}}}}"#
        ),
    )
}

/// A row's gateway, its connection, and the number of the next call.
struct Gateway {
    _embedded: Embedded,
    connection: Connection,
    next: u64,
}

fn open(runtime: &Runtime, row: &Row) -> Gateway {
    let mut settings = Settings::new("bench-key-sources");
    let mut set = |name: &str, value: &str| settings.set(name, value).expect(name);
    set("store", "memory");
    set("principal", "bench");
    // Every call is recorded: room for every round of every run.
    set("max-records-per-scope", "100000000");
    set("max-records-total", "100000000");
    if row.policies {
        set("tools", POLICIES);
    }
    let embedded = runtime.block_on(settings.open()).expect("memory gateway");
    let connection = embedded.connect(None);
    Gateway {
        _embedded: embedded,
        connection,
        next: 1,
    }
}

/// The next `count` calls of `row` on `gateway`, built.
fn next_calls(gateway: &mut Gateway, row: &Row, count: u64, large: &str) -> Vec<(String, String)> {
    let first = gateway.next;
    gateway.next += count;
    (first..first + count)
        .map(|n| messages(row.call, n, large))
        .collect()
}

/// Hands each call and its answer to the gateway, as a server's transport would: what is
/// measured. Never inlined, so that callgrind counts it alone (`--toggle-collect`).
#[inline(never)]
fn counted_calls(
    runtime: &Runtime,
    connection: &Connection,
    calls: &[(String, String)],
    keyed: bool,
) {
    hand_over(runtime, connection, calls, keyed);
}

/// Hands each call and its answer to the gateway (uncounted: the warm-up of [`one_row`]).
fn hand_over(runtime: &Runtime, connection: &Connection, calls: &[(String, String)], keyed: bool) {
    runtime.block_on(async {
        for (request, answer) in calls {
            match connection.from_client(black_box(request)).await {
                FromClient::ForwardRewritten(_) if keyed => {}
                FromClient::Forward if !keyed => {}
                other => panic!("unexpected {other:?} for {request}"),
            }
            let answered = connection.from_server(black_box(answer)).await;
            assert!(matches!(answered, FromServer::Forward), "{answered:?}");
        }
    });
}

fn run(runtime: &Runtime, gateway: &mut Gateway, row: &Row, count: u64, large: &str) -> Duration {
    let calls = next_calls(gateway, row, count, large);
    let keyed = !matches!(row.call, Call::PassThrough { .. });
    let start = Instant::now();
    counted_calls(runtime, &gateway.connection, &calls, keyed);
    start.elapsed() / count as u32
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn arg_after(flag: &str) -> Option<Option<String>> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == flag)?;
    Some(args.get(at + 1).filter(|v| !v.starts_with("--")).cloned())
}

fn main() {
    if let Some(row) = arg_after("--row").flatten() {
        let calls = arg_after("--calls").flatten().and_then(|n| n.parse().ok());
        return one_row(row.parse().expect("--row N"), calls.unwrap_or(2000));
    }
    let rows = selected_rows();
    if let Some(calls) = arg_after("--instructions") {
        return instructions(&rows, calls.and_then(|n| n.parse().ok()).unwrap_or(2000));
    }
    let rounds = arg_after("--rounds")
        .flatten()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    timed(&rows, rounds);
}

/// The rows `--rows 0,2,4` names (by their place in [`ROWS`]) and their baselines; all by default.
fn selected_rows() -> Vec<usize> {
    let Some(list) = arg_after("--rows").flatten() else {
        return (0..ROWS.len()).collect();
    };
    let mut rows: Vec<usize> = list
        .split(',')
        .map(|n| n.trim().parse().expect("--rows takes row numbers, 0 to 8"))
        .flat_map(|at: usize| [ROWS[at].baseline, at])
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// The rows in rotating order, `rounds` times; fastest and median batch of each, and their ratios
/// to the row's baseline.
fn timed(rows: &[usize], rounds: usize) {
    let runtime = runtime();
    let large = large_extra();
    let mut gateways: Vec<Gateway> = rows.iter().map(|&at| open(&runtime, &ROWS[at])).collect();
    // Warm up, and size each row's batch to about 0.5 ms.
    let mut sizes = Vec::new();
    for (gateway, &at) in gateways.iter_mut().zip(rows) {
        run(&runtime, gateway, &ROWS[at], 300, &large);
        let per_call = run(&runtime, gateway, &ROWS[at], 300, &large);
        let size = (Duration::from_micros(500).as_nanos() / per_call.as_nanos().max(1)).max(20);
        sizes.push(size as u64);
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); rows.len()];
    for round in 0..rounds {
        for step in 0..rows.len() {
            let i = (round + step) % rows.len();
            let (row, gateway) = (&ROWS[rows[i]], &mut gateways[i]);
            samples[i].push(run(&runtime, gateway, row, sizes[i], &large));
        }
    }
    println!(
        "key sources: from_client + from_server per call, memory store, {rounds} rounds of ~0.5 ms \
         batches"
    );
    println!(
        "{:<46} {:>9} {:>7} {:>9} {:>7}",
        "row", "best", "ratio", "median", "ratio"
    );
    let best: Vec<Duration> = samples.iter().map(|s| fastest(s)).collect();
    let mid: Vec<Duration> = samples.iter().map(|s| median(s)).collect();
    let place = |at: usize| {
        rows.iter()
            .position(|&r| r == at)
            .expect("baseline selected")
    };
    for (i, &at) in rows.iter().enumerate() {
        let (row, b) = (&ROWS[at], place(ROWS[at].baseline));
        println!(
            "{:<46} {:>9} {:>6.3}x {:>9} {:>6.3}x",
            row.name,
            format!("{} ns", best[i].as_nanos()),
            ratio(best[i], best[b]),
            format!("{} ns", mid[i].as_nanos()),
            ratio(mid[i], mid[b]),
        );
    }
}

/// One row under callgrind (spawned by [`instructions`]): warm-up calls, then `calls` counted.
fn one_row(at: usize, calls: u64) {
    let runtime = runtime();
    let large = large_extra();
    let row = &ROWS[at];
    let mut gateway = open(&runtime, row);
    let keyed = !matches!(row.call, Call::PassThrough { .. });
    let warm_up = next_calls(&mut gateway, row, 300, &large);
    hand_over(&runtime, &gateway.connection, &warm_up, keyed);
    let counted = next_calls(&mut gateway, row, calls, &large);
    counted_calls(&runtime, &gateway.connection, &counted, keyed);
}

/// Each row in a process of its own under callgrind; instructions per call and the ratio to the
/// row's baseline.
fn instructions(rows: &[usize], calls: u64) {
    let me = std::env::current_exe().expect("the bench's own path");
    let work = std::env::temp_dir().join(format!("key-sources-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("a temporary directory");
    println!(
        "key sources: instructions per call (from_client + from_server), memory store, {calls} \
         calls a row"
    );
    println!("{:<46} {:>12} {:>8}", "row", "instructions", "ratio");
    let mut counts = vec![f64::NAN; ROWS.len()];
    for &at in rows {
        let out = work.join(format!("row-{at}.out"));
        let status = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--collect-atstart=no")
            .arg("--toggle-collect=*::counted_calls")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&me)
            .args(["--row", &at.to_string(), "--calls", &calls.to_string()])
            .stderr(std::process::Stdio::null())
            .status()
            .expect("valgrind (Debian package valgrind) runs");
        assert!(status.success(), "row {at} under callgrind: {status}");
        let text = std::fs::read_to_string(&out).expect("callgrind's output");
        let total: u64 = text
            .lines()
            .find_map(|line| line.strip_prefix("totals:"))
            .and_then(|t| t.split_whitespace().next()?.parse().ok())
            .expect("callgrind's totals line");
        counts[at] = total as f64 / calls as f64;
        let row = &ROWS[at];
        println!(
            "{:<46} {:>12.0} {:>7.3}x",
            row.name,
            counts[at],
            counts[at] / counts[row.baseline]
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}
