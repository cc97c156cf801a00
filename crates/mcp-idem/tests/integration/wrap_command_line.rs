//! `wrap`'s command line: the server's command with or without `--`.
//!
//! The first word that is not one of `wrap`'s options starts the server's command line, and every
//! word after it is the server's (`--config` there is the server's, not `wrap`'s; a `--` there is
//! passed on). A launcher that strips `--` (the MCP Inspector's CLI does) still starts `wrap`
//! right: the last test drives `wrap` through the Inspector's CLI, unmodified from the npm registry
//! (`@modelcontextprotocol/inspector`, pinned in `interop/package.json`, on the Node 22 that
//! `scripts/conformance.sh --install-only` installs), around `@modelcontextprotocol/server-memory`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::support::common::{ledger_lines, StdioPeer};
use crate::support::interop::interop_dir;
use crate::support::wrap::{charge, charge_id, Sandbox, EXE};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

/// `mcp-idem wrap --store STORE SERVER...`: no `--` before the server's command.
fn wrap_without_dashes(sandbox: &Sandbox, server: &[OsString]) -> StdioPeer {
    let mut command = Command::new(EXE);
    command
        .arg("wrap")
        .arg("--store")
        .arg(sandbox.store())
        .args(server)
        .env("MCP_IDEM_LOG", "warn")
        .env_remove("MCP_IDEM_CONFIG")
        .env_remove("MCP_IDEM_NAMESPACE");
    StdioPeer::spawn(command, &sandbox.path("wrap.stderr"))
}

#[test]
fn a_command_without_dashes_is_wrapped() {
    let sandbox = Sandbox::new();
    let ledger = sandbox.ledger();
    let mut wrap = wrap_without_dashes(&sandbox, &sandbox.demo(&ledger));
    let first = wrap.request(charge(
        1,
        json!({"amount": 5, "currency": "usd"}),
        "no-dashes",
    ));
    let retry = wrap.request(charge(
        2,
        json!({"amount": 5, "currency": "usd"}),
        "no-dashes",
    ));
    assert_eq!(charge_id(&first), charge_id(&retry), "{retry}");
    assert_eq!(
        ledger_lines(&ledger).len(),
        1,
        "the retry ran the tool again"
    );
    wrap.close_stdin();
    assert!(wrap.finish().success());
}

/// What `sh -c 'printf "%s\n" "$@" > FILE' sh ARGS...` (the "server") was started with.
fn server_arguments(wrap_args: &[&str], file: &Path) -> Vec<String> {
    let script = format!("printf '%s\\n' \"$@\" > '{}'", file.display());
    let output = Command::new(EXE)
        .arg("wrap")
        .args(["--store", "memory"])
        .args(wrap_args)
        .args(["sh", "-c", &script, "sh"])
        .args(["--config", "theirs.toml", "--", "--store", "x"])
        .env_remove("MCP_IDEM_CONFIG")
        .output()
        .expect("run mcp-idem wrap");
    assert!(output.status.success(), "{output:?}");
    std::fs::read_to_string(file)
        .expect("the server wrote its arguments")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_word_after_the_command_is_the_servers() {
    let sandbox = Sandbox::new();
    let expected = ["--config", "theirs.toml", "--", "--store", "x"];
    for wrap_args in [&[][..], &["--"][..]] {
        let file = sandbox.path("args.txt");
        assert_eq!(
            server_arguments(wrap_args, &file),
            expected,
            "with {wrap_args:?}"
        );
    }
}

#[test]
fn a_config_after_the_command_is_not_read_by_wrap() {
    let missing = "/nonexistent/mcp-idem-test.toml";
    let check = |args: &[&str]| {
        Command::new(EXE)
            .args(["config-check", "wrap"])
            .args(args)
            .env_remove("MCP_IDEM_CONFIG")
            .output()
            .expect("run mcp-idem config-check")
    };
    let theirs = check(&["node", "server.js", "--config", missing]);
    assert!(theirs.status.success(), "{theirs:?}");
    let ours = check(&["--config", missing, "node", "server.js"]);
    assert!(!ours.status.success(), "{ours:?}");
    let stderr = String::from_utf8_lossy(&ours.stderr);
    assert!(
        stderr.contains("cannot read the config file") && stderr.contains(missing),
        "{stderr}"
    );
}

#[test]
fn a_mistyped_option_is_an_error_not_a_command() {
    let output = Command::new(EXE)
        .args(["wrap", "--stor", "memory", "node", "server.js"])
        .output()
        .expect("run mcp-idem wrap");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unexpected argument '--stor'"), "{stderr}");
}

/// The Inspector's pieces: Node 22, its CLI launcher and the memory server it launches.
struct Inspector {
    node: PathBuf,
    launcher: PathBuf,
    memory_server: PathBuf,
}

impl Inspector {
    /// `None` (a note; under `CI=true` a panic) when Node 22 (`scripts/conformance.sh
    /// --node-path`) or the npm packages are not installed.
    fn find() -> Option<Self> {
        let modules = interop_dir().join("node_modules/@modelcontextprotocol");
        let launcher = modules.join("inspector/clients/launcher/build/index.js");
        let memory_server = modules.join("server-memory/dist/index.js");
        let output = Command::new("bash")
            .arg(interop_dir().join("../scripts/conformance.sh"))
            .arg("--node-path")
            .output()
            .expect("run scripts/conformance.sh --node-path");
        let why = if !output.status.success() {
            "Node 22 is not installed: run `scripts/conformance.sh --install-only`"
        } else if !launcher.is_file() || !memory_server.is_file() {
            "the MCP Inspector or server-memory is missing: run `npm ci` in interop/"
        } else {
            let node = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
            return Some(Self {
                node,
                launcher,
                memory_server,
            });
        };
        assert!(!in_ci(), "CI=true but {why}");
        eprintln!("NOTE: skipping the MCP Inspector test: {why}");
        None
    }

    /// One `tools/call` of `create_entities` through the Inspector's CLI, as a user types it:
    /// `--cli mcp-idem wrap --store STORE --tools POLICY -- node server-memory ...`. The Inspector
    /// drops the `--` before launching `wrap`.
    fn create_entity(&self, sandbox: &Sandbox, memory_file: &Path) -> Value {
        let policy = r#"{"create_entities": {"window": "1m"}}"#;
        let entity =
            r#"{"entities":[{"name":"ledger","entityType":"account","observations":["opened"]}]}"#;
        let output = Command::new(&self.node)
            .arg(&self.launcher)
            .args(["--cli", EXE, "wrap", "--store"])
            .arg(sandbox.store())
            .args(["--tools", policy, "--", "node"])
            .arg(&self.memory_server)
            .arg("-e")
            .arg(format!("MEMORY_FILE_PATH={}", memory_file.display()))
            .args(["--method", "tools/call", "--tool-name", "create_entities"])
            .args(["--tool-args-json", entity])
            .env("MCP_IDEM_LOG", "warn")
            .env_remove("MCP_IDEM_CONFIG")
            .current_dir(interop_dir())
            .output()
            .expect("run the MCP Inspector's CLI");
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
            panic!(
                "the Inspector printed no JSON ({err}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}

/// The Inspector's CLI strips `--` from the command it launches: `wrap` still starts the server,
/// and a call repeated within the tool's window is the first call's replay (the Inspector prints
/// the marker), not a second run.
#[test]
fn the_inspector_cli_drives_wrap() {
    let Some(inspector) = Inspector::find() else {
        return;
    };
    let sandbox = Sandbox::new();
    let memory_file = sandbox.path("memory.jsonl");
    let first = inspector.create_entity(&sandbox, &memory_file);
    assert_eq!(
        first["structuredContent"]["entities"][0]["name"], "ledger",
        "{first}"
    );
    assert!(first.get("_meta").is_none(), "{first}");
    let again = inspector.create_entity(&sandbox, &memory_file);
    assert_eq!(again["_meta"]["mcp-idem/replayed"], "window", "{again}");
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    let memory = std::fs::read_to_string(&memory_file).expect("the memory server wrote its file");
    assert_eq!(memory.lines().count(), 1, "{memory}");
}
