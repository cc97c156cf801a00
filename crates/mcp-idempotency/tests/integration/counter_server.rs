//! A real rmcp server with two tools, `bump` and `charge`, that count their executions: the
//! upstream of the embedding tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};

#[derive(Clone)]
pub(crate) struct Counter {
    executions: Arc<AtomicU64>,
    tool_router: ToolRouter<Self>,
}

impl Counter {
    /// A server counting into `executions`.
    pub(crate) fn new(executions: Arc<AtomicU64>) -> Self {
        Self {
            executions,
            tool_router: Self::tool_router(),
        }
    }
}

/// The arguments of `charge`.
#[derive(Debug, serde::Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(crate) struct Charge {
    order_id: Option<String>,
    amount: u64,
}

#[tool_router]
impl Counter {
    #[tool(description = "Counts its executions.")]
    async fn bump(&self) -> String {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        format!("execution {n}")
    }

    #[tool(description = "Charges `amount` for `order_id`, counted as an execution.")]
    async fn charge(&self, Parameters(charge): Parameters<Charge>) -> String {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        let order = charge.order_id.unwrap_or_default();
        format!("execution {n}: {} for {order}", charge.amount)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Counter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}
