//! Operating `mcp-idem proxy` and `mcp-idem wrap`: Prometheus counters on `--metrics-listen`
//! after real calls, replays and conflicts; `/healthz` and `/readyz` on the metrics listener and on
//! the proxy's own address; `/readyz` following a Redis store that goes down and comes back (a
//! private `redis-server` on a free port, started and killed by the test).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::common::{free_port, ledger_lines, PrivateRedis, TIMEOUT};
use crate::support::http::{charge, ledger_in, sqlite_in, HttpDemo, Proxy, Raw};
use crate::support::wrap::Sandbox;

/// `GET path` on `authority` (`HOST:PORT`): the status and the body.
fn get(authority: &str, path: &str) -> (u16, String) {
    let mut stream =
        TcpStream::connect(authority).unwrap_or_else(|err| panic!("{authority}: {err}"));
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// The metrics listener's `HOST:PORT`, from the `mcp-idem: metrics on http://…/metrics` line.
pub(crate) fn metrics_authority(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("mcp-idem: metrics on http://"))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in stderr:\n{stderr}"))
        .to_owned()
}

/// The value of the sample `series` (name and labels exactly as exported) in a scrape.
pub(crate) fn sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{scrape}"))
}

pub(crate) fn scrape(authority: &str) -> String {
    let (status, body) = get(authority, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

fn rejections(scrape: &str, kind: &str) -> f64 {
    sample(
        scrape,
        &format!("mcp_idem_rejections_total{{type=\"{kind}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_metrics_count_executions_replays_and_rejections() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let proxy = Proxy::spawn(
        &server.base_url(),
        &[
            "--store",
            &store,
            "--metrics-listen",
            "127.0.0.1:0",
            "--max-records-total",
            "5000",
        ],
    );
    let metrics = metrics_authority(&proxy.stderr());
    let raw = Raw::new(&proxy);

    let before = scrape(&metrics);
    assert_eq!(sample(&before, "mcp_idem_executions_total"), 0.0);
    // The limits in force, for the quota alert (deploy/prometheus/alerts.yml).
    assert_eq!(
        sample(&before, "mcp_idem_record_limit{limit=\"total\"}"),
        5000.0
    );
    assert!(sample(&before, "mcp_idem_record_limit{limit=\"per_scope\"}") > 0.0);
    assert_eq!(rejections(&before, "idempotency_key_conflict"), 0.0);
    // Counted on this first scrape; later scrapes within 10 s reuse the counts (the wrap test below
    // checks a count after calls).
    assert_eq!(
        sample(&before, "mcp_idem_records{state=\"completed\"}"),
        0.0
    );

    let first = raw.call(charge(1, 10, Some("order-1"))).await;
    assert!(first.charge_id().is_some(), "{}", first.body);
    let replay = raw.call(charge(2, 10, Some("order-1"))).await;
    assert_eq!(replay.charge_id(), first.charge_id());
    let conflict = raw.call(charge(3, 11, Some("order-1"))).await;
    assert_eq!(
        conflict.error_type().as_deref(),
        Some("idempotency_key_conflict")
    );
    let invalid = raw.call(charge(4, 12, Some(""))).await;
    assert_eq!(
        invalid.error_type().as_deref(),
        Some("idempotency_key_invalid")
    );
    let unkeyed = raw.call(charge(5, 13, None)).await;
    assert!(unkeyed.charge_id().is_some(), "{}", unkeyed.body);
    assert_eq!(ledger_lines(&ledger).len(), 2);

    let after = scrape(&metrics);
    assert_eq!(sample(&after, "mcp_idem_executions_total"), 1.0);
    assert_eq!(
        sample(&after, "mcp_idem_replays_total{outcome=\"result\"}"),
        1.0
    );
    assert_eq!(rejections(&after, "idempotency_key_conflict"), 1.0);
    assert_eq!(rejections(&after, "idempotency_key_invalid"), 1.0);
    assert_eq!(rejections(&after, "idempotency_key_in_progress"), 0.0);
    assert_eq!(rejections(&after, "idempotency_store_unavailable"), 0.0);
    assert_eq!(
        sample(&after, "mcp_idem_bypasses_total{reason=\"no_key\"}"),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            "mcp_idem_outcomes_recorded_total{outcome=\"success\"}"
        ),
        1.0
    );
    // Three claims reached the store (execute, replay, conflict); the invalid key did not.
    assert_eq!(
        sample(
            &after,
            "mcp_idem_store_operation_duration_seconds_count{operation=\"claim\"}"
        ),
        3.0
    );
    assert_eq!(
        sample(
            &after,
            "mcp_idem_store_operation_duration_seconds_count{operation=\"complete\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            "mcp_idem_store_errors_total{operation=\"claim\",error=\"unavailable\"}"
        ),
        0.0
    );
    assert!(after.contains("# TYPE mcp_idem_store_operation_duration_seconds histogram"));

    // Health on the metrics listener and on the proxy's own address (answered, not forwarded).
    let proxy_authority = proxy
        .url
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix("/mcp"))
        .unwrap()
        .to_owned();
    for authority in [&metrics, &proxy_authority] {
        assert_eq!(get(authority, "/healthz"), (200, "ok\n".to_owned()));
        assert_eq!(get(authority, "/readyz"), (200, "ready\n".to_owned()));
    }
}

#[test]
fn wrap_serves_metrics_while_it_runs() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&["--metrics-listen", "127.0.0.1:0"]);
    let arguments = json!({"amount": 5, "currency": "EUR"});
    let first = wrap.request(crate::support::wrap::charge(1, arguments.clone(), "w-1"));
    let charged = crate::support::wrap::charge_id(&first);
    let replay = wrap.request(crate::support::wrap::charge(2, arguments, "w-1"));
    assert_eq!(crate::support::wrap::charge_id(&replay), charged);
    let conflict = wrap.request(crate::support::wrap::charge(
        3,
        json!({"amount": 6, "currency": "EUR"}),
        "w-1",
    ));
    crate::support::wrap::assert_rejected(
        &conflict,
        -32602,
        "idempotency_key_conflict",
        Some("w-1"),
    );

    let metrics = metrics_authority(&wrap.stderr());
    let scraped = scrape(&metrics);
    assert_eq!(sample(&scraped, "mcp_idem_executions_total"), 1.0);
    assert_eq!(
        sample(&scraped, "mcp_idem_replays_total{outcome=\"result\"}"),
        1.0
    );
    assert_eq!(rejections(&scraped, "idempotency_key_conflict"), 1.0);
    assert_eq!(
        sample(&scraped, "mcp_idem_records{state=\"completed\"}"),
        1.0
    );
    assert_eq!(get(&metrics, "/readyz").0, 200);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_eq!(wrap.finish().code(), Some(0));
}

/// Polls `GET /readyz` until it answers `status`; panics after 30 s.
fn wait_for_readyz(authority: &str, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (got, body) = get(authority, "/readyz");
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz on {authority} stayed {got} ({body}), expected {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn readyz_follows_the_redis_store() {
    let port = free_port();
    let Some(redis) = PrivateRedis::start(port) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "redis-server could not be started: CI=true requires it"
        );
        eprintln!("note: redis-server not available; test skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = HttpDemo::spawn(&ledger_in(&dir), &[]);
    let store = format!("redis://127.0.0.1:{port}");
    let proxy = Proxy::spawn(
        &server.base_url(),
        &["--store", &store, "--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = metrics_authority(&proxy.stderr());
    let proxy_authority = proxy
        .url
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix("/mcp"))
        .unwrap()
        .to_owned();
    assert_eq!(get(&metrics, "/readyz").0, 200);
    assert_eq!(get(&proxy_authority, "/readyz").0, 200);

    drop(redis);
    let body = wait_for_readyz(&proxy_authority, 503);
    assert!(body.starts_with("not ready: "), "{body}");
    assert_eq!(get(&metrics, "/readyz").0, 503);
    // Alive all the same.
    assert_eq!(get(&proxy_authority, "/healthz").0, 200);
    let scraped = scrape(&metrics);
    let get_errors: f64 = scraped
        .lines()
        .filter(|line| line.starts_with("mcp_idem_store_errors_total{operation=\"get\","))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(get_errors >= 1.0, "{scraped}");

    let _redis = PrivateRedis::start(port).expect("redis-server restarts");
    wait_for_readyz(&proxy_authority, 200);
    assert_eq!(get(&metrics, "/readyz").0, 200);
}
