//! The MCP server a client command (`call`, `tools`) talks to through the library's client
//! ([`mcp_idempotency::client`]): a Streamable HTTP endpoint (`--url`, with `--header` and
//! `--ca-cert`) or a stdio command after `--`.

use std::path::PathBuf;

use clap::{ArgGroup, Args};
use mcp_idempotency::client::{Connect, ConnectError, HttpConnector, Session, StdioConnector};

/// Where the server is: `--url URL` or `-- <command> [args...]` (exactly one).
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("server").required(true).args(["url", "command"])))]
pub(crate) struct ServerArgs {
    /// Streamable HTTP endpoint of the MCP server, e.g. http://127.0.0.1:8080/mcp.
    #[arg(long, value_name = "URL")]
    pub(crate) url: Option<String>,

    /// An HTTP header for every request, `NAME: VALUE` (with --url; repeatable), e.g.
    /// "Authorization: Bearer TOKEN".
    #[arg(long = "header", short = 'H', value_name = "NAME:VALUE", requires = "url", value_parser = parse_header)]
    pub(crate) headers: Vec<(String, String)>,

    /// A PEM file of CA certificates to trust besides the system's (a private CA), for an
    /// https:// --url.
    #[arg(long, value_name = "FILE", env = "MCP_IDEM_CA_CERT")]
    pub(crate) ca_cert: Option<PathBuf>,

    /// The stdio MCP server to start, and its arguments (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<String>,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("expected NAME: VALUE, got {text:?}"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("empty header name in {text:?}"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

impl ServerArgs {
    /// The connector for the server: HTTP with the headers and the CA file, or the command.
    pub(crate) fn connector(&self) -> Connector {
        match (&self.url, self.command.split_first()) {
            (Some(url), _) => {
                let mut connector = self
                    .headers
                    .iter()
                    .fold(HttpConnector::new(url), |connector, (name, value)| {
                        connector.header(name, value)
                    });
                if let Some(ca) = &self.ca_cert {
                    connector = connector.ca_cert(ca);
                }
                Connector::Http(Box::new(connector))
            }
            (None, Some((program, args))) => {
                Connector::Stdio(StdioConnector::new(program).args(args))
            }
            (None, None) => unreachable!("clap requires --url or a command"),
        }
    }

    /// The server in words, for messages: the URL, or the command line.
    pub(crate) fn describe(&self) -> String {
        match &self.url {
            Some(url) => url.clone(),
            None => self.command.join(" "),
        }
    }
}

/// The library's connector for one of the two transports.
#[derive(Debug)]
pub(crate) enum Connector {
    Http(Box<HttpConnector>),
    Stdio(StdioConnector),
}

impl Connect for Connector {
    async fn connect(&self) -> Result<Session, ConnectError> {
        match self {
            Self::Http(connector) => connector.connect().await,
            Self::Stdio(connector) => connector.connect().await,
        }
    }
}
