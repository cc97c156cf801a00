//! `mcp-idem check` draws a progress line on stderr when stderr is a terminal (here a pseudo
//! terminal from `script`), and nothing when it is a pipe.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// `mcp-idem check` of `wrap --store memory` around the demo server, as a shell command line.
fn check_command(ledger: &std::path::Path) -> Vec<String> {
    [
        EXE,
        "check",
        "--tool",
        "charge_payment",
        "--args",
        r#"{"amount": 1, "currency": "usd"}"#,
        "--",
        EXE,
        "wrap",
        "--store",
        "memory",
        "--",
        EXE,
        "demo-server",
        "--ledger",
        ledger.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[test]
fn progress_is_drawn_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let command = check_command(&dir.path().join("ledger.jsonl"));

    let piped = Command::new(&command[0])
        .args(&command[1..])
        .env("MCP_IDEM_LOG", "error")
        .output()
        .unwrap();
    assert_eq!(piped.status.code(), Some(0), "{piped:?}");
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(!stderr.contains("mcp-idem check:"), "{stderr}");
    assert!(!stderr.contains('\r'), "{stderr}");

    let line: Vec<String> = command.iter().map(|w| sh_quote(w)).collect();
    let Ok(tty) = Command::new("script")
        .args(["-qec", &line.join(" "), "/dev/null"])
        .env("MCP_IDEM_LOG", "error")
        .output()
    else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "`script` (util-linux) is needed for a pseudo terminal: CI=true requires it"
        );
        eprintln!("note: `script` not available; terminal case skipped");
        return;
    };
    assert_eq!(tty.status.code(), Some(0), "{tty:?}");
    let screen = String::from_utf8_lossy(&tty.stdout);
    assert!(
        screen.contains("mcp-idem check: 1/14 no_key.executes"),
        "{screen}"
    );
    assert!(screen.contains("mcp-idem check: 14/14 "), "{screen}");
    // The report follows on a clean line.
    assert!(screen.contains("\r\x1b[2K"), "{screen}");
}
