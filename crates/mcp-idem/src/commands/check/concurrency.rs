//! A duplicate sent while the original still runs. The SEP: the server MUST NOT begin a second
//! execution (`in_progress.single_execution`), MUST NOT block the duplicate waiting for the
//! original to finish (`in_progress.not_blocked`), and SHOULD reject it immediately with
//! `idempotency_key_in_progress` naming the key (`in_progress.rejected`).

use std::time::{Duration, Instant};

use mcp_idempotency::RejectionKind;

use super::checks::{
    error_summary, exchange, fresh_key, note, same, Checker, Same, DUPLICATE_AFTER,
};
use super::report::{Evidence, Level, Outcome, Status};
use super::session::{Key, Reply};

const SINGLE: &str = "in_progress.single_execution";
const NOT_BLOCKED: &str = "in_progress.not_blocked";
const REJECTED: &str = "in_progress.rejected";

impl Checker<'_> {
    pub(super) async fn in_progress(&mut self) -> anyhow::Result<Vec<Outcome>> {
        let Some(slow) = self.plan.slow_args.as_ref().map(ToString::to_string) else {
            let detail = "no --slow-args: no call runs long enough to send a duplicate meanwhile";
            return Ok(all(Status::Skip, detail, Vec::new()));
        };
        let key_text = fresh_key();
        let key = Key::Text(key_text.clone());
        let params = self.session.tool_params(&self.plan.tool, &slow, &key, "");
        let origin = Instant::now();
        let pending = self
            .session
            .start("tools/call", Some(&self.plan.tool), params)
            .await?;
        tokio::time::sleep(DUPLICATE_AFTER).await;
        let duplicate = self.witness(&slow, &key).await;
        let timeout = self.session.timeout;
        let original = self.session.finish(pending, timeout).await?;
        self.note_marker(&original);
        let mut evidence = exchange("original", &original);
        let duplicate = match duplicate {
            Ok(duplicate) => duplicate,
            Err(err) => {
                evidence.push(note("duplicate", format!("{err:#}")));
                let detail = format!(
                    "the duplicate got no answer within {timeout:?} (the original answered \
                     after {} ms)",
                    original.received_ms(origin)
                );
                return Ok(all(Status::Fail, &detail, evidence));
            }
        };
        evidence.extend(exchange("duplicate", &duplicate));
        let timing = Timing::new(origin, &original, &duplicate);
        evidence.insert(0, note("timing", timing.text.clone()));
        if original.received <= duplicate.sent {
            let detail = format!(
                "the slow call finished before the duplicate was sent ({}); make --slow-args \
                 run longer (1 s or more)",
                timing.text
            );
            return Ok(all(Status::Skip, &detail, evidence));
        }
        if original.error_type() == Some(RejectionKind::KeyInProgress.as_str()) {
            let detail = format!(
                "the duplicate reached the server first and the original was refused as in \
                 progress ({}); run again, or make --slow-args run longer",
                timing.text
            );
            return Ok(all(Status::Skip, &detail, evidence));
        }
        let retry = self.witness_settled(&slow, &key).await?;
        evidence.extend(exchange("retry after the original finished", &retry));
        let verdicts = [
            (
                SINGLE,
                Level::Must,
                single_execution(&original, &duplicate, &retry),
            ),
            (NOT_BLOCKED, Level::Must, not_blocked(&duplicate, &timing)),
            (
                REJECTED,
                Level::Should,
                rejected_at_once(&duplicate, &key_text, &timing),
            ),
        ];
        Ok(verdicts
            .into_iter()
            .map(|(name, level, (status, detail))| {
                Outcome::new(name, level, status, detail).with(evidence.clone())
            })
            .collect())
    }
}

/// When the duplicate was answered, relative to the original.
struct Timing {
    /// How long the duplicate waited for its answer.
    waited: Duration,
    /// How long the original still ran after the duplicate was sent.
    remaining: Duration,
    /// Whether the duplicate's answer came no earlier than the original's.
    after_original: bool,
    text: String,
}

impl Timing {
    fn new(origin: Instant, original: &Reply, duplicate: &Reply) -> Self {
        let waited = duplicate.received.duration_since(duplicate.sent);
        let text = format!(
            "original sent at +0 ms, answered at +{} ms; duplicate sent at +{} ms, answered at \
             +{} ms (after {:.1} ms)",
            original.received_ms(origin),
            duplicate.sent.duration_since(origin).as_millis(),
            duplicate.received_ms(origin),
            waited.as_secs_f64() * 1000.0
        );
        Self {
            waited,
            remaining: original.received.saturating_duration_since(duplicate.sent),
            after_original: duplicate.received >= original.received,
            text,
        }
    }

    /// Answered before the original finished, leaving at least a tenth of its remaining time.
    fn before_original(&self) -> bool {
        !self.after_original && self.waited < self.remaining.mul_f64(0.9)
    }

    /// Answered within the first half of the time the original still had to run.
    fn at_once(&self) -> bool {
        !self.after_original && self.waited * 2 <= self.remaining
    }
}

/// The duplicate did not run the tool again, and the original's outcome is what a retry gets.
fn single_execution(original: &Reply, duplicate: &Reply, retry: &Reply) -> (Status, String) {
    if duplicate.is_success() && same(original, duplicate) == Same::Different {
        return (
            Status::Fail,
            "the duplicate got a result of its own: the tool ran a second time".to_owned(),
        );
    }
    if same(original, retry) == Same::Different {
        return (
            Status::Fail,
            "after the original finished, a retry did not get its recorded outcome".to_owned(),
        );
    }
    let duplicate_got = if duplicate.message.get("error").is_some() {
        format!("was refused with {}", error_summary(duplicate))
    } else {
        "got the original's outcome".to_owned()
    };
    (
        Status::Pass,
        format!("one execution: the duplicate {duplicate_got}; a later retry replays the original"),
    )
}

/// The duplicate's answer did not wait for the original to finish.
fn not_blocked(duplicate: &Reply, timing: &Timing) -> (Status, String) {
    if timing.before_original() {
        return (
            Status::Pass,
            format!(
                "the duplicate was answered before the original finished: {}",
                timing.text
            ),
        );
    }
    (
        Status::Fail,
        format!(
            "the duplicate ({}) was not answered before the original finished: {}",
            error_summary(duplicate),
            timing.text
        ),
    )
}

/// The duplicate was refused with `idempotency_key_in_progress` naming the key, within the first
/// half of the time the original still had to run.
fn rejected_at_once(duplicate: &Reply, key: &str, timing: &Timing) -> (Status, String) {
    let text = &timing.text;
    if duplicate.error_type() != Some(RejectionKind::KeyInProgress.as_str()) {
        return (
            Status::Fail,
            format!(
                "the duplicate got {}, not idempotency_key_in_progress: {text}",
                error_summary(duplicate)
            ),
        );
    }
    if duplicate.error_key() != Some(key) {
        return (
            Status::Fail,
            format!(
                "idempotency_key_in_progress, but data.idempotencyKey is {:?}, not the key sent",
                duplicate.error_key()
            ),
        );
    }
    if !timing.at_once() {
        return (
            Status::Fail,
            format!("idempotency_key_in_progress, but not at once: {text}"),
        );
    }
    let code = duplicate
        .error_code()
        .map_or("none".to_owned(), |c| c.to_string());
    (
        Status::Pass,
        format!("refused at once with idempotency_key_in_progress (code {code}): {text}"),
    )
}

fn all(status: Status, detail: &str, evidence: Vec<Evidence>) -> Vec<Outcome> {
    [
        (SINGLE, Level::Must),
        (NOT_BLOCKED, Level::Must),
        (REJECTED, Level::Should),
    ]
    .into_iter()
    .map(|(name, level)| {
        Outcome::new(name, level, status, detail.to_owned()).with(evidence.clone())
    })
    .collect()
}
