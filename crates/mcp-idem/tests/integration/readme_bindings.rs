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

/// The first ```` ```fence ```` block after the line `heading` (a heading, or a list item whose
/// block is indented under it: the indentation of its opening fence is taken off every line).
pub(crate) fn snippet(heading: &str, fence: &str) -> String {
    let readme = readme();
    let section = readme
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?} in the README"))
        .1;
    let mut lines = section.lines();
    let open = lines
        .by_ref()
        .find(|line| line.trim_start() == format!("```{fence}"))
        .unwrap_or_else(|| panic!("no ```{fence} block under {heading:?}"));
    let indent = open.len() - open.trim_start().len();
    let mut code = Vec::new();
    for line in lines {
        if line.trim_start() == "```" {
            return code.join("\n");
        }
        code.push(line.get(indent..).unwrap_or_else(|| line.trim_start()));
    }
    panic!("the ```{fence} block under {heading:?} does not end")
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

/// The README's block for jlowin's `fastmcp`.
const FASTMCP_ITEM: &str = "- jlowin's `fastmcp` (3.x or 4.x), the same one line:";

/// Each JSON Pointer a README snippet gives `key_from` names an argument of the tool it protects
/// (the jlowin `fastmcp` snippet once set `/order_id` on a `charge` without one).
#[test]
fn the_fastmcp_snippets_policy_names_an_argument_of_its_tool() {
    let code = snippet(FASTMCP_ITEM, "python");
    let signature = code
        .lines()
        .find(|line| line.contains("def charge("))
        .unwrap_or_else(|| panic!("no `def charge(` in:\n{code}"));
    let policy = code
        .lines()
        .find(|line| line.contains("key_from"))
        .unwrap_or_else(|| panic!("no key_from in:\n{code}"));
    let pointers: Vec<&str> = policy
        .split('"')
        .filter(|part| part.starts_with('/'))
        .collect();
    assert!(!pointers.is_empty(), "{policy}");
    for pointer in pointers {
        let argument = pointer.trim_start_matches('/');
        assert!(
            signature.contains(&format!("({argument}:"))
                || signature.contains(&format!(" {argument}:")),
            "`{pointer}` names no argument of {signature}"
        );
    }
}

/// The jlowin `fastmcp` snippet, run as written on fastmcp 4.x (the `mcp2` framework environment of
/// `bindings/python/frameworks.sh`): a key-less retry with the same `order_id` replays the first
/// charge, and the same `order_id` with another amount is a conflict naming it.
#[test]
fn the_fastmcp_snippet_replays_a_keyless_retry_by_order_id() {
    if !Binding::Python.require() {
        return;
    }
    let environments = std::env::var_os("MCP_IDEM_FRAMEWORKS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bindings/python/.frameworks"),
        Into::into,
    );
    let python = environments.join("mcp2/bin/python");
    if !python.exists() {
        let why = format!(
            "no framework environment at {}: run bindings/python/frameworks.sh",
            python.display()
        );
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {why}"
        );
        eprintln!("NOTE: skipping the fastmcp snippet: {why}");
        return;
    }
    let sandbox = Sandbox::new();
    let server = sandbox.path("server.py");
    std::fs::write(&server, snippet(FASTMCP_ITEM, "python")).unwrap();
    let mut command = Command::new(python);
    command
        .arg(&server)
        .env("XDG_DATA_HOME", sandbox.path("data"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let mut peer = StdioPeer::spawn(command, &sandbox.path("snippet.stderr"));
    let discovered = peer.request(discover(1));
    assert!(
        discovered["result"]["capabilities"]["tools"]["idempotency"].is_object(),
        "{discovered}"
    );
    let order = json!({"order_id": "ord-1", "amount": 5, "currency": "eur"});
    let first = peer.request(call(2, "charge", order.clone(), None));
    let retry = peer.request(call(3, "charge", order, None));
    let charge_id = |answer: &Value| -> String {
        let text = answer["result"]["content"][0]["text"].as_str();
        let text = text.unwrap_or_else(|| panic!("no text content in {answer}"));
        assert!(text.contains("ch_"), "{answer}");
        text.to_owned()
    };
    assert_eq!(
        charge_id(&first),
        charge_id(&retry),
        "the retry charged again"
    );
    let other = json!({"order_id": "ord-1", "amount": 6, "currency": "eur"});
    let conflict = peer.request(call(4, "charge", other, None));
    let error = assert_rejected(&conflict, -32602, "idempotency_key_conflict", None);
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("/order_id"),
        "{conflict}"
    );
    let another = json!({"order_id": "ord-2", "amount": 5, "currency": "eur"});
    let second = peer.request(call(5, "charge", another, None));
    assert_ne!(
        charge_id(&second),
        charge_id(&first),
        "another order is another charge"
    );
}
