//! `mcp-idem demo-server`: a small payment MCP server on stdio (or Streamable HTTP with
//! `--http`, see [`demo_server_http`](http)), built on rmcp.
//!
//! The upstream behind the idempotency gateway in demos, tests and benchmarks. It knows nothing
//! about idempotency: every `charge_payment` it runs appends one line to the [ledger](crate::ledger),
//! so the ledger shows how many times a side effect really happened.
//!
//! rmcp speaks protocol 2026-07-28 (`server/discover`, `_meta` on every request) and still
//! answers the legacy `initialize` handshake. Requests run concurrently, so responses may come
//! back out of order. stdout carries the protocol, logs go to stderr, and stdin EOF ends the
//! server with status 0.
//!
//! Tools:
//! - `charge_payment {amount, currency, order_id?, delay_ms?, fail_after_charge?}`: logs
//!   "charge_payment started" (info level, so tests can see a call has begun), sleeps `delay_ms`,
//!   appends a charge (with `orderId` when the call named an `order_id`: the business identifier
//!   a `key-from = ["/order_id"]` policy keys on), and returns `{chargeId, amount, currency}` as
//!   text and `structuredContent`. With `fail_after_charge` it appends the charge and then answers with a
//!   JSON-RPC internal error naming the charge id: the side effect happened, the call failed.
//!   A cancelled call (`notifications/cancelled`) still charges: only the response is dropped.
//! - `get_balance`: the number of charges in the ledger and the sum per currency.
//! - `noop` and `work_1ms`: no ledger write; answer at once, or after a 1 ms timer.
//! - `confirm_charge {amount, currency, order_id?}`, only with `--http-stateful` or, on stdio,
//!   `--confirm` (otherwise stdio and stateless HTTP list exactly the tools above): asks the
//!   client with a server-to-client `elicitation/create` request (form mode, an empty schema)
//!   whether to charge, and charges
//!   (one ledger line, the same answer as `charge_payment`) only if the client answers `accept`;
//!   `decline` or `cancel` charge nothing and answer `{charged: false, action}`. It needs a
//!   session whose client declared the `elicitation` capability; without one the call fails
//!   with a JSON-RPC error and charges nothing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, ElicitRequestParams, ElicitationAction, ElicitationSchema,
    Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::service::{ElicitationMode, ServerInitializeError};
use rmcp::{
    tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler, ServiceExt,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Number, Value};

use super::demo_server_http::HttpMode;
use crate::ledger::{self, Charge, Ledger};

#[derive(Debug, Args)]
pub(crate) struct DemoServerArgs {
    /// Ledger file: one JSON line per executed charge, appended, shareable by several servers.
    /// Default: $MCP_IDEM_LEDGER if set, else mcp-idem-demo-ledger.jsonl in the system
    /// temporary directory.
    #[arg(long, value_name = "PATH")]
    ledger: Option<PathBuf>,
    /// Serve Streamable HTTP (stateless, POST http://ADDR/mcp) instead of stdio. Port 0 picks a
    /// free port; the first stderr line is `listening on http://IP:PORT/mcp`.
    #[arg(long, value_name = "IP:PORT")]
    http: Option<SocketAddr>,
    /// With --http: answer with text/event-stream instead of plain application/json.
    #[arg(long, requires = "http")]
    http_sse: bool,
    /// With --http: serve with sessions, as servers of the `initialize` era do. `initialize`
    /// opens a session (`Mcp-Session-Id` response header, kept in memory: after a restart old
    /// ids get 404); answers are text/event-stream; GET opens the session's server-to-client
    /// stream; DELETE ends it. Adds the tool `confirm_charge {amount, currency}`, which asks the
    /// client (elicitation/create) before charging. Each new session prints
    /// `session opened: ID` on stderr, each GET stream `stream opened: ID`.
    #[arg(long, requires = "http", conflicts_with = "http_sse")]
    http_stateful: bool,
    /// On stdio: also offer `confirm_charge {amount, currency, order_id?}`, which asks the client
    /// (elicitation/create, to a client that declared the elicitation capability in its
    /// `initialize`) before charging. `--http-stateful` always offers it.
    #[arg(long, conflicts_with = "http")]
    confirm: bool,
    /// The name the server gives itself (`serverInfo.name`), which gateways key its records by
    /// by default: two servers under one name on one store share records.
    #[arg(long, value_name = "NAME", default_value = DEMO_SERVER_NAME)]
    name: String,
}

/// The demo server's default `serverInfo.name`.
const DEMO_SERVER_NAME: &str = "mcp-idem-demo-server";

impl DemoServerArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let path = self.ledger.unwrap_or_else(ledger::default_path);
        let ledger = Ledger::open(&path)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let server = PaymentServer::new(ledger, self.http_stateful || self.confirm, self.name);
        match self.http {
            Some(addr) => {
                let mode = if self.http_stateful {
                    HttpMode::Stateful
                } else {
                    HttpMode::Stateless { sse: self.http_sse }
                };
                runtime.block_on(super::demo_server_http::serve(server, addr, mode))?
            }
            None => runtime.block_on(serve(server))?,
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Serves MCP on stdin/stdout until stdin reaches EOF.
async fn serve(server: PaymentServer) -> anyhow::Result<()> {
    tracing::info!(ledger = %server.ledger.path().display(), "demo server listening on stdio");
    let running = match server.serve(rmcp::transport::stdio_pipes()).await {
        Ok(running) => running,
        // EOF before the first request: nobody came, which is not an error.
        Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(err) => return Err(err).context("the MCP session did not start"),
    };
    let reason = running
        .waiting()
        .await
        .context("the MCP service task failed")?;
    tracing::info!(?reason, "demo server stopped");
    Ok(())
}

/// Arguments of `charge_payment`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ChargeArgs {
    /// Amount to charge; stored as given.
    amount: Number,
    /// Currency code, e.g. "EUR".
    currency: String,
    /// Your identifier of the order this charge pays, e.g. "ord_1042"; recorded with the charge.
    #[serde(default)]
    order_id: Option<String>,
    /// Sleep this many milliseconds before charging, to simulate a slow call.
    #[serde(default)]
    delay_ms: u64,
    /// Record the charge, then fail the call with a JSON-RPC internal error.
    #[serde(default)]
    fail_after_charge: bool,
}

/// Arguments of `confirm_charge`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ConfirmArgs {
    /// Amount to charge if the client confirms; stored as given.
    amount: Number,
    /// Currency code, e.g. "EUR".
    currency: String,
    /// Your identifier of the order this charge pays; recorded with the charge.
    #[serde(default)]
    order_id: Option<String>,
}

#[derive(Debug, Clone)]
struct PaymentServer {
    ledger: Arc<Ledger>,
    name: Arc<str>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl PaymentServer {
    /// The server over `ledger`; with `confirm`, it also offers `confirm_charge`.
    fn new(ledger: Ledger, confirm: bool, name: String) -> Self {
        let mut tool_router = Self::tool_router();
        if confirm {
            tool_router += Self::confirm_router();
        }
        Self {
            ledger: Arc::new(ledger),
            name: name.into(),
            tool_router,
        }
    }

    /// Appends one charge to the ledger.
    fn record(
        &self,
        amount: Number,
        currency: String,
        order_id: Option<String>,
    ) -> Result<Charge, ErrorData> {
        let charge = Charge::new(amount, currency, order_id);
        self.ledger.append(&charge).map_err(|err| {
            tracing::error!(%err, ledger = %self.ledger.path().display(), "cannot append a charge");
            ErrorData::internal_error(format!("cannot write the ledger: {err}"), None)
        })?;
        tracing::debug!(charge_id = %charge.charge_id, "charged");
        Ok(charge)
    }

    #[tool(
        description = "Charge a payment: appends one line to the ledger and returns its chargeId. \
                       order_id (optional) names the order paid and is recorded with the charge; \
                       delay_ms sleeps before charging; fail_after_charge charges, then fails."
    )]
    async fn charge_payment(
        &self,
        params: Parameters<ChargeArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = params.0;
        tracing::info!(amount = %args.amount, delay_ms = args.delay_ms, "charge_payment started");
        if args.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
        }
        let charge = self.record(args.amount, args.currency, args.order_id)?;
        if args.fail_after_charge {
            return Err(ErrorData::internal_error(
                format!(
                    "charge {} was recorded, then the call failed (fail_after_charge)",
                    charge.charge_id
                ),
                Some(json!({ "chargeId": charge.charge_id })),
            ));
        }
        Ok(charged(&charge))
    }

    #[tool(
        description = "Number of charges in the ledger and the sum per currency.",
        annotations(read_only_hint = true)
    )]
    async fn get_balance(&self) -> Result<CallToolResult, ErrorData> {
        let charges = ledger::read(self.ledger.path())
            .map_err(|err| ErrorData::internal_error(format!("{err:#}"), None))?;
        let balance = ledger::balance(&charges);
        let sums: Map<String, Value> = balance
            .sums
            .iter()
            .map(|(currency, sum)| (currency.clone(), Value::Number(sum.clone())))
            .collect();
        let mut text = format!("{} charges", balance.charges);
        for (currency, sum) in &balance.sums {
            text.push_str(&format!("; {sum} {currency}"));
        }
        Ok(with_structured(
            text,
            json!({ "charges": balance.charges, "sums": sums }),
        ))
    }

    #[tool(description = "Do nothing and answer at once (no ledger write).")]
    async fn noop(&self) -> String {
        "ok".to_owned()
    }

    #[tool(description = "Wait on a 1 ms timer, then answer (no ledger write).")]
    async fn work_1ms(&self) -> String {
        tokio::time::sleep(Duration::from_millis(1)).await;
        "ok".to_owned()
    }
}

#[tool_router(router = confirm_router)]
impl PaymentServer {
    #[tool(
        description = "Ask the client (elicitation/create) whether to charge; charge once, as \
                       charge_payment does, only if it accepts. Needs a session whose client \
                       supports form elicitation."
    )]
    async fn confirm_charge(
        &self,
        params: Parameters<ConfirmArgs>,
        peer: Peer<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = params.0;
        if !peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            return Err(ErrorData::invalid_request(
                "confirm_charge asks the client to confirm: the client must declare the \
                 elicitation capability (form mode) in its initialize request",
                None,
            ));
        }
        let question = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: format!("Charge {} {}?", args.amount, args.currency),
            requested_schema: ElicitationSchema::new(BTreeMap::new()),
        };
        let answer = peer.create_elicitation(question).await.map_err(|err| {
            ErrorData::internal_error(
                format!("cannot ask the client to confirm the charge: {err}"),
                None,
            )
        })?;
        if matches!(answer.action, ElicitationAction::Accept) {
            let charge = self.record(args.amount, args.currency, args.order_id)?;
            return Ok(charged(&charge));
        }
        // `decline` or `cancel`, as the client wrote it.
        let action = serde_json::to_value(&answer.action)
            .ok()
            .and_then(|action| action.as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{:?}", answer.action));
        Ok(with_structured(
            format!("not charged: the client answered {action}"),
            json!({ "charged": false, "action": action }),
        ))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for PaymentServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                self.name.to_string(),
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "A demo payment service without idempotency: every charge_payment call charges.",
            )
    }
}

/// The answer to an executed charge: `{chargeId, amount, currency}` as text and
/// `structuredContent`.
fn charged(charge: &Charge) -> CallToolResult {
    let text = format!(
        "charged {} {}: {}",
        charge.amount, charge.currency, charge.charge_id
    );
    with_structured(
        text,
        json!({
            "chargeId": charge.charge_id,
            "amount": charge.amount,
            "currency": charge.currency,
        }),
    )
}

/// A successful result carrying `text` as content and `structured` as `structuredContent`.
fn with_structured(text: String, structured: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}
