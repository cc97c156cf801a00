//! Store faults through the real proxy (issue 6).
//!
//! * PostgreSQL behind a TCP forwarder the test controls: during an outage (the forwarder stops
//!   listening and drops its live connections) keyed calls are answered
//!   `idempotency_store_unavailable` and nothing runs; after recovery the same proxy process serves
//!   the failed key exactly once, and a key completed before the outage still replays. An outage
//!   that starts while a call runs and ends after it answered: the proxy writes the outcome once
//!   the store is back, so a retry replays it and never runs it twice (`--after-crash reject`
//!   and `reexecute`).
//!   The shared PostgreSQL server is never disturbed.
//! * SQLite files that cannot be used: a path whose parent is a regular file, a directory, a file
//!   that is not a database, a read-only file system and a full one (small tmpfs mounts, skipped
//!   with a note where mounting is not permitted). The proxy refuses to start with an error naming
//!   the file, or answers keyed calls `idempotency_store_unavailable` without running them.
//! * A TLS Redis (`REDIS_TLS_URL`, scripts/tls-redis.sh) whose certificate cannot be verified, or
//!   whose CA file is missing: the proxy refuses to start, saying why.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::common::ledger_lines;
use crate::support::http::{
    call_until_settled, charge, discover, ledger_in, slow_charge, unique_namespace, HttpDemo,
    Proxy, Raw, SharedStore,
};
use crate::support::store_faults::{assert_unavailable, behind_forwarder, until_available};
use crate::support::wrap::signal_pid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_fails_closed_and_the_proxy_recovers() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    let (forwarder, store) = behind_forwarder(&url, SharedStore::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace("store-faults-pg");
    let proxy = Proxy::spawn(
        &server.base_url(),
        &["--store", &store, "--namespace", &namespace],
    );
    let raw = Raw::new(&proxy);

    let before = raw.call(charge(1, 10, Some("before-outage"))).await;
    let before_id = before
        .charge_id()
        .unwrap_or_else(|| panic!("{}", before.body));
    assert_eq!(ledger_lines(&ledger).len(), 1);

    forwarder.cut();
    let started = Instant::now();
    let during = raw.call(charge(2, 20, Some("during-outage"))).await;
    let refused_in = started.elapsed();
    assert_unavailable(&during);
    assert_unavailable(&raw.call(charge(3, 20, Some("during-outage"))).await);
    // A completed key cannot be read either: refused too, not run again.
    assert_unavailable(&raw.call(charge(4, 10, Some("before-outage"))).await);
    assert_eq!(
        ledger_lines(&ledger).len(),
        1,
        "nothing runs without a record"
    );
    let discovered = raw.call(discover(5)).await;
    assert_eq!(discovered.status, 200, "{}", discovered.body);

    let forwarder = forwarder.resume().await;
    let started = Instant::now();
    let after = until_available(&raw, &charge(6, 20, Some("during-outage"))).await;
    let recovered_in = started.elapsed();
    let after_id = after
        .charge_id()
        .unwrap_or_else(|| panic!("{}", after.body));
    assert_eq!(ledger_lines(&ledger).len(), 2, "the failed key runs once");
    let replay = raw.call(charge(7, 20, Some("during-outage"))).await;
    assert_eq!(replay.charge_id().as_deref(), Some(after_id.as_str()));
    let replay_before = raw.call(charge(8, 10, Some("before-outage"))).await;
    assert_eq!(
        replay_before.charge_id().as_deref(),
        Some(before_id.as_str())
    );
    assert_eq!(ledger_lines(&ledger).len(), 2);
    eprintln!(
        "store_faults/postgres: refused in {refused_in:.2?} during the outage; served again \
         {recovered_in:.2?} after it ended"
    );
    drop(forwarder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_during_a_call_never_runs_it_twice() {
    outage_during_a_call("reject").await;
}

/// With `--after-crash reexecute`, a retry that found the record's lease run out would run the
/// call again: the completion, sent again with the lease kept, lands first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_during_a_call_with_reexecute_never_runs_it_twice() {
    outage_during_a_call("reexecute").await;
}

/// The store goes away while a call runs and is back after it answered: the proxy sends the
/// completion again until the store takes it (the lease, 4 s, outlasts the outage), so retries
/// replay the charge and never run it again, whatever `--after-crash` says.
async fn outage_during_a_call(after_crash: &str) {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    let (forwarder, store) = behind_forwarder(&url, SharedStore::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace(&format!("store-faults-pg-mid-{after_crash}"));
    let proxy = Proxy::spawn(
        &server.base_url(),
        &[
            "--store",
            &store,
            "--namespace",
            &namespace,
            "--lease",
            "4s",
            "--after-crash",
            after_crash,
        ],
    );
    let raw = Raw::new(&proxy);

    // The charge is claimed, then the store goes away while it runs (1.5 s) and is still away
    // when it completes: the first write of its outcome fails.
    let call = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.call(slow_charge(1, 10, 1500, Some("mid-call"))).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    forwarder.cut();
    let answer = call.await.unwrap();
    let charge_id = answer
        .charge_id()
        .unwrap_or_else(|| panic!("the client gets the charge: {}", answer.body));
    assert_eq!(ledger_lines(&ledger).len(), 1, "the charge ran once");
    proxy
        .logged("the outcome of a call is not recorded yet")
        .await;
    let forwarder = forwarder.resume().await;

    // Retries wait (in progress) until the outcome is written, then replay it.
    let started = Instant::now();
    let retry = until_available(&raw, &slow_charge(2, 10, 1500, Some("mid-call"))).await;
    let settled = call_until_settled(&raw, &slow_charge(3, 10, 1500, Some("mid-call"))).await;
    let replayed_in = started.elapsed();
    assert_eq!(ledger_lines(&ledger).len(), 1, "never twice");
    eprintln!(
        "store_faults/postgres mid-call (--after-crash {after_crash}): retry after recovery \
         {:?}; replayed {replayed_in:.2?} after the outage ended",
        retry.error_type().or(retry.charge_id()),
    );
    assert_eq!(
        settled.charge_id().as_deref(),
        Some(charge_id.as_str()),
        "{}",
        settled.body
    );
    proxy
        .logged("recorded the outcome of a call once the store answered again")
        .await;
    assert!(
        !proxy
            .stderr()
            .contains("cannot record the outcome of a call"),
        "{}",
        proxy.stderr()
    );
    drop(forwarder);
}

/// SIGTERM while the proxy still sends again a completion the store failed: it waits for it
/// within `--shutdown-grace`, the store comes back, the outcome is written, the proxy exits 0,
/// and a new proxy replays the charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_waits_for_a_completion_the_store_failed() {
    let Some(url) = SharedStore::Postgres.url() else {
        return;
    };
    let (forwarder, store) = behind_forwarder(&url, SharedStore::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let namespace = unique_namespace("store-faults-pg-stop");
    let args = [
        "--store",
        &store,
        "--namespace",
        &namespace,
        "--lease",
        "10s",
    ];
    let mut first = Proxy::spawn_with_log(
        &server.base_url(),
        &[&args[..], &["--shutdown-grace", "8s"]].concat(),
        "warn,mcp_idem::commands=info,mcp_idempotency::upkeep=info",
    );
    let raw = Raw::new(&first);
    let call = {
        let raw = raw.clone();
        tokio::spawn(async move {
            raw.call(slow_charge(1, 30, 1500, Some("stop-mid-call")))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    forwarder.cut();
    let answer = call.await.unwrap();
    let charge_id = answer
        .charge_id()
        .unwrap_or_else(|| panic!("the client gets the charge: {}", answer.body));
    first
        .logged("the outcome of a call is not recorded yet")
        .await;
    signal_pid(first.pid(), "TERM");
    first
        .logged("waiting for the outcomes the store has not taken yet")
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forwarder = forwarder.resume().await;
    assert_eq!(first.exited().await.code(), Some(0), "{}", first.stderr());
    assert!(
        first
            .stderr()
            .contains("recorded the outcome of a call once the store answered again"),
        "{}",
        first.stderr()
    );

    let second = Proxy::spawn(&server.base_url(), &args);
    let replay = Raw::new(&second)
        .call(slow_charge(2, 30, 1500, Some("stop-mid-call")))
        .await;
    assert_eq!(
        replay.charge_id().as_deref(),
        Some(charge_id.as_str()),
        "{}",
        replay.body
    );
    assert_eq!(ledger_lines(&ledger).len(), 1, "one execution");
    drop(forwarder);
}

/// Spawns `mcp-idem proxy --store STORE` and returns its exit status and stderr if it exits
/// within 20 s, or `None` (killed) if it starts listening instead.
fn proxy_startup(upstream: &str, store: &str) -> Option<(std::process::ExitStatus, String)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(["--store", store])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the proxy");
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some((status, reader.join().unwrap()));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = reader.join().unwrap();
            assert!(
                stderr.contains("listening on"),
                "neither exited nor listened: {stderr}"
            );
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The proxy must not start: exit status 2, and an error naming `path`.
fn assert_refuses_to_start(upstream: &str, path: &Path, case: &str) -> String {
    let store = format!("sqlite:{}", path.display());
    let (status, stderr) = proxy_startup(upstream, &store)
        .unwrap_or_else(|| panic!("{case}: the proxy started on {store}"));
    assert_eq!(status.code(), Some(2), "{case}: {stderr}");
    assert!(
        stderr.contains("cannot open the record store")
            && stderr.contains(&*path.to_string_lossy()),
        "{case}: the error names the file: {stderr}"
    );
    let line = stderr.lines().last().unwrap_or("").to_owned();
    eprintln!("store_faults/sqlite {case}: exit 2: {line}");
    line
}

/// A TLS Redis whose certificate cannot be checked (no `sslrootcert`, so the system's roots,
/// which do not know the test CA) or whose CA file is missing: the proxy refuses to start (exit
/// 2), saying why, without the password.
#[test]
fn a_tls_redis_that_cannot_be_verified_stops_the_proxy_at_startup() {
    let Some(url) = SharedStore::RedisTls.url() else {
        return;
    };
    let (base, _ca) = url.rsplit_once("sslrootcert=").expect("a CA parameter");
    let base = base.trim_end_matches(['?', '&']);
    let with_password = base.replacen("://", "://:s3cret@", 1);
    let dir = tempfile::tempdir().unwrap();
    let server = HttpDemo::spawn(&ledger_in(&dir), &[]);
    let joiner = if with_password.contains('?') {
        '&'
    } else {
        '?'
    };
    for (store, needle) in [
        (
            with_password.clone(),
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            format!("{with_password}{joiner}sslrootcert=/nonexistent/ca.pem"),
            "cannot read CA certificates from /nonexistent/ca.pem",
        ),
    ] {
        let (status, stderr) = proxy_startup(&server.base_url(), &store)
            .unwrap_or_else(|| panic!("the proxy started on {store}"));
        assert_eq!(status.code(), Some(2), "{store}: {stderr}");
        assert!(
            stderr.contains("cannot open the record store") && stderr.contains(needle),
            "{store}: {stderr}"
        );
        assert!(!stderr.contains("s3cret"), "{stderr}");
        let line = stderr.lines().last().unwrap_or("").to_owned();
        eprintln!("store_faults/tls-redis: exit 2: {line}");
    }
}

#[test]
fn sqlite_unusable_paths_stop_the_proxy_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let upstream = server.base_url();

    // Root ignores permission bits: say so, and rely on the cases below that do not need them.
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    set_mode(&locked, 0o555);
    let root = std::fs::write(locked.join("probe"), b"x").is_ok();
    if root {
        eprintln!(
            "store_faults/sqlite: a 0555 directory is writable here (root): permission bits are \
             not tested; read-only and full file systems are tested with tmpfs mounts instead"
        );
    } else {
        assert_refuses_to_start(&upstream, &locked.join("records.sqlite3"), "0555 directory");
    }
    set_mode(&locked, 0o755);

    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    assert_refuses_to_start(&upstream, &file.join("records.sqlite3"), "parent is a file");
    assert_refuses_to_start(&upstream, dir.path(), "path is a directory");
    let garbage = dir.path().join("garbage.sqlite3");
    std::fs::write(&garbage, vec![b'x'; 8192]).unwrap();
    assert_refuses_to_start(&upstream, &garbage, "not a database");
    assert_refuses_to_start(
        &upstream,
        Path::new("/proc/self/no-such-dir/records.sqlite3"),
        "under /proc",
    );
    assert_eq!(ledger_lines(&ledger).len(), 0);
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A small tmpfs mounted for the test, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (with a note) where mounting is not permitted.
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("note: cannot mount a tmpfs here (not permitted); this part is skipped");
            return None;
        }
        Some(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount_read_only(&self) -> bool {
        Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(self.path())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_read_only_file_system() {
    let Some(fs) = Tmpfs::mount("1m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let db = fs.path().join("records.sqlite3");
    let store = format!("sqlite:{}", db.display());

    // A store with one completed record, then the file system becomes read-only.
    let charged = {
        let proxy = Proxy::spawn(&server.base_url(), &["--store", &store]);
        Raw::new(&proxy).call(charge(1, 10, Some("done"))).await
    };
    let charge_id = charged
        .charge_id()
        .unwrap_or_else(|| panic!("{}", charged.body));
    assert!(fs.remount_read_only(), "remount read-only");
    assert!(
        std::fs::write(fs.path().join("probe"), b"x").is_err(),
        "really read-only"
    );

    let upstream = server.base_url();
    let outcome = tokio::task::spawn_blocking(move || proxy_startup(&upstream, &store))
        .await
        .unwrap();
    match outcome {
        Some((status, stderr)) => {
            assert_eq!(status.code(), Some(2), "{stderr}");
            assert!(
                stderr.contains("cannot open the record store")
                    && stderr.contains(&*db.to_string_lossy()),
                "the error names the file: {stderr}"
            );
            eprintln!(
                "store_faults/sqlite read-only fs: refuses to start: {}",
                stderr.lines().last().unwrap_or("")
            );
        }
        None => {
            // It started read-only: keyed calls must be refused and must not run.
            let proxy = Proxy::spawn(
                &server.base_url(),
                &["--store", &format!("sqlite:{}", db.display())],
            );
            let raw = Raw::new(&proxy);
            assert_unavailable(&raw.call(charge(2, 20, Some("new"))).await);
            let replay = raw.call(charge(3, 10, Some("done"))).await;
            eprintln!(
                "store_faults/sqlite read-only fs: starts; new key refused store_unavailable; \
                 replay of a completed key: {:?}",
                replay.charge_id().or(replay.error_type())
            );
            if let Some(id) = replay.charge_id() {
                assert_eq!(id, charge_id);
            }
        }
    }
    assert_eq!(
        ledger_lines(&ledger).len(),
        1,
        "nothing ran on the read-only store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_file_system() {
    let Some(fs) = Tmpfs::mount("256k") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let db = fs.path().join("records.sqlite3");
    let store = format!("sqlite:{}", db.display());
    let proxy = Proxy::spawn(&server.base_url(), &["--store", &store]);
    let raw = Raw::new(&proxy);

    // Large keys fill the file system quickly; go on until the store refuses.
    let mut ok = 0usize;
    let mut refused = 0usize;
    let mut other = Vec::new();
    let pad = "k".repeat(200);
    for i in 0..5000u64 {
        let answer = raw.call(charge(i, 1, Some(&format!("{pad}-{i}")))).await;
        if answer.charge_id().is_some() {
            ok += 1;
        } else if answer.error_type().as_deref() == Some("idempotency_store_unavailable") {
            refused += 1;
            if refused >= 20 {
                break;
            }
        } else {
            other.push(answer.body);
        }
    }
    let executed = ledger_lines(&ledger).len();
    eprintln!(
        "store_faults/sqlite full fs (256 KiB tmpfs): {ok} charges recorded, then {refused} \
         refused store_unavailable; {executed} executed; other answers: {}",
        other.len()
    );
    assert!(refused > 0, "the file system never filled ({ok} calls)");
    assert!(other.is_empty(), "{other:?}");
    assert_eq!(executed, ok, "a refused call does not run");
    // Retrying every accepted key runs nothing again: completed ones replay from the full store;
    // one whose outcome could not be written (the disk filled between claim and completion) is
    // still in progress, and the after-crash policy will answer it once its lease runs out.
    let (mut replayed, mut in_progress) = (0, 0);
    for i in 0..ok as u64 {
        let answer = raw.call(charge(i, 1, Some(&format!("{pad}-{i}")))).await;
        match answer.error_type().as_deref() {
            None if answer.charge_id().is_some() => replayed += 1,
            Some("idempotency_key_in_progress") => in_progress += 1,
            _ => panic!("retry of accepted key {i}: {}", answer.body),
        }
    }
    eprintln!(
        "store_faults/sqlite full fs: retries of the {ok} accepted keys: {replayed} replayed, \
         {in_progress} in progress (outcome not recorded)"
    );
    assert!(replayed > 0);
    assert_eq!(
        ledger_lines(&ledger).len(),
        executed,
        "a retry does not run again"
    );
}
