//! Real third-party MCP servers behind the gateway: a Python SDK 2.x `MCPServer` (the former
//! FastMCP, `interop/py_server.py`) and a TypeScript SDK v2 `McpServer` (`interop/ts-server.mjs`),
//! each behind `mcp-idem wrap` over stdio and behind `mcp-idem proxy` over Streamable HTTP.
//!
//! Discovery through the gateway shows `tools.idempotency`; a keyed `charge` runs once (the server
//! appends one line per execution to its executions file) and its retry is the replay.

use std::ffi::OsString;
use std::path::Path;

use serde_json::{json, Value};

use crate::support::http::{Proxy, Raw};
use crate::support::interop::{
    assert_advertises_idempotency, executions, script, HttpFixture, Toolchain,
};
use crate::support::wrap::{call, discover, Sandbox};

const KEY: &str = "interop-server-key";

/// Which fixture server, and how to start it.
#[derive(Clone, Copy)]
enum Fixture {
    TypeScript,
    Python,
}

impl Fixture {
    fn toolchain(self) -> Toolchain {
        match self {
            Self::TypeScript => Toolchain::Node,
            Self::Python => Toolchain::Python,
        }
    }

    /// The command line serving stdio; `--http` added for Streamable HTTP.
    fn command(self, executions_file: &Path) -> Vec<OsString> {
        let name = match self {
            Self::TypeScript => "ts-server.mjs",
            Self::Python => "py_server.py",
        };
        vec![
            self.toolchain().program().into(),
            script(name).into(),
            "--executions".into(),
            executions_file.into(),
        ]
    }
}

fn keyed_charge(id: u64) -> Value {
    call(
        id,
        "charge",
        json!({"amount": 5, "currency": "usd"}),
        Some(json!(KEY)),
    )
}

fn execution_id(response: &Value) -> String {
    assert!(response["result"]["isError"] != true, "{response}");
    response["result"]["structuredContent"]["executionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no executionId in {response}"))
        .to_owned()
}

/// The keyed call and its retry gave the same execution, and the server ran it once.
fn assert_ran_once(fixture: Fixture, first: &Value, retry: &Value, executions_file: &Path) {
    let id = execution_id(first);
    assert_eq!(execution_id(retry), id, "the retry is not the replay");
    let lines = executions(executions_file);
    assert_eq!(lines.len(), 1, "one execution expected: {lines:?}");
    assert_eq!(lines[0]["executionId"], id.as_str(), "{lines:?}");
    if let Fixture::TypeScript = fixture {
        // The TypeScript fixture records the key the gateway passed in _meta.
        assert_eq!(lines[0]["key"], KEY, "{lines:?}");
    }
}

fn behind_wrap(fixture: Fixture) {
    if !fixture.toolchain().require() {
        return;
    }
    let sandbox = Sandbox::new();
    let executions_file = sandbox.path("executions.jsonl");
    let mut peer = sandbox.wrap(&[], &fixture.command(&executions_file));

    let discovered = peer.request(discover(1));
    assert_advertises_idempotency(&discovered["result"]);
    let first = peer.request(keyed_charge(2));
    let retry = peer.request(keyed_charge(3));
    assert_ran_once(fixture, &first, &retry, &executions_file);
}

async fn behind_proxy(fixture: Fixture) {
    if !fixture.toolchain().require() {
        return;
    }
    let sandbox = Sandbox::new();
    let executions_file = sandbox.path("executions.jsonl");
    let command = fixture.command(&executions_file);
    let mut args = command[1..].to_vec();
    args.push("--http".into());
    let server = HttpFixture::spawn(fixture.toolchain().program(), &args);
    let store = sandbox.store();
    let proxy = Proxy::spawn(&server.base_url(), &["--store", &store]);
    let raw = Raw::new(&proxy);

    let discovered = raw.call(discover(1)).await;
    assert_eq!(discovered.status, 200, "{}", discovered.body);
    assert_advertises_idempotency(&discovered.json()["result"]);
    let first = raw.call(keyed_charge(2)).await;
    let retry = raw.call(keyed_charge(3)).await;
    assert_ran_once(fixture, &first.json(), &retry.json(), &executions_file);
}

#[test]
fn typescript_sdk_server_behind_wrap() {
    behind_wrap(Fixture::TypeScript);
}

#[test]
fn python_sdk_server_behind_wrap() {
    behind_wrap(Fixture::Python);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_server_behind_proxy() {
    behind_proxy(Fixture::TypeScript).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_server_behind_proxy() {
    behind_proxy(Fixture::Python).await;
}
