//! Helpers of the tests of `deploy/` (`deploy_*.rs`): where the repository's files are, the tools
//! that `deploy/tools.sh` installs (a venv under `deploy/.tools/`, npm packages under
//! `deploy/node_modules/`, `promtool` and `prometheus` from Debian), and YAML read through the
//! venv's PyYAML (the test crate has no YAML parser of its own).
//!
//! A missing tool fails the test under `CI=true`, and skips it with a message elsewhere.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The repository's root.
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `deploy/PATH` in the repository.
pub(crate) fn deploy_path(path: &str) -> PathBuf {
    repo_root().join("deploy").join(path)
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci.eq_ignore_ascii_case("true") || ci == "1")
}

/// `None` after saying that `what` is missing for `test`; under `CI=true`, panics instead.
fn missing<T>(test: &str, what: &str) -> Option<T> {
    let message = format!("{test}: {what} is missing; run deploy/tools.sh (.ci/run does)");
    assert!(!in_ci(), "{message}");
    eprintln!("skipped: {message}");
    None
}

/// `deploy/.tools/venv/bin/NAME`, installed by `deploy/tools.sh`.
pub(crate) fn venv_tool(test: &str, name: &str) -> Option<PathBuf> {
    let path = deploy_path(".tools/venv/bin").join(name);
    if path.is_file() {
        Some(path)
    } else {
        missing(test, &format!("{} (from PyPI)", path.display()))
    }
}

/// `NAME` on `PATH`.
pub(crate) fn system_tool(test: &str, name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    match found {
        Some(found) => Some(found),
        None => missing(test, &format!("`{name}` on PATH")),
    }
}

/// `deploy/node_modules/PACKAGE` (from `npm ci` in `deploy/`), and `node`.
pub(crate) fn node_package(test: &str, package: &str) -> Option<(PathBuf, PathBuf)> {
    let node = system_tool(test, "node")?;
    let dir = deploy_path("node_modules").join(package);
    if dir.is_dir() {
        Some((node, dir))
    } else {
        missing(test, &format!("{} (from npm)", dir.display()))
    }
}

/// Runs `program args`; panics with its output unless it exits 0.
pub(crate) fn run_ok<I, S>(program: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{} failed ({}):\n{}",
        program.display(),
        output.status,
        describe(&output)
    );
    output
}

/// Runs `program args` and returns its output, whatever its exit status.
pub(crate) fn run<I, S>(program: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(program)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|err| panic!("run {}: {err}", program.display()))
}

/// stdout and stderr, for a message.
pub(crate) fn describe(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The YAML documents of `path`, as JSON, read by the venv's Python (PyYAML, safe loader).
pub(crate) fn yaml_documents(python: &Path, path: &Path) -> Vec<Value> {
    let script = "import json, sys, yaml\n\
                  with open(sys.argv[1]) as f:\n    \
                  print(json.dumps([d for d in yaml.safe_load_all(f) if d is not None]))";
    let output = run_ok(
        python,
        [OsStr::new("-c"), OsStr::new(script), path.as_os_str()],
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("{}: not JSON from PyYAML: {err}", path.display()))
}

/// The one YAML document of `path`, as JSON.
pub(crate) fn yaml_document(python: &Path, path: &Path) -> Value {
    let mut documents = yaml_documents(python, path);
    assert_eq!(documents.len(), 1, "{}: one document", path.display());
    documents.remove(0)
}
