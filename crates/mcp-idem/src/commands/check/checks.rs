//! The check runner: what the user told us about the server ([`Plan`]), the order the checks run
//! in, and the helpers they share. The checks themselves live in `replay.rs`, `rejections.rs`,
//! `meta.rs` and `concurrency.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use mcp_idempotency::RejectionKind;
use serde_json::Value;

use super::report::{Evidence, Level, Outcome, Status};
use super::session::{Key, Reply, Session};
use crate::progress::Progress;
use crate::shown::abridge;

/// The tools and arguments the checks use.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// The witness: a tool whose result changes on every real execution.
    pub(crate) tool: String,
    pub(crate) args: Value,
    /// Witness arguments that run long enough to send a duplicate meanwhile.
    pub(crate) slow_args: Option<Value>,
    /// Witness arguments whose execution has an error outcome.
    pub(crate) error_args: Option<Value>,
    /// A read-only tool whose result shows whether anything ran (a balance, a count).
    pub(crate) observe: Option<(String, Value)>,
    /// A tool that answers `input_required` (MRTR), its arguments, and the `inputResponses` of
    /// the continuation.
    pub(crate) mrtr: Option<(String, Value, Value)>,
}

/// How two outcomes compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Same {
    /// Byte for byte.
    Bytes,
    /// The same JSON value, serialized differently.
    Value,
    /// The same JSON value once the replay marker `_meta["mcp-idem/replayed"]` is set aside: a
    /// replay that a key policy of the server decided.
    Marked,
    Different,
}

/// Runs the checks over one session, collecting outcomes.
pub(crate) struct Checker<'a> {
    pub(super) session: &'a mut Session,
    pub(super) plan: &'a Plan,
    /// The witness arguments as sent (serde_json's serialization).
    pub(super) args: String,
    /// Whether two executions of the witness give different results (known after `no_key`).
    pub(super) witness_varies: Option<bool>,
    /// The key sources named by replay markers (`_meta["mcp-idem/replayed"]`) the witness's
    /// answers carried: the witness tool has a key policy on this server.
    pub(crate) policy_marks: BTreeSet<String>,
    /// Why the server cannot be reached any more, once it cannot.
    gone: Option<String>,
    pub(crate) outcomes: Vec<Outcome>,
    progress: Progress,
}

/// How many checks [`Checker::run`] settles, for the progress line.
const CHECKS: usize = 14;

/// How long the in-progress check waits between the original and the duplicate.
pub(super) const DUPLICATE_AFTER: Duration = Duration::from_millis(250);

impl<'a> Checker<'a> {
    pub(crate) fn new(session: &'a mut Session, plan: &'a Plan) -> Self {
        Self {
            session,
            args: plan.args.to_string(),
            plan,
            witness_varies: None,
            policy_marks: BTreeSet::new(),
            gone: None,
            outcomes: Vec::new(),
            progress: Progress::new("mcp-idem check", CHECKS),
        }
    }

    /// Runs every check, in an order where each leaves nothing running for the next.
    pub(crate) async fn run(&mut self) {
        let r = self.no_key().await;
        self.settle(&[("no_key.executes", Level::Must)], r).await;
        let r = self.replay_result().await;
        self.settle(&[("replay.result", Level::Must)], r).await;
        for (name, what) in [
            ("equivalence.key_order", "reordered members and whitespace:"),
            ("equivalence.numbers", "re-spelled numbers:"),
            ("equivalence.strings", "escaped strings:"),
        ] {
            let r = self.equivalence(name, what).await;
            self.settle(&[(name, Level::Must)], r).await;
        }
        let r = self.conflict().await;
        let names = [
            ("conflict.rejected", Level::Must),
            ("conflict.error_data", Level::Should),
        ];
        self.settle(&names, r).await;
        let r = self.meta_replay().await;
        self.settle(&[("meta.replay", Level::Should)], r).await;
        let r = self.meta_conflict().await;
        self.settle(&[("meta.conflict", Level::Should)], r).await;
        let r = self.in_progress().await;
        let names = [
            ("in_progress.single_execution", Level::Must),
            ("in_progress.not_blocked", Level::Must),
            ("in_progress.rejected", Level::Should),
        ];
        self.settle(&names, r).await;
        let r = self.replay_error().await;
        self.settle(&[("replay.error", Level::Must)], r).await;
        for name in ["key.not_a_string", "key.empty", "key.too_long"] {
            let r = self.invalid_key(name).await;
            self.settle(&[(name, Level::Should)], r).await;
        }
        let r = self.mrtr().await;
        self.settle(&[("mrtr.continuation", Level::Should)], r)
            .await;
    }

    /// Records a check's outcomes; a check that broke off fails every outcome it owns, and if the
    /// server no longer answers, every later check is skipped.
    async fn settle(
        &mut self,
        names: &[(&'static str, Level)],
        result: anyhow::Result<Vec<Outcome>>,
    ) {
        self.progress
            .step(names.first().map_or("", |&(name, _)| name));
        if let Some(gone) = &self.gone {
            for &(name, level) in names {
                let detail = format!("not run: the server stopped answering earlier ({gone})");
                self.outcomes
                    .push(Outcome::new(name, level, Status::Skip, detail));
            }
            return;
        }
        match result {
            Ok(outcomes) => self.outcomes.extend(outcomes),
            Err(err) => {
                let error = abridge(&format!("{err:#}"), 300);
                for &(name, level) in names {
                    let detail = format!("the check broke off: {error}");
                    self.outcomes
                        .push(Outcome::new(name, level, Status::Fail, detail));
                }
                if !self.session.ping().await {
                    self.gone = Some(error);
                }
            }
        }
    }

    /// Calls the witness tool with `arguments` (JSON text, sent as is).
    pub(super) async fn witness(&mut self, arguments: &str, key: &Key) -> anyhow::Result<Reply> {
        let reply = self.session.call(&self.plan.tool, arguments, key).await?;
        self.note_marker(&reply);
        Ok(reply)
    }

    /// Remembers the key source of a replay marker on a witness answer.
    pub(super) fn note_marker(&mut self, reply: &Reply) {
        if let Some(source) = reply.replay_marker() {
            self.policy_marks.insert(source.to_owned());
        }
    }

    /// What the report says when the witness tool has a key policy on the server (its answers
    /// carried replay markers); `None` when none was seen.
    pub(crate) fn policy_note(&self) -> Option<String> {
        if self.policy_marks.is_empty() {
            return None;
        }
        let sources: Vec<String> = self
            .policy_marks
            .iter()
            .map(|source| format!("{source:?}"))
            .collect();
        let mut note = format!(
            "the witness tool has a key policy on this server: replays came back marked \
             _meta[\"{}\"] = {}. Calls without a key are deduplicated on purpose (so \
             no_key.executes is skipped), and marked replays are compared without the marker.",
            mcp_idempotency::REPLAYED_META,
            sources.join(" / ")
        );
        if self.policy_marks.contains("key-from") {
            note.push_str(
                " With key-from, the identifier in the arguments decides calls without a key and \
                 retries with a fresh key; a call with a key of its own keeps the SEP's rules \
                 for it (read first, recorded beside the identifier), so a replay by the key \
                 cannot be told from one by the identifier and the replay and key.* checks are \
                 skipped. For every SEP rule, check a tool without a policy.",
            );
        }
        Some(note)
    }

    /// The observation tool's outcome (called without a key), if there is one.
    pub(super) async fn observe(&mut self) -> anyhow::Result<Option<String>> {
        let Some((tool, args)) = &self.plan.observe else {
            return Ok(None);
        };
        let reply = self
            .session
            .call(tool, &args.to_string(), &Key::None)
            .await?;
        Ok(reply.outcome_raw().map(str::to_owned))
    }

    /// Calls the witness again while the answer is `idempotency_key_in_progress`.
    pub(super) async fn witness_settled(
        &mut self,
        arguments: &str,
        key: &Key,
    ) -> anyhow::Result<Reply> {
        let deadline = tokio::time::Instant::now() + self.session.timeout;
        loop {
            let reply = self.witness(arguments, key).await?;
            if reply.error_type() != Some(RejectionKind::KeyInProgress.as_str())
                || tokio::time::Instant::now() >= deadline
            {
                return Ok(reply);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A key no earlier call used.
pub(super) fn fresh_key() -> String {
    format!(
        "mcp-idem-check-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// How the outcomes (`result`, else `error`) of two replies compare.
pub(super) fn same(a: &Reply, b: &Reply) -> Same {
    match (a.outcome_raw(), b.outcome_raw()) {
        (Some(x), Some(y)) if x == y => Same::Bytes,
        (Some(x), Some(y)) => {
            let parse = |t: &str| serde_json::from_str::<Value>(t).ok();
            let same_kind = a.result_raw.is_some() == b.result_raw.is_some();
            let (Some(x), Some(y)) = (parse(x), parse(y)) else {
                return Same::Different;
            };
            if !same_kind {
                Same::Different
            } else if x == y {
                Same::Value
            } else if without_marker(x) == without_marker(y) {
                Same::Marked
            } else {
                Same::Different
            }
        }
        _ => Same::Different,
    }
}

/// A result without the replay marker `_meta["mcp-idem/replayed"]` (and without `_meta` if that
/// was all it held).
fn without_marker(mut outcome: Value) -> Value {
    if let Some(meta) = outcome.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove(mcp_idempotency::REPLAYED_META);
        if meta.is_empty() {
            outcome.as_object_mut().map(|result| result.remove("_meta"));
        }
    }
    outcome
}

/// "byte for byte", "the same value, re-serialized", or marked by a key policy.
pub(super) fn how_same(same: Same) -> &'static str {
    match same {
        Same::Bytes => "byte for byte",
        Same::Marked => {
            "the same result plus the marker _meta[\"mcp-idem/replayed\"] (a key policy of the \
             server decided the replay)"
        }
        _ => "the same value, re-serialized (the bytes differ)",
    }
}

/// The request and response of `reply`, abridged, labelled with `what`.
pub(super) fn exchange(what: &str, reply: &Reply) -> Vec<Evidence> {
    vec![
        Evidence {
            label: format!("{what} request"),
            text: abridge(&reply.request_for_display(), 400),
        },
        Evidence {
            label: format!("{what} response"),
            text: abridge(&reply.text, 400),
        },
    ]
}

/// A labelled note.
pub(super) fn note(label: &str, text: impl Into<String>) -> Evidence {
    Evidence {
        label: label.to_owned(),
        text: text.into(),
    }
}

/// `error.code` and `error.message` of a reply, or a note that it is no error.
pub(super) fn error_summary(reply: &Reply) -> String {
    match reply.message.get("error") {
        Some(error) => format!(
            "error {} {:?}{}",
            error.get("code").unwrap_or(&Value::Null),
            abridge(
                error.get("message").and_then(Value::as_str).unwrap_or(""),
                80
            ),
            reply
                .error_type()
                .map(|t| format!(", data.type {t}"))
                .unwrap_or_default()
        ),
        None if reply.is_success() => "a successful result".to_owned(),
        None => "a tool result with isError: true".to_owned(),
    }
}

/// One outcome in a list.
pub(super) fn one(
    name: &'static str,
    level: Level,
    status: Status,
    detail: String,
    evidence: Vec<Evidence>,
) -> Vec<Outcome> {
    vec![Outcome::new(name, level, status, detail).with(evidence)]
}
