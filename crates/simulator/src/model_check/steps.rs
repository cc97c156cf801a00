//! The world's actions: each drives the real engine one step and applies at most one store
//! request, atomically, to the abstract store.

use mcp_idempotency::store::{ClaimOutcome, Fenced};
use mcp_idempotency::{Decision, Outcome, RejectionKind, Replay, Step};

use super::state::{
    refusal, Action, Call, CallId, Delivery, KeyLog, Phase, Slot, SlotState, State,
};
use super::store;
use super::world::{
    args_name, at, bit, lost_answer, parse_result, result, tick_of, token_name, Narration, World,
};

impl World {
    /// Applies `action` to `state`: the next state, or `None` when nothing changes.
    pub(crate) fn apply(
        &self,
        state: &State,
        action: Action,
        say: &mut Narration,
    ) -> Option<State> {
        let mut next = state.clone();
        let into = &mut next;
        match action {
            Action::Send {
                gateway,
                key,
                args,
                delivery,
            } => {
                let send = state.keys[usize::from(key)].sends;
                self.send(
                    state,
                    into,
                    CallId { gateway, key, send },
                    args,
                    delivery,
                    say,
                )
            }
            Action::TakeOver { call, delivery } => self.take_over(state, into, call, delivery, say),
            Action::Execute { call } => self.execute(into, call, say),
            Action::Renew { call } => self.renew(state, into, call, say),
            Action::Complete { call, delivery } => self.complete(state, into, call, delivery, say),
            Action::Release { call } => self.release(state, into, call, say),
            Action::Crash { gateway } => self.crash(into, gateway, say),
            Action::Tick => self.tick(state, into, say),
        }?;
        Some(next)
    }

    /// A client sends a call through a gateway: the engine begins it and its claim goes to the store.
    fn send(
        &self,
        state: &State,
        next: &mut State,
        id: CallId,
        args: u8,
        delivery: Delivery,
        say: &mut Narration,
    ) -> Option<()> {
        let (gateway, key) = (id.gateway, id.key);
        next.keys[usize::from(key)].sends += 1;
        let (mut pending, req) = self.begin(id, args, state.now);
        let k = self.key_of(&req.id);
        let slot = &mut next.records[k];
        let (found, answer) = match delivery {
            Delivery::Answered => {
                let found = store::claim(slot, &req);
                let answer = match &found {
                    Ok(()) => ClaimOutcome::Claimed,
                    Err(existing) => ClaimOutcome::Existing(self.record(key, existing)),
                };
                (found.err(), Ok(answer))
            }
            Delivery::LostApplied => {
                let _ = store::claim(slot, &req);
                (None, Err(lost_answer()))
            }
            Delivery::LostUnapplied => (None, Err(lost_answer())),
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
        Some(())
    }

    /// The take-over the engine asked for goes to the store.
    fn take_over(
        &self,
        state: &State,
        next: &mut State,
        id: CallId,
        delivery: Delivery,
        say: &mut Narration,
    ) -> Option<()> {
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
            Delivery::Answered => Ok(store::take_over(slot, &req, flaw)),
            Delivery::LostApplied => {
                let _ = store::take_over(slot, &req, flaw);
                Err(lost_answer())
            }
            Delivery::LostUnapplied => Err(lost_answer()),
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
        Some(())
    }

    /// The tool runs for a call that holds its key.
    fn execute(&self, next: &mut State, id: CallId, say: &mut Narration) -> Option<()> {
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
        Some(())
    }

    /// A running call renews its lease, as the engine computes it.
    fn renew(
        &self,
        state: &State,
        next: &mut State,
        id: CallId,
        say: &mut Narration,
    ) -> Option<()> {
        let call = state.calls.iter().find(|call| call.id == id)?;
        let mut claim = self.claim_of(call);
        let deadline = self.engine.renew(&mut claim, at(state.now));
        let k = self.key_of(claim.id());
        let fenced = store::renew(&mut next.records[k], claim.owner(), deadline);
        if *next == *state {
            return None;
        }
        say.say(|| {
            format!(
                "{} renews its lease to t={}: {fenced:?}",
                token_name(id.token()),
                tick_of(deadline)
            )
        });
        Some(())
    }

    /// A call that ran records its outcome, fenced by its token, and answers its caller.
    fn complete(
        &self,
        state: &State,
        next: &mut State,
        id: CallId,
        delivery: Delivery,
        say: &mut Narration,
    ) -> Option<()> {
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
            Delivery::Answered => Some(store::complete(slot, &req, run, args, flaw)),
            Delivery::LostApplied => {
                let _ = store::complete(slot, &req, run, args, flaw);
                None
            }
            Delivery::LostUnapplied => None,
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
        Some(())
    }

    /// A gateway releases a claim whose answer was lost, fenced by its token.
    fn release(
        &self,
        state: &State,
        next: &mut State,
        id: CallId,
        say: &mut Narration,
    ) -> Option<()> {
        let index = state.unreleased.iter().position(|lost| *lost == id)?;
        next.unreleased.remove(index);
        let slot = &mut next.records[usize::from(id.key)];
        let fenced = store::release(slot, id.token());
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
        Some(())
    }

    /// A gateway crashes and restarts: its calls in flight and what it remembered are gone.
    fn crash(&self, next: &mut State, gateway: u8, say: &mut Narration) -> Option<()> {
        next.calls.retain(|call| call.id.gateway != gateway);
        next.unreleased.retain(|id| id.gateway != gateway);
        next.crashes += 1;
        say.say(|| format!("gateway {gateway} crashes and restarts"));
        Some(())
    }

    /// The clock moves one tick.
    fn tick(&self, state: &State, next: &mut State, say: &mut Narration) -> Option<()> {
        if state.now >= self.config.ticks {
            return None;
        }
        next.now += 1;
        say.say(|| format!("the clock moves to t={}", next.now));
        Some(())
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
