//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, server mode, the
//! 2026-07-28 requirement set) against the fixture server, once directly and once through
//! `mcp-idem proxy`: every scenario that passes directly must pass through the proxy.
//!
//! The run itself is `scripts/conformance.sh`; this test hands it the binaries cargo built and
//! reads back its `summary.tsv`. The suite needs Node 22 and the npm package, installed by
//! `scripts/conformance.sh --install-only` (CI does it in `.ci/run`). Without them the test
//! fails under `CI=true` and otherwise prints how to install them and returns.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Exit status of `scripts/conformance.sh` when Node 22 or the suite is not installed and
/// `MCP_IDEM_CONFORMANCE_NO_INSTALL` forbids installing.
const NOT_INSTALLED: i32 = 3;

/// The scenarios the 2026-07-28 revision requires of a server (`conformance list --server
/// --requirements 2026-07-28`). The fixture passes all of them directly, so "the proxy passes
/// what the server passes" cannot hold vacuously.
const REQUIRED: &[&str] = &[
    "server-stateless",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "server-sse-multiple-streams",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "sep-2164-resource-not-found",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
    "caching",
    "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots",
    "input-required-result-request-state",
    "input-required-result-multiple-input-requests",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-non-tool-request",
    "input-required-result-result-type",
    "input-required-result-unsupported-methods",
    "input-required-result-tampered-state",
    "input-required-result-capability-check",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
];

#[derive(Debug)]
struct Row {
    scenario: String,
    direct: String,
    proxied: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the crate sits two levels below the workspace root")
        .to_path_buf()
}

/// `mcp-idem` from the same target directory as the fixture: `cargo test --workspace` builds
/// both.
fn mcp_idem_bin(fixture: &Path) -> PathBuf {
    let dir = fixture.parent().expect("a binary lives in a directory");
    let bin = dir.join(format!("mcp-idem{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p mcp-idem` first (`cargo test --workspace` builds it)",
        bin.display()
    );
    bin
}

#[test]
fn proxy_passes_every_scenario_the_server_passes() {
    let fixture = PathBuf::from(env!("CARGO_BIN_EXE_mcp-idem-conformance-server"));
    let proxy = mcp_idem_bin(&fixture);
    let out = tempfile::tempdir().expect("cannot create a temporary directory");

    let output = Command::new("bash")
        .arg(repo_root().join("scripts/conformance.sh"))
        .env("MCP_IDEM_CONFORMANCE_NO_INSTALL", "1")
        .env("MCP_IDEM_CONFORMANCE_OUT", out.path())
        .env("MCP_IDEM_BIN", &proxy)
        .env("MCP_IDEM_CONFORMANCE_SERVER_BIN", &fixture)
        .output()
        .expect("cannot run scripts/conformance.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    if output.status.code() == Some(NOT_INSTALLED) {
        let note = "Node 22 or @modelcontextprotocol/conformance is not installed: \
                    run `scripts/conformance.sh --install-only` (npm registry only)";
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{note}\n{stderr}");
        }
        eprintln!("note: skipping the conformance comparison. {note}");
        return;
    }
    println!("{stdout}");
    eprintln!("{stderr}");

    let summary = std::fs::read_to_string(out.path().join("summary.tsv"))
        .expect("scripts/conformance.sh wrote no summary.tsv");
    let rows: Vec<Row> = summary
        .lines()
        .map(|line| {
            let mut fields = line.split('\t');
            let mut next = || fields.next().unwrap_or_default().to_owned();
            Row {
                scenario: next(),
                direct: next(),
                proxied: next(),
            }
        })
        .collect();

    let missing: Vec<&Row> = rows
        .iter()
        .filter(|row| row.direct == "missing" || row.proxied == "missing")
        .collect();
    assert!(missing.is_empty(), "scenarios run only once: {missing:?}");

    let regressions: Vec<&str> = rows
        .iter()
        .filter(|row| row.direct == "pass" && row.proxied != "pass")
        .map(|row| row.scenario.as_str())
        .collect();
    assert!(
        regressions.is_empty(),
        "pass directly, fail through the proxy: {regressions:?}"
    );

    for scenario in REQUIRED {
        let row = rows
            .iter()
            .find(|row| row.scenario == *scenario)
            .unwrap_or_else(|| panic!("the suite did not run {scenario}"));
        assert_eq!(
            row.direct, "pass",
            "{scenario} fails against the fixture itself"
        );
    }

    assert!(
        output.status.success(),
        "scripts/conformance.sh failed ({}): see the table above",
        output.status
    );
}
