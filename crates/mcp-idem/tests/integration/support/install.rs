//! Helpers for the install tests (`install_readme`, `install_artifacts`): a user's install
//! command run in a folder of its own with its output kept for the failure message, the project's
//! pinned SDKs installed as a user's project already has them, and a `PATH` without Rust.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::interop::in_ci;

/// The repository root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// `true` when `programs` all start on `path` (`PROGRAM --version`). When one does not: panics
/// under `CI=true`, else prints a note and returns `false` (the test then ends early).
pub(crate) fn require(test: &str, path: &OsString, programs: &[&str]) -> bool {
    for program in programs {
        let runs = Command::new(program)
            .arg("--version")
            .env("PATH", path)
            .output()
            .is_ok_and(|output| output.status.success());
        if !runs {
            let why = format!("`{program}` does not run");
            assert!(!in_ci(), "CI=true but {why}");
            eprintln!("NOTE: skipping {test}: {why} (set CI=true to fail instead)");
            return false;
        }
    }
    true
}

/// This process's `PATH`.
pub(crate) fn path() -> OsString {
    std::env::var_os("PATH").unwrap_or_default()
}

/// This process's `PATH` without every directory that holds `cargo` or `rustc` (`~/.cargo/bin`):
/// what a user without a Rust toolchain has.
pub(crate) fn path_without_rust() -> OsString {
    let kept = std::env::split_paths(&path())
        .filter(|dir| !dir.join("cargo").exists() && !dir.join("rustc").exists())
        .collect::<Vec<_>>();
    let path = std::env::join_paths(kept).expect("a PATH");
    let cargo = Command::new("cargo")
        .arg("--version")
        .env("PATH", &path)
        .output();
    assert!(cargo.is_err(), "cargo is still on {path:?}");
    path
}

/// `readme-install/` in this checkout's target directory (`$CARGO_TARGET_DIR`, else `target/`):
/// what a command run here builds goes there, kept between runs, so that it reuses the crates it
/// compiled there before (and the README's two installs, each other's). Not the target directory
/// itself: the README's npm install builds with `--target <host>` and the system linker the crates
/// `scripts/dist.sh` builds with zig, in the same folder under the same names, so each would build
/// the other's again.
fn shared_target() -> OsString {
    let root =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo().join("target"), PathBuf::from);
    root.join("readme-install").into()
}

/// The host's target triple, as rustc names it.
fn host_triple() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let output = Command::new("rustc")
            .arg("-vV")
            .output()
            .expect("rustc -vV");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("host: "))
            .expect("rustc -vV names the host")
            .to_owned()
    })
}

/// Runs `command` with `sh -c` in `dir`, with `path` as `PATH` and builds in this checkout's target
/// directory; panics with its output when it fails. Returns its stdout and stderr.
pub(crate) fn run(dir: &Path, path: &OsString, command: &str) -> String {
    let output = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        .env("CARGO_INCREMENTAL", "0")
        .env("CARGO_TARGET_DIR", shared_target())
        // napi-rs builds with `--target <host>`; so does maturin then, and the two bindings'
        // builds share their compiled dependencies (same folder, same features).
        .env("CARGO_BUILD_TARGET", host_triple())
        .env_remove("VIRTUAL_ENV")
        .output()
        .unwrap_or_else(|err| panic!("sh -c {command:?}: {err}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "`{command}` in {} failed ({}):\n{text}",
        dir.display(),
        output.status
    );
    text
}

/// A new venv at `dir/venv` with the Python SDK the repository pins (`interop/requirements.txt`),
/// as a user's project already has its SDK. Returns the `PATH` with the venv's `bin` first (an
/// activated venv).
pub(crate) fn python_project(dir: &Path, path: &OsString) -> OsString {
    run(dir, path, "python3 -m venv venv");
    let requirements = repo().join("interop/requirements.txt");
    let venv_bin = dir.join("venv/bin");
    let mut dirs = vec![venv_bin.clone()];
    dirs.extend(std::env::split_paths(path));
    let activated = std::env::join_paths(dirs).expect("a PATH");
    run(
        dir,
        &activated,
        &format!(
            "pip install --quiet --disable-pip-version-check -r '{}'",
            requirements.display()
        ),
    );
    activated
}

/// An npm project at `dir` with the TypeScript SDK and zod the README's snippet imports, at the
/// versions bindings/node/package.json pins for its tests, as a user's project already has them.
pub(crate) fn node_project(dir: &Path, path: &OsString) {
    let manifest = repo().join("bindings/node/package.json");
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap())
        .expect("bindings/node/package.json");
    let pinned = |name: &str| {
        let version = manifest["devDependencies"][name].as_str();
        format!("{name}@{}", version.expect("a pinned dev dependency"))
    };
    std::fs::write(
        dir.join("package.json"),
        r#"{"name": "project", "version": "1.0.0", "private": true}"#,
    )
    .unwrap();
    run(
        dir,
        path,
        &format!(
            "npm install --no-audit --no-fund --loglevel=error {} {}",
            pinned("@modelcontextprotocol/server"),
            pinned("zod")
        ),
    );
}
