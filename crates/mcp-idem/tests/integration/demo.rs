//! `mcp-idem demo` runs its eight steps over real stdio sessions and says each behaved.

use std::process::Command;

#[test]
fn demo_passes_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(["demo", "--dir"])
        .arg(dir.path())
        .output()
        .expect("run mcp-idem demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert_eq!(stdout.matches("  ok: ").count(), 8, "{stdout}");
    assert!(stdout.contains("All 8 steps behaved"), "{stdout}");
    assert!(dir.path().join("records.sqlite3").exists());
    // Executions: two unkeyed charges, then one per key (order-1..order-4), then one for the
    // key-less order-8 and its replayed retry.
    let ledger = std::fs::read_to_string(dir.path().join("ledger.jsonl")).unwrap();
    assert_eq!(ledger.lines().count(), 7, "{ledger}");
    assert!(stdout.contains("8. Without a key again"), "{stdout}");
}

#[test]
fn demo_reports_an_unusable_directory_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(["demo", "--dir"])
        .arg(not_a_dir.join("sub"))
        .output()
        .expect("run mcp-idem demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot create"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
