//! `mcp-idem demo`: SEP-3182 over real stdio sessions, step by step.
//!
//! Spawns `mcp-idem wrap --store sqlite:… -- mcp-idem demo-server --ledger …`, talks MCP to it over
//! stdio, and after each step prints the ledger of executed charges, checking that it shows exactly
//! what the SEP requires. Fails (exit status 1) if any step misbehaves.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use mcp_idempotency::RejectionKind;
use serde_json::{json, Value};

use crate::ledger;
use crate::line_client::LineClient;

/// How long the "slow" charge of step 4 runs.
const SLOW_CHARGE: Duration = Duration::from_millis(1500);

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Directory for the demo's SQLite store and ledger (default: a fresh temporary directory).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

impl DemoArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        let temp;
        let dir = match self.dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                dir
            }
            None => {
                temp = tempfile::tempdir().context("cannot create a temporary directory")?;
                temp.path().to_owned()
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let failures = runtime.block_on(Demo::new(&dir)?.run())?;
        Ok(if failures == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

struct Demo {
    exe: PathBuf,
    store: PathBuf,
    ledger: PathBuf,
    failures: usize,
}

impl Demo {
    fn new(dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            exe: std::env::current_exe().context("cannot find the mcp-idem executable")?,
            store: dir.join("records.sqlite3"),
            ledger: dir.join("ledger.jsonl"),
            failures: 0,
        })
    }

    /// Starts the gateway around the demo server, and initializes a session.
    async fn connect(&self) -> anyhow::Result<LineClient> {
        self.connect_with(&[]).await
    }

    /// [`connect`](Self::connect), with more options for `wrap` (`--tools POLICY`).
    async fn connect_with(&self, options: &[&str]) -> anyhow::Result<LineClient> {
        let mut args = vec![
            "wrap".into(),
            "--store".into(),
            format!("sqlite:{}", self.store.display()),
            "--namespace".into(),
            "demo-payments".into(),
        ];
        args.extend(options.iter().map(|option| (*option).to_owned()));
        args.extend([
            "--".into(),
            self.exe.display().to_string(),
            "demo-server".into(),
            "--ledger".into(),
            self.ledger.display().to_string(),
        ]);
        // The demo's narrative is on stdout; keep the children's logs to errors.
        let mut client = LineClient::spawn(&self.exe, &args, &[("MCP_IDEM_LOG", "error")])?;
        let result = client.initialize().await?;
        let advertised = result.pointer("/capabilities/tools/idempotency").is_some();
        println!("   (gateway started; capabilities.tools.idempotency advertised: {advertised})");
        Ok(client)
    }

    async fn charge(
        &self,
        client: &mut LineClient,
        arguments: Value,
        key: Option<&str>,
    ) -> anyhow::Result<Value> {
        let id = self.send_charge(client, arguments, key).await?;
        client.response(id, Duration::from_secs(30)).await
    }

    async fn send_charge(
        &self,
        client: &mut LineClient,
        arguments: Value,
        key: Option<&str>,
    ) -> anyhow::Result<u64> {
        let mut params = json!({"name": "charge_payment", "arguments": arguments});
        if let Some(key) = key {
            params["idempotencyKey"] = json!(key);
        }
        println!("  -> tools/call {params}");
        client.send("tools/call", params).await
    }

    fn charges(&self) -> anyhow::Result<Vec<ledger::Charge>> {
        if !self.ledger.exists() {
            return Ok(Vec::new());
        }
        ledger::read(&self.ledger)
    }

    fn check(&mut self, ok: bool, what: &str) -> anyhow::Result<()> {
        if ok {
            println!("  ok: {what}");
        } else {
            println!("  FAILED: {what}");
            self.failures += 1;
        }
        let charges = self.charges()?;
        let lines: Vec<String> = charges
            .iter()
            .map(|c| format!("{} {} {}", c.charge_id, c.amount, c.currency))
            .collect();
        println!(
            "     ledger ({} charges): [{}]\n",
            charges.len(),
            lines.join(", ")
        );
        Ok(())
    }

    async fn run(mut self) -> anyhow::Result<usize> {
        println!("mcp-idem demo: a payment server behind `mcp-idem wrap`, over stdio.");
        println!(
            "records: {}\nledger:  {}\n",
            self.store.display(),
            self.ledger.display()
        );
        let mut client = self.connect().await?;

        println!("1. Without a key, a retry after a lost response charges twice.");
        let lost = self
            .send_charge(
                &mut client,
                json!({"amount": 1000, "currency": "usd"}),
                None,
            )
            .await?;
        client.response(lost, Duration::from_secs(30)).await?;
        println!("  <- (response lost; the client cannot tell whether it ran, so it retries)");
        let retry = self
            .charge(
                &mut client,
                json!({"amount": 1000, "currency": "usd"}),
                None,
            )
            .await?;
        println!("  <- {}", summary(&retry));
        let charged_twice = self.charges()?.len() == 2;
        self.check(
            charged_twice,
            "two charges for one payment: the problem SEP-3182 solves",
        )?;

        println!("2. With a key, the retry gets the original charge and nothing is charged again.");
        let first = self
            .charge(
                &mut client,
                json!({"amount": 4200, "currency": "usd"}),
                Some("order-1"),
            )
            .await?;
        println!("  <- {}", summary(&first));
        println!("  <- (response lost; retrying with the same key)");
        let retry = self
            .charge(
                &mut client,
                json!({"amount": 4200, "currency": "usd"}),
                Some("order-1"),
            )
            .await?;
        println!("  <- {}", summary(&retry));
        let original = charge_id(&first);
        let ok = original.is_some() && original == charge_id(&retry) && self.charges()?.len() == 3;
        self.check(ok, "one charge; the retry replays the original charge id")?;

        println!("3. The same key with another amount is a conflict.");
        let conflict = self
            .charge(
                &mut client,
                json!({"amount": 9900, "currency": "usd"}),
                Some("order-1"),
            )
            .await?;
        println!("  <- {}", summary(&conflict));
        let ok =
            rejection(&conflict) == Some(RejectionKind::KeyConflict) && self.charges()?.len() == 3;
        self.check(
            ok,
            "rejected with idempotency_key_conflict; nothing charged",
        )?;

        println!("4. A duplicate sent while the first call is still running is rejected at once.");
        let slow_args =
            json!({"amount": 700, "currency": "eur", "delay_ms": SLOW_CHARGE.as_millis() as u64});
        let slow = self
            .send_charge(&mut client, slow_args.clone(), Some("order-2"))
            .await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        let duplicate = self.charge(&mut client, slow_args, Some("order-2")).await?;
        let waited = sent.elapsed();
        println!(
            "  <- {} (answered {} ms after it was sent)",
            summary(&duplicate),
            waited.as_millis()
        );
        let slow = client.response(slow, Duration::from_secs(30)).await?;
        println!("  <- {}", summary(&slow));
        let ok = rejection(&duplicate) == Some(RejectionKind::KeyInProgress)
            && waited < SLOW_CHARGE / 2
            && charge_id(&slow).is_some()
            && self.charges()?.len() == 4;
        self.check(
            ok,
            "idempotency_key_in_progress without waiting for the first call; one charge",
        )?;

        println!("5. `1` vs `1.0`, reordered members and escaped strings are the same call.");
        let first = self
            .charge(
                &mut client,
                json!({"amount": 1, "currency": "usd"}),
                Some("order-3"),
            )
            .await?;
        println!("  <- {}", summary(&first));
        let respelled = r#"{"name": "charge_payment", "idempotencyKey": "order-3", "arguments": {"currency": "\u0075sd", "amount": 1.0}}"#;
        println!("  -> tools/call {respelled}");
        let retry = client.send_raw("tools/call", respelled).await?;
        let retry = client.response(retry, Duration::from_secs(30)).await?;
        println!("  <- {}", summary(&retry));
        let ok = charge_id(&first).is_some()
            && charge_id(&first) == charge_id(&retry)
            && self.charges()?.len() == 5;
        self.check(ok, "replayed as the same call; one charge")?;

        println!("6. A charge that failed after charging replays its error, not a second charge.");
        let failing = json!({"amount": 5000, "currency": "gbp", "fail_after_charge": true});
        let first = self
            .charge(&mut client, failing.clone(), Some("order-4"))
            .await?;
        println!("  <- {}", summary(&first));
        let retry = self.charge(&mut client, failing, Some("order-4")).await?;
        println!("  <- {}", summary(&retry));
        let ok = first.get("error").is_some()
            && first.get("error") == retry.get("error")
            && self.charges()?.len() == 6;
        self.check(ok, "the recorded error is replayed; one charge")?;

        println!(
            "7. The gateway is killed (SIGKILL) and restarted; the retry is still deduplicated."
        );
        client.kill().await?;
        println!("   (gateway killed)");
        let mut client = self.connect().await?;
        let retry = self
            .charge(
                &mut client,
                json!({"amount": 4200, "currency": "usd"}),
                Some("order-1"),
            )
            .await?;
        println!("  <- {}", summary(&retry));
        let ok = original.is_some() && charge_id(&retry) == original && self.charges()?.len() == 6;
        self.check(
            ok,
            "the record survived in SQLite: the original charge id, nothing charged",
        )?;

        client.close().await?;

        self.keyless_with_policy().await?;
        if self.failures == 0 {
            println!("All 8 steps behaved as SEP-3182 requires.");
        } else {
            println!("{} step(s) did not behave.", self.failures);
        }
        Ok(self.failures)
    }
}

impl Demo {
    /// Step 8: step 1's key-less retry, with a `key-from` policy on `charge_payment` (what
    /// `mcp-idem tools` suggests for it, given an `order_id`): the retry is replayed.
    async fn keyless_with_policy(&mut self) -> anyhow::Result<()> {
        let policy = r#"{"charge_payment": {"key-from": ["/order_id"], "required": true}}"#;
        println!("8. Without a key again, once a key-from policy is on: the retry is replayed.");
        println!("   (gateway restarted with --tools '{policy}')");
        let mut client = self.connect_with(&["--tools", policy]).await?;
        let arguments = json!({"amount": 1000, "currency": "usd", "order_id": "order-8"});
        let first = self.charge(&mut client, arguments.clone(), None).await?;
        println!("  <- {}", summary(&first));
        println!("  <- (response lost; the client retries, still without a key)");
        let retry = self.charge(&mut client, arguments, None).await?;
        println!("  <- {}", summary(&retry));
        let original = charge_id(&first);
        let ok = original.is_some() && charge_id(&retry) == original && self.charges()?.len() == 7;
        self.check(
            ok,
            "one charge: the order_id names the payment, so the retry replays it",
        )?;
        client.close().await?;
        Ok(())
    }
}

fn charge_id(response: &Value) -> Option<&str> {
    response
        .pointer("/result/structuredContent/chargeId")?
        .as_str()
}

fn rejection(response: &Value) -> Option<RejectionKind> {
    response.pointer("/error/data/type")?.as_str()?.parse().ok()
}

fn summary(response: &Value) -> String {
    if let Some(id) = charge_id(response) {
        return format!("charged: {id}");
    }
    match response.get("error") {
        Some(error) => format!(
            "error {}: {}",
            error
                .pointer("/data/type")
                .and_then(Value::as_str)
                .unwrap_or("(no data.type)"),
            error.get("message").and_then(Value::as_str).unwrap_or("")
        ),
        None => response.to_string(),
    }
}
