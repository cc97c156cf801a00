//! Checks of the `_meta` carrier: a key in `params._meta.idempotencyKey`, where the official SDKs'
//! public APIs let a client put one (`session.call_tool(..., meta=...)` in the Python SDK), since
//! their typed requests drop an unknown top-level `idempotencyKey`. The SEP does not name this
//! carrier, so its checks are SHOULD: `meta.replay` and `meta.conflict`, the SEP key's rules with
//! the key in `_meta`.

use super::checks::{fresh_key, Checker};
use super::report::{Level, Outcome, Status};
use super::session::Key;

/// What a failed `_meta` check means for a client.
const UNPROTECTED: &str = "a client that can send its key only in _meta (the official SDKs' \
                           meta=) is not protected";

impl Checker<'_> {
    /// The same `_meta.idempotencyKey` and arguments under a new JSON-RPC id get the recorded
    /// result.
    pub(super) async fn meta_replay(&mut self) -> anyhow::Result<Vec<Outcome>> {
        let args = self.args.clone();
        let key = Key::Meta(fresh_key());
        let what = "the same arguments and _meta.idempotencyKey";
        let outcomes = self
            .replayed("meta.replay", Level::Should, key, &args, what)
            .await?;
        Ok(outcomes.into_iter().map(explain_failure).collect())
    }

    /// The same `_meta.idempotencyKey` with different arguments is rejected, nothing runs, and
    /// the record stays.
    pub(super) async fn meta_conflict(&mut self) -> anyhow::Result<Vec<Outcome>> {
        let key_text = fresh_key();
        let key = Key::Meta(key_text.clone());
        let outcomes = self
            .conflicting(("meta.conflict", Level::Should), None, &key_text, key)
            .await?;
        Ok(outcomes.into_iter().map(explain_failure).collect())
    }
}

/// A failed `_meta` check says what it costs a client.
fn explain_failure(mut outcome: Outcome) -> Outcome {
    if outcome.status == Status::Fail {
        outcome.detail = format!("{}; {UNPROTECTED}", outcome.detail);
    }
    outcome
}
