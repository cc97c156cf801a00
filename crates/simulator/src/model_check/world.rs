//! The world: gateways that decide calls with the library's real [`Engine`] and
//! [`PendingDecision`], against the abstract store (`store.rs`). Each action drives the real
//! engine one step and applies the store request it names atomically.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use mcp_idempotency::fingerprint::Fingerprint;
use mcp_idempotency::store::{ClaimOutcome, ClaimRequest, Fenced, StoreError};
use mcp_idempotency::{
    Claim, Decision, Engine, EngineConfig, Outcome, PendingDecision, Record, RecordId, RecordState,
    RejectionKind, Replay, Scope, Step, Timestamp, ToolCall,
};
use serde_json::Value;

use super::state::{refusal, Call, CallId, KeyLog, Phase, Slot, SlotState, State};
use super::Config;

/// The one tool of the world.
pub(crate) const TOOL: &str = "charge";
/// The two argument values: a call with the other one under the same key is a conflict.
const ARGS: [&str; 2] = [r#"{"amount":1}"#, r#"{"amount":2}"#];
/// One tick of the model's clock, on the engine's clock.
const TICK: Duration = Duration::from_secs(1);
/// Tick 0 on the engine's clock (any instant will do).
const EPOCH_MS: u64 = 1_700_000_000_000;

/// The engine's time at `tick`.
pub(crate) fn at(tick: u8) -> Timestamp {
    Timestamp::from_millis(EPOCH_MS).saturating_add(TICK * u32::from(tick))
}

/// The tick of an engine time (for display).
pub(crate) fn tick_of(time: Timestamp) -> u64 {
    time.saturating_since(Timestamp::from_millis(EPOCH_MS))
        .as_secs()
}

/// The model: the world's fixed parts (the real engine, the keys, the arguments) and the figures
/// gathered while it is checked.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) config: Config,
    engine: Engine,
    scope: Scope,
    /// Each key's JSON value, as a client sends it (`params.idempotencyKey`).
    keys: Vec<Value>,
    /// Each key's record id, as the engine derives it.
    ids: Vec<RecordId>,
    /// Each argument value's fingerprint, as the engine computes it (for display).
    pub(crate) fingerprints: [Fingerprint; 2],
    /// The largest number of runs of one key in any state.
    pub(crate) max_runs: AtomicUsize,
    /// States in which some key ran more than once.
    pub(crate) rerun_states: AtomicUsize,
    /// Which properties ([`SPECS`](super::properties::SPECS)) were discovered already.
    pub(crate) discovered: [AtomicBool; super::properties::COUNT],
}

/// A step's narration, for rendering a path; nothing is formatted while the checker runs.
pub(crate) struct Narration(Option<Vec<String>>);

impl Narration {
    pub(crate) fn silent() -> Self {
        Self(None)
    }

    pub(crate) fn recording() -> Self {
        Self(Some(Vec::new()))
    }

    fn say(&mut self, line: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.0 {
            lines.push(line());
        }
    }

    pub(crate) fn into_text(self) -> String {
        self.0.unwrap_or_default().join("; ")
    }
}

/// The error a gateway sees when a store answer is lost.
fn lost_answer() -> StoreError {
    StoreError::Unavailable {
        message: "the answer was lost".into(),
        source: None,
    }
}

fn bit(run: u8) -> u16 {
    1 << run
}

/// A call's token as shown: `k<key>#<send>`.
pub(crate) fn token_name(token: mcp_idempotency::FencingToken) -> String {
    let n = token.as_u64().saturating_sub(1);
    format!("k{}#{}", n / 16, n % 16)
}

impl World {
    pub(crate) fn new(config: Config) -> Self {
        let engine = Engine::new(
            EngineConfig::default()
                .with_lease(TICK * u32::from(config.lease_ticks))
                .with_after_crash(config.after_crash),
        );
        let mut world = Self {
            keys: (0..config.keys)
                .map(|k| Value::String(format!("order-{k}")))
                .collect(),
            config,
            engine,
            scope: Scope::new("model-check", "client"),
            ids: Vec::new(),
            fingerprints: [Fingerprint::from_bytes([0; 32]); 2],
            max_runs: AtomicUsize::new(0),
            rerun_states: AtomicUsize::new(0),
            discovered: Default::default(),
        };
        world.ids = (0..world.config.keys)
            .map(|key| world.first_claim(key, 0).id)
            .collect();
        world.fingerprints = [0, 1].map(|args| world.first_claim(0, args).fingerprint);
        world
    }

    /// The engine's call of `key` with argument value `args`.
    fn tool_call(&self, key: u8, args: u8) -> ToolCall<'_> {
        ToolCall {
            tool_name: TOOL,
            arguments: Some(ARGS[usize::from(args)]),
            idempotency_key: Some(&self.keys[usize::from(key)]),
            ..ToolCall::default()
        }
    }

    fn first_claim(&self, key: u8, args: u8) -> ClaimRequest {
        let id = CallId {
            gateway: 0,
            key,
            send: 0,
        };
        self.begin(id, args, 0).1
    }

    /// `Engine::begin` for the call, which for a valid SEP key always asks to claim it first.
    fn begin(&self, id: CallId, args: u8, began: u8) -> (PendingDecision<'_>, ClaimRequest) {
        let call = self.tool_call(id.key, args);
        let (pending, step) = self.engine.begin(&self.scope, call, id.token(), at(began));
        match step {
            Step::TryClaim(req) => (pending, req),
            other => panic!("the engine claims a valid SEP key first, not {other:?}"),
        }
    }

    /// The engine's pending decision of `call` re-derived from its inputs (the call, its token,
    /// when it began, the store's answers so far), with the step it stands at.
    fn replay(&self, call: &Call) -> (PendingDecision<'_>, Step) {
        let (mut pending, req) = self.begin(call.id, call.args, call.began);
        let found = match &call.phase {
            Phase::TakingOver { found } => found,
            Phase::Running { found: None, .. } => {
                let step = pending.on_claim(req, Ok(ClaimOutcome::Claimed));
                return (pending, step);
            }
            Phase::Running {
                found: Some(found), ..
            } => found,
        };
        let existing = ClaimOutcome::Existing(self.record(call.id.key, found));
        let step = pending.on_claim(req, Ok(existing));
        match (&call.phase, step) {
            (Phase::Running { .. }, Step::TakeOver(req)) => {
                let step = pending.on_take_over(req, Ok(Fenced::Applied));
                (pending, step)
            }
            (_, step) => (pending, step),
        }
    }

    /// The claim of a running call, as the engine granted it.
    fn claim_of(&self, call: &Call) -> Claim {
        match self.replay(call).1 {
            Step::Done(Decision::Execute(claim)) => claim,
            other => panic!("a running call's inputs re-derive its grant, not {other:?}"),
        }
    }

    /// The slot as the engine reads it: a real [`Record`].
    fn record(&self, key: u8, slot: &Slot) -> Record {
        Record {
            id: self.ids[usize::from(key)].clone(),
            fingerprint: slot.fingerprint,
            tool_name: TOOL.into(),
            state: match slot.state {
                SlotState::InProgress {
                    owner,
                    lease_expires_at,
                } => RecordState::InProgress {
                    owner,
                    lease_expires_at,
                },
                SlotState::Completed {
                    run,
                    args,
                    completed_at,
                } => RecordState::Completed {
                    outcome: Outcome::Success(result(key, run, args)),
                    completed_at,
                },
            },
            created_at: slot.created_at,
            expires_at: slot.expires_at,
        }
    }

    /// The key a store request is for.
    fn key_of(&self, id: &RecordId) -> usize {
        self.ids
            .iter()
            .position(|known| known == id)
            .expect("the engine's requests name the records of the world's keys")
    }

    /// Applies `action` to `state`: the next state, or `None` when nothing changes.
    pub(crate) fn apply(
        &self,
        state: &State,
        action: super::state::Action,
        say: &mut Narration,
    ) -> Option<State> {
        use super::state::Action;
        let mut next = state.clone();
        match action {
            Action::Send {
                gateway,
                key,
                args,
                delivery,
            } => {
                let log = &mut next.keys[usize::from(key)];
                let id = CallId {
                    gateway,
                    key,
                    send: log.sends,
                };
                log.sends += 1;
                let (mut pending, req) = self.begin(id, args, state.now);
                let k = self.key_of(&req.id);
                let slot = &mut next.records[k];
                let (found, answer) = match delivery {
                    super::state::Delivery::Answered => {
                        let found = super::store::claim(slot, &req);
                        let answer = match &found {
                            Ok(()) => ClaimOutcome::Claimed,
                            Err(existing) => ClaimOutcome::Existing(self.record(key, existing)),
                        };
                        (found.err(), Ok(answer))
                    }
                    super::state::Delivery::LostApplied => {
                        let _ = super::store::claim(slot, &req);
                        (None, Err(lost_answer()))
                    }
                    super::state::Delivery::LostUnapplied => (None, Err(lost_answer())),
                };
                say.say(|| {
                    format!(
                        "gateway {gateway} sends key {key} with args {} as {}: claim {delivery}",
                        args_name(args),
                        token_name(id.token())
                    )
                });
                if delivery.is_lost() {
                    next.lost += 1;
                    next.unreleased.push(id);
                }
                let step = pending.on_claim(req, answer);
                let mut call = Call {
                    id,
                    args,
                    began: state.now,
                    phase: Phase::Running {
                        found: None,
                        run: None,
                        completion: None,
                    },
                };
                match (step, found) {
                    (Step::Done(Decision::Execute(_)), _) => {
                        say.say(|| "claimed: execute".into());
                        next.calls.push(call);
                    }
                    (Step::TakeOver(req), Some(found)) => {
                        say.say(|| {
                            format!(
                                "the lease of {} ran out: take it over",
                                token_name(req.previous_owner)
                            )
                        });
                        call.phase = Phase::TakingOver { found };
                        next.calls.push(call);
                    }
                    (Step::Done(decision), _) => {
                        answer_client(&mut next.keys[k], args, decision, say);
                    }
                    (other, _) => {
                        say.say(|| format!("unexpected step {other:?}"));
                        next.keys[k].refusals |= refusal::UNEXPECTED;
                    }
                }
            }
            Action::TakeOver { call: id, delivery } => {
                let index = state.calls.iter().position(|call| call.id == id)?;
                let call = &state.calls[index];
                let Phase::TakingOver { found } = &call.phase else {
                    return None;
                };
                let (mut pending, step) = self.replay(call);
                let Step::TakeOver(req) = step else {
                    panic!("a call taking over re-derives its take-over, not {step:?}");
                };
                let k = self.key_of(&req.id);
                let before = next.records[k].clone();
                let flaw = self.config.store_flaw;
                let slot = &mut next.records[k];
                let answer = match delivery {
                    super::state::Delivery::Answered => {
                        Ok(super::store::take_over(slot, &req, flaw))
                    }
                    super::state::Delivery::LostApplied => {
                        let _ = super::store::take_over(slot, &req, flaw);
                        Err(lost_answer())
                    }
                    super::state::Delivery::LostUnapplied => Err(lost_answer()),
                };
                // A take-over the store applied: did the lease it replaced really run out?
                if let Some(Slot {
                    state:
                        SlotState::InProgress {
                            owner,
                            lease_expires_at,
                        },
                    ..
                }) = before
                {
                    let now_owner = match &next.records[k] {
                        Some(Slot {
                            state: SlotState::InProgress { owner, .. },
                            ..
                        }) => Some(*owner),
                        _ => None,
                    };
                    if owner == req.previous_owner && now_owner == Some(req.new_owner) {
                        if lease_expires_at <= at(state.now) {
                            next.keys[k].lapses += 1;
                        }
                        say.say(|| {
                            format!(
                                "the store moves the record from {} (lease to t={}) to {}",
                                token_name(owner),
                                tick_of(lease_expires_at),
                                token_name(req.new_owner)
                            )
                        });
                    }
                }
                say.say(|| format!("{}'s take-over {delivery}", token_name(id.token())));
                if delivery.is_lost() {
                    next.lost += 1;
                    next.unreleased.push(id);
                }
                let raced = matches!(answer, Ok(Fenced::NotOwner));
                match pending.on_take_over(req, answer) {
                    Step::Done(Decision::Execute(_)) => {
                        say.say(|| "taken over: execute".into());
                        next.calls[index].phase = Phase::Running {
                            found: Some(found.clone()),
                            run: None,
                            completion: None,
                        };
                    }
                    Step::Done(decision) => {
                        next.calls.remove(index);
                        next.keys[k].lost_race |= raced
                            && matches!(&decision, Decision::Reject(r) if r.kind() == RejectionKind::KeyInProgress);
                        answer_client(&mut next.keys[k], call.args, decision, say);
                    }
                    other => {
                        say.say(|| format!("unexpected step {other:?}"));
                        next.keys[k].refusals |= refusal::UNEXPECTED;
                    }
                }
            }
            Action::Execute { call: id } => {
                let call = next.calls.iter_mut().find(|call| call.id == id)?;
                let Phase::Running {
                    run: run @ None, ..
                } = &mut call.phase
                else {
                    return None;
                };
                let log = &mut next.keys[usize::from(id.key)];
                log.runs += 1;
                *run = Some(log.runs);
                if call.args == 1 {
                    log.run_args |= bit(log.runs);
                }
                if log.lapses > 0 {
                    log.runs_after_lapse |= bit(log.runs);
                }
                let runs = log.runs;
                say.say(|| format!("{} runs the tool: run {runs}", token_name(id.token())));
            }
            Action::Renew { call: id } => {
                let call = state.calls.iter().find(|call| call.id == id)?;
                let mut claim = self.claim_of(call);
                let deadline = self.engine.renew(&mut claim, at(state.now));
                let k = self.key_of(claim.id());
                let fenced = super::store::renew(&mut next.records[k], claim.owner(), deadline);
                if next == *state {
                    return None;
                }
                say.say(|| {
                    format!(
                        "{} renews its lease to t={}: {fenced:?}",
                        token_name(id.token()),
                        tick_of(deadline)
                    )
                });
            }
            Action::Complete { call: id, delivery } => {
                let index = state.calls.iter().position(|call| call.id == id)?;
                let call = &state.calls[index];
                let Phase::Running {
                    run: Some(run),
                    completion,
                    ..
                } = call.phase
                else {
                    return None;
                };
                let claim = self.claim_of(call);
                let tick = completion.unwrap_or(state.now);
                let outcome = Outcome::Success(result(id.key, run, call.args));
                let req = self.engine.completion(&claim, outcome, at(tick));
                let (key, run, args) = match &req.outcome {
                    Outcome::Success(raw) => parse_result(raw),
                    _ => None,
                }
                .expect("the engine records the outcome it is given");
                let k = self.key_of(&req.id);
                let flaw = self.config.store_flaw;
                let slot = &mut next.records[k];
                let fenced = match delivery {
                    super::state::Delivery::Answered => {
                        Some(super::store::complete(slot, &req, run, args, flaw))
                    }
                    super::state::Delivery::LostApplied => {
                        let _ = super::store::complete(slot, &req, run, args, flaw);
                        None
                    }
                    super::state::Delivery::LostUnapplied => None,
                };
                let log = &mut next.keys[usize::from(key)];
                if let (
                    None,
                    Some(Slot {
                        state: SlotState::Completed { run, .. },
                        ..
                    }),
                ) = (log.register, &next.records[k])
                {
                    log.register = Some(*run);
                }
                say.say(|| {
                    format!(
                        "{} records run {run}: {delivery}{}",
                        token_name(id.token()),
                        fenced.map_or(String::new(), |f| format!(", {f:?}"))
                    )
                });
                if completion.is_none() {
                    // The tool ran: its caller gets the result, whatever the store answered.
                    log.direct |= bit(run);
                    say.say(|| format!("its caller gets run {run}'s result"));
                }
                match fenced {
                    Some(Fenced::Applied) => {
                        next.calls.remove(index);
                    }
                    Some(Fenced::NotOwner) => {
                        log.fenced_out = true;
                        next.calls.remove(index);
                    }
                    None => {
                        // The gateway sends the same completion again later.
                        next.lost += 1;
                        next.calls[index].phase = Phase::Running {
                            found: match &call.phase {
                                Phase::Running { found, .. } => found.clone(),
                                Phase::TakingOver { .. } => None,
                            },
                            run: Some(run),
                            completion: Some(tick),
                        };
                    }
                }
            }
            Action::Release { call: id } => {
                let index = state.unreleased.iter().position(|lost| *lost == id)?;
                next.unreleased.remove(index);
                let slot = &mut next.records[usize::from(id.key)];
                let fenced = super::store::release(slot, id.token());
                if fenced == Fenced::Applied {
                    next.keys[usize::from(id.key)].released = true;
                }
                say.say(|| {
                    format!(
                        "gateway {} releases the lost claim {}: {fenced:?}",
                        id.gateway,
                        token_name(id.token())
                    )
                });
            }
            Action::Crash { gateway } => {
                next.calls.retain(|call| call.id.gateway != gateway);
                next.unreleased.retain(|id| id.gateway != gateway);
                next.crashes += 1;
                say.say(|| format!("gateway {gateway} crashes and restarts"));
            }
            Action::Tick => {
                if state.now >= self.config.ticks {
                    return None;
                }
                next.now += 1;
                say.say(|| format!("the clock moves to t={}", next.now));
            }
        }
        Some(next)
    }

    /// The world before anything happened.
    pub(crate) fn initial(&self) -> State {
        State {
            now: 0,
            records: vec![None; usize::from(self.config.keys)],
            calls: Vec::new(),
            keys: vec![KeyLog::default(); usize::from(self.config.keys)],
            unreleased: Vec::new(),
            crashes: 0,
            lost: 0,
        }
    }
}

/// Records what a client got for a call the engine did not let run.
fn answer_client(log: &mut KeyLog, args: u8, decision: Decision, say: &mut Narration) {
    match decision {
        Decision::Replay(Replay::Result(raw)) => match parse_result(&raw) {
            Some((_, run, _)) => {
                log.replayed[usize::from(args)] |= bit(run);
                say.say(|| format!("replayed: run {run}'s result"));
            }
            None => {
                log.refusals |= refusal::UNEXPECTED;
                say.say(|| format!("replayed something else: {raw}"));
            }
        },
        Decision::Reject(rejection) => {
            log.refusals |= match rejection.kind() {
                RejectionKind::KeyConflict => refusal::CONFLICT,
                RejectionKind::KeyInProgress => refusal::IN_PROGRESS,
                RejectionKind::OutcomeUnknown => refusal::OUTCOME_UNKNOWN,
                RejectionKind::StoreUnavailable => refusal::STORE_UNAVAILABLE,
                _ => refusal::UNEXPECTED,
            };
            say.say(|| format!("refused: {}", rejection.kind().as_str()));
        }
        other => {
            log.refusals |= refusal::UNEXPECTED;
            say.say(|| format!("unexpected decision {other:?}"));
        }
    }
}

/// The result of run `run` of `key` with argument value `args`: what the tool answers.
fn result(key: u8, run: u8, args: u8) -> String {
    format!(r#"{{"content":[],"structuredContent":{{"key":{key},"run":{run},"args":{args}}}}}"#)
}

/// `(key, run, args)` of a [`result`].
fn parse_result(raw: &str) -> Option<(u8, u8, u8)> {
    let value: Value = serde_json::from_str(raw).ok()?;
    let field = |name: &str| {
        value["structuredContent"][name]
            .as_u64()
            .and_then(|n| u8::try_from(n).ok())
    };
    Some((field("key")?, field("run")?, field("args")?))
}

/// An argument value as shown.
pub(crate) fn args_name(args: u8) -> &'static str {
    ["A", "B"][usize::from(args)]
}
