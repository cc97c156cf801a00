//! A process's connection to the shared store: each operation crosses a network that loses,
//! delays and partitions as the seed's faults say, and reaches the [`ModelStore`] atomically.
//!
//! An operation goes through four points, each of which a fault may hit: the request on its way
//! (lost: nothing applied), the store applying it, the store flushing it before answering (a
//! restart meanwhile loses the write, unacknowledged), the reply on its way (lost: the write
//! stands, the caller sees an error). A process whose host was killed has its link cut: from
//! then on its operations never complete, so nothing it left running writes on its behalf.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, Store, StoreError,
    StoreFuture, StoreStats, TakeOverRequest,
};
use mcp_idempotency::{FencingToken, Outcome, Record, RecordId, RecordState, Timestamp};

use super::{lock, Claimant, TakeOver, World};
use crate::store::{Answer, Op};
use crate::violation::Violation;

/// How long a network store's client waits for an answer before giving up (the real stores' 10 s).
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// One process's handle on the store.
#[derive(Debug)]
pub struct StoreLink {
    world: Arc<World>,
    host: usize,
    process: u64,
    who: String,
    cut: Arc<AtomicBool>,
}

fn unavailable(message: &str) -> StoreError {
    StoreError::Unavailable {
        message: message.to_owned(),
        source: None,
    }
}

impl StoreLink {
    /// The link of `process` on `host`; `cut` is set when the host is killed.
    pub fn new(world: Arc<World>, host: usize, process: u64, cut: Arc<AtomicBool>) -> Self {
        Self {
            world,
            host,
            process,
            who: format!("p{process}@h{host}"),
            cut,
        }
    }

    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Waits for `duration`, or forever once the link is cut.
    async fn wait(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
        if self.is_cut() {
            std::future::pending::<()>().await;
        }
    }

    /// One operation; notes it when it fails or takes longer than a sixth of a lease (the
    /// renewals' tick): either may keep its process from renewing a lease in time.
    async fn call(&self, op: Op) -> Result<Answer, StoreError> {
        let started = self.world.elapsed();
        let answer = self.reach_store(op).await;
        let ended = self.world.elapsed();
        let slow = ended - started > self.world.gateway.engine.lease() / 6;
        if answer.is_err() || slow {
            lock(&self.world.troubled).push((self.process, started, ended));
        }
        answer
    }

    async fn reach_store(&self, op: Op) -> Result<Answer, StoreError> {
        let world = &self.world;
        if self.is_cut() {
            std::future::pending::<()>().await;
        }
        let name = describe(&op);
        if let Op::Claim(req) = &op {
            // The claim's `now`, on the simulation's time: when its record's lease and window
            // start, as the host's clock put it.
            let offset = world.hosts[self.host].clock.offset_ms();
            let millis = i64::try_from(req.now.as_millis()).unwrap_or(i64::MAX)
                - i64::try_from(super::clock::EPOCH.as_millis()).unwrap_or(0)
                - offset;
            lock(&world.claim_nows).push((
                self.process,
                req.id.scope.principal().to_owned(),
                req.id.key.for_tool().to_owned(),
                Duration::from_millis(u64::try_from(millis).unwrap_or(0)),
            ));
        }
        let sent = match &op {
            Op::Claim(req) => Some(&req.id),
            Op::Get { id, .. } => Some(id),
            _ => None,
        };
        if let Some(id) = sent {
            let (principal, key) = (id.scope.principal(), id.key.for_tool());
            lock(&world.claims_sent).push((
                self.process,
                principal.to_owned(),
                key.to_owned(),
                world.elapsed(),
            ));
        }
        let (unreachable, slow, lose_request, renewal_fails) = {
            let faults = lock(&world.faults);
            (
                faults.unreachable(self.host),
                faults.slow(),
                faults.losing_requests(self.host) && world.chance(0.5),
                matches!(op, Op::Renew { .. }) && faults.renewals_fail(self.host),
            )
        };
        if unreachable {
            self.wait(world.draw_ms(1, 20)).await;
            world
                .history
                .note(&self.who, format!("{name} → refused (store unreachable)"));
            return Err(unavailable("connection refused (simulated)"));
        }
        if renewal_fails {
            self.wait(world.draw_ms(1, 2_000)).await;
            world
                .history
                .note(&self.who, format!("{name} → failed (renewals fail)"));
            return Err(unavailable("renewal failed (simulated)"));
        }
        let (to_store, flush, back) = if slow {
            (
                world.draw_ms(0, 3_000),
                world.draw_ms(0, 3_000),
                world.draw_ms(0, 3_000),
            )
        } else {
            (
                world.draw_ms(0, 5),
                world.draw_ms(0, 3),
                world.draw_ms(0, 5),
            )
        };
        self.wait(to_store).await;
        if lose_request || lock(&world.faults).unreachable(self.host) {
            world
                .history
                .note(&self.who, format!("{name} → request lost"));
            self.wait(OP_TIMEOUT.saturating_sub(to_store)).await;
            return Err(unavailable("timed out (simulated: request lost)"));
        }
        let epoch = world.store_epoch();
        let before = match &op {
            Op::Complete(req) => completed_outcome(world, &req.id),
            _ => None,
        };
        let (answer, write) = world.store.apply(&op);
        self.observe(&op, &answer, before);
        let written = write.map_or(String::new(), |seq| format!(" [{seq:?}]"));
        world
            .history
            .note(&self.who, format!("{name} → {}{written}", show(&answer)));
        // The store flushes the write, then answers: its own doing, whatever becomes of the
        // caller (a killed process's operation is still acknowledged).
        let (flushed, answered) = tokio::sync::oneshot::channel();
        let store_world = Arc::clone(world);
        // A completion counts as recorded once it is durable (a restart before loses it).
        let completed = match (&op, &answer) {
            (Op::Complete(req), Answer::Fenced(Fenced::Applied)) => Some((
                req.id.scope.principal().to_owned(),
                req.id.key.for_tool().to_owned(),
                self.process,
            )),
            _ => None,
        };
        tokio::spawn(async move {
            tokio::time::sleep(flush).await;
            let durable = store_world.store_epoch() == epoch;
            if let (true, Some(seq)) = (durable, write) {
                store_world.store.acknowledge(seq);
            }
            if let (true, Some((principal, key, process))) = (durable, completed) {
                let at = store_world.elapsed();
                lock(&store_world.completions).push((principal, key, at, process));
            }
            let _ = flushed.send(durable);
        });
        let durable = answered.await.unwrap_or(false);
        if self.is_cut() {
            std::future::pending::<()>().await;
        }
        if !durable {
            world.history.note(
                &self.who,
                format!("{name} → connection reset by the restart"),
            );
            self.wait(OP_TIMEOUT.saturating_sub(to_store + flush)).await;
            return Err(unavailable("connection reset (simulated: store restarted)"));
        }
        let lose_reply = {
            let faults = lock(&world.faults);
            faults.unreachable(self.host) || (faults.losing_replies(self.host) && world.chance(0.5))
        };
        if lose_reply {
            world
                .history
                .note(&self.who, format!("{name} → reply lost"));
            self.wait(OP_TIMEOUT.saturating_sub(to_store + flush)).await;
            return Err(unavailable("timed out (simulated: reply lost)"));
        }
        self.wait(back).await;
        Ok(answer)
    }
}

impl StoreLink {
    /// Keeps what the checks need of an operation the store applied.
    fn observe(&self, op: &Op, answer: &Answer, completed_before: Option<Outcome>) {
        let world = &self.world;
        let at = world.elapsed();
        let of = |id: &RecordId| {
            (
                id.scope.principal().to_owned(),
                id.key.for_tool().to_owned(),
            )
        };
        let claimant = |id: &RecordId, token: FencingToken| {
            let (principal, key) = of(id);
            Claimant {
                principal,
                key,
                process: self.process,
                token,
                at,
            }
        };
        match (op, answer) {
            (Op::Claim(req), Answer::Claim(ClaimOutcome::Claimed)) => {
                lock(&world.claimants).push(claimant(&req.id, req.owner));
            }
            (Op::TakeOver(req), Answer::Fenced(Fenced::Applied)) => {
                lock(&world.claimants).push(claimant(&req.id, req.new_owner));
                let (principal, key) = of(&req.id);
                lock(&world.take_overs).push(TakeOver {
                    principal,
                    key,
                    previous_owner: req.previous_owner,
                    process: self.process,
                    at,
                });
            }
            (Op::Complete(req), Answer::Fenced(Fenced::Applied)) => {
                let (principal, key) = of(&req.id);
                if let Some(before) = completed_before.filter(|before| *before != req.outcome) {
                    lock(&world.violations).push(Violation {
                        invariant: "write-once",
                        detail: format!(
                            "{principal}/{key}, completed ({:?}), completed again ({:?}) by {}",
                            before.kind(),
                            req.outcome.kind(),
                            self.who
                        ),
                    });
                }
            }
            _ => {}
        }
    }
}

/// The outcome the store holds for `id`, if its record is completed.
fn completed_outcome(world: &World, id: &RecordId) -> Option<Outcome> {
    world
        .store
        .records()
        .into_iter()
        .find(|record| record.id == *id)
        .and_then(|record| match record.state {
            RecordState::Completed { outcome, .. } => Some(outcome),
            RecordState::InProgress { .. } => None,
        })
}

/// An operation, one line of the history.
fn describe(op: &Op) -> String {
    let id = |id: &RecordId| {
        // Records an earlier release kept under the command's namespace show as such.
        let legacy = if id.scope.namespace() == super::COMMAND_NAMESPACE {
            "legacy:"
        } else {
            ""
        };
        format!("{legacy}{}/{}", id.scope.principal(), id.key.for_tool())
    };
    match op {
        Op::Claim(req) => format!("claim {} by {}", id(&req.id), token(req.owner)),
        Op::Complete(req) => format!(
            "complete {} by {} ({:?})",
            id(&req.id),
            token(req.owner),
            req.outcome.kind()
        ),
        Op::TakeOver(req) => format!(
            "take over {} from {} by {}",
            id(&req.id),
            token(req.previous_owner),
            token(req.new_owner)
        ),
        Op::Renew {
            id: record, owner, ..
        } => format!("renew {} by {}", id(record), token(*owner)),
        Op::Release { id: record, owner } => {
            format!("release {} by {}", id(record), token(*owner))
        }
        Op::Get { id: record, .. } => format!("get {}", id(record)),
        Op::PurgeExpired { .. } => "purge expired".to_owned(),
        Op::Stats { .. } => "stats".to_owned(),
        Op::List { .. } => "list".to_owned(),
        Op::Delete { id: record } => format!("delete {}", id(record)),
    }
}

/// A token, short: its last four hex digits.
fn token(token: FencingToken) -> String {
    format!("#{:04x}", token.as_u64() & 0xffff)
}

fn show_record(record: &Record) -> String {
    match &record.state {
        RecordState::InProgress { owner, .. } => format!("in progress by {}", token(*owner)),
        RecordState::Completed { outcome, .. } => format!("completed ({:?})", outcome.kind()),
    }
}

/// An answer, one line of the history.
fn show(answer: &Answer) -> String {
    match answer {
        Answer::Claim(ClaimOutcome::Claimed) => "claimed".to_owned(),
        Answer::Claim(ClaimOutcome::Existing(record)) => {
            format!("existing, {}", show_record(record))
        }
        Answer::Claim(ClaimOutcome::QuotaExceeded(quota)) => format!("quota exceeded {quota:?}"),
        Answer::Fenced(fenced) => format!("{fenced:?}"),
        Answer::Record(None) => "none".to_owned(),
        Answer::Record(Some(record)) => show_record(record),
        Answer::Count(count) => format!("{count}"),
        Answer::Stats(stats) => format!("{stats:?}"),
        Answer::Records(records) => format!("{} records", records.len()),
        Answer::Deleted(deleted) => format!("deleted: {deleted}"),
    }
}

/// An answer of another kind than the operation's: the model store never gives one.
fn mismatch() -> StoreError {
    StoreError::Backend {
        message: "the model store answered another kind of operation".to_owned(),
        source: None,
    }
}

impl Store for StoreLink {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        Box::pin(async move {
            match self.call(Op::Claim(req.clone())).await? {
                Answer::Claim(outcome) => Ok(outcome),
                _ => Err(mismatch()),
            }
        })
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        Box::pin(async move {
            match self.call(Op::Complete(req)).await? {
                Answer::Fenced(fenced) => Ok(fenced),
                _ => Err(mismatch()),
            }
        })
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            match self.call(Op::TakeOver(req.clone())).await? {
                Answer::Fenced(fenced) => Ok(fenced),
                _ => Err(mismatch()),
            }
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Renew {
                id: id.clone(),
                owner,
                lease_expires_at,
            };
            let answer = self.call(op).await;
            if answer.is_err() {
                let at = self.world.elapsed();
                lock(&self.world.renewals_failed).push((owner, at));
            }
            match answer? {
                Answer::Fenced(fenced) => Ok(fenced),
                _ => Err(mismatch()),
            }
        })
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            let op = Op::Release {
                id: id.clone(),
                owner,
            };
            match self.call(op).await? {
                Answer::Fenced(fenced) => Ok(fenced),
                _ => Err(mismatch()),
            }
        })
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            match self
                .call(Op::Get {
                    id: id.clone(),
                    now,
                })
                .await?
            {
                Answer::Record(record) => Ok(record),
                _ => Err(mismatch()),
            }
        })
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            match self.call(Op::PurgeExpired { now }).await? {
                Answer::Count(count) => Ok(count),
                _ => Err(mismatch()),
            }
        })
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        Box::pin(async move {
            match self.call(Op::Stats { now }).await? {
                Answer::Stats(stats) => Ok(stats),
                _ => Err(mismatch()),
            }
        })
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        Box::pin(async move {
            let op = Op::List {
                filter: filter.clone(),
                now,
                limit,
            };
            match self.call(op).await? {
                Answer::Records(records) => Ok(records),
                _ => Err(mismatch()),
            }
        })
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            match self.call(Op::Delete { id: id.clone() }).await? {
                Answer::Deleted(deleted) => Ok(deleted),
                _ => Err(mismatch()),
            }
        })
    }
}
