//! `fingerprint` on raw argument text versus `serde_json::to_string` of the same
//! arguments already parsed into a `Value`, as a ratio measured in one process.
//!
//! The machine is shared, so a single long timing mostly measures the neighbours.
//! Instead the two functions run in short alternating batches, many rounds each, and
//! the ratio is taken between their fastest batches (the rounds least disturbed) and,
//! as a check, between their median batches.
//!
//! `cargo bench -p mcp-idempotency --bench fingerprint [-- --rounds N]`

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

mod timing;
use timing::{fastest, median};

use mcp_idempotency::fingerprint::fingerprint;

/// About 200 bytes, members in the order a client struct would emit them.
const SMALL: &str = r#"{"customer_id":"cus_9f8e7d6c","amount":1999,"currency":"usd","description":"Order #1042 – rush","items":[{"sku":"A-17","qty":2,"price":9.995}],"metadata":{"source":"web","retry":false},"dry_run":false}"#;

/// Deterministic xorshift so the large input is identical on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const WORDS: [&str; 8] = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "Zürich",
    "naïve",
    "quote\\\"d",
    "tab\\tsep",
];

/// About 1 MB: an array of customer records mixing strings (some escaped or non-ASCII),
/// integers, decimals, booleans, nulls and nested objects and arrays.
fn large() -> String {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut s = String::from(r#"{"version":3,"records":["#);
    let mut i = 0u64;
    while s.len() < 1_000_000 {
        if i > 0 {
            s.push(',');
        }
        let r = rng.next();
        write!(
            s,
            r#"{{"id":{i},"name":"customer-{:x}","email":"user{i}@example.com","active":{},"balance":{}.{:02},"#,
            r >> 40,
            r & 1 == 0,
            r % 100_000,
            (r >> 20) % 100,
        )
        .unwrap();
        s.push_str(r#""tags":["#);
        for t in 0..(r % 4) {
            if t > 0 {
                s.push(',');
            }
            write!(s, r#""{}""#, WORDS[(rng.next() % 8) as usize]).unwrap();
        }
        write!(
            s,
            r#"],"address":{{"street":"{} Main Street","city":"{}","zip":"{:05}","geo":{{"lat":{:.4},"lng":{:.4}}}}},"#,
            r % 997,
            WORDS[(r >> 8) as usize % 8],
            r % 99_999,
            (r % 18_000) as f64 / 100.0 - 90.0,
            (r % 36_000) as f64 / 100.0 - 180.0,
        )
        .unwrap();
        s.push_str(r#""notes":"Customer asked for \"express\" shipping.\nCall before 5pm \u00e9t\u00e9 \ud83d\ude00 — thanks!","#);
        s.push_str(r#""history":["#);
        for h in 0..(1 + r % 3) {
            if h > 0 {
                s.push(',');
            }
            let e = rng.next();
            write!(
                s,
                r#"{{"ts":{},"amount":-{}.{},"kind":"{}","ref":null}}"#,
                1_700_000_000 + e % 10_000_000,
                e % 500,
                e % 10,
                if e & 1 == 0 { "debit" } else { "credit" },
            )
            .unwrap();
        }
        write!(s, r#"],"score":{},"ratio":{}e-3}}"#, r % 1000, r % 97).unwrap();
        i += 1;
    }
    s.push_str(r#"],"meta":{"generated":"2025-01-01T00:00:00Z","count":"#);
    write!(s, "{i}}}}}").unwrap();
    s
}

/// Per-call time of `f`, run `iterations` times in a row.
fn batch(iterations: u32, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed() / iterations
}

/// How many calls of `f` fill about `target`.
fn calibrate(target: Duration, mut f: impl FnMut()) -> u32 {
    let mut iterations = 1u32;
    loop {
        let start = Instant::now();
        for _ in 0..iterations {
            f();
        }
        if start.elapsed() >= target || iterations >= 1 << 24 {
            return iterations;
        }
        iterations *= 2;
    }
}

struct Timings {
    serde: Vec<Duration>,
    fingerprint: Vec<Duration>,
}

fn measure(text: &str, rounds: usize) -> Timings {
    let value: serde_json::Value = serde_json::from_str(text).expect("bench input is valid JSON");
    let serde = || {
        black_box(serde_json::to_string(black_box(&value)).unwrap());
    };
    let fp = || {
        black_box(fingerprint(black_box("tool"), Some(black_box(text))).unwrap());
    };
    let target = Duration::from_micros(500);
    let iterations = calibrate(target, serde).max(calibrate(target, fp)).max(1);
    let mut timings = Timings {
        serde: Vec::with_capacity(rounds),
        fingerprint: Vec::with_capacity(rounds),
    };
    for round in 0..rounds {
        // Alternate which goes first, so neither always runs on a cache the other warmed.
        if round % 2 == 0 {
            timings.serde.push(batch(iterations, serde));
            timings.fingerprint.push(batch(iterations, fp));
        } else {
            timings.fingerprint.push(batch(iterations, fp));
            timings.serde.push(batch(iterations, serde));
        }
    }
    timings
}

fn format(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 10_000 {
        format!("{:.3} ms", ns as f64 / 1e6)
    } else {
        format!("{ns} ns")
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

fn rounds_from_args() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(400)
}

fn main() {
    let rounds = rounds_from_args();
    println!(
        "fingerprint vs serde_json::to_string, {rounds} alternating rounds of ~0.5 ms batches"
    );
    println!(
        "{:<12} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}",
        "input", "serde best", "fp best", "ratio", "serde median", "fp median", "ratio"
    );
    for (name, text) in [("small_200B", SMALL.to_owned()), ("large_1MB", large())] {
        let t = measure(&text, rounds);
        let (sb, fb) = (fastest(&t.serde), fastest(&t.fingerprint));
        let (sm, fm) = (median(&t.serde), median(&t.fingerprint));
        println!(
            "{:<12} {:>12} {:>12} {:>7.2}x {:>12} {:>12} {:>7.2}x",
            name,
            format(sb),
            format(fb),
            ratio(fb, sb),
            format(sm),
            format(fm),
            ratio(fm, sm),
        );
    }
}
