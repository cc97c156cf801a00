//! `mcp-idem demo`: the SEP-3182 decisions, step by step, on a real SQLite store.
//!
//! Plays a small payment service: each executed `charge_payment` appends a line to an in-memory
//! ledger. Every step says what the client sent, what the engine decided, and whether that is what
//! the SEP requires; the command fails if any step misbehaves.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use mcp_idempotency::store::{SqliteStore, Store};
use mcp_idempotency::{
    Claim, Decision, Deduplicator, EngineConfig, Outcome, Replay, Scope, ToolCall,
};
use serde_json::{json, Value};

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// SQLite file to keep the records in (default: a fresh file in a temporary directory).
    #[arg(long, value_name = "PATH")]
    sqlite: Option<PathBuf>,
}

impl DemoArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let temp;
        let path = match self.sqlite {
            Some(path) => path,
            None => {
                temp = tempfile::tempdir().context("cannot create a temporary directory")?;
                temp.path().join("records.sqlite3")
            }
        };
        let passed = runtime.block_on(run(path))?;
        Ok(if passed {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

/// The demo's payment service: a ledger of executed charges.
struct PaymentService {
    dedup: Deduplicator,
    scope: Scope,
    ledger: Vec<String>,
    failures: usize,
}

impl PaymentService {
    async fn open(path: &std::path::Path, ledger: Vec<String>) -> anyhow::Result<Self> {
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(path)
                .await
                .with_context(|| format!("cannot open the SQLite store {}", path.display()))?,
        );
        Ok(Self {
            dedup: Deduplicator::new(EngineConfig::default(), store),
            scope: Scope::new("demo-payments", "local-user"),
            ledger,
            failures: 0,
        })
    }

    /// Sends a `tools/call` for `charge_payment` and returns the decision.
    async fn call(&self, key: &str, arguments: &str) -> Decision {
        let key = json!(key);
        println!("  -> tools/call charge_payment {arguments} idempotencyKey={key}");
        self.dedup
            .decide(
                &self.scope,
                &ToolCall {
                    tool_name: "charge_payment",
                    arguments: Some(arguments),
                    idempotency_key: Some(&key),
                    mrtr_continuation: false,
                },
            )
            .await
    }

    /// Runs the tool for a claimed call: charges, or fails after charging.
    async fn execute(&mut self, claim: &Claim, arguments: &str, fail: bool) -> anyhow::Result<()> {
        let args: Value = serde_json::from_str(arguments)?;
        let charge_id = format!("ch_{:04}", self.ledger.len() + 1);
        self.ledger.push(format!(
            "{charge_id} {} {}",
            args["amount"], args["currency"]
        ));
        let outcome = if fail {
            Outcome::Error(
                json!({"code": -32603, "message": format!("bank timeout after charging {charge_id}")})
                    .to_string(),
            )
        } else {
            Outcome::Success(
                json!({"content": [{"type": "text", "text": format!("charged: {charge_id}")}],
                       "structuredContent": {"chargeId": charge_id}})
                .to_string(),
            )
        };
        self.dedup
            .complete(claim, outcome)
            .await
            .context("cannot record the outcome")?;
        println!("     executed: {charge_id}");
        Ok(())
    }

    fn check(&mut self, ok: bool, what: &str) {
        if ok {
            println!("  ok: {what}");
        } else {
            println!("  FAILED: {what}");
            self.failures += 1;
        }
        println!("     ledger: [{}]", self.ledger.join(", "));
    }
}

fn describe(decision: &Decision) -> String {
    match decision {
        Decision::Bypass(reason) => format!("bypass ({reason:?})"),
        Decision::Execute(_) => "execute (key claimed)".into(),
        Decision::Replay(Replay::Result(raw)) => format!("replay result {raw}"),
        Decision::Replay(Replay::Error(raw)) => format!("replay error {raw}"),
        Decision::Reject(rejection) => format!(
            "reject {} ({})",
            rejection.kind().as_str(),
            rejection.message()
        ),
    }
}

fn is_rejection(decision: &Decision, kind: &str) -> bool {
    matches!(decision, Decision::Reject(r) if r.kind().as_str() == kind)
}

async fn run(path: PathBuf) -> anyhow::Result<bool> {
    println!(
        "mcp-idem demo: SEP-3182 decisions on the SQLite store {}\n",
        path.display()
    );
    let mut svc = PaymentService::open(&path, Vec::new()).await?;
    let charge = r#"{"amount": 4200, "currency": "usd"}"#;

    println!("1. First call with a fresh key executes the charge.");
    let decision = svc.call("order-1", charge).await;
    println!("  <- {}", describe(&decision));
    let Decision::Execute(claim) = &decision else {
        svc.check(false, "a fresh key must execute");
        return Ok(false);
    };
    svc.execute(claim, charge, false).await?;
    let first_outcome = svc
        .dedup
        .store()
        .get(claim.id(), mcp_idempotency::Timestamp::now())
        .await?;
    svc.check(svc.ledger.len() == 1, "charged once");

    println!("\n2. The response was lost; the client retries with the same key.");
    let decision = svc.call("order-1", charge).await;
    println!("  <- {}", describe(&decision));
    let replayed_original = matches!(
        (&decision, first_outcome.as_ref().map(|r| &r.state)),
        (Decision::Replay(Replay::Result(raw)), Some(mcp_idempotency::RecordState::Completed { outcome: Outcome::Success(stored), .. })) if raw == stored
    );
    svc.check(
        replayed_original && svc.ledger.len() == 1,
        "the original charge id is replayed, nothing charged again",
    );

    println!("\n3. The same key reused with another amount.");
    let decision = svc
        .call("order-1", r#"{"amount": 9900, "currency": "usd"}"#)
        .await;
    println!("  <- {}", describe(&decision));
    svc.check(
        is_rejection(&decision, "idempotency_key_conflict") && svc.ledger.len() == 1,
        "rejected as a conflict, nothing charged",
    );

    println!("\n4. A duplicate arrives while the first call is still running.");
    let slow = r#"{"amount": 700, "currency": "eur"}"#;
    let running = svc.call("order-2", slow).await;
    println!("  <- {} (the charge is now running)", describe(&running));
    let duplicate = svc.call("order-2", slow).await;
    println!("  <- {}", describe(&duplicate));
    let answered_at_once = is_rejection(&duplicate, "idempotency_key_in_progress");
    if let Decision::Execute(claim) = &running {
        svc.execute(claim, slow, false).await?;
    }
    svc.check(
        answered_at_once && svc.ledger.len() == 2,
        "the duplicate is rejected at once with a retry hint; one charge",
    );

    println!("\n5. Re-spelled arguments: 1 vs 1.0, keys in another order, escaped strings.");
    let decision = svc
        .call("order-3", r#"{"amount": 1, "currency": "usd"}"#)
        .await;
    if let Decision::Execute(claim) = &decision {
        svc.execute(claim, r#"{"amount": 1, "currency": "usd"}"#, false)
            .await?;
    }
    let respelled = r#"{"currency": "\u0075sd", "amount": 1.0}"#;
    let decision = svc.call("order-3", respelled).await;
    println!("  <- {}", describe(&decision));
    svc.check(
        matches!(decision, Decision::Replay(_)) && svc.ledger.len() == 3,
        "the same call: replayed, charged once",
    );

    println!(
        "\n6. A charge that failed after charging: the retry gets the error, not a second charge."
    );
    let failing = r#"{"amount": 5000, "currency": "gbp"}"#;
    let decision = svc.call("order-4", failing).await;
    if let Decision::Execute(claim) = &decision {
        svc.execute(claim, failing, true).await?;
    }
    let decision = svc.call("order-4", failing).await;
    println!("  <- {}", describe(&decision));
    svc.check(
        matches!(decision, Decision::Replay(Replay::Error(_))) && svc.ledger.len() == 4,
        "the recorded error is replayed",
    );

    println!("\n7. The process restarts: the store is reopened from the same file.");
    let ledger = std::mem::take(&mut svc.ledger);
    let failures = svc.failures;
    drop(svc);
    let mut svc = PaymentService::open(&path, ledger).await?;
    svc.failures = failures;
    let decision = svc.call("order-1", charge).await;
    println!("  <- {}", describe(&decision));
    svc.check(
        matches!(decision, Decision::Replay(Replay::Result(_))) && svc.ledger.len() == 4,
        "still deduplicated after the restart",
    );

    println!("\n8. Without a key nothing is deduplicated: a retry charges again.");
    let key = None;
    let decision = svc
        .dedup
        .decide(
            &svc.scope,
            &ToolCall {
                tool_name: "charge_payment",
                arguments: Some(charge),
                idempotency_key: key,
                mrtr_continuation: false,
            },
        )
        .await;
    println!("  <- {}", describe(&decision));
    svc.check(
        matches!(decision, Decision::Bypass(_)),
        "bypassed: the caller executes it again, unprotected",
    );

    println!();
    if svc.failures == 0 {
        println!(
            "All steps behaved as SEP-3182 requires. Charges executed: {}.",
            svc.ledger.len()
        );
        Ok(true)
    } else {
        println!("{} step(s) did not behave.", svc.failures);
        Ok(false)
    }
}
