//! What the chaos runs (`chaos` over Streamable HTTP, `chaos_stdio` over stdio)
//! share: the run's size and seed from the environment, how a logical call ended, and the
//! comparison of the demo server's ledger with what the clients saw.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::common::ledger_lines;

/// `CHAOS_CALLS` (default `default_calls`) and `CHAOS_SEED` (default: from the clock).
pub(crate) fn size_and_seed(default_calls: u64) -> (u64, u64) {
    let calls = std::env::var("CHAOS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_calls);
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64
        });
    (calls, seed)
}

/// Milliseconds since the Unix epoch (the ledger's `unixMs` clock).
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The `--after-crash` policy of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterCrash {
    Reject,
    Reexecute,
}

impl AfterCrash {
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Reexecute => "reexecute",
        }
    }
}

/// How a logical call ended, from its client's point of view.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Charged(String),
    ToolError(String),
    Unknown,
    GaveUp(String),
}

/// What one answer to an attempt means for its logical call.
pub(crate) enum AnswerMeans {
    /// The call has its outcome.
    Final(Outcome),
    /// Retry with the same key after `pause`; `why` is kept for a call that gives up.
    Retry {
        pause: Option<Duration>,
        why: String,
    },
}

/// Classifies a JSON-RPC answer (`raw` is its text, kept for a tool error): a charge id or another
/// tool result is final, and so is `idempotency_outcome_unknown`; `in progress` and `store
/// unavailable` are retried (in progress after its `retryAfterMs`, 10 to 500 ms), and so is
/// anything unexpected.
pub(crate) fn classify(answer: &serde_json::Value, raw: &str) -> AnswerMeans {
    if let Some(id) = answer["result"]["structuredContent"]["chargeId"].as_str() {
        return AnswerMeans::Final(if answer["result"]["isError"] == true {
            Outcome::ToolError(raw.to_owned())
        } else {
            Outcome::Charged(id.to_owned())
        });
    }
    let retry = |pause, why: &str| AnswerMeans::Retry {
        pause,
        why: why.to_owned(),
    };
    match answer["error"]["data"]["type"].as_str() {
        Some("idempotency_outcome_unknown") => AnswerMeans::Final(Outcome::Unknown),
        Some("idempotency_key_in_progress") => {
            let wait = answer["error"]["data"]["retryAfterMs"]
                .as_u64()
                .unwrap_or(100);
            retry(
                Some(Duration::from_millis(wait.clamp(10, 500))),
                "in progress",
            )
        }
        Some("idempotency_store_unavailable") => retry(None, "store unavailable"),
        // A tool result without a charge id: definitive, but not a charge.
        _ if answer.get("result").is_some() => {
            AnswerMeans::Final(Outcome::ToolError(raw.to_owned()))
        }
        _ => retry(None, &format!("unexpected: {raw}")),
    }
}

pub(crate) struct CallResult {
    /// Names the logical call: unique per call, and what the ledger line carries.
    pub(crate) amount: u64,
    pub(crate) outcome: Outcome,
    pub(crate) attempts: u32,
    /// One line per attempt (when it ended, where it went, what came back), printed when the
    /// verdict finds the call executed too often.
    pub(crate) history: Vec<String>,
}

/// One execution: a ledger line.
#[derive(Debug, Clone)]
pub(crate) struct Execution {
    pub(crate) charge_id: String,
    /// The demo server process that ran it.
    pub(crate) pid: u32,
    pub(crate) unix_ms: u64,
}

/// The ledger's executions per logical call (by amount); panics on a line of no call in `1..=calls`.
pub(crate) fn executions(ledger: &Path, calls: u64) -> HashMap<u64, Vec<Execution>> {
    let mut executions: HashMap<u64, Vec<Execution>> = HashMap::new();
    for line in ledger_lines(ledger) {
        let amount = line["amount"]
            .as_u64()
            .unwrap_or_else(|| panic!("ledger line without an integer amount: {line}"));
        assert!(
            (1..=calls).contains(&amount),
            "ledger line of no logical call: {line}"
        );
        executions.entry(amount).or_default().push(Execution {
            charge_id: line["chargeId"].as_str().unwrap_or_default().to_owned(),
            pid: line["pid"]
                .as_u64()
                .and_then(|pid| u32::try_from(pid).ok())
                .unwrap_or_default(),
            unix_ms: line["unixMs"].as_u64().unwrap_or_default(),
        });
    }
    executions
}

/// The comparison of the ledger with the clients' view.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) charged: u64,
    pub(crate) tool_errors: u64,
    pub(crate) unknown: u64,
    /// Outcome-unknown calls that the ledger shows executed.
    pub(crate) unknown_executed: u64,
    pub(crate) gave_up: u64,
    pub(crate) attempts: u64,
    /// Ledger lines.
    pub(crate) executions: u64,
    /// Logical calls with more than one ledger line.
    pub(crate) duplicated_calls: u64,
    /// Ledger lines beyond the first of each call.
    pub(crate) extra_executions: u64,
    /// Logical calls that had an attempt in flight on a process when it was killed (counted once
    /// per kill: a call in flight at two kills counts twice).
    pub(crate) in_flight_at_kills: u64,
    /// Violations of the run's guarantees; empty when it passed.
    pub(crate) problems: Vec<String>,
}

/// Compares the ledger with the clients' results.
///
/// Always: every ledger line belongs to a logical call; every call its client saw charged has a
/// ledger line with the charge id it got. With `reject`: no call has two lines, and a charged call
/// has exactly one. With `reexecute`: a call may have `1 + k` lines only if it was in flight on a
/// process at `k` kills of that process (`in_flight_at_kills[amount] == k`), so duplicates come
/// only from calls whose owner died between execution and recording, and their total is bounded
/// by the calls in flight at kills.
pub(crate) fn verify(
    results: &[CallResult],
    executions: &HashMap<u64, Vec<Execution>>,
    after_crash: AfterCrash,
    in_flight_at_kills: &HashMap<u64, u64>,
) -> Verdict {
    let mut verdict = Verdict {
        executions: executions.values().map(|e| e.len() as u64).sum(),
        in_flight_at_kills: in_flight_at_kills.values().sum(),
        ..Verdict::default()
    };
    for result in results {
        verdict.attempts += u64::from(result.attempts);
        let lines = executions
            .get(&result.amount)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ids: Vec<&str> = lines.iter().map(|e| e.charge_id.as_str()).collect();
        if lines.len() > 1 {
            verdict.duplicated_calls += 1;
            verdict.extra_executions += lines.len() as u64 - 1;
            let kills = in_flight_at_kills.get(&result.amount).copied().unwrap_or(0);
            let allowed = match after_crash {
                AfterCrash::Reject => 0,
                AfterCrash::Reexecute => kills,
            };
            if lines.len() as u64 - 1 > allowed {
                let runs: Vec<String> = lines
                    .iter()
                    .map(|e| format!("{} by pid {} at {}", e.charge_id, e.pid, e.unix_ms))
                    .collect();
                verdict.problems.push(format!(
                    "call {} executed {} times (in flight at {kills} kills of its owner, \
                     --after-crash {}): {ids:?} ({:?})\n  executions: {runs:?}\n  attempts:\n    {}",
                    result.amount,
                    lines.len(),
                    after_crash.arg(),
                    result.outcome,
                    result.history.join("\n    ")
                ));
            }
        }
        match &result.outcome {
            Outcome::Charged(id) => {
                verdict.charged += 1;
                let fine = match after_crash {
                    AfterCrash::Reject => ids == [id.as_str()],
                    AfterCrash::Reexecute => ids.contains(&id.as_str()),
                };
                if !fine {
                    verdict.problems.push(format!(
                        "call {} got {id} but the ledger has {ids:?}",
                        result.amount
                    ));
                }
            }
            Outcome::ToolError(body) => {
                verdict.tool_errors += 1;
                eprintln!(
                    "chaos: call {} ended in a tool error: {body}",
                    result.amount
                );
            }
            Outcome::Unknown => {
                verdict.unknown += 1;
                if !lines.is_empty() {
                    verdict.unknown_executed += 1;
                }
            }
            Outcome::GaveUp(last) => {
                verdict.gave_up += 1;
                eprintln!(
                    "chaos: call {} gave up after {} attempts; last: {last}",
                    result.amount, result.attempts
                );
            }
        }
    }
    verdict
}

impl Verdict {
    /// The report's lines about the calls and their executions.
    pub(crate) fn summary(&self, calls: u64) -> String {
        format!(
            "logical calls {calls}: {} charged, {} tool errors, {} outcome unknown \
             ({} of them executed), {} gave up\n  \
             attempts {}\n  \
             executions (ledger lines) {}, duplicated calls {} ({} extra executions); \
             calls in flight at kills of their owner {}",
            self.charged,
            self.tool_errors,
            self.unknown,
            self.unknown_executed,
            self.gave_up,
            self.attempts,
            self.executions,
            self.duplicated_calls,
            self.extra_executions,
            self.in_flight_at_kills,
        )
    }

    /// Panics with the problems, if any, naming the seed that reproduces the run's choices.
    pub(crate) fn assert_ok(&self, run: &str, seed: u64) {
        assert!(
            self.problems.is_empty(),
            "chaos ({run}, CHAOS_SEED={seed}):\n{}",
            self.problems.join("\n")
        );
    }
}
