//! The JSON-RPC interceptor on arbitrary lines from both sides: it never panics, whatever the
//! client and the server send, in any order. Keyed calls are decided by a real engine whose store
//! always grants the claim, so responses are matched to calls in flight and recorded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_idempotency::interceptor::{ClientAction, Interceptor, InterceptorConfig};
use mcp_idempotency::store::ClaimOutcome;
use mcp_idempotency::{Engine, EngineConfig, FencingToken, Scope, Step, Timestamp};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let engine = Engine::new(EngineConfig::default());
    let scope = Scope::new("fuzz", "fuzzer");
    let mut interceptor: Interceptor = Interceptor::new(InterceptorConfig::default());
    // Lines starting with '<' come from the server, the others from the client.
    for line in text.split('\n') {
        match line.strip_prefix('<') {
            Some(server_line) => {
                let _ = interceptor.on_server_message(server_line);
            }
            None => {
                let ClientAction::Decide(call) = interceptor.on_client_message(line) else {
                    continue;
                };
                let now = Timestamp::from_millis(1_000);
                let step =
                    match engine.begin(&scope, &call.tool_call(), FencingToken::random(), now) {
                        Step::TryClaim(req) => engine.on_claim(req, Ok(ClaimOutcome::Claimed)),
                        step => step,
                    };
                if let Step::Done(decision) = step {
                    let _ = interceptor.on_decision(call, decision);
                }
            }
        }
    }
    let _ = interceptor.on_server_gone("fuzzing");
});
