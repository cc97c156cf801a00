//! The SEP-3182 scenarios against servers that carry the library in process through a binding:
//! the Python SDK's `MCPServer` with the `mcp-idempotency` wheel (`bindings/python`) and the
//! TypeScript SDK's `McpServer` with the `mcp-idempotency` npm package (`bindings/node`). Each
//! binding's payments server (`bindings/python/tests/payments_server.py`,
//! `bindings/node/test/payments-server.mjs`) takes the demo server's tools and ledger, so every
//! scenario here is the one `wrap` and `proxy` pass:
//!
//! - `mcp-idem check` passes, over stdio and over Streamable HTTP;
//! - the official clients (Python `mcp` 2.x, TypeScript SDK v2), unmodified, run the dedup
//!   scenario of `interop_clients` (replay, conflict, in-progress, replay after it) over stdio and
//!   Streamable HTTP, with one ledger line per key;
//! - two server processes on one Redis take a storm of 200 duplicates and execute it once;
//! - a server SIGKILLed while a keyed call runs leaves a claim that a restarted server answers
//!   `idempotency_outcome_unknown`, never a second execution.
//!
//! - every shared store works by URL (Redis, PostgreSQL, Redis Cluster, both over TLS);
//! - the binding's own tests pass (`bindings/python/tests` with pytest, `bindings/node/test` with
//!   `node --test`): bad store URLs and keys get `wrap`'s errors (compared with a `wrap` run side
//!   by side), a misspelled option or policy setting is named as the user wrote it (`after_crash`,
//!   `afterCrash`, `keyFrom`), a store that goes down mid-run refuses keyed calls and loses no
//!   outcome, and the npm package installs with its prebuilt addon, beside either SDK line
//!   without adding the other, and into a project on fastmcp 3.x, left as it is (`idempotent()`
//!   then throws, naming its version); the npm package's framework matrix (`frameworks.test.mjs`: the
//!   TypeScript SDK v1 and v2, `McpServer` and low-level `Server`, and punkpeye's fastmcp, over
//!   stdio and Streamable HTTP, pass `check` and a SIGKILL mid-call) and its refusals of what it
//!   cannot wire (`shapes.test.mjs`); the key policies of issue 34
//!   (`tools`, `meta-key`) hold with the official clients: a key in `_meta`, a business
//!   identifier, `required`, a window, and a key-less duplicate waiting beside the elicitation
//!   answer its running call waits for; and the Python binding holds on every framework it
//!   supports (`tests/test_frameworks.py`: `mcp` 2.x and 1.x, jlowin's `fastmcp` 4.x and 3.x, each
//!   pinned in a venv of its own: `check` over stdio and Streamable HTTP, a SIGKILL mid-call, the
//!   key policies, the wheel's dependencies leaving the framework as it is, and what it refuses).
//!
//! The bindings are built and installed by `bindings/python/install.sh` (the framework venvs by
//! `bindings/python/frameworks.sh`) and `bindings/node/install.sh` (`.ci/run` runs them). Without them the tests print a note and pass,
//! except under `CI=true`, where they fail.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::check::{witness_options, Run, CHARGES_OF_A_PASSING_RUN};
use crate::interop_clients::assert_dedup;
use crate::support::common::{ledger_lines, StdioPeer};
use crate::support::http::{unique_namespace, Answer, Raw, SharedStore, Spawned};
use crate::support::interop::{run_report, script, Toolchain};
use crate::support::wrap::{charge, discover, Sandbox};

/// A language binding of the library, with its payments server.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Binding {
    /// `pip install mcp-idempotency` (bindings/python), on the Python SDK `mcp` 2.x.
    Python,
    /// `npm install mcp-idempotency` (bindings/node), on the TypeScript SDK v2.
    Node,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

impl Binding {
    /// The interpreter and SDK the binding's server runs on.
    pub(crate) fn toolchain(self) -> Toolchain {
        match self {
            Self::Python => Toolchain::Python,
            Self::Node => Toolchain::Node,
        }
    }

    /// The binding's payments server script.
    pub(crate) fn payments_server(self) -> PathBuf {
        match self {
            Self::Python => repo().join("bindings/python/tests/payments_server.py"),
            Self::Node => repo().join("bindings/node/test/payments-server.mjs"),
        }
    }

    /// Why the binding cannot be loaded, or `None` when it can.
    fn missing(self) -> Option<String> {
        let (program, probe, install) = match self {
            Self::Python => (
                "python3",
                vec!["-c".to_owned(), "import mcp_idempotency".to_owned()],
                "bindings/python/install.sh",
            ),
            Self::Node => {
                let index = repo().join("bindings/node/index.js");
                let code = format!("import({:?}).then(() => {{}})", index.display().to_string());
                (
                    "node",
                    vec!["-e".to_owned(), code],
                    "bindings/node/install.sh",
                )
            }
        };
        match Command::new(program).args(&probe).output() {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(format!(
                "the {self:?} binding does not load ({}): run {install}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(err) => Some(format!("`{program}` cannot be started: {err}")),
        }
    }

    /// `true` when the binding's server can run. When it cannot: panics under `CI=true`, else
    /// prints a note and returns `false` (the test then ends without checking anything).
    pub(crate) fn require(self) -> bool {
        if !self.toolchain().require() {
            return false;
        }
        let Some(why) = self.missing() else {
            return true;
        };
        assert!(!in_ci(), "CI=true but {why}");
        eprintln!("NOTE: skipping a {self:?} binding test: {why} (set CI=true to fail instead)");
        false
    }

    /// `[program, payments server, --ledger, LEDGER, extra…]`: the command line of the bound
    /// server over stdio.
    pub(crate) fn stdio_command(self, ledger: &Path, extra: &[&str]) -> Vec<OsString> {
        let mut command: Vec<OsString> = vec![
            self.toolchain().program().into(),
            self.payments_server().into(),
            "--ledger".into(),
            ledger.into(),
        ];
        command.extend(extra.iter().map(OsString::from));
        command
    }

    /// The bound server over stateless Streamable HTTP on a free port.
    pub(crate) fn spawn_http(self, ledger: &Path, extra: &[&str]) -> BoundHttp {
        let mut argv = self.stdio_command(ledger, extra);
        argv.push("--http".into());
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).env("PYTHONDONTWRITEBYTECODE", "1");
        let name = format!("{self:?} payments server");
        let (process, rest) = Spawned::spawn(command, &name, "listening on ");
        BoundHttp {
            process,
            url: rest.trim().to_owned(),
        }
    }
}

/// A bound payments server over HTTP, killed on drop.
pub(crate) struct BoundHttp {
    pub(crate) process: Spawned,
    /// `http://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
}

fn check_over_stdio(binding: Binding) {
    if !binding.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let store = sandbox.store();
    let server = binding.stdio_command(&ledger, &["--store", &store]);
    let mut target: Vec<&str> = vec!["--"];
    target.extend(server.iter().map(|arg| arg.to_str().unwrap()));
    let run = Run::new(&witness_options(), &target);
    run.assert_outcome(&[], &["mrtr.continuation"]);
    assert_eq!(run.code(), Some(0));
    // As for `wrap` around the demo server: two unkeyed calls, then one per key that ran.
    let charges = ledger_lines(&ledger).len();
    assert_eq!(charges, CHARGES_OF_A_PASSING_RUN, "{:#}", run.report);
}

fn check_over_http(binding: Binding) {
    if !binding.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let server = binding.spawn_http(&ledger, &["--store", "memory"]);
    let run = Run::new(&witness_options(), &["--url", &server.url]);
    run.assert_outcome(&[], &["mrtr.continuation"]);
    assert_eq!(run.code(), Some(0));
    let charges = ledger_lines(&ledger).len();
    assert_eq!(charges, CHARGES_OF_A_PASSING_RUN, "{:#}", run.report);
}

/// An official client (`client`: `py_client.py` or `ts-client.mjs` on `toolchain`) runs the
/// dedup scenario against the bound server over stdio.
fn sdk_client_over_stdio(binding: Binding, toolchain: Toolchain, client: &str) {
    if !binding.require() || !toolchain.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let store = sandbox.store();
    let mut args: Vec<OsString> = vec![script(client).into(), "dedup".into(), "stdio".into()];
    args.push("--".into());
    args.extend(binding.stdio_command(&sandbox.ledger(), &["--store", &store]));
    let report = run_report(toolchain.program(), &args, &sandbox.path("client.stderr"));
    assert_dedup(&report, &sandbox.ledger());
}

fn sdk_client_over_http(binding: Binding, toolchain: Toolchain, client: &str, extra: &[&str]) {
    if !binding.require() || !toolchain.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let store = sandbox.store();
    let mut options = vec!["--store", store.as_str()];
    options.extend(extra);
    let server = binding.spawn_http(&sandbox.ledger(), &options);
    let args: Vec<OsString> = vec![
        script(client).into(),
        "dedup".into(),
        "http".into(),
        server.url.clone().into(),
    ];
    let report = run_report(toolchain.program(), &args, &sandbox.path("client.stderr"));
    assert_dedup(&report, &sandbox.ledger());
}

/// A keyed `charge_payment` of 100 EUR that takes `delay_ms`.
fn keyed_charge(id: u64, key: &str, delay_ms: u64) -> Value {
    crate::support::http::tool_call(
        id,
        "charge_payment",
        json!({"amount": 100, "currency": "eur", "delay_ms": delay_ms}),
        Some(key),
    )
}

fn charge_id(answer: &Answer) -> Option<String> {
    answer.json()["result"]["structuredContent"]["chargeId"]
        .as_str()
        .map(str::to_owned)
}

/// How many duplicates the storm sends.
const STORM: usize = 200;

/// Two bound servers on one Redis, `STORM` duplicates of one keyed call spread over both, all
/// at once: one execution, every other answer the replay of its result or "in progress".
async fn storm_on_one_redis(binding: Binding) {
    if !binding.require() {
        return;
    }
    let Some(redis) = SharedStore::Redis.url() else {
        return;
    };
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let namespace = unique_namespace("binding-storm");
    let options = ["--store", redis.as_str(), "--namespace", namespace.as_str()];
    let servers = [
        binding.spawn_http(&ledger, &options),
        binding.spawn_http(&ledger, &options),
    ];
    let clients: Vec<Raw> = servers.iter().map(|server| Raw::new(&server.url)).collect();
    let clients = std::sync::Arc::new(clients);
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..STORM {
        let clients = std::sync::Arc::clone(&clients);
        calls.spawn(async move {
            let answer = clients[n % 2]
                .call(keyed_charge(n as u64 + 1, "storm-key", 300))
                .await;
            (answer.charge_id_or_error(), answer.json())
        });
    }
    let mut executed = Vec::new();
    let mut in_progress = 0;
    while let Some(joined) = calls.join_next().await {
        let (outcome, answer) = joined.expect("a storm call panicked");
        match outcome {
            Ok(charge) => executed.push(charge),
            Err(kind) if kind == "idempotency_key_in_progress" => in_progress += 1,
            Err(kind) => panic!("unexpected answer {kind}: {answer}"),
        }
    }
    let lines = ledger_lines(&ledger);
    assert_eq!(
        lines.len(),
        1,
        "{STORM} duplicates ran more than once: {lines:?}"
    );
    let charged = lines[0]["chargeId"].as_str().unwrap().to_owned();
    assert!(
        executed.iter().all(|charge| *charge == charged),
        "{executed:?}"
    );
    assert_eq!(executed.len() + in_progress, STORM);
    // Once it is recorded, every retry on either server is its replay.
    for client in clients.iter() {
        let replay = client.call(keyed_charge(1000, "storm-key", 300)).await;
        assert_eq!(
            charge_id(&replay).as_deref(),
            Some(charged.as_str()),
            "{}",
            replay.json()
        );
    }
    assert_eq!(ledger_lines(&ledger).len(), 1);
}

trait StormAnswer {
    /// The charge id of a result, or the `error.data.type` of an error.
    fn charge_id_or_error(&self) -> Result<String, String>;
}

impl StormAnswer for Answer {
    fn charge_id_or_error(&self) -> Result<String, String> {
        charge_id(self).ok_or_else(|| self.error_type().unwrap_or_else(|| self.json().to_string()))
    }
}

/// A bound server SIGKILLed while a keyed call runs: a server started again on the same store
/// answers the retry `idempotency_outcome_unknown` once the dead claim's lease ran out, and the
/// tool never runs a second time.
async fn sigkill_leaves_outcome_unknown(binding: Binding) {
    if !binding.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let store = sandbox.store();
    let options = ["--store", store.as_str(), "--lease", "1s"];
    let mut first = binding.spawn_http(&ledger, &options);
    let client = Raw::new(&first.url);
    let running = {
        let client = Raw::new(&first.url);
        tokio::spawn(async move {
            client
                .hang_up_after(&keyed_charge(1, "killed", 60_000), Duration::from_secs(60))
                .await
        })
    };
    // The call is claimed once a duplicate is told it is in progress. A duplicate that reached
    // the server first runs instead (the same call): it is given up after a second, and the
    // next duplicate finds it running.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let duplicate = client.call(keyed_charge(2, "killed", 60_000));
        let answer = tokio::time::timeout(Duration::from_secs(1), duplicate).await;
        if let Ok(duplicate) = &answer {
            if duplicate.error_type().as_deref() == Some("idempotency_key_in_progress") {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the call was never claimed: {:?}",
            answer.map(|duplicate| duplicate.json())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.process.kill();
    running.abort();

    let second = binding.spawn_http(&ledger, &options);
    let retry_client = Raw::new(&second.url);
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        let answer = retry_client.call(keyed_charge(3, "killed", 60_000)).await;
        match answer.error_type().as_deref() {
            // The dead owner's lease (1 s) has not run out yet.
            Some("idempotency_key_in_progress") if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            _ => break answer,
        }
    };
    assert_eq!(
        answer.error_type().as_deref(),
        Some("idempotency_outcome_unknown"),
        "{}",
        answer.json()
    );
    // The killed call never finished, and the retry did not run it again.
    assert_eq!(
        ledger_lines(&ledger).len(),
        0,
        "{:?}",
        ledger_lines(&ledger)
    );
}

/// The binding on every shared store by URL, as `wrap --store` takes them (Redis, PostgreSQL,
/// Redis Cluster, and Redis and Redis Cluster over TLS with a CA file): a retry replays the first
/// charge, one ledger line.
fn every_store_by_url(binding: Binding) {
    if !binding.require() {
        return;
    }
    let stores = [
        SharedStore::Redis,
        SharedStore::Postgres,
        SharedStore::RedisCluster,
        SharedStore::RedisTls,
        SharedStore::RedisTlsCluster,
    ];
    for store in stores {
        let Some(url) = store.url() else {
            continue;
        };
        let sandbox = Sandbox::new();
        let ledger = sandbox.ledger();
        let namespace = unique_namespace("binding-store");
        let options = ["--store", url.as_str(), "--namespace", namespace.as_str()];
        let argv = binding.stdio_command(&ledger, &options);
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).env("PYTHONDONTWRITEBYTECODE", "1");
        let mut peer = StdioPeer::spawn(command, &sandbox.path("server.stderr"));
        let discovered = peer.request(discover(1));
        assert!(
            discovered["result"]["capabilities"]["tools"]["idempotency"].is_object(),
            "{store:?}: {discovered}"
        );
        let arguments = json!({"amount": 3, "currency": "eur"});
        let first = peer.request(charge(2, arguments.clone(), "store-key"));
        let retry = peer.request(charge(3, arguments, "store-key"));
        let charged = |answer: &Value| answer["result"]["structuredContent"]["chargeId"].clone();
        assert!(charged(&first).is_string(), "{store:?}: {first}");
        assert_eq!(charged(&first), charged(&retry), "{store:?}: {retry}");
        assert_eq!(ledger_lines(&ledger).len(), 1, "{store:?}");
    }
}

/// Runs the binding's own test suite against this build of `mcp-idem` (for the side-by-side
/// comparisons with `wrap`); fails with its output when a test fails.
fn own_tests(binding: Binding) {
    if !binding.require() {
        return;
    }
    let (program, args, directory): (&str, &[&str], PathBuf) = match binding {
        Binding::Python => (
            "python3",
            &["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            repo().join("bindings/python"),
        ),
        Binding::Node => (
            "node",
            &[
                "--test",
                "--test-reporter=dot",
                "test/binding.test.mjs",
                "test/key-sources.test.mjs",
                "test/package.test.mjs",
                "test/shapes.test.mjs",
                "test/frameworks.test.mjs",
            ],
            repo().join("bindings/node"),
        ),
    };
    let output = Command::new(program)
        .args(args)
        .current_dir(&directory)
        .env("MCP_IDEM_BIN", env!("CARGO_BIN_EXE_mcp-idem"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|err| panic!("cannot start {program}: {err}"));
    assert!(
        output.status.success(),
        "the {binding:?} binding's tests failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The binding's `_meta` key, exit-time settle grace (ms) and option names, as its language sees
/// them: they are the library's, not copies of them.
fn constants_are_the_librarys(binding: Binding) {
    if !binding.require() {
        return;
    }
    let (program, flag, code) = match binding {
        Binding::Python => (
            "python3",
            "-c",
            "import json, mcp_idempotency as m, mcp_idempotency._native as n; \
             print(json.dumps([m.META_KEY, n.SETTLE_GRACE_SECONDS * 1000, m.OPTIONS]))",
        ),
        Binding::Node => (
            "node",
            "-e",
            "const m = require('./index.js'); \
             const n = require(`./mcp-idempotency.${require('./triple.js').platformTriple()}.node`); \
             console.log(JSON.stringify([m.META_KEY, n.settleGraceMs(), m.OPTIONS]))",
        ),
    };
    let output = Command::new(program)
        .args([flag, code])
        .current_dir(repo().join("bindings/node"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|err| panic!("cannot start {program}: {err}"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = mcp_idempotency::embedded::options::every()
        .map(|option| option.name)
        .collect();
    let grace_ms = mcp_idempotency::stdio::DEFAULT_SHUTDOWN_GRACE.as_millis();
    assert_eq!(seen[0], mcp_idempotency::interceptor::META_KEY, "{seen}");
    assert_eq!(seen[1].as_f64(), Some(grace_ms as f64), "{seen}");
    assert_eq!(seen[2], json!(names), "{seen}");
}

macro_rules! scenarios {
    ($module:ident, $binding:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn check_passes_over_stdio() {
                check_over_stdio($binding);
            }

            #[test]
            fn check_passes_over_http() {
                check_over_http($binding);
            }

            #[test]
            fn the_python_sdk_client_dedups_over_stdio() {
                sdk_client_over_stdio($binding, Toolchain::Python, "py_client.py");
            }

            #[test]
            fn the_python_sdk_client_dedups_over_http() {
                sdk_client_over_http($binding, Toolchain::Python, "py_client.py", &[]);
            }

            #[test]
            fn the_typescript_sdk_client_dedups_over_stdio() {
                sdk_client_over_stdio($binding, Toolchain::Node, "ts-client.mjs");
            }

            #[test]
            fn the_typescript_sdk_client_dedups_over_http() {
                sdk_client_over_http($binding, Toolchain::Node, "ts-client.mjs", &[]);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_servers_on_one_redis_run_a_storm_of_duplicates_once() {
                storm_on_one_redis($binding).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_sigkilled_servers_claim_ends_outcome_unknown() {
                sigkill_leaves_outcome_unknown($binding).await;
            }

            #[test]
            fn every_store_by_url_replays() {
                every_store_by_url($binding);
            }

            #[test]
            fn the_bindings_own_tests_pass() {
                own_tests($binding);
            }

            #[test]
            fn the_meta_key_settle_grace_and_options_are_the_librarys() {
                constants_are_the_librarys($binding);
            }
        }
    };
}

scenarios!(python, Binding::Python);

/// The Python SDK serves Streamable HTTP with sessions (`Mcp-Session-Id`) and SSE answers too; the
/// binding is in its middleware chain there as well.
mod python_sessions {
    use super::*;

    #[test]
    fn the_python_sdk_client_dedups_over_http_with_sessions() {
        let client = "py_client.py";
        sdk_client_over_http(Binding::Python, Toolchain::Python, client, &["--sessions"]);
    }

    #[test]
    fn the_typescript_sdk_client_dedups_over_http_with_sessions() {
        let client = "ts-client.mjs";
        sdk_client_over_http(Binding::Python, Toolchain::Node, client, &["--sessions"]);
    }
}
scenarios!(node, Binding::Node);
