//! The tool policies `wrap` and `proxy` take (issue 34): `--tools JSON` (the config file's
//! `[tools.NAME]` tables) and `--meta-key NAMES`; the library's option table gives each its name,
//! parser and help, as for the bindings.

use clap::Args;
use mcp_idempotency::embedded::options::{self, MetaKeys, META_KEY, TOOLS};
use mcp_idempotency::policy::ToolPolicies;

/// Per-tool key policies for calls without a SEP key.
#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    #[arg(long = TOOLS.name, env = "MCP_IDEM_TOOLS", value_name = "JSON", help = TOOLS.help,
          value_parser = |value: &str| options::tool_policies(value).map(Box::new))]
    pub(crate) tools: Option<Box<ToolPolicies>>,

    #[arg(long = META_KEY.name, env = "MCP_IDEM_META_KEY", value_name = "NAMES",
          help = META_KEY.help, value_parser = options::meta_keys)]
    pub(crate) meta_key: Option<MetaKeys>,
}

impl PolicyArgs {
    /// The policies, with the `_meta` names added.
    pub(crate) fn policies(&self) -> anyhow::Result<ToolPolicies> {
        let names = self.meta_key.iter().flat_map(|names| &names.0);
        Ok(self
            .tools
            .as_deref()
            .cloned()
            .unwrap_or_default()
            .with_meta_keys(names.map(String::as_str))?)
    }

    /// Logs the policies once at start: each tool's, so an operator sees what protects what.
    pub(crate) fn log(policies: &ToolPolicies) {
        if policies.is_suggested() {
            tracing::info!(
                "tool policy: suggested (applied to each tool once the server lists it; a tool's \
                 own table overrides it)"
            );
        }
        for (tool, policy) in policies.named_tools() {
            tracing::info!(tool, policy = %policy.to_string().trim_end().replace('\n', "; "), "tool policy");
        }
        if let Some(policy) = policies.any_tool() {
            tracing::info!(tool = "*", policy = %policy.to_string().trim_end().replace('\n', "; "), "tool policy");
        }
    }
}
