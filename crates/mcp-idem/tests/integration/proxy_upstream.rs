//! `mcp-idem proxy --upstream`: the upstream named by its endpoint URL, as MCP clients name a
//! server (`http://HOST:PORT/mcp`, no more `/mcp/mcp`), other paths (OAuth metadata under
//! `/.well-known/`) reaching the upstream's origin as they are, and `https://` upstreams through
//! the library's one HTTP client: trusted with `--upstream-ca-cert`, a clear `502` naming the
//! certificate problem without it (nothing runs, the key stays free), a clear error at start for
//! an unusable CA file. The demo server's ledger counts the charges.

use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::bridge_sessions::{TestCa, TlsFront};
use crate::support::common::ledger_lines;
use crate::support::http::{charge, discover, ledger_in, sqlite_in, HttpDemo, Proxy, Raw};
use crate::support::upstream::RecordingUpstream;

/// A keyed charge runs once and its retry replays it, through `raw`; returns the charge id.
async fn charges_once(raw: &Raw, ledger: &std::path::Path, key: &str) -> String {
    let first = raw.call(charge(1, 25, Some(key))).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let charged = first
        .charge_id()
        .unwrap_or_else(|| panic!("no charge: {}", first.body));
    let retry = raw.call(charge(2, 25, Some(key))).await;
    assert_eq!(retry.json()["id"], 2, "{}", retry.body);
    assert_eq!(retry.charge_id().as_deref(), Some(charged.as_str()));
    let lines = ledger_lines(ledger);
    assert_eq!(lines.iter().filter(|l| l["chargeId"] == charged).count(), 1);
    charged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_is_named_by_its_endpoint_url() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    // `http://127.0.0.1:PORT/mcp`, as a client would be configured with.
    assert!(demo.url.ends_with("/mcp"), "{}", demo.url);
    let proxy = Proxy::spawn(&demo.url, &["--store", &store]);
    let raw = Raw::new(&proxy);
    let discovered = raw.call(discover(0)).await;
    assert_eq!(discovered.status, 200, "{}", discovered.body);
    assert!(
        discovered.json()["result"]["capabilities"]["tools"]["idempotency"].is_object(),
        "{}",
        discovered.body
    );
    charges_once(&raw, &ledger, "endpoint-url").await;
    assert_eq!(ledger_lines(&ledger).len(), 1);

    // The URL without a path keeps its meaning: the proxy's /mcp goes to /mcp.
    let bare = Proxy::spawn(&demo.base_url(), &["--store", &store]);
    let raw = Raw::new(&bare);
    charges_once(&raw, &ledger, "origin-url").await;
    assert_eq!(ledger_lines(&ledger).len(), 2);
}

/// GET `path` on the proxy, answered by the recording upstream with the path it got.
async fn get(proxy: &Proxy, path: &str) -> Value {
    let base = proxy.url.strip_suffix("/mcp").unwrap();
    let raw = Raw::new(&format!("{base}{path}"));
    let request = http::Request::get(&raw.url).header(http::header::HOST, &raw.authority);
    let answer = raw.send(request, &Value::Null).await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    answer.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_path_is_mapped_and_other_paths_reach_the_upstream_as_they_are() {
    let upstream = RecordingUpstream::start();
    // A namespace of its own: the proxy does not ask the upstream its name, so the upstream
    // sees only what is forwarded.
    let proxy = Proxy::spawn(
        &format!("{}/api/v1/mcp", upstream.origin),
        &["--store", "memory", "--namespace", "paths"],
    );
    let raw = Raw::new(&proxy);
    let listed = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{}}});
    assert_eq!(
        raw.call(listed.clone()).await.json()["result"]["path"],
        "/api/v1/mcp"
    );
    // Keyed calls, too.
    let keyed = raw.call(charge(2, 3, Some("mapped"))).await;
    assert_eq!(
        keyed.json()["result"]["path"],
        "/api/v1/mcp",
        "{}",
        keyed.body
    );
    // The upstream's own endpoint path reaches it as well.
    let base = proxy.url.strip_suffix("/mcp").unwrap();
    let direct = Raw::new(&format!("{base}/api/v1/mcp"));
    assert_eq!(
        direct.call(listed).await.json()["result"]["path"],
        "/api/v1/mcp"
    );
    // OAuth metadata (RFC 9728, RFC 8414) and anything else: the same path on the upstream.
    for path in [
        "/.well-known/oauth-protected-resource/api/v1/mcp",
        "/.well-known/oauth-authorization-server",
        "/mcp/other",
    ] {
        assert_eq!(get(&proxy, path).await["path"], path);
    }
    assert_eq!(get(&proxy, "/mcp?x=1").await["path"], "/api/v1/mcp?x=1");
    let seen: Vec<(String, String)> = upstream
        .seen()
        .into_iter()
        .map(|s| (s.method, s.path))
        .collect();
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert!(
        seen[..3].iter().all(|(method, _)| method == "POST"),
        "{seen:?}"
    );
    assert!(
        seen[3..].iter().all(|(method, _)| method == "GET"),
        "{seen:?}"
    );
}

/// Runs `test` on a runtime of its own: the TLS front has one too, made and dropped outside it.
fn block_on<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(test)
}

#[test]
fn an_https_upstream_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let ca = TestCa::new(dir.path());
    let front = TlsFront::start(&ca, &demo.authority);
    assert!(front.url.starts_with("https://"), "{}", front.url);
    let ca_pem = ca.ca_pem.to_str().unwrap();
    let proxy = Proxy::spawn(
        &front.url,
        &["--store", "memory", "--upstream-ca-cert", ca_pem],
    );
    block_on(charges_once(&Raw::new(&proxy), &ledger, "over-tls"));
    assert_eq!(ledger_lines(&ledger).len(), 1);
    assert!(front.handshakes() >= 1);
}

#[test]
fn an_https_upstream_without_its_ca_is_a_clear_502_and_the_key_stays_free() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let demo = HttpDemo::spawn(&ledger, &[]);
    let ca = TestCa::new(dir.path());
    let front = TlsFront::start(&ca, &demo.authority);
    let store = sqlite_in(&dir);
    let args = ["--store", store.as_str(), "--namespace", "tls"];

    let untrusting = Proxy::spawn(&front.url, &args);
    let answer = block_on(Raw::new(&untrusting).call(charge(1, 9, Some("tls-key"))));
    assert_eq!(answer.status, 502, "{}", answer.body);
    let message = answer.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        message.contains("certificate") && message.contains("unknownissuer"),
        "not a clear TLS error: {message}"
    );
    assert_eq!(front.handshakes(), 0);
    front.wait_for_a_failed_handshake();
    assert!(ledger_lines(&ledger).is_empty());
    drop(untrusting);

    // Nothing ran, so the key is free: with the CA, the same call runs (once).
    let ca_pem = ca.ca_pem.to_str().unwrap();
    let mut trusting_args = args.to_vec();
    trusting_args.extend(["--upstream-ca-cert", ca_pem]);
    let trusting = Proxy::spawn(&front.url, &trusting_args);
    let ran = block_on(Raw::new(&trusting).call(charge(2, 9, Some("tls-key"))));
    assert!(ran.charge_id().is_some(), "{}", ran.body);
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

#[test]
fn an_unusable_ca_file_or_upstream_url_stops_the_proxy_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--upstream",
                "https://127.0.0.1:1/mcp",
                "--upstream-ca-cert",
                not_pem.to_str().unwrap(),
            ],
            "no pem certificate",
        ),
        (
            &[
                "--upstream",
                "https://127.0.0.1:1/mcp",
                "--upstream-ca-cert",
                missing.to_str().unwrap(),
            ],
            "missing.pem",
        ),
        (&["--upstream", "ftp://127.0.0.1:1/mcp"], "http[s]://host"),
    ];
    for (args, says) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
            .args(["proxy", "--listen", "127.0.0.1:0", "--store", "memory"])
            .args(args)
            .env_remove("MCP_IDEM_UPSTREAM_CA_CERT")
            .stdin(Stdio::null())
            .output()
            .expect("run the proxy");
        let stderr = String::from_utf8_lossy(&output.stderr).to_lowercase();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
