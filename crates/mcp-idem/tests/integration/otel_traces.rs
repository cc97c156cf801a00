//! OpenTelemetry traces end to end: `mcp-idem proxy` exporting to an OTLP receiver in the test
//! (real OTLP protobuf, over gRPC and over HTTP), the official Python SDK client's
//! `_meta.traceparent` as the parent,
//! the upstream given mcp-idem's own span as its parent (in `_meta` and in the HTTP header), and
//! a retry through a second proxy on the same Redis linked to the first proxy's execution; the same
//! through `wrap` over stdio and through the Python binding, the retry in a new process. With
//! tracing off, nothing changes: `_meta` reaches the upstream as the client sent it.

use std::time::Duration;

use mcp_idempotency::telemetry::receiver::{ReceivedSpan, Receiver};
use serde_json::{json, Value};

use crate::binding_scenarios::Binding;
use crate::support::bridge::{Fault, Forwarder, Plan};
use crate::support::common::{ledger_lines, StdioPeer};
use crate::support::http::{unique_namespace, HttpDemo, Proxy, Raw, SharedStore};
use crate::support::interop::{run_report, script, Toolchain};
use crate::support::upstream::RecordingUpstream;
use crate::support::wrap::{charge, Sandbox};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A keyed `tools/call` of `charge` with `_meta.traceparent` (and `tracestate`, `baggage`).
fn traced_call(id: u64, key: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": "charge", "arguments": {"amount": 42},
            "idempotencyKey": key,
            "_meta": {
                "traceparent": format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
                "tracestate": "vendor=opaque",
                "baggage": "tenant=acme"
            }
        }
    })
}

fn proxy_env<'a>(endpoint: &'a str, protocol: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_SERVICE_NAME", "mcp-idem-test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ]
}

fn server_span<'a>(spans: &'a [ReceivedSpan], decision: &str) -> Option<&'a ReceivedSpan> {
    spans
        .iter()
        .find(|s| s.kind == "server" && s.str_attribute("mcp_idem.decision") == Some(decision))
}

/// The execution's span (a child of the client's span, on `store`) and the replay's, linked to
/// it; returns the execution's.
fn assert_linked_execution<'a>(spans: &'a [ReceivedSpan], store: &str) -> &'a ReceivedSpan {
    let execution =
        server_span(spans, "execute").unwrap_or_else(|| panic!("no execution span in {spans:#?}"));
    assert_eq!(execution.trace_id, CLIENT_TRACE);
    assert_eq!(execution.parent_span_id.as_deref(), Some(CLIENT_SPAN));
    assert_eq!(execution.str_attribute("mcp_idem.store"), Some(store));
    let replay = server_span(spans, "replay").expect("a replay span");
    assert!(
        replay
            .links
            .iter()
            .any(|l| l.trace_id == execution.trace_id && l.span_id == execution.span_id),
        "{replay:#?}"
    );
    execution
}

async fn one_trace_through_two_proxies(protocol: &str) {
    let Some(redis) = SharedStore::Redis.url() else {
        return;
    };
    if !Toolchain::Python.require() {
        return;
    }
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = match protocol {
        "grpc" => receiver.grpc_endpoint(),
        _ => receiver.http_endpoint(),
    };
    let sandbox = Sandbox::new();
    let demo = HttpDemo::spawn(&sandbox.ledger(), &[]);
    // Between the proxies and the demo server: what each forwarded call carried.
    let upstream = Forwarder::start(
        &format!("{}/mcp", demo.base_url()),
        None,
        Plan::new(|_| Fault::Forward),
        Duration::ZERO,
    );
    let namespace = unique_namespace("otel-traces");
    let args = ["--store", &redis, "--namespace", &namespace];
    let env = proxy_env(&endpoint, protocol);
    let first = Proxy::spawn_with_env(&upstream.url, &args, &env);
    let second = Proxy::spawn_with_env(&upstream.url, &args, &env);

    // The official Python SDK client: the call through the first proxy, its retry (same key)
    // through the second.
    let client_args: Vec<std::ffi::OsString> = vec![
        script("py_traced_client.py").into(),
        format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01").into(),
        first.url.clone().into(),
        second.url.clone().into(),
    ];
    let report = tokio::task::block_in_place(|| {
        run_report(
            Toolchain::Python.program(),
            &client_args,
            &sandbox.path("client.stderr"),
        )
    });
    let results = report["results"].as_array().expect("two results");
    let charge = |result: &Value| result["structuredContent"]["chargeId"].clone();
    assert!(charge(&results[0]).is_string(), "{report}");
    assert_eq!(charge(&results[0]), charge(&results[1]), "{report}");
    assert_eq!(
        ledger_lines(&sandbox.ledger()).len(),
        1,
        "the retry ran nothing"
    );
    let calls = upstream.exchanges();
    assert_eq!(calls.len(), 1, "the retry reached no upstream: {calls:?}");

    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            server_span(spans, "execute").is_some() && server_span(spans, "replay").is_some()
        })
        .await;
    let execution = assert_linked_execution(&spans, "redis");
    // The MCP semantic conventions.
    assert_eq!(execution.name, "tools/call charge_payment");
    for (name, value) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "charge_payment"),
        ("gen_ai.operation.name", "execute_tool"),
        ("mcp_idem.decision", "execute"),
        ("mcp_idem.key.source", "sep"),
    ] {
        assert_eq!(
            execution.str_attribute(name),
            Some(value),
            "{name}: {execution:#?}"
        );
    }
    assert!(execution.str_attribute("jsonrpc.request.id").is_some());
    assert!(execution.str_attribute("mcp.protocol.version").is_some());
    let digest = execution.str_attribute("mcp_idem.key.digest").unwrap();
    assert_eq!(digest.len(), 32, "a digest, never the key: {digest}");
    assert!(
        !format!("{spans:?}").contains("traced-order-1"),
        "the key leaked"
    );
    assert_eq!(
        execution.resource.get("service.name"),
        Some(&json!("mcp-idem-test"))
    );
    // The store's claim and completion, and the forwarded request, are its children.
    let children: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id.as_deref() == Some(execution.span_id.as_str()))
        .map(|s| (s.name.as_str(), s.kind, s.str_attribute("db.system.name")))
        .collect();
    for child in [
        ("claim", "client", Some("redis")),
        ("complete", "client", Some("redis")),
        ("tools/call charge_payment", "client", None),
    ] {
        assert!(children.contains(&child), "{child:?} in {children:?}");
    }
    let forwarded = spans
        .iter()
        .find(|s| {
            s.parent_span_id.as_deref() == Some(execution.span_id.as_str())
                && s.name == "tools/call charge_payment"
        })
        .unwrap();
    // The upstream saw mcp-idem's span as its parent, in `_meta` and in the header.
    let expected = format!("00-{CLIENT_TRACE}-{}-01", forwarded.span_id);
    assert_eq!(
        calls[0].meta_traceparent.as_deref(),
        Some(expected.as_str())
    );
    assert_eq!(calls[0].traceparent.as_deref(), Some(expected.as_str()));

    // The retry's span, through the second proxy, is linked to the first one's execution.
    let replay = server_span(&spans, "replay").unwrap();
    assert_eq!(replay.trace_id, CLIENT_TRACE);
    assert_eq!(
        replay.str_attribute("mcp_idem.linked.trace_id"),
        Some(CLIENT_TRACE)
    );
    assert_eq!(
        replay.str_attribute("mcp_idem.key.digest"),
        Some(digest),
        "one digest for one key"
    );
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_another_proxy_links_to_the_execution_over_grpc() {
    one_trace_through_two_proxies("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_another_proxy_links_to_the_execution_over_http() {
    one_trace_through_two_proxies("http/protobuf").await;
}

/// Tracing off: `_meta` (its `traceparent` too) reaches the upstream exactly as sent, with no
/// header added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tracing_meta_passes_untouched() {
    let upstream = RecordingUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let store = crate::support::http::sqlite_in(&dir);
    let proxy = Proxy::spawn(&upstream.origin, &["--store", &store, "--namespace", "n"]);
    let sent = traced_call(1, "order-8");
    let answer = Raw::new(&proxy).call(sent.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let seen = &upstream.seen()[0];
    let body: Value = serde_json::from_str(&seen.body).unwrap();
    let mut meta = body["params"]["_meta"].clone();
    meta.as_object_mut()
        .unwrap()
        .remove("mcp-idem/idempotencyKey");
    assert_eq!(meta, sent["params"]["_meta"]);
    assert_eq!(seen.traceparent, None);
}

/// `wrap` over stdio: the client's `_meta.traceparent` is the parent, the server gets mcp-idem's
/// span in `_meta`, and the retry on a new process (a new connection, no handshake) over the same
/// SQLite file replays with a link to the first process's execution; the last spans are flushed
/// when the client closes its input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrap_links_a_replay_in_a_new_process_to_the_execution() {
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = receiver.grpc_endpoint();
    let sandbox = Sandbox::new();
    // The first process's server input (`tee` truncates it: one file per process).
    let capture = sandbox.path("capture.1.jsonl");
    let run = |id: u64| {
        let server = sandbox.demo_with_capture(
            &sandbox.ledger(),
            &sandbox.path(&format!("capture.{id}.jsonl")),
        );
        let mut command = sandbox.wrap_command(&[], &server);
        command.envs(proxy_env(&endpoint, "grpc"));
        let mut peer = StdioPeer::spawn(command, &sandbox.path(&format!("wrap.{id}.stderr")));
        let mut call = charge(id, json!({"amount": 5, "currency": "usd"}), "order-9");
        call["params"]["_meta"]["traceparent"] =
            json!(format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"));
        let response = peer.request(call);
        assert!(peer.finish().success());
        response
    };
    // The receiver runs on this runtime's other worker meanwhile.
    let (executed, replayed) = tokio::task::block_in_place(|| (run(1), run(2)));
    assert!(executed.get("result").is_some(), "{executed}");
    assert_eq!(executed["result"], replayed["result"]);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);

    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            server_span(spans, "execute").is_some() && server_span(spans, "replay").is_some()
        })
        .await;
    let execution = assert_linked_execution(&spans, "sqlite");
    let forwarded = spans
        .iter()
        .find(|s| {
            s.kind == "client"
                && s.parent_span_id.as_deref() == Some(&execution.span_id)
                && s.name == execution.name
        })
        .unwrap_or_else(|| panic!("no forwarded span in {spans:#?}"));
    let sent: Vec<Value> = std::fs::read_to_string(&capture)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|m: &Value| m["method"] == "tools/call")
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0]["params"]["_meta"]["traceparent"],
        format!("00-{CLIENT_TRACE}-{}-01", forwarded.span_id)
    );
}

/// `wrap` with a `key-from` policy, after a 2025-06-18 `initialize`: while a call runs, a
/// duplicate that sent a key of its own is refused at once (`idempotency_key_in_progress`) and one
/// without a key waits for the outcome; both spans link to the running call's span and carry its
/// trace id, and every span has the revision the `initialize` result chose as
/// `mcp.protocol.version` (its calls have no per-request `_meta` version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrap_links_an_in_progress_rejection_and_a_waiting_duplicate_to_the_running_call() {
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = receiver.grpc_endpoint();
    let sandbox = Sandbox::new();
    let mut command = sandbox.wrap_command(
        &[
            "--tools",
            r#"{"charge_payment": {"key-from": "/order_id"}}"#,
        ],
        &sandbox.demo(&sandbox.ledger()),
    );
    command
        .envs(proxy_env(&endpoint, "grpc"))
        .env("MCP_IDEM_LOG", "debug");
    let arguments = json!({"amount": 7, "currency": "usd", "order_id": "ord-77", "delay_ms": 1500});
    // A legacy call: no per-request `_meta` version, the client's trace context only.
    let legacy_call = |id: u64, key: Option<&str>| {
        let mut call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "charge_payment", "arguments": arguments.clone(),
            "_meta": {"traceparent": format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")}}});
        if let Some(key) = key {
            call["params"]["idempotencyKey"] = json!(key);
        }
        call
    };
    let (running, refused, waited) = tokio::task::block_in_place(|| {
        let mut wrap = StdioPeer::spawn(command, &sandbox.path("wrap.stderr"));
        let initialized = wrap.request(crate::support::wrap::legacy_initialize(0));
        assert_eq!(initialized["result"]["protocolVersion"], "2025-06-18");
        wrap.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        wrap.send(&legacy_call(1, None));
        // Sent while call 1 runs (it takes 1.5 s).
        let refused = wrap.request(legacy_call(2, Some("own-key-2")));
        let waited = wrap.request(legacy_call(3, None));
        let running = wrap.response(&json!(1));
        assert!(wrap.finish().success());
        (running, refused, waited)
    });
    assert!(running["result"].is_object(), "{running}");
    assert_eq!(
        refused["error"]["data"]["type"], "idempotency_key_in_progress",
        "{refused}"
    );
    assert_eq!(
        waited["result"]["structuredContent"],
        running["result"]["structuredContent"]
    );
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);

    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            ["execute", "in_progress", "waited"]
                .iter()
                .all(|decision| server_span(spans, decision).is_some())
        })
        .await;
    let execution = server_span(&spans, "execute").unwrap();
    assert_eq!(execution.parent_span_id.as_deref(), Some(CLIENT_SPAN));
    assert_eq!(
        execution.str_attribute("mcp_idem.key.source"),
        Some("key-from")
    );
    for decision in ["in_progress", "waited"] {
        let span = server_span(&spans, decision).unwrap();
        assert!(
            span.links
                .iter()
                .any(|l| l.trace_id == execution.trace_id && l.span_id == execution.span_id),
            "{decision} links to the running call: {span:#?}"
        );
        assert_eq!(
            span.str_attribute("mcp_idem.linked.trace_id"),
            Some(CLIENT_TRACE)
        );
    }
    let refusal = server_span(&spans, "in_progress").unwrap();
    assert_eq!(refusal.status, "error");
    assert_eq!(
        refusal.str_attribute("error.type"),
        Some("idempotency_key_in_progress")
    );
    let waiting = server_span(&spans, "waited").unwrap();
    assert!(
        waiting.attributes["mcp_idem.wait.looks"].as_i64() > Some(0),
        "{waiting:#?}"
    );
    assert_eq!(
        waiting.status, "unset",
        "the waiting duplicate got the outcome: {waiting:#?}"
    );
    for span in spans.iter().filter(|s| s.kind == "server") {
        assert_eq!(
            span.str_attribute("mcp.protocol.version"),
            Some("2025-06-18"),
            "{span:#?}"
        );
    }
}

/// The Python binding, in process in an SDK server, exports with the same pipeline and the same
/// variables: its span's parent is the client's `_meta.traceparent`, and the retry, in a new
/// server process on the same SQLite file, links to the execution (the first process flushes its
/// spans as it exits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_binding_links_a_replay_to_the_execution() {
    let binding = Binding::Python;
    if !binding.require() {
        return;
    }
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = receiver.http_endpoint();
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let store = sandbox.store();
    let argv = binding.stdio_command(&ledger, &["--store", &store, "--namespace", "traced"]);
    let run = |id: u64| {
        let mut command = std::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .envs(proxy_env(&endpoint, "http/protobuf"));
        let mut peer = StdioPeer::spawn(command, &sandbox.path(&format!("server.{id}.stderr")));
        let mut call = charge(id, json!({"amount": 3, "currency": "eur"}), "order-10");
        call["params"]["_meta"]["traceparent"] =
            json!(format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"));
        let response = peer.request(call);
        assert!(peer.finish().success());
        response
    };
    let (executed, replayed) = tokio::task::block_in_place(|| (run(1), run(2)));
    let charged = |answer: &Value| answer["result"]["structuredContent"]["chargeId"].clone();
    assert!(charged(&executed).is_string(), "{executed}");
    assert_eq!(charged(&executed), charged(&replayed));
    assert_eq!(ledger_lines(&ledger).len(), 1);

    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            server_span(spans, "execute").is_some() && server_span(spans, "replay").is_some()
        })
        .await;
    assert_linked_execution(&spans, "sqlite");
}

/// With the collector's endpoint at a closed port, every call of a load succeeds and the spans
/// that could not be sent are dropped and counted (`mcp_idem_spans_dropped_total`); the calls'
/// durations are on the Prometheus endpoint by tool and decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_collector_every_call_succeeds_and_dropped_spans_are_counted() {
    let upstream = RecordingUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let store = crate::support::http::sqlite_in(&dir);
    let closed = crate::support::http::closed_port_url();
    let args = [
        "--store",
        &store,
        "--namespace",
        "n",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let proxy = Proxy::spawn_with_env(
        &upstream.origin,
        &args,
        &proxy_env(&closed, "http/protobuf"),
    );
    let raw = Raw::new(&proxy);
    const CALLS: u64 = 200;
    for id in 1..=CALLS {
        let answer = raw.call(traced_call(id, &format!("load-{id}"))).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(answer.json()["result"].is_object(), "{}", answer.body);
    }
    assert_eq!(upstream.seen().len(), CALLS as usize);
    let authority = crate::ops::metrics_authority(&proxy.stderr());
    let dropped = |scrape: &str| -> f64 {
        scrape
            .lines()
            .filter(|line| line.starts_with("mcp_idem_spans_dropped_total"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut scrape = crate::ops::scrape(&authority);
    // Each call makes four spans (the call, its claim and completion, the forwarded request).
    while dropped(&scrape) < (4 * CALLS) as f64 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        scrape = crate::ops::scrape(&authority);
    }
    assert_eq!(dropped(&scrape), (4 * CALLS) as f64, "{scrape}");
    let executed = crate::ops::sample(
        &scrape,
        "mcp_server_operation_duration_seconds_count{mcp_method_name=\"tools/call\",gen_ai_tool_name=\"_OTHER\",error_type=\"\",mcp_idem_decision=\"execute\"}",
    );
    assert_eq!(executed, CALLS as f64);
}

/// `bridge`: a call whose client sent a trace context goes on with it, and it is in the HTTP
/// `traceparent` header too; a call without one gets a span of the bridge's own (exported), whose
/// context the server gets in `_meta` and in the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_passes_its_clients_context_on_or_starts_one_per_call() {
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = receiver.http_endpoint();
    let upstream = RecordingUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-idem"));
    command
        .arg("bridge")
        .arg(format!("{}/mcp", upstream.origin))
        .env("MCP_IDEM_LOG", "warn")
        .envs(proxy_env(&endpoint, "http/protobuf"));
    let (given, started) = tokio::task::block_in_place(|| {
        let mut bridge = StdioPeer::spawn(command, &dir.path().join("bridge.stderr"));
        let mut with_context = traced_call(1, "order-11");
        with_context["params"]
            .as_object_mut()
            .unwrap()
            .remove("idempotencyKey");
        let given = bridge.request(with_context);
        let mut without = traced_call(2, "order-12");
        without["params"]["_meta"] = json!({});
        let started = bridge.request(without);
        assert!(bridge.finish().success());
        (given, started)
    });
    assert!(given["result"].is_object(), "{given}");
    assert!(started["result"].is_object(), "{started}");
    let calls: Vec<_> = upstream
        .seen()
        .into_iter()
        .filter(|seen| seen.body.contains("tools/call"))
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    let client_context = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let meta = |seen: &crate::support::upstream::Seen| -> Value {
        serde_json::from_str::<Value>(&seen.body).unwrap()["params"]["_meta"].clone()
    };
    assert_eq!(meta(&calls[0])["traceparent"], client_context.as_str());
    assert_eq!(
        calls[0].traceparent.as_deref(),
        Some(client_context.as_str())
    );
    let own = meta(&calls[1])["traceparent"]
        .as_str()
        .expect("the bridge's own context")
        .to_owned();
    assert_eq!(calls[1].traceparent.as_deref(), Some(own.as_str()));
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| !spans.is_empty())
        .await;
    assert_eq!(
        spans.len(),
        1,
        "one span, for the call without a context: {spans:#?}"
    );
    let span = &spans[0];
    assert_eq!(span.kind, "client");
    assert_eq!(own, format!("00-{}-{}-01", span.trace_id, span.span_id));
    assert_eq!(span.str_attribute("gen_ai.tool.name"), Some("charge"));
}

/// A call no key protects gets a span too (decision `bypass`, reason `no_key`, key source
/// `none`), whose forwarded request's context the upstream gets in `_meta` and the header; it is
/// timed by tool and decision. With tracing off, the same call reaches the upstream byte for byte
/// as the client sent it, and is not timed (it passes through unread), metrics endpoint or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_call_gets_a_span_and_passes_it_on() {
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = receiver.http_endpoint();
    let upstream = RecordingUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let store = crate::support::http::sqlite_in(&dir);
    let args = [
        "--store",
        &store,
        "--namespace",
        "n",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let mut unkeyed = traced_call(1, "unused");
    unkeyed["params"]
        .as_object_mut()
        .unwrap()
        .remove("idempotencyKey");
    let duration_count = |decision: &str| {
        format!(
            "mcp_server_operation_duration_seconds_count{{mcp_method_name=\"tools/call\",\
             gen_ai_tool_name=\"_OTHER\",error_type=\"\",mcp_idem_decision=\"{decision}\"}}"
        )
    };

    let traced = Proxy::spawn_with_env(
        &upstream.origin,
        &args,
        &proxy_env(&endpoint, "http/protobuf"),
    );
    let answer = Raw::new(&traced).call(unkeyed.clone()).await;
    assert!(answer.json()["result"].is_object(), "{}", answer.body);
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            server_span(spans, "bypass").is_some() && spans.len() >= 2
        })
        .await;
    let span = server_span(&spans, "bypass").unwrap();
    assert_eq!(span.name, "tools/call charge");
    assert_eq!(span.trace_id, CLIENT_TRACE);
    assert_eq!(span.parent_span_id.as_deref(), Some(CLIENT_SPAN));
    for (name, value) in [
        ("mcp_idem.decision.reason", "no_key"),
        ("mcp_idem.key.source", "none"),
        ("mcp.protocol.version", "2026-07-28"),
    ] {
        assert_eq!(span.str_attribute(name), Some(value), "{name}: {span:#?}");
    }
    assert_eq!(
        span.str_attribute("mcp_idem.store"),
        None,
        "no store: {span:#?}"
    );
    let forwarded = spans
        .iter()
        .find(|s| s.parent_span_id.as_deref() == Some(span.span_id.as_str()))
        .unwrap_or_else(|| panic!("no forwarded span in {spans:#?}"));
    assert_eq!(forwarded.kind, "client");
    let expected = format!("00-{CLIENT_TRACE}-{}-01", forwarded.span_id);
    let seen = &upstream.seen()[0];
    let body: Value = serde_json::from_str(&seen.body).unwrap();
    assert_eq!(body["params"]["_meta"]["traceparent"], expected.as_str());
    assert_eq!(body["params"]["_meta"]["baggage"], "tenant=acme");
    assert_eq!(seen.traceparent.as_deref(), Some(expected.as_str()));
    let authority = crate::ops::metrics_authority(&traced.stderr());
    let scrape = crate::ops::scrape(&authority);
    assert_eq!(
        crate::ops::sample(&scrape, &duration_count("bypass")),
        1.0,
        "{scrape}"
    );
    drop(traced);

    // Tracing off, durations recorded: the call goes on untouched, unread.
    let timed = Proxy::spawn(&upstream.origin, &args);
    let sent = unkeyed.to_string();
    let answer = Raw::new(&timed).call(unkeyed).await;
    assert!(answer.json()["result"].is_object(), "{}", answer.body);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].body, sent, "byte for byte");
    assert_eq!(seen[1].traceparent, None);
    let authority = crate::ops::metrics_authority(&timed.stderr());
    let scrape = crate::ops::scrape(&authority);
    assert!(
        !scrape.contains("mcp_idem_decision=\"bypass\""),
        "an unread call is not timed: {scrape}"
    );
    assert_eq!(
        crate::ops::sample(&scrape, "mcp_idem_bypasses_total{reason=\"no_key\"}"),
        1.0,
        "{scrape}"
    );
}

/// A call whose client's `traceparent` says "not sampled" (the default sampler follows it) makes
/// no span, yet its context goes on to the server, not sampled, in `_meta` and the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsampled_call_makes_no_span_and_passes_its_context_on() {
    let receiver = Receiver::start().await.expect("the OTLP receiver");
    let endpoint = receiver.http_endpoint();
    let upstream = RecordingUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let store = crate::support::http::sqlite_in(&dir);
    let args = ["--store", &store, "--namespace", "n"];
    let proxy = Proxy::spawn_with_env(
        &upstream.origin,
        &args,
        &proxy_env(&endpoint, "http/protobuf"),
    );
    let raw = Raw::new(&proxy);
    const UNSAMPLED: &str = "5bf92f3577b34da6a3ce929d0e0e4736";
    let mut unsampled = traced_call(1, "order-13");
    unsampled["params"]["_meta"]["traceparent"] = json!(format!("00-{UNSAMPLED}-{CLIENT_SPAN}-00"));
    assert_eq!(raw.call(unsampled).await.status, 200);
    // A sampled call after it: once its spans are in, the unsampled one's would be too.
    assert_eq!(raw.call(traced_call(2, "order-14")).await.status, 200);
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            server_span(spans, "execute").is_some()
        })
        .await;
    assert!(spans.iter().all(|s| s.trace_id != UNSAMPLED), "{spans:#?}");
    assert!(spans.iter().all(|s| s.trace_id == CLIENT_TRACE));
    let seen = &upstream.seen()[0];
    let body: Value = serde_json::from_str(&seen.body).unwrap();
    let sent = body["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(sent.starts_with(&format!("00-{UNSAMPLED}-")), "{sent}");
    assert!(sent.ends_with("-00"), "not sampled: {sent}");
    assert_eq!(seen.traceparent.as_deref(), Some(sent.as_str()));
}
