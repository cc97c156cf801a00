//! `mcp-idem config-check wrap|proxy [OPTIONS]`: the effective configuration and where each value
//! came from, without starting anything.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgMatches, Args, Subcommand};
use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::store::{redact_password, StoreUrl};

use super::proxy::ProxyArgs;
use super::wrap::WrapArgs;
use crate::config_file::{Invocation, Source};

/// Options of `mcp-idem config-check`.
#[derive(Debug, Args)]
pub(crate) struct ConfigCheckArgs {
    #[command(subcommand)]
    target: Target,
}

/// The command whose configuration to show; it takes the same options (and `--config`).
#[derive(Debug, Subcommand)]
enum Target {
    /// The configuration `mcp-idem wrap` would run with (the server command is optional here).
    Wrap(Box<WrapArgs>),
    /// The configuration `mcp-idem proxy` would run with.
    Proxy(Box<ProxyArgs>),
}

impl ConfigCheckArgs {
    pub(crate) fn exec(self, invocation: &Invocation) -> anyhow::Result<ExitCode> {
        let name = match self.target {
            Target::Wrap(_) => "wrap",
            Target::Proxy(_) => "proxy",
        };
        let (_, check) = invocation
            .matches
            .subcommand()
            .context("no config-check arguments")?;
        let (_, matches) = check.subcommand().context("no command to check")?;
        print!("{}", report(name, invocation, matches)?);
        Ok(ExitCode::SUCCESS)
    }
}

/// One `key = "value"  # source` line per option, in TOML so it can seed a config file. Passwords
/// in URLs are replaced by `***`; unset options are commented out.
fn report(name: &str, invocation: &Invocation, matches: &ArgMatches) -> anyhow::Result<String> {
    let sub = invocation
        .command
        .find_subcommand("config-check")
        .and_then(|check| check.find_subcommand(name))
        .with_context(|| format!("no `config-check {name}` command"))?;
    let mut out = String::new();
    writeln!(out, "# effective configuration of `mcp-idem {name}`")?;
    match &invocation.file {
        Some(path) => writeln!(out, "# config file: {}", path.display())?,
        None => writeln!(out, "# config file: none")?,
    }
    let mut tools = None;
    for arg in sub.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version" | "config") {
            continue;
        }
        let key = arg.get_long().unwrap_or(id);
        let source = invocation.source(matches, id);
        let values: Vec<String> = matches
            .get_raw(id)
            .map(|raw| raw.map(|v| redact_password(&v.to_string_lossy())).collect())
            .unwrap_or_default();
        if id == "store" {
            if let Some(url) = values.first() {
                url.parse::<StoreUrl>()
                    .with_context(|| format!("invalid store URL {url:?}"))?;
            }
        }
        let origin = match source {
            Source::CommandLine => "command line".to_owned(),
            Source::Environment => match arg.get_env() {
                Some(var) => format!("environment {}", var.to_string_lossy()),
                None => "environment".to_owned(),
            },
            Source::File => "config file".to_owned(),
            Source::Default => "default".to_owned(),
            Source::Unset if id == "tools" => continue,
            Source::Unset => {
                writeln!(out, "# {key} = (unset)")?;
                continue;
            }
        };
        if id == "tools" {
            // Printed last, as tables: each tool's effective policy, `[tools."*"]` merged in.
            tools = matches
                .get_one::<Box<ToolPolicies>>(id)
                .map(|policies| (&**policies, origin));
            continue;
        }
        let value = match values.as_slice() {
            [one] => toml_string(one),
            many => format!(
                "[{}]",
                many.iter()
                    .map(|v| toml_string(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        writeln!(out, "{key} = {value}  # {origin}")?;
    }
    match tools {
        Some((policies, origin)) => {
            writeln!(
                out,
                "\n# tools: the effective policy of each tool ({origin})"
            )?;
            if policies.is_suggested() {
                writeln!(
                    out,
                    "\n# suggested: each tool the server lists gets what `mcp-idem tools` \
                     prints,\n# the tables below over it"
                )?;
            }
            for (tool, policy) in policies.named_tools() {
                write!(out, "\n[tools.{}]\n{policy}", toml_key(tool))?;
            }
            if let Some(policy) = policies.any_tool() {
                write!(out, "\n# every other tool\n[tools.\"*\"]\n{policy}")?;
            }
        }
        None => writeln!(
            out,
            "# tools = (unset: calls without a SEP or `_meta` key run unprotected)"
        )?,
    }
    Ok(out)
}

/// A tool name as a TOML key: bare when it can be, quoted otherwise.
fn toml_key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        name.to_owned()
    } else {
        toml_string(name)
    }
}

fn toml_string(value: &str) -> String {
    toml::Value::String(value.to_owned()).to_string()
}
