//! Sans-IO tests of the JSON-RPC [`Interceptor`]: lines in, actions out, with a real [`Engine`]
//! stepped by hand in place of a store. No runtime, no I/O.

use std::collections::BTreeMap;

use mcp_idempotency::fingerprint::Fingerprint;
use mcp_idempotency::interceptor::{
    CancelPolicy, ClientAction, Decided, Interceptor, InterceptorConfig, KeyedCall, LearnName,
    ServerAction, META_KEY,
};
use mcp_idempotency::store::{ClaimOutcome, StoreError};
use mcp_idempotency::{
    BypassReason, Claim, Decision, Engine, EngineConfig, FencingToken, Outcome, Record,
    RecordState, Replay, Scope, Step, Timestamp,
};
use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn scope() -> Scope {
    Scope::new("interceptor-tests", "alice")
}

fn now() -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000)
}

/// An interceptor and an engine, with the store's answers supplied by each test.
struct Harness {
    interceptor: Interceptor,
    engine: Engine,
}

impl Harness {
    fn new() -> Self {
        Self::with(InterceptorConfig::default())
    }

    fn with(config: InterceptorConfig) -> Self {
        Self {
            interceptor: Interceptor::new(config),
            engine: Engine::new(EngineConfig::default()),
        }
    }

    /// The line must be a keyed call to decide.
    fn keyed(&mut self, line: &str) -> KeyedCall {
        match self.interceptor.on_client_message(line) {
            ClientAction::Decide(call) => call,
            other => panic!("expected Decide for {line}, got {other:?}"),
        }
    }

    /// The decision the engine makes for `call` when the store answers `answer` to its claim.
    fn decision(
        &self,
        call: &KeyedCall,
        answer: impl FnOnce(&mcp_idempotency::store::ClaimRequest) -> Result<ClaimOutcome, StoreError>,
    ) -> Decision {
        let scope = scope();
        let (mut pending, step) =
            self.engine
                .begin(&scope, call.tool_call(), FencingToken::random(), now());
        match step {
            Step::Done(decision) => decision,
            Step::TryClaim(req) => {
                let answer = answer(&req);
                match pending.on_claim(req, answer) {
                    Step::Done(decision) => decision,
                    other => panic!("unexpected step {other:?}"),
                }
            }
            other => panic!("unexpected step {other:?}"),
        }
    }

    /// Claims `call` (the store answers "claimed") and returns the claim and the request for the
    /// server.
    fn execute_call(&mut self, call: KeyedCall) -> (Claim, String) {
        let decision = self.decision(&call, |_| Ok(ClaimOutcome::Claimed));
        let Decision::Execute(claim) = decision.clone() else {
            panic!("expected Execute, got {decision:?}");
        };
        match self.interceptor.on_decision(call, decision) {
            Decided::Forward(request) => (claim, request),
            other => panic!("expected Forward, got {other:?}"),
        }
    }

    /// Sends a keyed line and claims it.
    fn execute(&mut self, line: &str) -> (Claim, String) {
        let call = self.keyed(line);
        self.execute_call(call)
    }

    /// Sends a keyed line whose key the store already holds with `state`, same fingerprint.
    fn existing(&mut self, line: &str, state: RecordState) -> Decided {
        let call = self.keyed(line);
        let decision = self.decision(&call, |req| {
            Ok(ClaimOutcome::Existing(Record {
                trace: None,
                id: req.id.clone(),
                fingerprint: req.fingerprint,
                tool_name: req.tool_name.to_string(),
                state,
                created_at: now(),
                expires_at: now().saturating_add(std::time::Duration::from_secs(3600)),
            }))
        });
        self.interceptor.on_decision(call, decision)
    }

    fn server(&mut self, line: &str) -> ServerAction {
        self.interceptor.on_server_message(line)
    }

    fn client(&mut self, line: &str) -> ClientAction {
        self.interceptor.on_client_message(line)
    }
}

fn call_line(id: &str, key: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"charge","arguments":{{"amount":1}},"idempotencyKey":"{key}"}}}}"#
    )
}

/// The members of a JSON object with their raw text, last one winning.
fn raw_members(text: &str) -> BTreeMap<String, String> {
    let members: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"));
    members
        .into_iter()
        .map(|(name, raw)| (name, raw.get().to_owned()))
        .collect()
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

fn expect_respond(action: ClientAction) -> Value {
    match action {
        ClientAction::Respond(response) => parse(&response),
        other => panic!("expected Respond, got {other:?}"),
    }
}

fn expect_record(action: ServerAction) -> (Claim, Outcome, bool) {
    match action {
        ServerAction::Record {
            claim,
            outcome,
            forward,
        } => (claim, outcome, forward),
        other => panic!("expected Record, got {other:?}"),
    }
}

fn is_forward(action: &ClientAction) -> bool {
    matches!(action, ClientAction::Forward)
}

fn is_server_forward(action: &ServerAction) -> bool {
    matches!(action, ServerAction::Forward)
}

fn respond_json(decided: Decided) -> Value {
    match decided {
        Decided::Respond(response) => parse(&response),
        Decided::Forward(request) => panic!("expected Respond, got Forward({request})"),
    }
}

mod batch;
mod garbage;
mod listing;
mod requests;
mod responses;
mod session;
