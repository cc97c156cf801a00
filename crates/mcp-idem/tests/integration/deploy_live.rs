//! `deploy/` against a real Prometheus: the services of `deploy/compose/compose.yaml` (two
//! `proxy` instances, a Redis of the test's own, the demo server as upstream) run as processes
//! (`support/compose.rs` maps them to loopback), a `prometheus` of the test's own (its own folder
//! and port, scraping both proxies every second, loading `deploy/prometheus/alerts.yml`) watches a
//! scripted load: keyed calls, replays across instances, conflicts, duplicates in progress, a
//! duplicate that waits (compose.yaml's `key-from` policy), key-less calls, and a store outage (the test's Redis stopped, then started again). Then:
//!
//! - the store alert's expression (read from alerts.yml) is false before the outage and true for
//!   both instances during it, and the alert is pending or firing;
//! - every query of every panel of `deploy/grafana/mcp-idem.json` returns series.
//!
//! Needs `prometheus` and `redis-server` on PATH and the venv of `deploy/tools.sh` (PyYAML);
//! without them it fails under `CI=true` and skips elsewhere.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::support::compose::{services, Running, Service};
use crate::support::deploy::{deploy_path, system_tool, venv_tool, yaml_document};
use crate::support::http::{charge, slow_charge, tool_call, HttpClient, Raw};

/// Longest wait for Prometheus to see something (scrapes are every second).
const SEE_TIMEOUT: Duration = Duration::from_secs(90);

/// What the dashboard's variables and Grafana's macros become outside Grafana.
fn outside_grafana(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$job", ".*")
        .replace("$instance", ".*")
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// A `prometheus` of the test's own, killed on drop.
struct Prometheus {
    _process: Running,
    port: u16,
    client: HttpClient,
}

impl Prometheus {
    fn start(program: &Path, dir: &Path, targets: &[String]) -> Self {
        let rules = deploy_path("prometheus/alerts.yml").canonicalize().unwrap();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules],
            "scrape_configs": [{
                "job_name": "mcp-idem",
                "static_configs": [{"targets": targets}],
            }],
        });
        // JSON is YAML.
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config.to_string()).unwrap();
        let port = crate::support::common::free_port();
        let service = Service {
            name: "prometheus".to_owned(),
            program: program.to_owned(),
            args: vec![
                format!("--config.file={}", config_file.display()),
                format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ],
            env: Vec::new(),
            ports: BTreeMap::from([(port, port)]),
            depends_on: Vec::new(),
        };
        Self {
            _process: Running::start(&service, dir),
            port,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn get(&self, path: &str) -> (http::StatusCode, String) {
        let request = http::Request::get(format!("http://127.0.0.1:{}{path}", self.port))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(20), self.client.request(request))
            .await
            .expect("Prometheus answers")
            .expect("an HTTP answer from Prometheus");
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Waits until Prometheus is ready: it listens before its storage is open, and answers 503
    /// until then.
    async fn ready(&self) {
        let deadline = Instant::now() + SEE_TIMEOUT;
        loop {
            let (status, body) = self.get("/-/ready").await;
            if status.is_success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus is not ready: HTTP {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The series `expr` returns now (an instant query).
    async fn query(&self, expr: &str) -> Vec<Value> {
        let (status, body) = self
            .get(&format!("/api/v1/query?query={}", encode(expr)))
            .await;
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("query {expr}: HTTP {status}: {body}"));
        assert!(
            status.is_success() && answer["status"] == "success",
            "query {expr}: HTTP {status}: {body}"
        );
        answer["data"]["result"].as_array().unwrap().clone()
    }

    /// Waits until `expr` returns at least `series` series; returns them.
    async fn until(&self, expr: &str, series: usize) -> Vec<Value> {
        let deadline = Instant::now() + SEE_TIMEOUT;
        loop {
            let result = self.query(expr).await;
            if result.len() >= series {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "{expr}: {} series, expected {series}: {result:?}",
                result.len()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The value after `flag` in `args`.
fn after<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at = args
        .iter()
        .position(|arg| arg == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    &args[at + 1]
}

/// The expression of alert `name` in alerts.yml.
fn alert_expr(python: &Path, name: &str) -> String {
    let rules = yaml_document(python, &deploy_path("prometheus/alerts.yml"));
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .find(|rule| rule["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name}"))["expr"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_compose_services_under_load_and_outage() {
    let test = "prometheus_scrapes_the_compose_services_under_load_and_outage";
    let Some(python) = venv_tool(test, "python") else {
        return;
    };
    let Some(prometheus) = system_tool(test, "prometheus") else {
        return;
    };
    if system_tool(test, "redis-server").is_none() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let compose = yaml_document(&python, &deploy_path("compose/compose.yaml"));
    let plan = services(&compose, dir.path());
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    for service in &plan {
        running.insert(service.name.clone(), Running::start(service, dir.path()));
    }
    let redis = plan
        .iter()
        .find(|service| service.program.ends_with("redis-server"))
        .expect("a redis-server service")
        .clone();
    let proxies: Vec<&Service> = plan
        .iter()
        .filter(|service| service.args.first().is_some_and(|arg| arg == "proxy"))
        .collect();
    assert_eq!(proxies.len(), 2, "two proxies");
    let raws: Vec<Raw> = proxies
        .iter()
        .map(|proxy| Raw::new(&format!("http://{}/mcp", after(&proxy.args, "--listen"))))
        .collect();
    let targets: Vec<String> = proxies
        .iter()
        .map(|proxy| after(&proxy.args, "--metrics-listen").to_owned())
        .collect();
    let prom = Prometheus::start(&prometheus, dir.path(), &targets);
    prom.ready().await;
    prom.until(r#"up{job="mcp-idem"} == 1"#, 2).await;
    let store_alert = alert_expr(&python, "McpIdemStoreUnavailable");
    assert!(
        prom.query(&store_alert).await.is_empty(),
        "the store alert's expression is true before the outage"
    );

    // Keyed calls on one instance, replayed by the other; conflicts; key-less calls.
    let (a, b) = (&raws[0], &raws[1]);
    let ids = std::cell::Cell::new(0);
    let next = || {
        ids.set(ids.get() + 1);
        ids.get()
    };
    for n in 0..5 {
        let key = format!("live-{n}");
        let first = a.call(charge(next(), 10 + n, Some(&key))).await;
        let retry = b.call(charge(next(), 10 + n, Some(&key))).await;
        assert!(first.charge_id().is_some(), "{}", first.body);
        assert_eq!(first.charge_id(), retry.charge_id(), "{}", retry.body);
        let conflict = b.call(charge(next(), 99, Some(&key))).await;
        assert_eq!(
            conflict.error_type().as_deref(),
            Some("idempotency_key_conflict"),
            "{}",
            conflict.body
        );
        // No key and no order id: the policy's identifier is missing, the call runs unprotected.
        let keyless = a.call(charge(next(), 1, None)).await;
        assert!(keyless.charge_id().is_some(), "{}", keyless.body);
        let unkeyed = a
            .call(tool_call(next(), "get_balance", json!({}), None))
            .await;
        assert!(unkeyed.json()["result"].is_object(), "{}", unkeyed.body);
    }
    // A duplicate of a call still running: sent on the other instance until the slow call
    // answers. Whichever reaches the store second is refused (the duplicate may overtake it).
    let mut in_progress = 0;
    let mut answers = Vec::new();
    for attempt in 0..3 {
        let key = format!("live-slow-{attempt}");
        let slow = tokio::spawn({
            let (a, message) = (a.clone(), slow_charge(next(), 5, 2_000, Some(&key)));
            async move { a.call(message).await }
        });
        while !slow.is_finished() {
            let duplicate = b.call(slow_charge(next(), 5, 2_000, Some(&key))).await;
            answers.push(duplicate.body.clone());
            if duplicate.error_type().as_deref() == Some("idempotency_key_in_progress") {
                in_progress += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let slow = slow.await.unwrap();
        answers.push(slow.body.clone());
        if slow.error_type().as_deref() == Some("idempotency_key_in_progress") {
            in_progress += 1;
        }
        if in_progress > 0 {
            break;
        }
    }
    assert!(
        in_progress > 0,
        "no duplicate found its call in progress: {answers:#?}"
    );

    // A duplicate without a key (keyed by its order id) of a call still running on the other
    // instance waits for that call's outcome, and gets it.
    let order =
        json!({"amount": 6, "currency": "EUR", "order_id": "live-order", "delay_ms": 1_500});
    let first = tokio::spawn({
        let (a, message) = (
            a.clone(),
            tool_call(next(), "charge_payment", order.clone(), None),
        );
        async move { a.call(message).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = b
        .call(tool_call(next(), "charge_payment", order, None))
        .await;
    let first = first.await.unwrap();
    assert!(first.charge_id().is_some(), "{}", first.body);
    assert_eq!(waited.charge_id(), first.charge_id(), "{}", waited.body);

    // The outage: the store stops; keyed calls are refused on both instances until the store
    // alert's expression holds for both.
    drop(running.remove(&redis.name));
    let outage = Instant::now();
    let deadline = outage + SEE_TIMEOUT;
    let mut refused = 0;
    loop {
        for raw in &raws {
            let n = next();
            let answer = raw.call(charge(n, 7, Some(&format!("outage-{n}")))).await;
            if answer.error_type().as_deref() == Some("idempotency_store_unavailable") {
                refused += 1;
            }
        }
        let firing = prom.query(&store_alert).await;
        if firing.len() == proxies.len() {
            let instances: Vec<&str> = firing
                .iter()
                .map(|series| series["metric"]["instance"].as_str().unwrap())
                .collect();
            for target in &targets {
                assert!(instances.contains(&target.as_str()), "{instances:?}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store alert's expression never held for both instances: {firing:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seen_after = outage.elapsed();
    assert!(refused > 0, "no call was refused during the outage");
    // The rule itself, loaded by this Prometheus, is pending (its `for:` is a minute).
    prom.until(r#"ALERTS{alertname="McpIdemStoreUnavailable"}"#, 1)
        .await;

    // The store comes back: the instances are ready again and run keyed calls.
    running.insert(redis.name.clone(), Running::start(&redis, dir.path()));
    for (raw, target) in raws.iter().zip(&targets) {
        let deadline = Instant::now() + SEE_TIMEOUT;
        loop {
            let n = next();
            let answer = raw.call(charge(n, 3, Some(&format!("after-{n}")))).await;
            if answer.charge_id().is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{target}: the store never came back: {}",
                answer.body
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // What the load did, as Prometheus saw it.
    for (expr, series) in [
        ("sum(mcp_idem_replays_total) > 0", 1),
        (
            r#"sum(mcp_idem_rejections_total{type="idempotency_key_conflict"}) > 0"#,
            1,
        ),
        (
            r#"sum(mcp_idem_rejections_total{type="idempotency_key_in_progress"}) > 0"#,
            1,
        ),
        (
            r#"sum by (instance) (mcp_idem_rejections_total{type="idempotency_store_unavailable"}) > 0"#,
            2,
        ),
        (r#"sum(mcp_idem_bypasses_total{reason="no_key"}) > 0"#, 1),
        (
            r#"sum(mcp_idem_bypasses_total{reason="missing_identifier"}) > 0"#,
            1,
        ),
        (
            r#"sum(mcp_server_operation_duration_seconds_count{mcp_idem_decision="waited"}) > 0"#,
            1,
        ),
        ("mcp_idem_record_limit", 4),
        ("mcp_idem_records", 1),
    ] {
        prom.until(expr, series).await;
    }

    // Every panel's queries return series.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_path("grafana/mcp-idem.json")).unwrap(),
    )
    .unwrap();
    let panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|panel| panel["type"] != "row")
        .collect();
    let mut queries = 0;
    for panel in &panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = outside_grafana(target["expr"].as_str().unwrap());
            queries += 1;
            prom.until(&expr, 1).await;
        }
    }
    eprintln!(
        "{test}: {} panels, {queries} queries; the store alert's expression held for both \
         instances {:.1} s after the store stopped; {:.1} s in all",
        panels.len(),
        seen_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(prom);
    for (name, service) in &running {
        let log = service.log();
        assert!(!log.contains("panicked"), "{name} panicked:\n{log}");
    }
}
