//! `mcp-idem <command> --help` for every command: each runs, and the help of the options that
//! commands share through flattened option groups (the store, the upstream, the server) is true
//! for each command that shows it: `wrap` and `proxy` take every store, `inspect` every store but
//! `memory`, `proxy` names its upstream by the endpoint URL and takes an https one, and the
//! client commands `call` and `tools` name their server alike.

use std::process::Command;

/// Every command and subcommand with its own `--help`.
const COMMANDS: [&[&str]; 17] = [
    &[],
    &["demo"],
    &["demo-server"],
    &["wrap"],
    &["proxy"],
    &["bridge"],
    &["call"],
    &["check"],
    &["tools"],
    &["inspect"],
    &["inspect", "list"],
    &["inspect", "show"],
    &["inspect", "stats"],
    &["inspect", "purge"],
    &["inspect", "delete"],
    &["config-check", "wrap"],
    &["config-check", "proxy"],
];

/// The help of `command`, which must succeed.
fn help(command: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .args(command)
        .arg("--help")
        .env("MCP_IDEM_LOG", "warn")
        .output()
        .expect("run mcp-idem --help");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 help");
    assert!(output.status.success(), "{command:?}: {stdout}");
    assert!(stdout.contains("Usage: mcp-idem"), "{command:?}: {stdout}");
    stdout
}

/// The help text of option `--name` in `help` (from the option to the next one, under
/// `Options:`).
fn option_help<'a>(help: &'a str, name: &str) -> Option<&'a str> {
    let options = &help[help.find("\nOptions:")?..];
    let rest = &options[options.find(&format!("--{name} <"))?..];
    let end = ["\n  -", "\n      --"]
        .iter()
        .filter_map(|next| rest[2..].find(next))
        .min()
        .map_or(rest.len(), |at| at + 2);
    Some(&rest[..end])
}

#[test]
fn every_command_has_a_help_whose_store_line_is_true_for_it() {
    for command in COMMANDS {
        let help = help(command);
        let Some(store) = option_help(&help, "store") else {
            continue;
        };
        let store = store.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            !store.contains("`sqlite:PATH` or `memory`"),
            "{command:?}: {store}"
        );
        for scheme in ["sqlite:", "redis://", "postgres://"] {
            assert!(
                store.contains(scheme),
                "{command:?} lacks {scheme}: {store}"
            );
        }
        // `inspect` cannot look into another process's memory; the gateways take it.
        let inspects = command.first() == Some(&"inspect");
        assert_eq!(store.contains("memory"), !inspects, "{command:?}: {store}");
    }
}

#[test]
fn the_stores_are_shown_where_they_are_taken() {
    for command in [
        &["wrap"][..],
        &["proxy"],
        &["inspect"],
        &["inspect", "list"],
        &["config-check", "proxy"],
    ] {
        assert!(
            option_help(&help(command), "store").is_some(),
            "{command:?} has no --store"
        );
    }
}

#[test]
fn proxy_help_names_the_upstream_by_its_endpoint_url_and_takes_https() {
    for command in [&["proxy"][..], &["config-check", "proxy"]] {
        let help = help(command);
        let upstream = option_help(&help, "upstream").expect("--upstream");
        let upstream = upstream.split_whitespace().collect::<Vec<_>>().join(" ");
        for says in ["endpoint URL", "http[s]://", "/mcp", "/.well-known/"] {
            assert!(upstream.contains(says), "{command:?}: {upstream}");
        }
        assert!(!upstream.contains("appended"), "{upstream}");
        let ca = option_help(&help, "upstream-ca-cert").expect("--upstream-ca-cert");
        assert!(ca.contains("https://") && ca.contains("PEM"), "{ca}");
    }
}

#[test]
fn inspect_help_says_it_lists_without_a_subcommand() {
    let help = help(&["inspect"]);
    assert!(
        help.contains("[COMMAND]"),
        "the subcommand is optional: {help}"
    );
    assert!(help.contains("without a subcommand"), "{help}");
}

#[test]
fn call_and_tools_name_their_server_alike() {
    let (call, tools) = (help(&["call"]), help(&["tools"]));
    for option in ["url", "header", "ca-cert"] {
        let shown = option_help(&call, option).unwrap_or_else(|| panic!("call has no --{option}"));
        assert_eq!(option_help(&tools, option), Some(shown), "--{option}");
    }
    for help in [&call, &tools] {
        assert!(help.contains("<--url <URL>|COMMAND>"), "{help}");
    }
    for says in [
        "readOnlyHint",
        "key-from",
        "key-argument",
        "window",
        "--json",
    ] {
        assert!(tools.contains(says), "tools --help lacks {says}: {tools}");
    }
}
