//! The world: gateways that decide calls with the library's real [`Engine`] and
//! [`PendingDecision`], against the abstract store (`store.rs`). Each action drives the real
//! engine one step and applies the store request it names atomically.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use mcp_idempotency::fingerprint::Fingerprint;
use mcp_idempotency::store::{ClaimOutcome, ClaimRequest, Fenced, StoreError};
use mcp_idempotency::{
    Claim, Decision, Engine, EngineConfig, Outcome, PendingDecision, Record, RecordId, RecordState,
    Scope, Step, Timestamp, ToolCall,
};
use serde_json::Value;

use super::state::{Call, CallId, Phase, Slot, SlotState};
use super::Config;

/// How many properties [`SPECS`](super::properties::SPECS) declares.
pub(crate) const COUNT: usize = 15;

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
    pub(super) engine: Engine,
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
    pub(crate) discovered: [AtomicBool; COUNT],
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

    pub(super) fn say(&mut self, line: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.0 {
            lines.push(line());
        }
    }

    pub(crate) fn into_text(self) -> String {
        self.0.unwrap_or_default().join("; ")
    }
}

/// The error a gateway sees when a store answer is lost.
pub(super) fn lost_answer() -> StoreError {
    StoreError::Unavailable {
        message: "the answer was lost".into(),
        source: None,
    }
}

pub(super) fn bit(run: u8) -> u16 {
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
    pub(super) fn begin(
        &self,
        id: CallId,
        args: u8,
        began: u8,
    ) -> (PendingDecision<'_>, ClaimRequest) {
        let call = self.tool_call(id.key, args);
        let (pending, step) = self.engine.begin(&self.scope, call, id.token(), at(began));
        match step {
            Step::TryClaim(req) => (pending, req),
            other => panic!("the engine claims a valid SEP key first, not {other:?}"),
        }
    }

    /// The engine's pending decision of `call` re-derived from its inputs (the call, its token,
    /// when it began, the store's answers so far), with the step it stands at.
    pub(super) fn replay(&self, call: &Call) -> (PendingDecision<'_>, Step) {
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
    pub(super) fn claim_of(&self, call: &Call) -> Claim {
        match self.replay(call).1 {
            Step::Done(Decision::Execute(claim)) => claim,
            other => panic!("a running call's inputs re-derive its grant, not {other:?}"),
        }
    }

    /// The slot as the engine reads it: a real [`Record`].
    pub(super) fn record(&self, key: u8, slot: &Slot) -> Record {
        Record {
            trace: None,
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
    pub(super) fn key_of(&self, id: &RecordId) -> usize {
        self.ids
            .iter()
            .position(|known| known == id)
            .expect("the engine's requests name the records of the world's keys")
    }
}

/// The result of run `run` of `key` with argument value `args`: what the tool answers.
pub(super) fn result(key: u8, run: u8, args: u8) -> String {
    format!(r#"{{"content":[],"structuredContent":{{"key":{key},"run":{run},"args":{args}}}}}"#)
}

/// `(key, run, args)` of a [`result`].
pub(super) fn parse_result(raw: &str) -> Option<(u8, u8, u8)> {
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
