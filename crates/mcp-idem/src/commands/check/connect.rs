//! Opening the session: which protocol era the server speaks, and whether it advertises
//! `tools.idempotency` in each handshake it answers (`capability.discover`,
//! `capability.initialize`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use mcp_idempotency::protocol;
use serde_json::Value;

use super::report::{Evidence, Level, Outcome, Status};
use super::session::{Era, Reply, Session};
use crate::http_line_client::HttpClient;
use crate::line_client::LineClient;
use crate::shown::abridge;

/// What to check: a stdio command, or a Streamable HTTP endpoint.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Stdio(Vec<String>),
    Http {
        url: String,
        headers: Vec<String>,
        ca_cert: Option<PathBuf>,
    },
}

impl Target {
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Stdio(command) => format!("stdio: {}", command.join(" ")),
            Self::Http { url, .. } => format!("Streamable HTTP: {url}"),
        }
    }

    /// A new connection: a new process for stdio, a new client for HTTP.
    fn open(&self, timeout: Duration) -> anyhow::Result<Session> {
        match self {
            Self::Stdio(command) => {
                let (program, args) = command.split_first().context("no command to run")?;
                let client = LineClient::spawn(program.as_ref(), args, &[])?;
                Ok(Session::stdio(client, timeout))
            }
            Self::Http {
                url,
                headers,
                ca_cert,
            } => Ok(Session::http(
                HttpClient::new(url, headers, ca_cert.as_deref())?,
                timeout,
            )),
        }
    }
}

/// An open session and what the handshakes showed.
pub(crate) struct Connected {
    pub(crate) session: Session,
    /// `capability.discover` and `capability.initialize`.
    pub(crate) outcomes: Vec<Outcome>,
    /// The era used, in words.
    pub(crate) era: String,
}

/// Tries `server/discover` (2026-07-28); checks the legacy `initialize` too, on a connection of
/// its own. The checks then use the current era if the server answered `server/discover`, else a
/// legacy session.
pub(crate) async fn connect(target: &Target, timeout: Duration) -> anyhow::Result<Connected> {
    let wait = timeout.min(Duration::from_secs(10));
    let mut session = target.open(timeout)?;
    let discover = session.discover(wait).await;
    if let Ok(reply) = &discover {
        if reply.message.get("result").is_some() {
            let discover = capability("capability.discover", protocol::DISCOVER, reply);
            let mut probe = target.open(timeout)?;
            let initialize = probe.initialize(wait).await;
            probe.close().await;
            let (initialize, also) = match initialize {
                Ok(reply) if reply.message.get("result").is_some() => (
                    capability("capability.initialize", protocol::INITIALIZE, &reply),
                    "; the legacy initialize is answered too",
                ),
                other => (
                    not_spoken("capability.initialize", protocol::INITIALIZE, &other),
                    "; the legacy initialize is not answered",
                ),
            };
            return Ok(Connected {
                session,
                outcomes: vec![discover, initialize],
                era: format!("{} (server/discover){also}", protocol::V_2026_07_28),
            });
        }
    }
    // A legacy server may have given up on a connection that did not start with `initialize`.
    session.close().await;
    let discover = not_spoken("capability.discover", protocol::DISCOVER, &discover);
    let mut session = target.open(timeout)?;
    let initialize = session.initialize(wait).await;
    let reply = match initialize {
        Ok(reply) if reply.message.get("result").is_some() => reply,
        other => bail!(
            "the server answered neither server/discover ({}) nor initialize ({})",
            discover.detail,
            answer_of(&other)
        ),
    };
    let Era::Legacy(version) = session.era.clone() else {
        bail!("initialize succeeded but the session is not in the legacy era");
    };
    Ok(Connected {
        outcomes: vec![
            discover,
            capability("capability.initialize", protocol::INITIALIZE, &reply),
        ],
        session,
        era: format!("legacy {version} (initialize); server/discover is not answered"),
    })
}

/// Whether the handshake result advertises `capabilities.tools.idempotency` (an object).
fn capability(name: &'static str, method: &str, reply: &Reply) -> Outcome {
    let evidence = vec![
        Evidence {
            label: "request".into(),
            text: abridge(&reply.request, 300),
        },
        Evidence {
            label: "response".into(),
            text: abridge(&reply.text, 600),
        },
    ];
    let (status, detail) = match protocol::idempotency_capability(&reply.message) {
        Some(Value::Object(_)) => (
            Status::Pass,
            format!("capabilities.tools.idempotency is advertised in the {method} result"),
        ),
        Some(other) => (
            Status::Fail,
            format!(
                "capabilities.tools.idempotency is {other}, not an object, in the {method} result"
            ),
        ),
        None => (
            Status::Fail,
            format!("the {method} result does not advertise capabilities.tools.idempotency"),
        ),
    };
    Outcome::new(name, Level::Must, status, detail).with(evidence)
}

/// A skipped capability check: the server does not speak this handshake.
fn not_spoken(name: &'static str, method: &str, answer: &anyhow::Result<Reply>) -> Outcome {
    let detail = format!(
        "the server does not speak {method} ({}), so it cannot advertise the capability there",
        answer_of(answer)
    );
    Outcome::new(name, Level::Must, Status::Skip, detail)
}

/// A short account of a handshake's answer.
fn answer_of(answer: &anyhow::Result<Reply>) -> String {
    match answer {
        Ok(reply) => match reply.message.get("error") {
            Some(error) => format!(
                "error {}: {}",
                error.get("code").unwrap_or(&Value::Null),
                error.get("message").and_then(Value::as_str).unwrap_or("")
            ),
            None => abridge(&reply.text, 120),
        },
        Err(err) => abridge(&format!("{err:#}"), 200),
    }
}
