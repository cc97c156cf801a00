//! What the bench binaries share: finding the binary under test, describing the machine.

use std::path::{Path, PathBuf};

// The binary's own step counter, shared by path: drawn only when stderr is a terminal.
#[path = "../../src/progress.rs"]
mod progress;
pub(crate) use progress::Progress;

/// The release binary to measure: `$MCP_IDEM_BIN`, default `target/release/mcp-idem`.
pub(crate) fn mcp_idem_bin() -> Result<PathBuf, String> {
    let (bin, from_env) = match std::env::var_os("MCP_IDEM_BIN") {
        Some(path) => (PathBuf::from(path), true),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/release")
                .join(format!("mcp-idem{}", std::env::consts::EXE_SUFFIX)),
            false,
        ),
    };
    if !bin.is_file() {
        let source = if from_env {
            "$MCP_IDEM_BIN"
        } else {
            "the default (set MCP_IDEM_BIN to measure another build)"
        };
        return Err(format!(
            "no mcp-idem binary at {} ({source}); run `cargo build --release -p mcp-idem` first",
            bin.display()
        ));
    }
    Ok(bin.canonicalize().unwrap_or(bin))
}

/// The 1, 5 and 15 minute load averages, as the kernel prints them.
/// How long ago `bin` was written, for the header of a run ("file modified 39s ago").
pub(crate) fn modified_ago(bin: &Path) -> String {
    std::fs::metadata(bin)
        .and_then(|meta| meta.modified())
        .ok()
        .and_then(|time| time.elapsed().ok())
        .map(|age| format!("file modified {}s ago", age.as_secs()))
        .unwrap_or_else(|| "modification time unknown".into())
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Nearest-rank percentile of sorted samples, in microseconds.
pub(crate) fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}
