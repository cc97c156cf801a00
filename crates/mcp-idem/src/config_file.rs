//! `--config FILE` (or `MCP_IDEM_CONFIG`): option values for `wrap` and `proxy` from a TOML file.
//!
//! Keys are the long option names (`store = "redis://..."`, `max-key-bytes = 128`), or the same in
//! snake_case or camelCase (`max_key_bytes`, `maxKeyBytes`), as policy settings are. A top-level key
//! applies to each of `wrap` and `proxy` that has the option (`listen` only to `proxy`); a `[wrap]`
//! or `[proxy]` table applies to that command only and wins over the top level. A key that is an
//! option of neither (or, in a table, not of its command) is an error naming it.
//!
//! Precedence: command line > environment > file > built-in default. The file's values become the
//! options' defaults before the command line is parsed, so clap keeps the first two rules, and
//! [`Invocation::source`] tells a file value from a built-in default.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use mcp_idempotency::embedded::options::{self, TOOLS};
use mcp_idempotency::policy::suggest::SUGGESTED;
use mcp_idempotency::policy::{kebab_case, ToolPolicies};

/// The commands a config file configures.
pub(crate) const CONFIGURABLE: [&str; 2] = ["wrap", "proxy"];

/// Option ids a file may not set: the file itself, and the wrapped command line.
const NOT_IN_FILE: [&str; 4] = ["config", "command", "help", "version"];

/// The parsed command line, and which option values came from the config file.
#[derive(Debug)]
pub(crate) struct Invocation {
    /// The command-line interface it was parsed with (without the file's values).
    pub(crate) command: Command,
    /// Everything clap parsed.
    pub(crate) matches: ArgMatches,
    /// The config file read, if any.
    pub(crate) file: Option<PathBuf>,
    /// Option ids whose default the file replaced.
    file_ids: Vec<String>,
}

/// Where an option's effective value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    CommandLine,
    Environment,
    File,
    Default,
    Unset,
}

impl Invocation {
    /// Where the value of option `id` of `matches` (a subcommand's matches) came from.
    pub(crate) fn source(&self, matches: &ArgMatches, id: &str) -> Source {
        match matches.value_source(id) {
            Some(ValueSource::CommandLine) => Source::CommandLine,
            Some(ValueSource::EnvVariable) => Source::Environment,
            Some(ValueSource::DefaultValue) if self.file_ids.iter().any(|f| f == id) => {
                Source::File
            }
            Some(_) => Source::Default,
            None => Source::Unset,
        }
    }
}

/// Parses `args` with `command`, after reading the config file that `--config` or
/// `MCP_IDEM_CONFIG` names for `wrap`, `proxy` and `config-check wrap|proxy`. Command-line
/// errors exit the process as clap does; config file errors are returned.
pub(crate) fn parse(command: Command, args: Vec<OsString>) -> anyhow::Result<Invocation> {
    let Some(path) = which_file(&command, &args) else {
        return Ok(Invocation {
            matches: command.clone().get_matches_from(args),
            command,
            file: None,
            file_ids: Vec::new(),
        });
    };
    let table = read(&path)?;
    let sections = sections(&command, &table, &path)?;
    let route = subcommand_path(&args);
    let mut values = route
        .last()
        .and_then(|name| sections.get(name.as_str()))
        .cloned()
        .unwrap_or_default();
    loop {
        let matches = configured(command.clone(), &route, &values).get_matches_from(args.clone());
        // A file value loses to an explicit value of an option it conflicts with (a file's
        // `jwt-key` to `--jwt-hmac-secret`): parse again without it.
        let overridden = overridden(&command, &route, &matches, &values);
        if overridden.is_empty() {
            return Ok(Invocation {
                command,
                matches,
                file: Some(path),
                file_ids: values.into_keys().collect(),
            });
        }
        for id in overridden {
            values.remove(&id);
        }
    }
}

/// `command` with the file's `values` as the defaults of the subcommand at `route`.
fn configured(command: Command, route: &[String], values: &BTreeMap<String, String>) -> Command {
    let configure = |sub: Command| with_file_defaults(sub, values);
    match route {
        [one] => command.mut_subcommand(one, configure),
        [outer, inner] => {
            command.mut_subcommand(outer, |outer| outer.mut_subcommand(inner, configure))
        }
        _ => command,
    }
}

/// The ids among `values` that conflict with an option given on the command line or in the
/// environment.
fn overridden(
    command: &Command,
    route: &[String],
    matches: &ArgMatches,
    values: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut sub = command;
    let mut sub_matches = matches;
    for name in route {
        match (
            sub.find_subcommand(name),
            sub_matches.subcommand_matches(name),
        ) {
            (Some(next), Some(next_matches)) => {
                sub = next;
                sub_matches = next_matches;
            }
            _ => return Vec::new(),
        }
    }
    values
        .keys()
        .filter(|id| {
            sub.get_arguments()
                .find(|arg| arg.get_id() == id.as_str())
                .is_some_and(|arg| {
                    sub.get_arg_conflicts_with(arg).iter().any(|other| {
                        matches!(
                            sub_matches.value_source(other.get_id().as_str()),
                            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                        )
                    })
                })
        })
        .cloned()
        .collect()
}

/// `["wrap"]`, `["proxy"]`, `["config-check", "wrap"]`, ...: the configurable command being run.
/// The global options given before the command (`--log-format json`) are passed over.
fn subcommand_path(args: &[OsString]) -> Vec<String> {
    let mut words: &[&str] = &args
        .iter()
        .skip(1)
        .map(|a| a.to_str().unwrap_or(""))
        .collect::<Vec<_>>();
    loop {
        words = match words {
            ["--log-format", _, rest @ ..] => rest,
            [global, rest @ ..] if global.starts_with("--log-format=") => rest,
            _ => break,
        };
    }
    match words {
        [first, ..] if CONFIGURABLE.contains(first) => vec![(*first).to_owned()],
        ["config-check", second, ..] if CONFIGURABLE.contains(second) => {
            vec!["config-check".to_owned(), (*second).to_owned()]
        }
        _ => Vec::new(),
    }
}

/// The file named by the command's own `--config`, else by `MCP_IDEM_CONFIG`. Read from a first
/// parse by clap that ignores errors (an option the file would supply may be missing): clap
/// knows which words are options, their values, and where `wrap`'s server command starts, so a
/// `--config` of the server's (`mcp-idem wrap server --config x.toml`) is never taken for ours.
fn which_file(command: &Command, args: &[OsString]) -> Option<PathBuf> {
    let route = subcommand_path(args);
    if route.is_empty() {
        return None;
    }
    let matches = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .ok()?;
    let mut matches = &matches;
    for name in &route {
        matches = matches.subcommand_matches(name)?;
    }
    matches
        .get_one::<PathBuf>("config")
        .filter(|path| !path.as_os_str().is_empty())
        .cloned()
}

fn read(path: &Path) -> anyhow::Result<toml::Table> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    text.parse::<toml::Table>()
        .with_context(|| format!("invalid TOML in the config file {}", path.display()))
}

/// Option id -> value, per configurable command, checked against that command's options.
type Sections = BTreeMap<&'static str, BTreeMap<String, String>>;

fn sections(command: &Command, table: &toml::Table, path: &Path) -> anyhow::Result<Sections> {
    let mut sections = Sections::new();
    for name in CONFIGURABLE {
        let sub = command
            .find_subcommand(name)
            .with_context(|| format!("no `{name}` command"))?;
        let mut values = BTreeMap::new();
        // Each option's key as written (`after_crash`, `afterCrash`), for the errors.
        let mut keys: BTreeMap<String, String> = BTreeMap::new();
        // `[tools.NAME]` tables: `[wrap.tools.NAME]` / `[proxy.tools.NAME]` replace the
        // top-level table of the same tool. `origins` says which, per tool, for the errors.
        let mut tools = toml::Table::new();
        let mut origins: BTreeMap<String, String> = BTreeMap::new();
        for (level, options) in [
            (None, Some(table)),
            (Some(name), section_of(table, name, path)?),
        ] {
            let Some(options) = options else {
                continue;
            };
            let mut here: BTreeMap<String, &str> = BTreeMap::new();
            for (key, value) in options {
                if level.is_none() && value.is_table() && CONFIGURABLE.contains(&key.as_str()) {
                    continue;
                }
                if key == TOOLS.name {
                    let origin = level.map_or_else(|| "tools".to_owned(), |l| format!("{l}.tools"));
                    for (tool, policy) in tool_tables(name, value, path)? {
                        origins.insert(tool.clone(), origin.clone());
                        tools.insert(tool, policy);
                    }
                    continue;
                }
                // A top-level key applies where it is an option; one that is an option nowhere
                // is reported below.
                let id = match (option_id(sub, key), level) {
                    (Some(id), _) => id,
                    (None, None) => continue,
                    (None, Some(_)) => bail!(unknown_key(sub, key, path)),
                };
                if let Some(first) = here.insert(id.clone(), key) {
                    bail!(
                        "`{first}` and `{key}` in {}{} are one option; give it once",
                        path.display(),
                        level.map(|l| format!(" [{l}]")).unwrap_or_default()
                    );
                }
                values.insert(id.clone(), scalar(key, value, path)?);
                keys.insert(id, key.clone());
            }
        }
        if !tools.is_empty() {
            check_tools(&tools, &origins, path)?;
            let id = option_id(sub, TOOLS.name).context("no --tools option")?;
            let json = serde_json::to_string(&tools).context("the [tools] tables")?;
            values.insert(id, json);
        }
        for (id, value) in &values {
            check_value(sub, id, value).with_context(|| {
                let key = keys.get(id).cloned().unwrap_or_else(|| long_name(sub, id));
                format!("invalid value for `{key}` in {}", path.display())
            })?;
        }
        sections.insert(name, values);
    }
    for (key, value) in table {
        if value.is_table() && CONFIGURABLE.contains(&key.as_str()) {
            continue;
        }
        let known = CONFIGURABLE
            .iter()
            .filter_map(|name| command.find_subcommand(name))
            .any(|sub| option_id(sub, key).is_some());
        if !known {
            let mut keys: Vec<&str> = CONFIGURABLE
                .iter()
                .filter_map(|name| command.find_subcommand(name))
                .flat_map(file_keys)
                .collect();
            keys.sort_unstable();
            keys.dedup();
            bail!(
                "unknown key `{key}` in the config file {} (not an option of `mcp-idem wrap` or \
                 `mcp-idem proxy`; keys are long option names, also in snake_case or camelCase: \
                 {})",
                path.display(),
                keys.join(", ")
            );
        }
    }
    Ok(sections)
}

/// The `[wrap]` or `[proxy]` table, if the file has one.
fn section_of<'a>(
    table: &'a toml::Table,
    name: &str,
    path: &Path,
) -> anyhow::Result<Option<&'a toml::Table>> {
    table
        .get(name)
        .map(|section| {
            section.as_table().with_context(|| {
                format!("[{name}] in {} must be a table of options", path.display())
            })
        })
        .transpose()
}

/// The id of the option whose long name is `key` (or the same in snake_case or camelCase:
/// `after_crash`, `afterCrash`), if a file may set it.
fn option_id(sub: &Command, key: &str) -> Option<String> {
    let key = kebab_case(key);
    sub.get_arguments()
        .filter(|arg| !NOT_IN_FILE.contains(&arg.get_id().as_str()))
        .find(|arg| arg.get_long() == Some(key.as_str()))
        .map(|arg| arg.get_id().as_str().to_owned())
}

fn long_name(sub: &Command, id: &str) -> String {
    sub.get_arguments()
        .find(|arg| arg.get_id() == id)
        .and_then(|arg| arg.get_long())
        .unwrap_or(id)
        .to_owned()
}

/// The keys `sub` accepts from a file.
pub(crate) fn file_keys(sub: &Command) -> Vec<&str> {
    sub.get_arguments()
        .filter(|arg| !NOT_IN_FILE.contains(&arg.get_id().as_str()))
        .filter_map(|arg| arg.get_long())
        .collect()
}

fn unknown_key(sub: &Command, key: &str, path: &Path) -> String {
    format!(
        "unknown key `{key}` in the config file {} (not an option of `mcp-idem {}`; keys are \
         long option names, also in snake_case or camelCase: {})",
        path.display(),
        sub.get_name(),
        file_keys(sub).join(", ")
    )
}

/// Reads the `[tools.NAME]` tables as `--tools` would, so that a mistake is reported against the
/// file, the table and the setting as written: `config.toml: [tools.charge] key_from: …`.
/// `origins` holds each tool's table prefix (`tools`, `wrap.tools`).
fn check_tools(
    tools: &toml::Table,
    origins: &BTreeMap<String, String>,
    path: &Path,
) -> anyhow::Result<()> {
    let json = serde_json::to_value(tools).context("the [tools] tables")?;
    let Err(error) = ToolPolicies::from_json(&json) else {
        return Ok(());
    };
    let origin = origins.get(error.tool()).map_or("tools", String::as_str);
    let table = if error.tool().is_empty() {
        format!("[{origin}]")
    } else {
        format!("[{origin}.{}]", toml_key(error.tool()))
    };
    match error.setting() {
        Some(setting) => bail!("{}: {table} {setting}: {}", path.display(), error.reason()),
        None => bail!("{}: {table} {}", path.display(), error.reason()),
    }
}

/// `key` as a TOML key: bare when it can be (`charge`), else quoted (`"*"`, `"my tool"`).
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bare {
        key.to_owned()
    } else {
        serde_json::Value::String(key.to_owned()).to_string()
    }
}

/// The `[tools]` table: tool name to its table of settings (`[tools.charge]`,
/// `[tools."*"]`); its settings are checked by [`check_tools`].
fn tool_tables(command: &str, value: &toml::Value, path: &Path) -> anyhow::Result<toml::Table> {
    if value.as_str() == Some(SUGGESTED) {
        // `tools = "suggested"`: as `suggested = true` in the `[tools]` table.
        let mut tables = toml::Table::new();
        tables.insert(SUGGESTED.into(), true.into());
        return Ok(tables);
    }
    let tables = value.as_table().with_context(|| {
        format!(
            "`tools` in {} must be \"suggested\" or tables of tool policies, as in [tools.charge] (for `{command}`)",
            path.display()
        )
    })?;
    Ok(tables.clone())
}

fn scalar(key: &str, value: &toml::Value, path: &Path) -> anyhow::Result<String> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(x) => x.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        _ => bail!(
            "`{key}` in {} must be a string, a number or a boolean",
            path.display()
        ),
    })
}

/// Runs the option's own parser on `value`, so a bad value is reported against the file.
fn check_value(sub: &Command, id: &str, value: &str) -> anyhow::Result<()> {
    let arg = sub
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .with_context(|| format!("no option {id}"))?;
    if !arg.get_action().takes_values() {
        return options::boolean(value)
            .map(drop)
            .map_err(|reason| anyhow::anyhow!("{reason}, got {value:?}"));
    }
    let long = arg.get_long().unwrap_or(id);
    let probe = Command::new("config").arg(
        arg.clone()
            .env(None)
            .default_value(None)
            .required(false)
            .conflicts_with(Resettable::Reset)
            .requires(Resettable::Reset)
            .overrides_with(Resettable::Reset),
    );
    probe
        .try_get_matches_from(["config", &format!("--{long}"), value])
        .map(drop)
        .map_err(|err| {
            let rendered = err.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            anyhow::anyhow!("{}", first.trim_start_matches("error: "))
        })
}

fn with_file_defaults(mut sub: Command, values: &BTreeMap<String, String>) -> Command {
    for (id, value) in values {
        let value = value.clone();
        sub = sub.mut_arg(id, |arg| arg.default_value(value).required(false));
    }
    sub
}

#[cfg(test)]
mod tests {
    use mcp_idempotency::embedded::{options, Settings};

    use super::*;

    /// Values each option is tried with: some are right for one option, wrong for the others.
    const PROBES: [&str; 13] = [
        "0",
        "1",
        "255",
        "1.5",
        "many",
        "24h",
        "soon",
        "true",
        "yes",
        "reject",
        "reexecute",
        "absorb",
        "forward",
    ];

    #[test]
    fn the_configured_command_is_found_after_global_options() {
        let path = |words: &[&str]| {
            let args: Vec<OsString> = ["mcp-idem"].iter().chain(words).map(Into::into).collect();
            subcommand_path(&args)
        };
        assert_eq!(path(&["proxy", "--listen", "x"]), ["proxy"]);
        assert_eq!(path(&["--log-format", "json", "proxy"]), ["proxy"]);
        assert_eq!(
            path(&["--log-format=json", "config-check", "wrap"]),
            ["config-check", "wrap"]
        );
        assert!(path(&["--log-format", "json", "demo"]).is_empty());
    }

    #[test]
    fn wraps_flags_and_config_file_take_each_option_as_the_librarys_table_says() {
        let cli = crate::cli::command();
        let wrap = cli.find_subcommand("wrap").unwrap();
        for option in &options::ALL {
            let arg = wrap
                .get_arguments()
                .find(|arg| arg.get_long() == Some(option.name))
                .unwrap_or_else(|| panic!("wrap has no --{}", option.name));
            let id = arg.get_id().as_str();
            assert_eq!(option_id(wrap, option.name).as_deref(), Some(id));
            let defaults: Vec<_> = arg.get_default_values().iter().collect();
            if arg.get_action().takes_values() {
                let expected: Vec<&str> = option.default.into_iter().collect();
                assert_eq!(defaults, expected, "default of --{}", option.name);
            } else {
                // A flag: off unless given.
                assert_eq!(option.default, Some("false"));
            }
            // Each front end describes its own default namespace and principal.
            if !matches!(option.name, "namespace" | "principal") {
                let help = arg.get_help().map(ToString::to_string);
                assert_eq!(
                    help.as_deref(),
                    Some(option.help),
                    "help of --{}",
                    option.name
                );
                for value in PROBES {
                    let in_file = check_value(wrap, id, value);
                    let in_settings = Settings::new("n").set(option.name, value);
                    assert_eq!(
                        in_file.is_ok(),
                        in_settings.is_ok(),
                        "--{} {value:?}: {in_file:?} / {in_settings:?}",
                        option.name
                    );
                    if let (Err(file), Err(settings)) = (in_file, in_settings) {
                        let reason = settings.to_string();
                        let reason = reason.rsplit(": ").next().unwrap_or_default();
                        // The settings also show the value as given; the flag's error shows it
                        // in clap's words.
                        let reason = reason.split(", got ").next().unwrap_or(reason);
                        assert!(file.to_string().contains(reason), "{file} / {reason}");
                    }
                }
            }
        }
    }
}
