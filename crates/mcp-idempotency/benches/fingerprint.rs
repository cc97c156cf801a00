//! `fingerprint` on raw argument text versus `serde_json::to_string` of the same
//! arguments already parsed into a `Value`.

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

fn compare(c: &mut Criterion) {
    for (name, text) in [("small_200B", SMALL.to_owned()), ("large_1MB", large())] {
        let value: serde_json::Value =
            serde_json::from_str(&text).expect("bench input is valid JSON");
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function("serde_json_to_string", |b| {
            b.iter(|| serde_json::to_string(black_box(&value)).unwrap())
        });
        group.bench_function("fingerprint", |b| {
            b.iter(|| fingerprint(black_box("tool"), Some(black_box(text.as_str()))).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, compare);
criterion_main!(benches);
