//! One seed, from its draws to its checked history.

use std::cell::RefCell;
use std::sync::{Arc, Once};
use std::time::Duration;

use mcp_idempotency::policy::ToolPolicies;
use mcp_idempotency::{AfterCrash, EngineConfig};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use crate::faults::{draw_plan, FaultEvent, FaultKind};
use crate::invariants::{self, Exceptions, Violation};
use crate::world::client;
use crate::world::{lock, GatewayConfig, World};

/// What a run simulates.
#[derive(Clone, Debug)]
pub struct Options {
    /// The kinds of fault seeds draw from.
    pub faults: Vec<FaultKind>,
    /// Hosts (at least 3).
    pub hosts: usize,
    /// Clients; they take the principals alice, bob and carol in turn.
    pub clients: usize,
    /// Calls each client makes (each may be retried and repeated).
    pub calls_per_client: usize,
    /// The fewest faults a seed draws (it draws up to half as many again).
    pub min_faults: usize,
    /// The mutant switched on, if any.
    pub mutant: Option<mcp_idempotency::simulation::Mutant>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            faults: FaultKind::default_set(),
            hosts: 3,
            clients: 6,
            calls_per_client: 9,
            min_faults: 10,
            mutant: None,
        }
    }
}

/// What a seed did and broke.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Its whole history.
    pub history: String,
    /// The invariants it broke.
    pub violations: Vec<Violation>,
    /// The documented exceptions it counted.
    pub exceptions: Exceptions,
    /// Calls the clients sent (attempts included).
    pub calls: usize,
    /// Tool executions.
    pub executions: usize,
    /// Faults injected.
    pub faults: usize,
}

/// Faults are drawn within this much of the start.
const FAULT_PERIOD: Duration = Duration::from_secs(120);

/// After the faults heal: long enough for the slowest tool, a lease, the backoffs and a `wait`.
const SETTLE: Duration = Duration::from_secs(180);

const PRINCIPALS: &[&str] = &["alice", "bob", "carol"];

thread_local! {
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Keeps every panic of this thread (the simulation's) for the report, also those of tasks
/// whose panics tokio would swallow.
fn catch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|panics| panics.borrow_mut().push(info.to_string()));
            default(info);
        }));
    });
}

/// The policies every gateway runs with.
fn policies() -> ToolPolicies {
    let tools = json!({
        "refund": {"key-from": ["/order_id"]},
        "transfer": {"key-argument": "request_id"},
        "notify": {"window": "30s", "on-error": "forget"},
        "audit": {"window": "30s", "store-down": "run-unprotected"},
    });
    ToolPolicies::from_json(&tools).expect("the simulation's policies are valid")
}

/// Runs seed `seed`.
pub fn run_seed(seed: u64, options: &Options) -> SeedReport {
    catch_panics();
    PANICS.with(|panics| panics.borrow_mut().clear());
    let _mutant = options
        .mutant
        .map(mcp_idempotency::simulation::Mutant::switch_on);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    let mut report = runtime.block_on(simulate(seed, options));
    drop(runtime);
    PANICS.with(|panics| {
        for panic in panics.borrow_mut().drain(..) {
            report.violations.push(Violation {
                invariant: "no panic",
                detail: panic,
            });
        }
    });
    report
}

async fn simulate(seed: u64, options: &Options) -> SeedReport {
    let mut rng = StdRng::seed_from_u64(seed);
    let after_crash = if rng.random_bool(0.3) {
        AfterCrash::Reexecute
    } else {
        AfterCrash::Reject
    };
    let mut engine = EngineConfig::default().with_after_crash(after_crash);
    let quota = rng.random_bool(0.3).then(|| rng.random_range(15..40));
    if let Some(quota) = quota {
        engine = engine.with_max_records_per_scope(quota);
    }
    let legacy = rng.random_bool(0.3);
    let gateway = GatewayConfig {
        engine,
        policies: policies(),
        shutdown_grace: mcp_idempotency::stdio::DEFAULT_SHUTDOWN_GRACE,
    };
    let count = rng.random_range(options.min_faults..=options.min_faults * 3 / 2);
    let plan = draw_plan(
        &mut rng,
        &options.faults,
        count,
        options.hosts,
        FAULT_PERIOD,
    );
    let world = World::new(rng, gateway, options.hosts.max(3), 5_000);
    world.history.note(
        "sim",
        format!(
            "seed {seed}: after-crash {}, {} faults, quota per scope {}, legacy records: {legacy}",
            after_crash.as_str(),
            plan.len(),
            quota.map_or("none".to_owned(), |quota| quota.to_string())
        ),
    );
    if legacy {
        keep_legacy_records(&world);
    }
    let faults = tokio::spawn(inject(Arc::clone(&world), plan.clone()));
    let mut clients = tokio::task::JoinSet::new();
    for index in 0..options.clients {
        let principal = PRINCIPALS[index % PRINCIPALS.len()].to_owned();
        clients.spawn(client::run(
            Arc::clone(&world),
            index,
            principal,
            options.calls_per_client,
        ));
    }
    let mut violations = Vec::new();
    while let Some(joined) = clients.join_next().await {
        if let Err(err) = joined {
            violations.push(Violation {
                invariant: "no panic",
                detail: format!("a client task failed: {err}"),
            });
        }
    }
    let _ = faults.await;
    // Every fault heals; every host comes back.
    lock(&world.faults).heal();
    for host in 0..world.hosts.len() {
        if !world.host_up(host) {
            world.restart_host(host);
        }
    }
    world.history.note("sim", "faults healed");
    tokio::time::sleep(SETTLE).await;
    let unresolved = final_attempts(&world).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (mut broken, exceptions) = invariants::check(&world, &unresolved);
    violations.append(&mut broken);
    let history = world.history.render();
    let executions = lock(&world.executions).len();
    SeedReport {
        seed,
        calls: history.matches(" calls ").count(),
        history,
        violations,
        exceptions,
        executions,
        faults: plan.len(),
    }
}

/// Injects the faults of `plan` at their times.
async fn inject(world: Arc<World>, plan: Vec<FaultEvent>) {
    let start = tokio::time::Instant::now();
    for event in plan {
        tokio::time::sleep_until(start + event.at).await;
        world.history.note("FAULT", &event);
        lock(&world.injected).push(event.clone());
        match event.kind {
            FaultKind::Kill => {
                world.kill_host(event.host);
                let (world, host, lasts) = (Arc::clone(&world), event.host, event.lasts);
                tokio::spawn(async move {
                    tokio::time::sleep(lasts).await;
                    if !world.host_up(host) {
                        world.restart_host(host);
                    }
                });
            }
            FaultKind::ClockJump => world.jump_clock(event.host, event.amount),
            FaultKind::StoreRestart => {
                world.restart_store(0);
                lock(&world.faults).start(&event);
            }
            FaultKind::LoseAcknowledged => {
                world.restart_store(usize::try_from(event.amount).unwrap_or(1));
                lock(&world.faults).start(&event);
            }
            _ => lock(&world.faults).start(&event),
        }
    }
}

/// Once the faults healed: one more call of every group whose key must be resolved by now (not
/// the windows, which may have ended, nor the unkeyed calls); the groups that got no answer.
async fn final_attempts(world: &Arc<World>) -> Vec<String> {
    let groups = lock(&world.groups).clone();
    let mut unresolved = Vec::new();
    for group in groups {
        if !group.keying.keyed() || group.keying.windowed() {
            continue;
        }
        if !client::final_attempt(world, &group).await {
            unresolved.push(group.name.clone());
        }
    }
    unresolved
}

/// Records an earlier release kept under the command's namespace, before namespaces were learned
/// from the server: one completed record of each principal under a key no client uses, so that
/// every process reads the legacy namespace beside its own (`LegacyNamespaceReads`).
fn keep_legacy_records(world: &World) {
    use mcp_idempotency::store::{ClaimRequest, CompleteRequest};
    use mcp_idempotency::{Clock, FencingToken, IdempotencyKey, Outcome, RecordId, Scope};

    use crate::store::Op;
    use crate::world::COMMAND_NAMESPACE;

    let now = world.hosts[0].clock.now();
    let limits = world.gateway.engine.record_limits();
    let (Ok(key), Ok(fingerprint)) = (
        IdempotencyKey::new("legacy-1", 255),
        mcp_idempotency::fingerprint::fingerprint("charge", Some("{}")),
    ) else {
        return;
    };
    for (index, principal) in PRINCIPALS.iter().enumerate() {
        let id = RecordId {
            scope: Scope::new(COMMAND_NAMESPACE, *principal),
            key: key.clone(),
        };
        let owner = FencingToken::from_u64(index as u64 + 1);
        let expires_at = now.saturating_add(Duration::from_secs(24 * 3600));
        let claim = ClaimRequest {
            trace: None,
            id: id.clone(),
            fingerprint,
            tool_name: "charge".into(),
            owner,
            now,
            lease_expires_at: now.saturating_add(Duration::from_secs(30)),
            expires_at,
            limits,
        };
        let complete = CompleteRequest {
            id,
            owner,
            outcome: Outcome::Success("{}".into()),
            completed_at: now,
            expires_at,
        };
        for op in [Op::Claim(claim), Op::Complete(complete)] {
            if let (_, Some(seq)) = world.store.apply(&op) {
                world.store.acknowledge(seq);
            }
        }
    }
}
