//! The README's install from source, run as a user runs it, not through `install.sh`: in a new
//! project folder, the README's `git clone` (of this checkout's committed `HEAD`, the README's URL
//! replaced by its path), then the README's `pip install ./mcp-idem/bindings/python` into a new
//! venv, or its `npm install ./mcp-idem/bindings/node` (whose install hook builds the addon),
//! verbatim. The user's project already
//! has its SDK (the versions the repository pins). The installed binding then runs the README's
//! snippet: the capability is advertised, and two calls with one key charge once.
//!
//! Both commands build the binding from source (maturin from PyPI, napi-rs's CLI from the npm
//! registry, the Rust toolchain): to keep CI time sane, they build into `readme-install/` in this
//! checkout's target directory (`$CARGO_TARGET_DIR`, else `target/`), kept between runs, so a later
//! run builds again only the clone's own crates; a cold run builds the library twice over (once per
//! binding: maturin builds into `release/`, napi-rs into `<host triple>/release/`). Not in the
//! target directory itself, where napi-rs's build would replace the crates `scripts/dist.sh` built
//! with zig's linker (same names, another linker), and the next `dist.sh` build them all again.
//! Needs git, Python >= 3.10, Node.js >= 20, npm, and a Rust toolchain: without them the tests
//! print a note and pass, except under `CI=true`, where they fail.

use std::path::PathBuf;
use std::process::Command;

use crate::readme_bindings::{replays_one_charge, snippet};
use crate::support::install::{node_project, path, python_project, repo, require, run};
use crate::support::wrap::Sandbox;

/// The README's install commands: the ```` ```sh ```` block under `## Install` that clones.
fn readme_install_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme
        .split_once("\n## Install\n")
        .expect("an `## Install` section in the README")
        .1;
    let section = section.split("\n## ").next().unwrap();
    section
        .split("```sh\n")
        .skip(1)
        .map(|block| block.split_once("\n```").expect("a closed block").0)
        .find(|block| block.contains("git clone "))
        .expect("a ```sh block with `git clone` under `## Install`")
        .lines()
        // A line's comment is the README's, not the command's.
        .map(|line| line.split(" #").next().unwrap().trim().to_owned())
        .collect()
}

/// The README's one line that starts with `start`.
fn readme_line(start: &str) -> String {
    let lines = readme_install_lines();
    let mut found: Vec<String> = lines
        .iter()
        .filter(|line| line.starts_with(start))
        .cloned()
        .collect();
    assert_eq!(
        found.len(),
        1,
        "`{start}…` in the README's install block: {lines:?}"
    );
    found.remove(0)
}

/// A project folder with the README's `git clone` run in it: `PROJECT/mcp-idem`.
fn project_with_clone(sandbox: &Sandbox) -> PathBuf {
    let project = sandbox.path("project");
    std::fs::create_dir_all(&project).unwrap();
    let clone = readme_line("git clone ");
    let url = clone.split_whitespace().nth(2).expect("git clone URL");
    assert!(
        clone.ends_with(url),
        "the clone's folder is the URL's last part: {clone}"
    );
    let folder = url.rsplit('/').next().unwrap().trim_end_matches(".git");
    let command = format!("git clone --quiet '{}' {folder}", repo().display());
    run(&project, &path(), &command);
    assert!(project.join("mcp-idem/bindings").is_dir(), "{command}");
    project
}

#[test]
fn the_readme_pip_install_from_a_clone_replays_a_charge() {
    let test = "the README's pip install";
    if !require(test, &path(), &["git", "python3", "cargo"]) {
        return;
    }
    let sandbox = Sandbox::new();
    let project = project_with_clone(&sandbox);
    let activated = python_project(&project, &path());
    let install = readme_line("pip install ");
    assert_eq!(install, "pip install ./mcp-idem/bindings/python");
    run(&project, &activated, &install);

    let server = project.join("server.py");
    let code = snippet("## Python servers: one line, in process", "python");
    std::fs::write(&server, code).unwrap();
    let mut command = Command::new(project.join("venv/bin/python"));
    command.arg(&server).current_dir(&project);
    replays_one_charge(command, &sandbox);
}

#[test]
fn the_readme_npm_install_from_a_clone_replays_a_charge() {
    let test = "the README's npm install";
    if !require(test, &path(), &["git", "node", "npm", "cargo"]) {
        return;
    }
    let sandbox = Sandbox::new();
    let project = project_with_clone(&sandbox);
    node_project(&project, &path());
    let install = readme_line("npm install ");
    assert_eq!(install, "npm install ./mcp-idem/bindings/node");
    let log = run(&project, &path(), &install);
    let addon = project.join("mcp-idem/bindings/node/mcp-idempotency.linux-x64-gnu.node");
    assert!(addon.exists(), "no addon was built:\n{log}");

    let server = project.join("server.mjs");
    let code = snippet("## TypeScript servers: one line, in process", "js");
    std::fs::write(&server, code).unwrap();
    let mut command = Command::new("node");
    command.arg(&server).current_dir(&project);
    replays_one_charge(command, &sandbox);
}
