//! What the interceptor learns from the server's discovery results: its name (the default
//! namespace of its records), and whether the results get `tools.idempotency`. Also the gateway's
//! own `server/discover`, sent when a call must be decided under the server's name before any
//! result has named it.

use std::collections::HashSet;

use super::RequestId;
use crate::policy::ToolPolicies;
use crate::protocol;
use crate::raw_object::{json_string, RawObject};

/// The discovery requests in flight and what their results said.
#[derive(Debug, Default)]
pub(super) struct Discovery {
    /// The client's `initialize` / `server/discover` requests whose results are awaited.
    pub(super) requests: HashSet<RequestId>,
    /// The gateway's own `server/discover`, while its result is awaited.
    probe: Option<RequestId>,
    /// How many probes were sent (their ids are numbered).
    probes_sent: u64,
    /// The last probe was answered without a name (an error: a server of a revision before
    /// 2026-07-28, which knows only `initialize`).
    probe_failed: bool,
    /// The server's `serverInfo.name`, from the first discovery result that had one.
    pub(super) server_name: Option<String>,
    /// The revision the server chose in an `initialize` result (`result.protocolVersion`).
    pub(super) protocol_version: Option<String>,
}

/// What a driver that decides under the server's name does before deciding a call
/// ([`Interceptor::learn_server_name`](super::Interceptor::learn_server_name)).
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub enum LearnName {
    /// The server has named itself: [`server_name`](super::Interceptor::server_name) is set.
    Known,
    /// Send this request (the gateway's own `server/discover`) to the server, then wait as for
    /// [`Wait`](Self::Wait). Its answer is the interceptor's: it never reaches the client.
    Send(String),
    /// A result that may name the server is awaited: ask again once the server has answered.
    Wait,
    /// The server answered the gateway's `server/discover` without naming itself, and no
    /// `initialize` result is awaited: a call cannot be decided under its name.
    Failed,
}

impl Discovery {
    /// The next step to learn the server's name; `in_use` tells whether an id is taken by a
    /// client request (the probe's id must not be one).
    pub(super) fn learn(&mut self, in_use: impl Fn(&RequestId) -> bool) -> LearnName {
        if self.server_name.is_some() {
            return LearnName::Known;
        }
        if !self.requests.is_empty() || self.probe.is_some() {
            return LearnName::Wait;
        }
        if self.probe_failed {
            return LearnName::Failed;
        }
        let (text, id) = loop {
            self.probes_sent += 1;
            let text = format!("mcp-idem/server-name-{}", self.probes_sent);
            let id = RequestId(json_string(&text));
            if !in_use(&id) {
                break (text, id);
            }
        };
        self.probe = Some(id);
        LearnName::Send(protocol::discover_request(text).to_string())
    }

    /// Whether `id` answers the gateway's own probe; if so, takes what it says.
    pub(super) fn on_probe_answer(&mut self, id: &RequestId, envelope: &RawObject<'_>) -> bool {
        if self.probe.as_ref() != Some(id) {
            return false;
        }
        self.probe = None;
        match result_of(envelope).and_then(|result| server_name(&result)) {
            Some(name) => {
                self.server_name.get_or_insert(name);
            }
            None => {
                tracing::warn!(
                    "the server answered mcp-idem's server/discover without its name; calls sent \
                     before `initialize` cannot be decided under it"
                );
                self.probe_failed = true;
            }
        }
        true
    }

    /// A result to a client's discovery request: the first name it gives is kept, and the revision
    /// an `initialize` result chose.
    pub(super) fn on_result(&mut self, envelope: &RawObject<'_>) {
        let Some(result) = result_of(envelope) else {
            return;
        };
        if self.server_name.is_none() {
            self.server_name = server_name(&result);
        }
        if let Some(chosen) = result.get_str("protocolVersion") {
            self.protocol_version = Some(chosen);
        }
    }

    /// The server went away: nothing is awaited any more.
    pub(super) fn clear(&mut self) {
        self.requests.clear();
        if self.probe.take().is_some() {
            self.probe_failed = true;
        }
    }
}

/// The `result` object of a response.
fn result_of<'a>(envelope: &RawObject<'a>) -> Option<RawObject<'a>> {
    RawObject::parse(envelope.get("result")?.get())
}

/// The server's name in an `initialize` result (`serverInfo.name`) or a `server/discover` result
/// (`_meta["io.modelcontextprotocol/serverInfo"].name`), when it is a string.
fn server_name(result: &RawObject<'_>) -> Option<String> {
    let info = match result.get("serverInfo") {
        Some(info) => info,
        None => RawObject::parse(result.get("_meta")?.get())?
            .get("io.modelcontextprotocol/serverInfo")?,
    };
    RawObject::parse(info.get())?.get_str("name")
}

/// Adds `tools.idempotency = {}` to the capabilities of an `initialize` / `server/discover` result.
pub(super) fn inject_capability(envelope: &RawObject<'_>) -> Option<String> {
    let result = result_of(envelope)?;
    let capabilities = RawObject::parse(result.get("capabilities")?.get())?;
    let tools = RawObject::parse(capabilities.get("tools")?.get())?;
    let tools = tools.to_string_with("idempotency", "{}");
    let capabilities = capabilities.to_string_with("tools", &tools);
    let result = result.to_string_with("capabilities", &capabilities);
    Some(envelope.to_string_with("result", &result))
}

/// Logs the tools a policy names that the server's `tools/list` result does not list; `false`
/// when the message is not such a result (the next one is checked).
pub(super) fn warn_unlisted(policies: &ToolPolicies, envelope: &RawObject<'_>) -> bool {
    #[derive(serde::Deserialize)]
    struct Listed {
        tools: Vec<Named>,
        #[serde(rename = "nextCursor")]
        next_cursor: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Named {
        name: String,
    }
    let Some(listed) = envelope
        .get("result")
        .and_then(|result| serde_json::from_str::<Listed>(result.get()).ok())
    else {
        return false;
    };
    if listed.next_cursor.is_some() {
        // One page of several: the policy may name a tool of another page.
        return true;
    }
    let names: Vec<&str> = listed.tools.iter().map(|tool| tool.name.as_str()).collect();
    for tool in policies.unlisted(&names) {
        tracing::warn!(
            tool,
            "a tool policy names a tool the server does not list; check its name"
        );
    }
    true
}
