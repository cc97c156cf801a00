//! Checks that a call runs when it should and is replayed when it should: `no_key.executes`,
//! `replay.result`, `equivalence.*` and `replay.error`.

use mcp_idempotency::RejectionKind;

use super::checks::{exchange, fresh_key, how_same, note, one, same, Checker, Same};
use super::report::{Evidence, Level, Outcome, Status};
use super::respell;
use super::session::Key;
use crate::shown::abridge;

impl Checker<'_> {
    /// Without a key, every call runs: two calls, two different results. This also shows whether
    /// the witness can tell a replay from a re-execution.
    pub(super) async fn no_key(&mut self) -> anyhow::Result<Vec<Outcome>> {
        const NAME: &str = "no_key.executes";
        let args = self.args.clone();
        let first = self.witness(&args, &Key::None).await?;
        let second = self.witness(&args, &Key::None).await?;
        let mut evidence = exchange("first", &first);
        evidence.extend(exchange("second", &second));
        for reply in [&first, &second] {
            if !reply.is_success() {
                let detail = "the witness call without a key did not succeed; check --tool and \
                              --args"
                    .to_owned();
                return Ok(one(NAME, Level::Must, Status::Fail, detail, evidence));
            }
        }
        if let Some(source) = second.replay_marker().or(first.replay_marker()) {
            let source = source.to_owned();
            return self.no_key_under_a_policy(&source, evidence).await;
        }
        if same(&first, &second) != Same::Different {
            self.witness_varies = Some(false);
            let detail = "two calls without a key returned the same result: either the server \
                          deduplicated calls that carry no key, or the witness result does not \
                          change on each execution (pick another --tool/--args)"
                .to_owned();
            return Ok(one(NAME, Level::Must, Status::Fail, detail, evidence));
        }
        self.witness_varies = Some(true);
        let detail = "two calls without a key both ran (two different results)".to_owned();
        Ok(one(NAME, Level::Must, Status::Pass, detail, evidence))
    }

    /// A call without a key was replayed with a marker: the witness tool has a key policy (a
    /// window, a business identifier), so calls without a key are deduplicated on purpose. Two
    /// calls with different keys then show whether the witness still varies.
    async fn no_key_under_a_policy(
        &mut self,
        source: &str,
        mut evidence: Vec<Evidence>,
    ) -> anyhow::Result<Vec<Outcome>> {
        const NAME: &str = "no_key.executes";
        let args = self.args.clone();
        let one_key = self.witness(&args, &Key::Text(fresh_key())).await?;
        let other_key = self.witness(&args, &Key::Text(fresh_key())).await?;
        evidence.extend(exchange("with a key", &one_key));
        evidence.extend(exchange("with another key", &other_key));
        let varies = one_key.is_success()
            && other_key.is_success()
            && same(&one_key, &other_key) == Same::Different;
        self.witness_varies = Some(varies);
        let then = if varies {
            "two calls with different keys both ran, so the checks below still tell a replay \
             from an execution"
        } else {
            "calls with different keys were replayed too, so the checks below cannot tell a \
             replay by the key from one by the policy"
        };
        let detail = format!(
            "the second call without a key was replayed, marked _meta[\"{}\"] = {source:?}: \
             the witness tool has a key policy on this server, which deduplicates calls \
             without a key on purpose; {then}",
            mcp_idempotency::REPLAYED_META
        );
        Ok(one(NAME, Level::Must, Status::Skip, detail, evidence))
    }

    /// The same key and arguments under a new JSON-RPC id get the recorded result.
    pub(super) async fn replay_result(&mut self) -> anyhow::Result<Vec<Outcome>> {
        let args = self.args.clone();
        let key = Key::Text(fresh_key());
        self.replayed(
            "replay.result",
            Level::Must,
            key,
            &args,
            "the same arguments",
        )
        .await
    }

    /// Arguments written differently but equal (as parsed JSON values) are the same call.
    pub(super) async fn equivalence(
        &mut self,
        name: &'static str,
        what: &str,
    ) -> anyhow::Result<Vec<Outcome>> {
        let args = &self.plan.args;
        let (respelled, missing) = match name {
            "equivalence.key_order" => (
                respell::reordered(args),
                "the witness arguments have no object with two members or more to reorder",
            ),
            "equivalence.numbers" => (
                respell::respelled_numbers(args),
                "the witness arguments contain no number to re-spell (1 vs 1.0)",
            ),
            _ => (
                respell::escaped_strings(args),
                "the witness arguments contain no string or member name to escape",
            ),
        };
        let Some(respelled) = respelled else {
            return Ok(one(
                name,
                Level::Must,
                Status::Skip,
                missing.into(),
                Vec::new(),
            ));
        };
        let what = format!("{what} {}", abridge(&respelled, 120));
        let key = Key::Text(fresh_key());
        self.replayed(name, Level::Must, key, &respelled, &what)
            .await
    }

    /// A call with the witness arguments and `key`, then a retry with `retry_args` and the same
    /// key: the retry must get the recorded result under its own id.
    pub(super) async fn replayed(
        &mut self,
        name: &'static str,
        level: Level,
        key: Key,
        retry_args: &str,
        what: &str,
    ) -> anyhow::Result<Vec<Outcome>> {
        let args = self.args.clone();
        let first = self.witness(&args, &key).await?;
        let mut evidence = exchange("original", &first);
        if !first.is_success() {
            let detail =
                "the original keyed call did not succeed, so there is nothing to replay".to_owned();
            return Ok(one(name, level, Status::Fail, detail, evidence));
        }
        let retry = self.witness(retry_args, &key).await?;
        evidence.extend(exchange("retry", &retry));
        let sameness = same(&first, &retry);
        let (status, detail) = if retry.error_type() == Some(RejectionKind::KeyConflict.as_str()) {
            (
                Status::Fail,
                format!("the retry with {what} was taken for different arguments: idempotency_key_conflict"),
            )
        } else if sameness == Same::Different {
            let got = if retry.is_success() {
                "a different result: the tool ran again"
            } else {
                "an error instead of the recorded result"
            };
            (Status::Fail, format!("the retry with {what} got {got}"))
        } else if !retry.id_matches() {
            (
                Status::Fail,
                "the replay does not carry the retry's JSON-RPC id".to_owned(),
            )
        } else if self.witness_varies == Some(false) && !self.policy_marks.is_empty() {
            (
                Status::Skip,
                "the retry got the same result, but so do calls with other keys (the witness \
                 tool's key policy, see no_key.executes), so a replay by the key cannot be told \
                 from one by the policy"
                    .to_owned(),
            )
        } else if self.witness_varies == Some(false) {
            (
                Status::Skip,
                "the retry got the same result, but two executions of the witness do too \
                 (see no_key.executes), so a replay cannot be told from a re-execution"
                    .to_owned(),
            )
        } else {
            (
                Status::Pass,
                format!(
                    "the retry with {what} (new id) got the recorded result, {}",
                    how_same(sameness)
                ),
            )
        };
        Ok(one(name, level, status, detail, evidence))
    }

    /// A call whose outcome was an error replays that error; it does not run again.
    pub(super) async fn replay_error(&mut self) -> anyhow::Result<Vec<Outcome>> {
        const NAME: &str = "replay.error";
        let Some(error_args) = self.plan.error_args.as_ref().map(ToString::to_string) else {
            let detail = "no --error-args: no call with an error outcome to replay".to_owned();
            return Ok(one(NAME, Level::Must, Status::Skip, detail, Vec::new()));
        };
        let key = Key::Text(fresh_key());
        let first = self.witness(&error_args, &key).await?;
        let mut evidence = exchange("original", &first);
        if !first.is_error_outcome() {
            let detail =
                "the --error-args call succeeded: it has no error outcome to replay".to_owned();
            return Ok(one(NAME, Level::Must, Status::Skip, detail, evidence));
        }
        let before = self.observe().await?;
        let retry = self.witness(&error_args, &key).await?;
        let after = self.observe().await?;
        evidence.extend(exchange("retry", &retry));
        let sameness = same(&first, &retry);
        if sameness == Same::Different {
            let detail =
                "the retry did not get the recorded error outcome: the call ran again".to_owned();
            return Ok(one(NAME, Level::Must, Status::Fail, detail, evidence));
        }
        if before != after {
            evidence.push(note("observation before", before.unwrap_or_default()));
            evidence.push(note("observation after", after.unwrap_or_default()));
            let detail = "the recorded error was returned, but the observation tool shows that \
                          something ran"
                .to_owned();
            return Ok(one(NAME, Level::Must, Status::Fail, detail, evidence));
        }
        let replayed = format!(
            "the recorded error outcome was replayed, {}",
            how_same(sameness)
        );
        if before.is_some() {
            let detail = format!("{replayed}; nothing ran (observation unchanged)");
            return Ok(one(NAME, Level::Must, Status::Pass, detail, evidence));
        }
        // Without an observation tool: can a fresh execution be told apart from a replay?
        let fresh = self.witness(&error_args, &Key::Text(fresh_key())).await?;
        evidence.extend(exchange("fresh key", &fresh));
        if same(&first, &fresh) != Same::Different {
            let detail = "the retry got the same error, but so does a fresh execution, so a \
                          replay cannot be told from a re-execution; name an --observe-tool"
                .to_owned();
            return Ok(one(NAME, Level::Must, Status::Skip, detail, evidence));
        }
        let detail = format!("{replayed} (a fresh execution gives another error)");
        Ok(one(NAME, Level::Must, Status::Pass, detail, evidence))
    }
}
