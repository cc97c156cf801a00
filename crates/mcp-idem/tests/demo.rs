//! `mcp-idem demo` runs every step against a real SQLite file and says each behaved.

use std::process::Command;

#[test]
fn demo_passes_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.sqlite3");
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(["demo", "--sqlite"])
        .arg(&db)
        .output()
        .expect("run mcp-idem demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "demo failed:\n{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert_eq!(stdout.matches("  ok: ").count(), 8, "{stdout}");
    assert!(stdout.contains("All steps behaved"), "{stdout}");
    assert!(
        db.exists(),
        "the demo must use the SQLite file it was given"
    );
}

#[test]
fn demo_reports_an_unusable_store_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(["demo", "--sqlite"])
        .arg(not_a_dir.join("records.sqlite3"))
        .output()
        .expect("run mcp-idem demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot open the SQLite store"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
