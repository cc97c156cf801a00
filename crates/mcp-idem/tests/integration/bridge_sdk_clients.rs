//! `mcp-idem bridge` under UNMODIFIED official SDK clients that send no idempotency key: the
//! Python SDK (`mcp` 2.3.0, `interop/py_plain_client.py`, pinned to protocol 2026-07-28) and the
//! TypeScript SDK v2 (`@modelcontextprotocol/client` 2.4.0, `interop/ts-plain-client.mjs`, its
//! default `initialize` handshake) launch `mcp-idem bridge --attempt-timeout 2s URL` as their
//! stdio server and make sequential `charge_payment` calls with the SDKs' plain call APIs.
//!
//! Between the bridge and the server sits the fault-injecting HTTP forwarder of
//! `support::bridge`, which lets the upstream execute a call and then drops its answer, cuts
//! it in the middle (a JSON body, an SSE stream), or holds it back past the attempt timeout:
//! - with the capability (forwarder -> two `mcp-idem proxy` instances on one Redis namespace ->
//!   `demo-server --http` and `--http-sse`, one ledger): every call gets its original charge, each
//!   charge is in the ledger exactly once, and each lost answer was re-issued with the same key
//!   and a new JSON-RPC id;
//! - without it (forwarder -> `demo-server --http`): no call executes twice, and each call whose
//!   answer was dropped gets the bridge's `mcp_idem_answer_lost` error.
//!
//! Also: the snippets that send the key from the official clients themselves
//! (`interop/snippet_py_key.py`, `interop/snippet-ts-key.mjs`) against `mcp-idem wrap`, and a
//! check that the forwarder injects what it claims. A missing SDK or Redis skips a test with a
//! note, or fails it under `CI=true`.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use crate::support::bridge::{Done, Exchange, Fault, Forwarder, Plan};
use crate::support::common::ledger_lines;
use crate::support::http::{tool_call, unique_namespace, HttpDemo, Proxy, Raw, SharedStore};
use crate::support::interop::{run_report, script, Toolchain};
use crate::support::wrap::{sh_join, Sandbox, EXE};

/// The bridge's `--attempt-timeout`.
const ATTEMPT_TIMEOUT: &str = "2s";
/// How long the forwarder holds back a delayed answer: well past [`ATTEMPT_TIMEOUT`].
const DELAY: Duration = Duration::from_secs(5);
/// The line the bridge logs for each re-issue.
const REISSUE: &str = "re-issuing tools/call";

/// One of the two plain clients.
#[derive(Clone, Copy, Debug)]
enum Sdk {
    /// `py_plain_client.py`: protocol 2026-07-28.
    Python,
    /// `ts-plain-client.mjs`: the default `initialize` handshake.
    TypeScript,
}

impl Sdk {
    fn toolchain(self) -> Toolchain {
        match self {
            Self::Python => Toolchain::Python,
            Self::TypeScript => Toolchain::Node,
        }
    }

    fn script(self) -> &'static str {
        match self {
            Self::Python => "py_plain_client.py",
            Self::TypeScript => "ts-plain-client.mjs",
        }
    }

    /// The raw handshake result the client reported: `server/discover` (Python) or `initialize`
    /// (TypeScript), as it came through the bridge.
    fn handshake(self, report: &Value) -> &Value {
        match self {
            Self::Python => &report["discover"],
            Self::TypeScript => &report["initialize"],
        }
    }

    /// Checks the protocol era the client negotiated.
    fn assert_era(self, report: &Value) {
        let version = report["protocolVersion"].as_str().unwrap_or_default();
        match self {
            Self::Python => assert_eq!(version, "2026-07-28", "{report}"),
            Self::TypeScript => assert!(
                version.starts_with("2025-"),
                "the TypeScript client's default handshake should be initialize-era, got {version:?}"
            ),
        }
    }
}

/// `mcp-idem bridge --attempt-timeout 2s URL`, its stderr appended to `log`, as the command line
/// a client launches.
fn bridge_command(url: &str, log: &Path) -> Vec<OsString> {
    let bridge: Vec<OsString> = vec![
        EXE.into(),
        "bridge".into(),
        "--attempt-timeout".into(),
        ATTEMPT_TIMEOUT.into(),
        url.into(),
    ];
    let script = format!(
        "exec {} 2>>{}",
        sh_join(&bridge),
        crate::support::wrap::sh_quote(log)
    );
    vec!["sh".into(), "-c".into(), script.into()]
}

/// Runs `sdk`'s plain client: `charges CALLS BASE stdio -- <the bridge to url>`.
fn run_client(sdk: Sdk, sandbox: &Sandbox, calls: u64, base: u64, url: &str) -> Value {
    let mut args: Vec<OsString> = vec![
        script(sdk.script()).into(),
        "charges".into(),
        calls.to_string().into(),
        base.to_string().into(),
        "stdio".into(),
        "--".into(),
    ];
    args.extend(bridge_command(url, &sandbox.path("bridge.stderr")));
    let report = run_report(
        sdk.toolchain().program(),
        &args,
        &sandbox.path("client.stderr"),
    );
    assert_eq!(
        report["calls"].as_array().map(Vec::len),
        Some(calls as usize),
        "{report}"
    );
    sdk.assert_era(&report);
    report
}

/// The bridge's `re-issuing tools/call` log lines.
fn reissue_lines(sandbox: &Sandbox) -> Vec<String> {
    std::fs::read_to_string(sandbox.path("bridge.stderr"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(REISSUE))
        .map(str::to_owned)
        .collect()
}

/// The charge id of a reported call that succeeded with `amount`.
fn charge_id(call: &Value, amount: u64, context: &str) -> String {
    assert!(
        call.get("error").is_none() && call["isError"] != true,
        "the charge of {amount} failed: {call}\n{context}"
    );
    assert_eq!(
        call["structuredContent"]["amount"], amount,
        "{call}\n{context}"
    );
    call["structuredContent"]["chargeId"]
        .as_str()
        .unwrap_or_else(|| panic!("no chargeId in {call}\n{context}"))
        .to_owned()
}

/// The forwarder's `tools/call` POSTs grouped by `idempotencyKey`, each group in arrival order.
fn by_key(exchanges: &[Exchange]) -> BTreeMap<String, Vec<&Exchange>> {
    let mut groups: BTreeMap<String, Vec<&Exchange>> = BTreeMap::new();
    for exchange in exchanges {
        let key = exchange
            .key
            .clone()
            .unwrap_or_else(|| panic!("the bridge sent a tools/call without a key: {exchange:?}"));
        assert!(is_uuid_v4(&key), "the bridge's key is not a UUID v4: {key}");
        groups.entry(key).or_default().push(exchange);
    }
    groups
}

fn is_uuid_v4(key: &str) -> bool {
    let parts: Vec<&str> = key.split('-').collect();
    let lengths: Vec<usize> = parts.iter().map(|part| part.len()).collect();
    lengths == [8, 4, 4, 4, 12]
        && key
            .chars()
            .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        && parts[2].starts_with('4')
        && parts[3].starts_with(['8', '9', 'a', 'b'])
}

/// The amount a `charge_payment` POST charged.
fn amount_of(exchange: &Exchange) -> u64 {
    exchange.arguments["amount"]
        .as_u64()
        .unwrap_or_else(|| panic!("no amount in {exchange:?}"))
}

// ---------------------------------------------------------------------------------------------
// With the capability: every lost answer re-issued, every charge exactly once.

const CALLS: u64 = 20;

/// Faults per call (attempt by attempt; later attempts are forwarded). `CutSse` only on a first
/// attempt: a re-issue is answered from the store, as JSON.
fn fault_script() -> Vec<Vec<Fault>> {
    use Fault::{CutJson, CutSse, Delay, Drop};
    let script: [&[Fault]; CALLS as usize] = [
        &[],
        &[Drop],
        &[CutJson],
        &[CutSse],
        &[Delay],
        &[],
        &[Drop, CutJson],
        &[CutSse, Drop],
        &[],
        &[CutJson],
        &[Drop],
        &[],
        &[CutSse],
        &[Delay],
        &[],
        &[Drop, Drop, CutJson],
        &[CutSse],
        &[],
        &[CutJson, Delay],
        &[Drop],
    ];
    script.iter().map(|faults| faults.to_vec()).collect()
}

/// What the forwarder must have done to each planned fault.
fn expected_done(fault: Fault) -> Done {
    match fault {
        Fault::Forward => Done::Forwarded,
        Fault::Drop => Done::Dropped,
        Fault::CutJson => Done::CutJson,
        Fault::CutSse => Done::CutSse,
        Fault::Delay => Done::Delayed,
    }
}

fn reissues_every_lost_answer(sdk: Sdk, base: u64) {
    if !sdk.toolchain().require() {
        return;
    }
    let Some(redis) = SharedStore::Redis.url() else {
        return;
    };
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    // Two servers on one ledger, one answering JSON and one SSE, each behind a proxy; the two
    // proxies share one Redis namespace, so a re-issue to either finds the first attempt's record.
    let json_demo = HttpDemo::spawn(&ledger, &[]);
    let sse_demo = HttpDemo::spawn(&ledger, &["--http-sse"]);
    let namespace = unique_namespace("bridge-sdk-clients");
    let store = ["--store", redis.as_str(), "--namespace", namespace.as_str()];
    let json_proxy = Proxy::spawn(&json_demo.base_url(), &store);
    let sse_proxy = Proxy::spawn(&sse_demo.base_url(), &store);
    let script = fault_script();
    let forwarder = Forwarder::start(
        &json_proxy.url,
        Some(&sse_proxy.url),
        Plan::by_amount(base, script.clone()),
        DELAY,
    );

    let report = run_client(sdk, &sandbox, CALLS, base, &forwarder.url);
    let exchanges = forwarder.exchanges();
    let context = format!(
        "report: {report}\nforwarder: {}\nbridge stderr:\n{}",
        forwarder.summary(),
        std::fs::read_to_string(sandbox.path("bridge.stderr")).unwrap_or_default()
    );

    // The capability is visible to the client through the bridge, in the raw handshake result.
    assert!(
        sdk.handshake(&report)["capabilities"]["tools"]["idempotency"].is_object(),
        "no capabilities.tools.idempotency in the {sdk:?} client's raw handshake result\n{context}"
    );

    // Every call got its original outcome, and each charge is in the ledger exactly once.
    let charged: Vec<String> = (0..CALLS)
        .map(|i| charge_id(&report["calls"][i as usize], base + i, &context))
        .collect();
    let lines = ledger_lines(&ledger);
    assert_eq!(
        lines.len(),
        CALLS as usize,
        "the ledger must hold one line per call\n{context}"
    );
    for (i, charge) in charged.iter().enumerate() {
        let matching: Vec<&Value> = lines
            .iter()
            .filter(|line| line["chargeId"] == charge.as_str())
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "charge {charge} must be in the ledger once\n{context}"
        );
        assert_eq!(matching[0]["amount"], base + i as u64, "{context}");
    }

    // The forwarder injected exactly the planned faults, and the upstream answered every POST.
    for exchange in &exchanges {
        let index = (amount_of(exchange) - base) as usize;
        let planned = script[index]
            .get(exchange.attempt as usize)
            .copied()
            .unwrap_or(Fault::Forward);
        assert_eq!(exchange.planned, planned, "{exchange:?}\n{context}");
        assert_eq!(
            exchange.done,
            expected_done(planned),
            "{exchange:?}\n{context}"
        );
        assert_eq!(exchange.status, 200, "{exchange:?}\n{context}");
    }
    let planned_faults: usize = script.iter().map(Vec::len).sum();
    assert_eq!(forwarder.faults(), planned_faults, "{context}");
    for done in [Done::Dropped, Done::CutJson, Done::CutSse, Done::Delayed] {
        assert!(forwarder.count(done) > 0, "no {done:?} injected\n{context}");
    }

    // Each call has one key of its own; every lost attempt was re-issued with that key and a new
    // JSON-RPC id, and logged.
    let groups = by_key(&exchanges);
    assert_eq!(groups.len(), CALLS as usize, "one key per call\n{context}");
    let reissues = reissue_lines(&sandbox);
    for (key, attempts) in &groups {
        let amount = amount_of(attempts[0]);
        assert!(
            attempts.iter().all(|a| amount_of(a) == amount),
            "one key, several calls: {attempts:?}"
        );
        let faults = script[(amount - base) as usize].len();
        assert!(
            attempts.len() > faults,
            "call {amount}: {faults} faults but only {} attempts\n{context}",
            attempts.len()
        );
        let ids: HashSet<String> = attempts.iter().map(|a| a.id.to_string()).collect();
        assert_eq!(
            ids.len(),
            attempts.len(),
            "a re-issue reused a JSON-RPC id: {attempts:?}"
        );
        let logged = reissues.iter().filter(|line| line.contains(key)).count();
        assert_eq!(
            logged,
            attempts.len() - 1,
            "call {amount} (key {key}): one `{REISSUE}` line per re-issue\n{context}"
        );
    }
    assert_eq!(
        reissues.len(),
        exchanges.len() - CALLS as usize,
        "{context}"
    );
    let reasons: std::collections::BTreeSet<&str> = reissues
        .iter()
        .filter_map(|line| line.split_once("reason=").map(|(_, reason)| reason))
        .collect();
    eprintln!(
        "{sdk:?}: {CALLS} calls, {}; {} re-issues, e.g.\n  {}\nreasons: {reasons:#?}",
        forwarder.summary(),
        reissues.len(),
        reissues.first().map_or("", String::as_str)
    );
}

#[test]
fn python_client_through_the_bridge_reissues_every_lost_answer() {
    reissues_every_lost_answer(Sdk::Python, 10_000);
}

#[test]
fn typescript_client_through_the_bridge_reissues_every_lost_answer() {
    reissues_every_lost_answer(Sdk::TypeScript, 20_000);
}

// ---------------------------------------------------------------------------------------------
// Without the capability: nothing re-issued, the client told the call may have run.

const PLAIN_CALLS: u64 = 6;

fn no_capability_no_second_execution(sdk: Sdk, base: u64) {
    if !sdk.toolchain().require() {
        return;
    }
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let demo = HttpDemo::spawn(&ledger, &[]);
    let dropped: [u64; 3] = [1, 3, 4];
    let script = (0..PLAIN_CALLS)
        .map(|i| {
            if dropped.contains(&i) {
                vec![Fault::Drop]
            } else {
                vec![]
            }
        })
        .collect();
    let forwarder = Forwarder::start(&demo.url, None, Plan::by_amount(base, script), DELAY);

    let report = run_client(sdk, &sandbox, PLAIN_CALLS, base, &forwarder.url);
    let exchanges = forwarder.exchanges();
    let context = format!(
        "report: {report}\nforwarder: {}\nbridge stderr:\n{}",
        forwarder.summary(),
        std::fs::read_to_string(sandbox.path("bridge.stderr")).unwrap_or_default()
    );
    assert!(
        sdk.handshake(&report)["capabilities"]["tools"]
            .get("idempotency")
            .is_none(),
        "the demo server does not advertise idempotency\n{context}"
    );

    // Nothing re-issued: one POST per call, each with a key of its own, and each executed once.
    let groups = by_key(&exchanges);
    assert_eq!(exchanges.len(), PLAIN_CALLS as usize, "{context}");
    assert_eq!(groups.len(), PLAIN_CALLS as usize, "{context}");
    assert_eq!(forwarder.count(Done::Dropped), dropped.len(), "{context}");
    assert!(reissue_lines(&sandbox).is_empty(), "{context}");
    let lines = ledger_lines(&ledger);
    let reached_the_server = exchanges.iter().filter(|e| e.status == 200).count();
    assert_eq!(lines.len(), reached_the_server, "{context}");
    let mut amounts: Vec<u64> = lines
        .iter()
        .map(|line| line["amount"].as_u64().unwrap_or_default())
        .collect();
    amounts.sort_unstable();
    assert_eq!(
        amounts,
        (base..base + PLAIN_CALLS).collect::<Vec<_>>(),
        "{context}"
    );

    for i in 0..PLAIN_CALLS {
        let call = &report["calls"][i as usize];
        let exchange = exchanges
            .iter()
            .find(|e| amount_of(e) == base + i)
            .unwrap_or_else(|| panic!("call {i} never reached the forwarder\n{context}"));
        if !dropped.contains(&i) {
            let charge = charge_id(call, base + i, &context);
            assert_eq!(
                crate::support::common::count_charge(&ledger, &charge),
                1,
                "{context}"
            );
            continue;
        }
        let error = &call["error"];
        assert_eq!(error["code"], -32603, "call {i}: {call}\n{context}");
        assert_eq!(
            error["data"]["type"], "mcp_idem_answer_lost",
            "call {i}\n{context}"
        );
        assert_eq!(error["data"]["mayHaveRun"], true, "call {i}\n{context}");
        assert_eq!(error["data"]["reissued"], false, "call {i}\n{context}");
        assert_eq!(
            error["data"]["idempotencyKey"].as_str(),
            exchange.key.as_deref(),
            "call {i}: the error names the call's key\n{context}"
        );
        let message = error["message"].as_str().unwrap_or_default().to_lowercase();
        assert!(
            message.contains("may have"),
            "call {i}: the message should say the call may have run: {message}"
        );
    }
    eprintln!(
        "{sdk:?}: {PLAIN_CALLS} calls, {}; a dropped call got {}",
        forwarder.summary(),
        report["calls"][dropped[0] as usize]
    );
}

#[test]
fn python_client_without_the_capability_never_runs_a_call_twice() {
    no_capability_no_second_execution(Sdk::Python, 30_000);
}

#[test]
fn typescript_client_without_the_capability_never_runs_a_call_twice() {
    no_capability_no_second_execution(Sdk::TypeScript, 40_000);
}

// ---------------------------------------------------------------------------------------------
// The README snippets: the key sent by the official clients themselves.

fn snippet_replays(toolchain: Toolchain, snippet: &str) {
    if !toolchain.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let mut args: Vec<OsString> = vec![
        script(snippet).into(),
        EXE.into(),
        "wrap".into(),
        "--store".into(),
        sandbox.store().into(),
        "--".into(),
    ];
    args.extend(sandbox.demo(&sandbox.ledger()));
    let results = run_report(toolchain.program(), &args, &sandbox.path("snippet.stderr"));
    let charge = |i: usize| {
        results[i]["structuredContent"]["chargeId"]
            .as_str()
            .unwrap_or_else(|| panic!("no chargeId in result {i}: {results}"))
            .to_owned()
    };
    assert_eq!(
        charge(0),
        charge(1),
        "the retry is not the replay: {results}"
    );
    let lines = ledger_lines(&sandbox.ledger());
    assert_eq!(lines.len(), 1, "one charge for one key: {lines:?}");
    assert_eq!(lines[0]["chargeId"], charge(0).as_str());
}

#[test]
fn python_snippet_sends_the_key() {
    snippet_replays(Toolchain::Python, "snippet_py_key.py");
}

#[test]
fn typescript_snippet_sends_the_key() {
    snippet_replays(Toolchain::Node, "snippet-ts-key.mjs");
}

// ---------------------------------------------------------------------------------------------
// The forwarder itself, against the demo server, with a raw HTTP client.

/// What a raw client got: `Err` if no response head came, else the status, the content type and
/// the body (`Err` with the bytes that came before the connection broke).
type Seen = Result<(u16, String, Result<Bytes, Bytes>), String>;

async fn post(raw: &Raw, message: &Value) -> Seen {
    let request = raw
        .post(message)
        .body(Full::new(Bytes::from(message.to_string())))
        .unwrap();
    let response =
        tokio::time::timeout(crate::support::common::TIMEOUT, raw.client.request(request))
            .await
            .map_err(|_| "no answer in time".to_owned())?
            .map_err(|err| err.to_string())?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    loop {
        match body.frame().await {
            None => return Ok((status, content_type, Ok(Bytes::from(bytes)))),
            Some(Ok(frame)) => bytes.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d)),
            Some(Err(_)) => return Ok((status, content_type, Err(Bytes::from(bytes)))),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarder_injects_the_planned_faults() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = crate::support::http::ledger_in(&dir);
    let (json_demo, sse_demo) = (
        HttpDemo::spawn(&ledger, &[]),
        HttpDemo::spawn(&ledger, &["--http-sse"]),
    );
    use Fault::{CutJson, CutSse, Delay, Drop};
    let script = vec![vec![], vec![Drop], vec![CutJson], vec![CutSse], vec![Delay]];
    let forwarder = Forwarder::start(
        &json_demo.url,
        Some(&sse_demo.url),
        Plan::by_amount(500, script),
        Duration::from_millis(100),
    );
    let raw = Raw::new(&forwarder.url);
    let call = |i: u64| {
        tool_call(
            i,
            "charge_payment",
            json!({"amount": 500 + i, "currency": "usd"}),
            Some(&format!("forwarder-self-test-{i}")),
        )
    };
    let complete = |seen: &Seen| -> Value {
        let (status, _, Ok(body)) = seen.as_ref().expect("an answer") else {
            panic!("a whole body expected: {seen:?}")
        };
        assert_eq!(*status, 200, "{seen:?}");
        serde_json::from_slice(body).unwrap_or_else(|err| panic!("{err}: {seen:?}"))
    };

    // Forward, and a non-tools/call request passes through.
    let seen = post(&raw, &call(0)).await;
    assert!(complete(&seen)["result"]["structuredContent"]["chargeId"].is_string());
    let seen = post(&raw, &crate::support::http::discover(9)).await;
    assert!(complete(&seen)["result"]["capabilities"].is_object());
    // Drop: no response head at all.
    let seen = post(&raw, &call(1)).await;
    assert!(seen.is_err(), "the answer should be dropped: {seen:?}");
    // Cut JSON: the head, then part of the body, then the connection breaks.
    let seen = post(&raw, &call(2)).await;
    let Ok((200, content_type, Err(part))) = &seen else {
        panic!("a cut JSON body expected: {seen:?}")
    };
    assert!(content_type.starts_with("application/json"), "{seen:?}");
    assert!(!part.is_empty() && serde_json::from_slice::<Value>(part).is_err());
    // Cut SSE: the head, part of the response event, then the connection breaks.
    let seen = post(&raw, &call(3)).await;
    let Ok((200, content_type, Err(part))) = &seen else {
        panic!("a cut SSE stream expected: {seen:?}")
    };
    assert!(content_type.starts_with("text/event-stream"), "{seen:?}");
    let text = String::from_utf8_lossy(part);
    assert!(text.contains("data:") && !text.contains("\n\n"), "{text}");
    // Delay: the whole answer, late.
    let seen = post(&raw, &call(4)).await;
    assert!(complete(&seen)["result"]["structuredContent"]["chargeId"].is_string());

    // The upstream executed every call, faulted or not, and each was counted.
    assert_eq!(ledger_lines(&ledger).len(), 5);
    assert_eq!(forwarder.exchanges().len(), 5, "{}", forwarder.summary());
    for done in [
        Done::Forwarded,
        Done::Dropped,
        Done::CutJson,
        Done::CutSse,
        Done::Delayed,
    ] {
        assert_eq!(
            forwarder.count(done),
            1,
            "{done:?}: {}",
            forwarder.summary()
        );
    }
}
