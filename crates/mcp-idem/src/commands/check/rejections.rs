//! Checks that some calls are refused without running, and one that must not be deduplicated:
//! `conflict.*`, `key.*` and `mrtr.continuation`.

use mcp_idempotency::jsonrpc::INVALID_PARAMS;
use mcp_idempotency::RejectionKind;
use serde_json::Value;

use super::checks::{error_summary, exchange, fresh_key, note, one, same, Checker, Same};
use super::report::{Evidence, Level, Outcome, Status};
use super::respell;
use super::session::{Key, Reply};

impl Checker<'_> {
    /// The same key with different arguments is rejected, nothing runs, and the record stays.
    pub(super) async fn conflict(&mut self) -> anyhow::Result<Vec<Outcome>> {
        let key_text = fresh_key();
        let key = Key::Text(key_text.clone());
        let rejected = ("conflict.rejected", Level::Must);
        self.conflicting(rejected, Some("conflict.error_data"), &key_text, key)
            .await
    }

    /// The conflict checks with `key`: `rejected` (its name and level), then, if named, whether
    /// the error data (a SHOULD) names `key_text`.
    pub(super) async fn conflicting(
        &mut self,
        (rejected, level): (&'static str, Level),
        data: Option<&'static str>,
        key_text: &str,
        key: Key,
    ) -> anyhow::Result<Vec<Outcome>> {
        let Some((other, what)) = respell::different(&self.plan.args) else {
            let detail = "cannot derive different arguments from the witness arguments".to_owned();
            return Ok(std::iter::once((rejected, level))
                .chain(data.map(|data| (data, Level::Should)))
                .map(|(n, l)| Outcome::new(n, l, Status::Skip, detail.clone()))
                .collect());
        };
        let args = self.args.clone();
        let first = self.witness(&args, &key).await?;
        let mut evidence = exchange("original", &first);
        if !first.is_success() {
            let detail = "the original keyed call did not succeed".to_owned();
            let mut outcomes = one(rejected, level, Status::Fail, detail, evidence);
            outcomes.extend(data.map(|data| {
                Outcome::new(
                    data,
                    Level::Should,
                    Status::Skip,
                    "no conflict to inspect".into(),
                )
            }));
            return Ok(outcomes);
        }
        let before = self.observe().await?;
        let conflict = self.witness(&other.to_string(), &key).await?;
        let after = self.observe().await?;
        let again = self.witness(&args, &key).await?;
        evidence.extend(exchange(&format!("conflicting ({what})"), &conflict));
        evidence.extend(exchange("original arguments again", &again));
        let (status, detail) = if same(&first, &conflict) != Same::Different {
            (
                Status::Fail,
                "the conflicting call got the original's recorded result".to_owned(),
            )
        } else if conflict.message.get("error").is_none() {
            (
                Status::Fail,
                "the conflicting call got a result of its own: it ran with the new arguments"
                    .to_owned(),
            )
        } else if before != after {
            evidence.push(note(
                "observation before",
                before.clone().unwrap_or_default(),
            ));
            evidence.push(note("observation after", after.unwrap_or_default()));
            (
                Status::Fail,
                "the conflicting call was rejected, but the observation tool shows that something ran"
                    .to_owned(),
            )
        } else if same(&first, &again) == Same::Different {
            (
                Status::Fail,
                "after the conflict, the original arguments no longer replay the original result"
                    .to_owned(),
            )
        } else {
            let ran = if before.is_some() {
                "nothing ran (observation unchanged)"
            } else {
                "not verified that nothing ran (no --observe-tool)"
            };
            (
                Status::Pass,
                format!(
                    "rejected with {}; {ran}; the original still replays",
                    error_summary(&conflict)
                ),
            )
        };
        let mut outcomes = one(rejected, level, status, detail, evidence);
        outcomes.extend(data.map(|data| {
            error_data(
                data,
                &conflict,
                RejectionKind::KeyConflict.as_str(),
                key_text,
            )
        }));
        Ok(outcomes)
    }

    /// A key that is not a non-empty string of reasonable length is refused with -32602 and the
    /// tool does not run. A long key may instead be honoured in full: the SEP sets no limit.
    pub(super) async fn invalid_key(&mut self, name: &'static str) -> anyhow::Result<Vec<Outcome>> {
        let (key, what) = match name {
            "key.not_a_string" => (Key::Raw("12345".into()), "a number (12345)"),
            "key.empty" => (Key::Text(String::new()), "an empty string"),
            _ => {
                let long = format!("{}-{}", fresh_key(), "x".repeat(300));
                (Key::Text(long[..300].to_owned()), "a 300-byte string")
            }
        };
        let args = self.args.clone();
        let before = self.observe().await?;
        let reply = self.witness(&args, &key).await?;
        let after = self.observe().await?;
        let mut evidence = exchange("call", &reply);
        if reply.message.get("error").is_some() {
            let code = reply.error_code();
            let message = reply
                .message
                .pointer("/error/message")
                .and_then(Value::as_str);
            let (status, detail) = if code != Some(INVALID_PARAMS) {
                (
                    Status::Fail,
                    format!("rejected, but with code {code:?} instead of -32602 (invalid params)"),
                )
            } else if message.is_none_or(str::is_empty) {
                (
                    Status::Fail,
                    "rejected with -32602 but no error message".to_owned(),
                )
            } else if before != after {
                evidence.push(note("observation before", before.unwrap_or_default()));
                evidence.push(note("observation after", after.unwrap_or_default()));
                (
                    Status::Fail,
                    "rejected, but the observation tool shows that something ran".to_owned(),
                )
            } else {
                let ran = if before.is_some() {
                    "nothing ran"
                } else {
                    "not verified that nothing ran (no --observe-tool)"
                };
                (
                    Status::Pass,
                    format!("{what} was refused: {}; {ran}", error_summary(&reply)),
                )
            };
            return Ok(one(name, Level::Should, status, detail, evidence));
        }
        if name == "key.too_long" && reply.is_success() {
            let retry = self.witness(&args, &key).await?;
            evidence.extend(exchange("retry", &retry));
            let (status, detail) = if same(&reply, &retry) == Same::Different {
                (
                    Status::Fail,
                    "a 300-byte key was accepted, but a retry ran again: the key was ignored"
                        .to_owned(),
                )
            } else if self.witness_varies == Some(false) {
                (
                    Status::Skip,
                    "a 300-byte key was accepted and a retry got the same result, but so do \
                     calls with other keys (see no_key.executes): whether the key was honoured \
                     cannot be told"
                        .to_owned(),
                )
            } else {
                (
                    Status::Pass,
                    "a 300-byte key was accepted and honoured in full (a retry replays); the SEP \
                     sets no length limit"
                        .to_owned(),
                )
            };
            return Ok(one(name, Level::Should, status, detail, evidence));
        }
        let detail = format!(
            "{what} as idempotencyKey was not refused: the call got {}",
            error_summary(&reply)
        );
        Ok(one(name, Level::Should, Status::Fail, detail, evidence))
    }

    /// An MRTR continuation (`requestState`, `inputResponses`) carrying the same key is processed
    /// as a continuation, not deduplicated against the request that asked for input.
    pub(super) async fn mrtr(&mut self) -> anyhow::Result<Vec<Outcome>> {
        const NAME: &str = "mrtr.continuation";
        let Some((tool, args, responses)) = self.plan.mrtr.clone() else {
            let detail =
                "no --mrtr-tool: no tool of this server is known to ask for input (MRTR), \
                          so continuations were not tested"
                    .to_owned();
            return Ok(one(NAME, Level::Should, Status::Skip, detail, Vec::new()));
        };
        let key = Key::Text(fresh_key());
        let args = args.to_string();
        let first = self.session.call(&tool, &args, &key).await?;
        let mut evidence = exchange("first", &first);
        let result = first.message.get("result");
        if result.and_then(|r| r.get("resultType")) != Some(&Value::from("input_required")) {
            let detail = format!(
                "the --mrtr-tool call did not ask for input (no resultType \"input_required\"): {}",
                error_summary(&first)
            );
            return Ok(one(NAME, Level::Should, Status::Skip, detail, evidence));
        }
        let mut extra = String::new();
        if let Some(state) = result.and_then(|r| r.get("requestState")) {
            extra.push_str(&format!(r#","requestState":{state}"#));
        }
        extra.push_str(&format!(r#","inputResponses":{responses}"#));
        let params = self.session.tool_params(&tool, &args, &key, &extra);
        let pending = self
            .session
            .start("tools/call", Some(&tool), params)
            .await?;
        let timeout = self.session.timeout;
        let continuation = self.session.finish(pending, timeout).await?;
        evidence.extend(exchange("continuation", &continuation));
        let (status, detail) = continuation_verdict(&first, &continuation);
        Ok(one(NAME, Level::Should, status, detail, evidence))
    }
}

fn continuation_verdict(first: &Reply, continuation: &Reply) -> (Status, String) {
    match continuation.error_type() {
        Some(kind) if kind.starts_with("idempotency_") => (
            Status::Fail,
            format!("the continuation was treated as a retry of the first request: {kind}"),
        ),
        _ if same(first, continuation) != Same::Different => (
            Status::Fail,
            "the continuation got the first request's recorded answer back (deduplicated)"
                .to_owned(),
        ),
        _ => (
            Status::Pass,
            format!(
                "the continuation (same key, requestState, inputResponses) was processed, not \
                 deduplicated: {}",
                error_summary(continuation)
            ),
        ),
    }
}

/// Whether a rejection carries `code` -32602 and `data` {type, idempotencyKey}.
pub(super) fn error_data(name: &'static str, reply: &Reply, kind: &str, key: &str) -> Outcome {
    let evidence: Vec<Evidence> = exchange("rejection", reply);
    let mut wrong = Vec::new();
    if reply.message.get("error").is_none() {
        wrong.push("no JSON-RPC error".to_owned());
    } else {
        if reply.error_code() != Some(INVALID_PARAMS) {
            wrong.push(format!("code {:?}, expected -32602", reply.error_code()));
        }
        if reply.error_type() != Some(kind) {
            wrong.push(format!(
                "data.type {:?}, expected {kind:?}",
                reply.error_type()
            ));
        }
        if reply.error_key() != Some(key) {
            wrong.push(format!(
                "data.idempotencyKey {:?}, expected the key sent",
                reply.error_key()
            ));
        }
    }
    if wrong.is_empty() {
        let detail = format!("code -32602, data.type {kind}, data.idempotencyKey names the key");
        Outcome::new(name, Level::Should, Status::Pass, detail).with(evidence)
    } else {
        Outcome::new(name, Level::Should, Status::Fail, wrong.join("; ")).with(evidence)
    }
}
