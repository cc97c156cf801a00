//! The README's Python and TypeScript snippets, run as they are written: each is a whole server
//! with the binding's one line, started over stdio with the default store (SQLite in the user's
//! data directory, here the sandbox's `XDG_DATA_HOME`). A client sees the capability, and a retry
//! with the same key replays the first charge instead of charging again.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::binding_scenarios::Binding;
use crate::support::common::StdioPeer;
use crate::support::wrap::{assert_rejected, call, discover, Sandbox};

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The first ```` ```fence ```` block after the heading `heading`.
pub(crate) fn snippet(heading: &str, fence: &str) -> String {
    let readme = readme();
    let section = readme
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?} in the README"))
        .1;
    let block = section
        .split_once(&format!("```{fence}\n"))
        .unwrap_or_else(|| panic!("no ```{fence} block under {heading:?}"))
        .1;
    block
        .split_once("\n```")
        .unwrap_or_else(|| panic!("the ```{fence} block under {heading:?} does not end"))
        .0
        .to_owned()
}

/// Starts the snippet's server, calls `charge` twice with one key and once with other arguments.
pub(crate) fn replays_one_charge(mut command: Command, sandbox: &Sandbox) {
    let data = sandbox.path("data");
    command
        .env("XDG_DATA_HOME", &data)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let mut peer = StdioPeer::spawn(command, &sandbox.path("snippet.stderr"));
    let discovered = peer.request(discover(1));
    assert!(
        discovered["result"]["capabilities"]["tools"]["idempotency"].is_object(),
        "{discovered}"
    );
    let arguments = json!({"amount": 5, "currency": "eur"});
    let first = peer.request(call(
        2,
        "charge",
        arguments.clone(),
        Some(json!("readme-key")),
    ));
    let retry = peer.request(call(3, "charge", arguments, Some(json!("readme-key"))));
    // The tool's answer holds a fresh charge id: the same text is the replay.
    let content = |answer: &Value| -> String {
        let text = answer["result"]["content"][0]["text"].as_str();
        let text = text.unwrap_or_else(|| panic!("no text content in {answer}"));
        assert!(text.contains("ch_"), "{answer}");
        text.to_owned()
    };
    assert_eq!(content(&first), content(&retry), "the retry charged again");
    let other = json!({"amount": 6, "currency": "eur"});
    let conflict = peer.request(call(4, "charge", other, Some(json!("readme-key"))));
    assert_rejected(
        &conflict,
        -32602,
        "idempotency_key_conflict",
        Some("readme-key"),
    );
    assert!(
        data.join("mcp-idem/records.sqlite3").exists(),
        "the default store is not in the user's data directory"
    );
}

#[test]
fn the_python_snippet_replays_a_charge() {
    if !Binding::Python.require() {
        return;
    }
    let sandbox = Sandbox::new();
    let server = sandbox.path("server.py");
    std::fs::write(
        &server,
        snippet("## Python servers: one line, in process", "python"),
    )
    .unwrap();
    let mut command = Command::new("python3");
    command.arg(&server);
    replays_one_charge(command, &sandbox);
}

#[test]
fn the_typescript_snippet_replays_a_charge() {
    if !Binding::Node.require() {
        return;
    }
    let sandbox = Sandbox::new();
    // The snippet's imports resolve as in a project that installed the package and the SDK.
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bindings/node");
    let modules = sandbox.path("node_modules");
    std::fs::create_dir_all(&modules).unwrap();
    for (name, target) in [
        ("mcp-idempotency", package.clone()),
        (
            "@modelcontextprotocol",
            package.join("node_modules/@modelcontextprotocol"),
        ),
        ("zod", package.join("node_modules/zod")),
    ] {
        std::os::unix::fs::symlink(&target, modules.join(name)).unwrap();
    }
    let server = sandbox.path("server.mjs");
    std::fs::write(
        &server,
        snippet("## TypeScript servers: one line, in process", "js"),
    )
    .unwrap();
    let mut command = Command::new("node");
    command.arg(&server);
    replays_one_charge(command, &sandbox);
}
