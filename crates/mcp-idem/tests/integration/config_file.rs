//! `--config FILE` / `MCP_IDEM_CONFIG` for `wrap` and `proxy`, and `mcp-idem config-check`:
//! command line beats environment beats file beats default, `[wrap]`/`[proxy]` tables, unknown keys
//! and bad values named in the error, passwords redacted; and a real proxy run by a config file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::http::{charge, ledger_in, HttpDemo, Proxy, Raw};

const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// `mcp-idem ARGS` with only `env` in its environment (no stray `MCP_IDEM_*` from outside).
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(EXE);
    command.env_clear().args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run mcp-idem")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "status {:?}; stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The line of `key` in a config-check report.
fn line<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .lines()
        .find(|line| line.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no {key} in:\n{report}"))
}

#[test]
fn flags_beat_environment_beat_file_beat_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "mcp-idem.toml",
        r#"
            retention = "1h"
            lease = "10s"
            max-key-bytes = 100
            store = "memory"
            listen = "127.0.0.1:9000"
            upstream = "http://127.0.0.1:9001"
            forward-key = true

            [proxy]
            namespace = "from-the-proxy-table"
        "#,
    );
    let file = file.to_str().unwrap();
    let report = stdout(&run(
        &[
            "config-check",
            "proxy",
            "--config",
            file,
            "--max-key-bytes",
            "300",
        ],
        &[("MCP_IDEM_LEASE", "20s"), ("MCP_IDEM_MAX_KEY_BYTES", "200")],
    ));
    assert_eq!(
        line(&report, "max-key-bytes"),
        r#"max-key-bytes = "300"  # command line"#
    );
    assert_eq!(
        line(&report, "lease"),
        r#"lease = "20s"  # environment MCP_IDEM_LEASE"#
    );
    assert_eq!(
        line(&report, "retention"),
        r#"retention = "1h"  # config file"#
    );
    assert_eq!(
        line(&report, "after-crash"),
        r#"after-crash = "reject"  # default"#
    );
    assert_eq!(
        line(&report, "namespace"),
        r#"namespace = "from-the-proxy-table"  # config file"#
    );
    assert_eq!(
        line(&report, "forward-key"),
        r#"forward-key = "true"  # config file"#
    );
    assert_eq!(
        line(&report, "listen"),
        r#"listen = "127.0.0.1:9000"  # config file"#
    );
    assert!(report.contains("# jwt-issuer = (unset)"), "{report}");
    assert!(
        report.contains(&format!("# config file: {file}")),
        "{report}"
    );

    // The same file through MCP_IDEM_CONFIG; `listen` is not a `wrap` option and is left out.
    let report = stdout(&run(
        &["config-check", "wrap"],
        &[("MCP_IDEM_CONFIG", file)],
    ));
    assert_eq!(
        line(&report, "retention"),
        r#"retention = "1h"  # config file"#
    );
    assert!(!report.contains("127.0.0.1:9000"), "{report}");
    assert!(!report.contains("from-the-proxy-table"), "{report}");
}

#[test]
fn a_flag_overrides_a_conflicting_file_option() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "jwt.toml",
        "jwt-key = \"/etc/mcp-idem/jwks.json\"\n",
    );
    let report = stdout(&run(
        &[
            "config-check",
            "proxy",
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:1",
            "--jwt-hmac-secret",
            "/run/secrets/hmac",
        ],
        &[],
    ));
    assert_eq!(
        line(&report, "jwt-hmac-secret"),
        r#"jwt-hmac-secret = "/run/secrets/hmac"  # command line"#
    );
    assert!(report.contains("# jwt-key = (unset)"), "{report}");
}

#[test]
fn passwords_are_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "secret.toml",
        "store = \"redis://app:hunter2@127.0.0.1:6379/0\"\n",
    );
    let report = stdout(&run(
        &["config-check", "wrap", "--config", file.to_str().unwrap()],
        &[],
    ));
    assert_eq!(
        line(&report, "store"),
        r#"store = "redis://app:***@127.0.0.1:6379/0"  # config file"#
    );
    assert!(!report.contains("hunter2"), "{report}");
}

/// Runs `config-check proxy --config FILE` on `text`; returns its stderr, after checking it
/// failed with status 2.
fn rejected(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "bad.toml", text);
    let output = run(
        &[
            "config-check",
            "proxy",
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:1",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn bad_files_are_errors_that_name_the_key() {
    let unknown = rejected("retention = \"1h\"\nretentoin = \"2h\"\n");
    assert!(unknown.contains("unknown key `retentoin`"), "{unknown}");

    let misplaced = rejected("[wrap]\nlisten = \"127.0.0.1:1\"\n");
    assert!(misplaced.contains("unknown key `listen`"), "{misplaced}");
    assert!(misplaced.contains("mcp-idem wrap"), "{misplaced}");

    let bad_value = rejected("retention = \"soon\"\n");
    assert!(bad_value.contains("`retention`"), "{bad_value}");

    let bad_number = rejected("max-key-bytes = \"many\"\n");
    assert!(bad_number.contains("`max-key-bytes`"), "{bad_number}");

    let not_toml = rejected("retention = \n");
    assert!(not_toml.contains("invalid TOML"), "{not_toml}");

    let not_scalar = rejected("retention = [\"1h\"]\n");
    assert!(not_scalar.contains("`retention`"), "{not_scalar}");

    let itself = rejected("config = \"other.toml\"\n");
    assert!(itself.contains("unknown key `config`"), "{itself}");

    let missing = run(
        &[
            "config-check",
            "wrap",
            "--config",
            "/nonexistent/mcp-idem.toml",
        ],
        &[],
    );
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read the config file"));
}

/// A real proxy takes its limits from the file unless a flag overrides them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_runs_with_the_file_and_a_flag_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let file = write(
        dir.path(),
        "mcp-idem.toml",
        "store = \"memory\"\n[proxy]\nmax-key-bytes = 8\n",
    );
    let file = file.to_str().unwrap();
    let long_key = "a-key-of-20-bytes-xx";

    let from_file = Proxy::spawn(&server.base_url(), &["--config", file]);
    let refused = Raw::new(&from_file)
        .call(charge(1, 10, Some(long_key)))
        .await;
    assert_eq!(
        refused.error_type().as_deref(),
        Some("idempotency_key_invalid"),
        "{}",
        refused.body
    );
    assert_eq!(crate::support::common::ledger_lines(&ledger).len(), 0);

    let overridden = Proxy::spawn(
        &server.base_url(),
        &["--config", file, "--max-key-bytes", "64"],
    );
    let charged = Raw::new(&overridden)
        .call(charge(2, 10, Some(long_key)))
        .await;
    assert!(charged.charge_id().is_some(), "{}", charged.body);
    assert_eq!(crate::support::common::ledger_lines(&ledger).len(), 1);
}

/// `[tools.NAME]` tables (issue 34): `[tools."*"]` under each tool key by key, a command's own
/// `[proxy.tools.NAME]` replacing the top-level table of that tool; `config-check` prints each
/// tool's effective policy as TOML that parses back.
#[test]
fn tool_tables_merge_and_config_check_prints_each_tools_effective_policy() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "tools.toml",
        r#"
            store = "memory"
            meta-key = "io.mcp-gateway/idempotency-key"

            [tools."*"]
            on-error = "forget"

            [tools.charge_payment]
            key-from = ["/order_id"]
            required = true

            [tools."billing.refund"]
            key-argument = "idempotency_key"

            [proxy.tools.charge_payment]
            window = "30s"
        "#,
    );
    let check = |command: &str| {
        let mut args = vec!["config-check", command, "--config", file.to_str().unwrap()];
        if command == "proxy" {
            args.extend([
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:1",
            ]);
        }
        stdout(&run(&args, &[]))
    };
    let wrap = check("wrap");
    assert!(
        line(&wrap, "meta-key").contains("io.mcp-gateway/idempotency-key"),
        "{wrap}"
    );
    let tables: toml::Table = wrap.parse().unwrap_or_else(|err| panic!("{err}:\n{wrap}"));
    let charge = &tables["tools"]["charge_payment"];
    assert_eq!(
        charge["key-from"].as_array().unwrap()[0].as_str(),
        Some("/order_id")
    );
    assert_eq!(charge["required"].as_bool(), Some(true));
    assert_eq!(charge["on-error"].as_str(), Some("forget"));
    assert!(charge.get("window").is_none());
    assert_eq!(
        tables["tools"]["billing.refund"]["key-argument"].as_str(),
        Some("idempotency_key")
    );
    assert_eq!(tables["tools"]["*"]["on-error"].as_str(), Some("forget"));

    // proxy's own table of the tool replaces the top-level one.
    let proxy = check("proxy");
    let tables: toml::Table = proxy.parse().unwrap();
    let charge = &tables["tools"]["charge_payment"];
    assert_eq!(charge["window"].as_str(), Some("30s"));
    assert!(charge.get("key-from").is_none());
    assert_eq!(charge["required"].as_bool(), Some(false));
}

#[test]
fn bad_tool_tables_stop_everything_with_a_clear_error() {
    for (text, expected) in [
        (
            "[tools.charge]\nkey-from = \"order_id\"\n",
            "must start with `/`",
        ),
        ("[tools.charge]\nwindow = \"20m\"\n", "out of range"),
        (
            "[tools.charge]\nrequired = true\n",
            "needs `key-from` or `key-argument`",
        ),
        (
            "[tools.charge]\nkeyfrom = \"/x\"\n",
            "unknown setting `keyfrom`",
        ),
        (
            "tools = \"charge\"\n",
            "must be \"suggested\" or tables of tool policies",
        ),
        ("meta-key = \"a,,b\"\n", "`meta-key`"),
    ] {
        let err = rejected(text);
        assert!(err.contains(expected), "{text}: {err}");
    }
    // The same policy on the command line, and a wrap that would start: nothing starts.
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ran");
    let output = run(
        &[
            "wrap",
            "--store",
            "memory",
            "--tools",
            r#"{"charge": {"window": "0s"}}"#,
            "--",
            "sh",
            "-c",
            &format!("touch {}", ledger.display()),
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("`window`"));
    assert!(!ledger.exists(), "the server started");
}

/// A policy mistake in the file names the file, the table and the setting as the user wrote them
/// (`bad.toml: [tools.charge] key_from: …`), never the `--tools` JSON the tables become.
#[test]
fn a_policy_error_names_the_file_the_table_and_the_setting_as_written() {
    for (text, expected) in [
        (
            "[tools.charge]\nkey_from = \"order_id\"\n",
            "bad.toml: [tools.charge] key_from: \"order_id\" is not a JSON Pointer",
        ),
        (
            "[tools.charge]\nkeyFrom = [\"/a\"]\nwindow = \"0s\"\n",
            "bad.toml: [tools.charge] window: \"0s\" is out of range",
        ),
        (
            "[tools.\"*\"]\nonError = \"retry\"\n",
            "bad.toml: [tools.\"*\"] onError: must be one of replay, forget",
        ),
        (
            "[tools.charge]\nkey-from = \"/a\"\n[proxy.tools.charge]\nstore_down = \"open\"\n",
            "bad.toml: [proxy.tools.charge] store_down: must be one of fail-closed",
        ),
        (
            "[tools.\"billing refund\"]\nkeyArgument = \"\"\n",
            "bad.toml: [tools.\"billing refund\"] keyArgument: must not be empty",
        ),
        (
            "[tools.charge]\nrequired = true\n",
            "bad.toml: [tools.charge] `required = true` needs `key-from` or `key-argument`",
        ),
        (
            "[tools.charge]\nkey_from = \"/a\"\nkeyFrom = \"/b\"\n",
            "bad.toml: [tools.charge] `keyFrom` and `key_from` are one setting; give it once",
        ),
        (
            "after_crash = \"retry\"\n",
            "invalid value for `after_crash` in",
        ),
        (
            "after_crash = \"reject\"\nafter-crash = \"reject\"\n",
            "`after-crash` and `after_crash` in",
        ),
    ] {
        let err = rejected(text);
        assert!(err.contains(expected), "{text}: {err}");
        assert!(!err.contains("--tools"), "{text}: {err}");
    }
}

/// `key-from`, `key_from` and `keyFrom` (and so every multi-word setting and option) are one
/// name, in the file and in `--tools`.
#[test]
fn every_multi_word_name_is_taken_in_kebab_snake_and_camel_case() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "spellings.toml",
        r#"
            store = "memory"
            after_crash = "reject"
            maxKeyBytes = 100

            [tools.a]
            key-from = "/id"
            on-error = "forget"
            store-down = "run-unprotected"

            [tools.b]
            key_from = "/id"
            on_error = "forget"
            store_down = "run-unprotected"

            [tools.c]
            keyFrom = "/id"
            onError = "forget"
            storeDown = "run-unprotected"

            [tools.d]
            key_argument = "k"

            [tools.e]
            keyArgument = "k"
        "#,
    );
    let report = stdout(&run(
        &["config-check", "wrap", "--config", file.to_str().unwrap()],
        &[],
    ));
    assert_eq!(
        line(&report, "after-crash"),
        r#"after-crash = "reject"  # config file"#
    );
    assert_eq!(
        line(&report, "max-key-bytes"),
        r#"max-key-bytes = "100"  # config file"#
    );
    let tables: toml::Table = report.parse().unwrap();
    for tool in ["a", "b", "c"] {
        let policy = &tables["tools"][tool];
        assert_eq!(policy["key-from"][0].as_str(), Some("/id"), "{report}");
        assert_eq!(policy["on-error"].as_str(), Some("forget"), "{report}");
        assert_eq!(
            policy["store-down"].as_str(),
            Some("run-unprotected"),
            "{report}"
        );
    }
    for tool in ["d", "e"] {
        assert_eq!(tables["tools"][tool]["key-argument"].as_str(), Some("k"));
    }

    let report = stdout(&run(
        &[
            "config-check",
            "wrap",
            "--store",
            "memory",
            "--tools",
            r#"{"a": {"keyFrom": "/id", "onError": "forget"}, "b": {"key_argument": "k"}}"#,
        ],
        &[],
    ));
    let tables: toml::Table = report.parse().unwrap();
    assert_eq!(tables["tools"]["a"]["key-from"][0].as_str(), Some("/id"));
    assert_eq!(tables["tools"]["a"]["on-error"].as_str(), Some("forget"));
    assert_eq!(tables["tools"]["b"]["key-argument"].as_str(), Some("k"));
}

/// `tools = "suggested"`, and `suggested = true` beside the tables: `config-check` says the
/// suggestion applies and prints the tables over it; a misspelt word names the accepted forms.
#[test]
fn the_suggested_policy_is_read_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let alone = write(dir.path(), "alone.toml", "tools = \"suggested\"\n");
    let report = stdout(&run(
        &["config-check", "wrap", "--config", alone.to_str().unwrap()],
        &[],
    ));
    assert!(
        report.contains("# suggested: each tool the server lists"),
        "{report}"
    );
    let mixed = write(
        dir.path(),
        "mixed.toml",
        "listen = \"127.0.0.1:9000\"\nupstream = \"http://127.0.0.1:9001\"\n\n[tools]\nsuggested = true\n\n[tools.send_email]\non-error = \"forget\"\n",
    );
    let report = stdout(&run(
        &["config-check", "proxy", "--config", mixed.to_str().unwrap()],
        &[],
    ));
    assert!(report.contains("# suggested: each tool"), "{report}");
    assert!(report.contains("[tools.send_email]\n"), "{report}");
    assert!(report.contains("on-error = \"forget\""), "{report}");
    let flag = stdout(&run(&["config-check", "wrap", "--tools", "suggested"], &[]));
    assert!(flag.contains("# suggested: each tool"), "{flag}");
    let wrong = write(dir.path(), "wrong.toml", "tools = \"suggest\"\n");
    let output = run(
        &["config-check", "wrap", "--config", wrong.to_str().unwrap()],
        &[],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("\"suggested\""), "{stderr}");
}
