//! The container image of `scripts/image.sh` (`target/dist/mcp-idem-image.oci.tar`, or
//! `$DIST_DIR`), run as a container runtime would, with no runtime and no base image: the OCI
//! archive is unpacked with `umoci unpack`, and its entrypoint runs with `chroot` into the
//! unpacked root file system as the image's user, with the image's environment and nothing of the
//! host's (`chroot` itself is the only host program). Checked:
//!
//! - the root file system holds the binary, its loader and libraries, the CA roots, the user's
//!   lines and `/data` (owned by 65532), and nothing else (no shell);
//! - `mcp-idem --version` runs there;
//! - a `proxy` from the image, in front of the demo server, with no `--store`, keeps its records
//!   in the image's default store (`/data/mcp-idem/records.sqlite3`) and replays a keyed retry:
//!   the demo server's ledger shows one charge.
//!
//! `.ci/run` builds the image; without it (or without `umoci`, or not as root, which `chroot`
//! needs) the tests print a note and pass, except under `CI=true`, where they fail.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::install_artifacts::artifact;
use crate::support::common::ledger_lines;
use crate::support::http::{charge, ledger_in, HttpDemo, Raw, Spawned};
use crate::support::install::{path, require};
use crate::support::interop::in_ci;

/// The image unpacked by `umoci`: its root file system and its configuration.
struct Unpacked {
    dir: tempfile::TempDir,
    /// The image's `config` (`Entrypoint`, `Env`, `User`, ...).
    config: Value,
}

impl Unpacked {
    fn rootfs(&self) -> PathBuf {
        self.dir.path().join("bundle/rootfs")
    }

    /// The entrypoint with `args`, run with `chroot --userspec=USER` into the root file system,
    /// with the image's environment only.
    fn command(&self, args: &[&str]) -> Command {
        let user = self.config["User"].as_str().expect("the image's user");
        let entrypoint = strings(&self.config["Entrypoint"]);
        assert!(!entrypoint.is_empty(), "no entrypoint: {}", self.config);
        // By its path on the host's PATH: the image's PATH (set below) would be searched.
        let chroot = std::env::split_paths(&path())
            .map(|dir| dir.join("chroot"))
            .find(|program| program.is_file())
            .expect("chroot on PATH");
        let mut command = Command::new(chroot);
        command
            .arg(format!("--userspec={user}"))
            .arg(self.rootfs())
            .args(&entrypoint)
            .args(args)
            .env_clear();
        for pair in strings(&self.config["Env"]) {
            let (name, value) = pair.split_once('=').expect("NAME=VALUE");
            command.env(name, value);
        }
        command
    }
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map_or_else(Vec::new, |items| {
        items
            .iter()
            .map(|item| item.as_str().expect("a string").to_owned())
            .collect()
    })
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The blob `digest` (`sha256:...`) of the OCI layout at `layout`, as JSON.
fn blob(layout: &Path, digest: &Value) -> Value {
    let digest = digest.as_str().expect("a digest");
    let (algorithm, hex) = digest.split_once(':').expect("ALGORITHM:HEX");
    read_json(&layout.join("blobs").join(algorithm).join(hex))
}

/// Runs `command`, which must succeed; returns its stdout.
fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("{command:?}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The image archive unpacked with `umoci`, or `None` (after a note; a panic under `CI=true`)
/// when the archive, `umoci` or root is missing.
fn unpacked(test: &str) -> Option<Unpacked> {
    let archive = artifact("mcp-idem-image.oci.tar", "")?;
    if !require(test, &path(), &["umoci", "chroot"]) {
        return None;
    }
    if run(Command::new("id").arg("-u")).trim() != "0" {
        let why = "`chroot` and `umoci unpack` need root";
        assert!(!in_ci(), "CI=true but {why}");
        eprintln!("NOTE: skipping {test}: {why} (set CI=true to fail instead)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout));
    let index = read_json(&layout.join("index.json"));
    let manifest = &index["manifests"][0];
    let tag = manifest["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap_or_else(|| panic!("no tag in index.json: {index}"));
    let config = blob(
        &layout,
        &blob(&layout, &manifest["digest"])["config"]["digest"],
    );
    run(Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{tag}", layout.display()))
        .arg(dir.path().join("bundle")));
    Some(Unpacked {
        dir,
        config: config["config"].clone(),
    })
}

/// Every file, link and folder under `root`, as `/path` (folders end with `/`).
fn tree(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = format!("/{}", path.strip_prefix(root).unwrap().display());
            if entry.file_type().unwrap().is_dir() {
                found.push(format!("{name}/"));
                pending.push(path);
            } else {
                found.push(name);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn the_image_holds_the_binary_and_what_it_needs_only_and_runs_it() {
    let Some(image) = unpacked("the image test") else {
        return;
    };
    assert_eq!(image.config["User"], "65532:65532", "{}", image.config);
    let rootfs = image.rootfs();
    let files: Vec<String> = tree(&rootfs)
        .into_iter()
        .filter(|path| !path.ends_with('/'))
        .collect();
    let expected = |path: &str| {
        path == "/usr/local/bin/mcp-idem"
            || path == "/etc/passwd"
            || path == "/etc/group"
            || path == "/etc/nsswitch.conf"
            || path == "/etc/ssl/certs/ca-certificates.crt"
            || ((path.starts_with("/lib") || path.starts_with("/usr/lib")) && path.contains(".so"))
    };
    let unexpected: Vec<&String> = files.iter().filter(|path| !expected(path)).collect();
    assert!(unexpected.is_empty(), "unexpected files: {unexpected:?}");
    assert!(
        files.iter().any(|path| path.contains("/libc.so")),
        "{files:?}"
    );
    assert!(!rootfs.join("bin/sh").exists());
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.starts_with("nonroot:x:65532:65532:"), "{passwd}");
    let data = std::fs::metadata(rootfs.join("data")).unwrap();
    assert_eq!((data.uid(), data.gid()), (65532, 65532));

    let version = run(&mut image.command(&["--version"]));
    assert_eq!(
        version.trim(),
        format!("mcp-idem {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn a_proxy_from_the_image_replays_a_keyed_retry_from_its_default_store() {
    let Some(image) = unpacked("the image's proxy test") else {
        return;
    };
    let host = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&host);
    let upstream = HttpDemo::spawn(&ledger, &[]);
    let base = upstream.base_url();
    let mut command = image.command(&["proxy", "--listen", "127.0.0.1:0", "--upstream", &base]);
    command.env("MCP_IDEM_LOG", "warn");
    let (proxy, listening) = Spawned::spawn(
        command,
        "mcp-idem proxy (image)",
        "mcp-idem proxy: listening on ",
    );
    let raw = Raw::new(&format!("{listening}/mcp"));

    let first = raw.call(charge(1, 25, Some("image-order-1"))).await;
    assert_eq!(first.status, 200, "{}\n{}", first.body, proxy.stderr());
    let charge_id = first.charge_id().expect("a charge id");
    let retry = raw.call(charge(2, 25, Some("image-order-1"))).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(retry.json()["id"], 2, "{}", retry.body);
    assert_eq!(retry.charge_id().as_deref(), Some(charge_id.as_str()));
    let lines = ledger_lines(&ledger);
    assert_eq!(
        lines.len(),
        1,
        "the upstream ran the charge once: {lines:?}"
    );

    // The records are in the image's default store, written as the image's user.
    let store = image.rootfs().join("data/mcp-idem/records.sqlite3");
    let metadata = std::fs::metadata(&store)
        .unwrap_or_else(|err| panic!("{}: {err}; stderr:\n{}", store.display(), proxy.stderr()));
    assert_eq!(metadata.uid(), 65532);
}
