//! The store suite's checks of derived keys, run by
//! [`store_test_suite!`](crate::store_test_suite) for every store beside
//! [`store::testsuite`](crate::store::testsuite)'s; they drive the deduplicator and the engine, so
//! they live above them. Derived keys are keys like any other: a key of each source (a business identifier, the SEP, a
//! `_meta` carrier, a key argument, a duplicate window), made by the engine from a call and a
//! tool policy as `wrap`, `proxy` and the bindings make it, keeps its U+001F prefix through every
//! operation; scopes keep such keys apart, quotas count them, `list` finds them, the crash rules
//! hold for them, and a window's record lives as long as its window.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::claims::Deduplicator;
use crate::config::{AfterCrash, EngineConfig};
use crate::engine::{Claim, Decision, Replay, ToolCall};
use crate::policy::select::{self, Chosen};
use crate::policy::ToolPolicies;
use crate::policy::{KeySource, KeyTerms, DERIVED};
use crate::raw_object::RawObject;
use crate::record::{Outcome, Record, RecordState, Scope};
use crate::rejection::RejectionKind;
use crate::store::testsuite::{keys, list, scope, LEASE, RETENTION, T0};
use crate::store::{Fenced, ListFilter, StateFilter, Store};
use crate::time::{Clock, ManualClock, Timestamp};

/// The window of `ping`: longer than the lease, much shorter than the retention.
const WINDOW: Duration = Duration::from_secs(60);

/// The tool policies of these checks. Duplicates answer at once (`wait = "0s"`): the checks look
/// at the store, not at the driver's waiting.
fn policies() -> ToolPolicies {
    ToolPolicies::from_json(&json!({
        "charge": {"key-from": ["/order_id"], "wait": "0s"},
        "refund": {"key-argument": "idempotency_key", "wait": "0s"},
        "ping": {"window": "60s", "wait": "0s"},
    }))
    .expect("valid policies")
}

/// The `tools/call` params of a call of each source, in the order of [`KeySource::ALL`]. The
/// client's key of the SEP call, of the `_meta` call and of the key argument is the same text.
fn params_of_each_source() -> [(KeySource, Value); 5] {
    [
        (
            KeySource::KeyFrom,
            json!({"name": "charge", "arguments": {"order_id": "ord_1", "amount": 5}}),
        ),
        (
            KeySource::Sep,
            json!({"name": "send", "arguments": {"to": "a"}, "idempotencyKey": "k-1"}),
        ),
        (
            KeySource::Meta,
            json!({"name": "send", "arguments": {"to": "a"}, "_meta": {"idempotencyKey": "k-1"}}),
        ),
        (
            KeySource::Argument,
            json!({"name": "refund", "arguments": {"idempotency_key": "k-1", "amount": 2}}),
        ),
        (
            KeySource::Window,
            json!({"name": "ping", "arguments": {"host": "a"}}),
        ),
    ]
}

/// A call keyed as the interceptor keys it: by the source its tool's policy chooses.
struct Keyed {
    tool: String,
    arguments: Option<String>,
    source: KeySource,
    value: Option<Value>,
    terms: KeyTerms,
}

impl Keyed {
    fn new(policies: &ToolPolicies, params: &Value) -> Self {
        let text = params.to_string();
        let raw = RawObject::parse(&text).expect("params are an object");
        let tool = params["name"].as_str().expect("a tool name").to_owned();
        let Chosen::Key(choice) = select::choose(policies, &tool, &raw) else {
            panic!("the policies key {params}");
        };
        Self {
            arguments: params.get("arguments").map(Value::to_string),
            value: choice.key,
            tool,
            source: choice.terms.source,
            terms: choice.terms,
        }
    }

    fn call(&self) -> ToolCall<'_> {
        ToolCall {
            trace: None,
            tool_name: &self.tool,
            arguments: self.arguments.as_deref(),
            idempotency_key: self.value.as_ref(),
            mrtr_continuation: false,
            terms: &self.terms,
        }
    }
}

/// The engine's driver over the store under test, on a clock the check moves, as a gateway with
/// [`policies`] runs it.
struct Gateway {
    dedup: Deduplicator,
    clock: Arc<ManualClock>,
    policies: ToolPolicies,
}

/// The engine's settings of these checks: the suite's lease and retention, no store-wide quota
/// (the store may be shared with other checks).
fn config() -> EngineConfig {
    EngineConfig::default()
        .with_retention(RETENTION)
        .with_lease(LEASE)
        .with_max_records_total(u64::MAX)
}

impl Gateway {
    fn new(store: &Arc<dyn Store>, config: EngineConfig, clock: &Arc<ManualClock>) -> Self {
        Self {
            dedup: Deduplicator::new(config, Arc::clone(store))
                .with_clock(Arc::clone(clock) as Arc<dyn Clock>),
            clock: Arc::clone(clock),
            policies: policies(),
        }
    }

    fn keyed(&self, params: &Value) -> Keyed {
        Keyed::new(&self.policies, params)
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    async fn decide(&self, scope: &Scope, keyed: &Keyed) -> Decision {
        self.dedup.decide(scope, &keyed.call()).await
    }

    /// The claim of `keyed`, which must be executed.
    async fn execute(&self, scope: &Scope, keyed: &Keyed) -> Claim {
        match self.decide(scope, keyed).await {
            Decision::Execute(claim) => claim,
            other => panic!("{} call not executed: {other:?}", keyed.source),
        }
    }

    /// The rejection of `keyed`, which must be of `kind`.
    async fn refused(&self, scope: &Scope, keyed: &Keyed, kind: RejectionKind) {
        match self.decide(scope, keyed).await {
            Decision::Reject(rejection) if rejection.kind() == kind => {}
            other => panic!("{} call: expected {kind:?}, got {other:?}", keyed.source),
        }
    }

    /// Records `text` as the outcome of `claim`.
    async fn finish(&self, claim: &Claim, text: &str) {
        let outcome =
            Outcome::Success(json!({"content": [{"type": "text", "text": text}]}).to_string());
        assert_eq!(
            self.dedup.complete(claim, outcome).await.expect("complete"),
            Fenced::Applied
        );
    }
}

/// The text of a replayed result (see [`Gateway::finish`]).
fn replayed_text(decision: Decision) -> String {
    match decision {
        Decision::Replay(Replay::Result(raw)) => {
            let result: Value = serde_json::from_str(&raw).expect("a JSON result");
            result["content"][0]["text"]
                .as_str()
                .expect("a text")
                .to_owned()
        }
        other => panic!("expected a replay, got {other:?}"),
    }
}

fn text_of(record: &Record) -> String {
    match &record.state {
        RecordState::Completed {
            outcome: Outcome::Success(raw),
            ..
        } => {
            let result: Value = serde_json::from_str(raw).expect("a JSON result");
            result["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        }
        other => panic!("expected a completed record, got {other:?}"),
    }
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0))
}

/// A key of each source keeps its prefix through claim, get, complete and delete: the record
/// comes back under exactly the key it was claimed with, the call again is answered from it, and
/// once deleted the call runs again.
pub async fn derived_keys_round_trip_with_their_source_prefix(store: Arc<dyn Store>) {
    let gateway = Gateway::new(&store, config(), &clock());
    let scope = scope();
    for (source, params) in params_of_each_source() {
        let keyed = gateway.keyed(&params);
        assert_eq!(keyed.source, source);
        let claim = gateway.execute(&scope, &keyed).await;
        let key = &claim.id().key;
        assert_eq!(key.source(), source);
        assert_eq!(key.as_str().starts_with(DERIVED), source != KeySource::Sep);
        assert!(!key.for_tool().contains(DERIVED), "{key:?}");
        assert_eq!(source.stored_key(key.for_tool()), key.as_str());

        let running = store.get(claim.id(), gateway.now()).await.unwrap();
        let running = running.expect("a running record");
        assert_eq!(running.id, *claim.id());
        assert_eq!(running.tool_name, keyed.tool);
        gateway.finish(&claim, source.as_str()).await;
        let done = store.get(claim.id(), gateway.now()).await.unwrap();
        let done = done.expect("a completed record");
        assert_eq!(done.id, *claim.id());
        assert_eq!(done.id.key.as_str(), claim.id().key.as_str());
        assert_eq!(text_of(&done), source.as_str());
        assert_eq!(
            replayed_text(gateway.decide(&scope, &keyed).await),
            source.as_str()
        );

        assert!(store.delete(claim.id()).await.unwrap());
        assert_eq!(store.get(claim.id(), gateway.now()).await.unwrap(), None);
        let again = gateway.execute(&scope, &keyed).await;
        assert_eq!(again.id(), claim.id());
    }
}

/// `list` returns derived keys exactly as stored, finds each by its stored key (and none by the
/// text after its prefix but the SEP record of that text), and filters by source; `stats` counts
/// them.
pub async fn derived_keys_are_listed_by_key_and_source(store: Arc<dyn Store>) {
    let gateway = Gateway::new(&store, config(), &clock());
    let scope = scope();
    let before = store.stats(gateway.now()).await.unwrap();
    let mut stored = Vec::new();
    for (source, params) in params_of_each_source() {
        let claim = gateway.execute(&scope, &gateway.keyed(&params)).await;
        if source != KeySource::Window {
            gateway.finish(&claim, source.as_str()).await;
        }
        stored.push((source, claim.id().key.as_str().to_owned()));
    }
    let now = gateway.now();
    let after = store.stats(now).await.unwrap();
    assert_eq!(after.completed - before.completed, 4);
    assert_eq!(after.in_progress - before.in_progress, 1);

    let in_scope = ListFilter {
        namespace: Some(scope.namespace().to_owned()),
        ..ListFilter::default()
    };
    let mut listed: Vec<(KeySource, String)> = list(&*store, &in_scope, now)
        .await
        .iter()
        .map(|record| (record.id.key.source(), record.id.key.as_str().to_owned()))
        .collect();
    listed.sort();
    let mut expected = stored.clone();
    expected.sort();
    assert_eq!(listed, expected);

    let exactly = |key: &str| ListFilter {
        key: Some(key.to_owned()),
        ..in_scope.clone()
    };
    for (source, key) in &stored {
        assert_eq!(
            keys(&list(&*store, &exactly(key), now).await),
            [key.as_str()]
        );
        // The one-record lookup of a scope and key (some stores read the record directly).
        let scoped = ListFilter {
            principal: Some(scope.principal().to_owned()),
            ..exactly(key)
        };
        assert_eq!(keys(&list(&*store, &scoped, now).await), [key.as_str()]);
        let by_source = ListFilter {
            sources: vec![*source],
            ..in_scope.clone()
        };
        assert_eq!(keys(&list(&*store, &by_source, now).await), [key.as_str()]);
    }
    // The text after a derived key's prefix names the SEP record of that text, and only it.
    assert_eq!(keys(&list(&*store, &exactly("k-1"), now).await), ["k-1"]);
    let clients = ListFilter {
        sources: vec![KeySource::Sep, KeySource::Meta],
        ..in_scope.clone()
    };
    let mut found: Vec<KeySource> = list(&*store, &clients, now)
        .await
        .iter()
        .map(|record| record.id.key.source())
        .collect();
    found.sort();
    assert_eq!(found, [KeySource::Sep, KeySource::Meta]);
    let running_windows = ListFilter {
        sources: vec![KeySource::Window, KeySource::KeyFrom],
        state: Some(StateFilter::InProgress),
        ..in_scope.clone()
    };
    let running = list(&*store, &running_windows, now).await;
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id.key.source(), KeySource::Window);
}

/// A client's key equal to the text after a derived key's prefix is another record: each runs
/// once and keeps its own outcome; and a client cannot send a derived key
/// itself (U+001F is a control character, refused).
pub async fn a_client_key_equal_to_a_derived_keys_text_is_another_record(store: Arc<dyn Store>) {
    let gateway = Gateway::new(&store, config(), &clock());
    let scope = scope();
    for (source, params) in params_of_each_source() {
        if source == KeySource::Sep {
            continue;
        }
        let derived = gateway.keyed(&params);
        let claim = gateway.execute(&scope, &derived).await;
        let text = claim.id().key.for_tool().to_owned();
        // The same tool and arguments under a SEP key reading as the derived key does.
        let mut sep_params = params.clone();
        sep_params["idempotencyKey"] = json!(text);
        if let Some(meta) = sep_params.as_object_mut() {
            meta.remove("_meta");
        }
        let mut sep = gateway.keyed(&sep_params);
        if sep.source != KeySource::Sep {
            // A business identifier decides over a client's key: key this one by the SEP alone.
            sep = Keyed {
                source: KeySource::Sep,
                value: Some(json!(text)),
                terms: KeyTerms::of(KeySource::Sep),
                ..sep
            };
        }
        let sep_claim = gateway.execute(&scope, &sep).await;
        assert_eq!(sep_claim.id().key.as_str(), text);
        assert_ne!(sep_claim.id(), claim.id());
        gateway.finish(&sep_claim, "sep").await;
        gateway.finish(&claim, source.as_str()).await;
        assert_eq!(
            replayed_text(gateway.decide(&scope, &derived).await),
            source.as_str()
        );
        assert_eq!(replayed_text(gateway.decide(&scope, &sep).await), "sep");
        let record = store.get(sep_claim.id(), gateway.now()).await.unwrap();
        assert_eq!(text_of(&record.expect("the SEP record")), "sep");

        // The stored form of the derived key, sent as a client's key, is refused.
        let forged = Keyed {
            source: KeySource::Sep,
            value: Some(json!(claim.id().key.as_str())),
            terms: KeyTerms::of(KeySource::Sep),
            ..gateway.keyed(&sep_params)
        };
        gateway
            .refused(&scope, &forged, RejectionKind::KeyInvalid)
            .await;
    }
}

/// The same derived key under two principals, or two namespaces, names two records: completing
/// one leaves the others running, and each scope lists only its own.
pub async fn derived_keys_keep_principals_apart(store: Arc<dyn Store>) {
    let gateway = Gateway::new(&store, config(), &clock());
    let alice = scope();
    let bob = Scope::new(alice.namespace(), "bob");
    let elsewhere = Scope::new(format!("{}-other", alice.namespace()), alice.principal());
    for (source, params) in params_of_each_source() {
        let keyed = gateway.keyed(&params);
        let claims = [
            gateway.execute(&alice, &keyed).await,
            gateway.execute(&bob, &keyed).await,
            gateway.execute(&elsewhere, &keyed).await,
        ];
        assert_eq!(claims[0].id().key, claims[1].id().key);
        gateway.finish(&claims[0], "alice").await;
        assert_eq!(replayed_text(gateway.decide(&alice, &keyed).await), "alice");
        for (scope, claim) in [(&bob, &claims[1]), (&elsewhere, &claims[2])] {
            gateway
                .refused(scope, &keyed, RejectionKind::KeyInProgress)
                .await;
            let record = store.get(claim.id(), gateway.now()).await.unwrap();
            assert!(
                matches!(record.map(|r| r.state), Some(RecordState::InProgress { owner, .. }) if owner == claim.owner()),
                "{source}"
            );
        }
    }
    for (scope, state) in [
        (&alice, StateFilter::Completed),
        (&bob, StateFilter::InProgress),
    ] {
        let only = ListFilter {
            namespace: Some(scope.namespace().to_owned()),
            principal: Some(scope.principal().to_owned()),
            ..ListFilter::default()
        };
        let records = list(&*store, &only, gateway.now()).await;
        assert_eq!(records.len(), 5, "{scope:?}");
        assert!(records
            .iter()
            .all(|record| record.id.scope == *scope && state.matches(record, gateway.now())));
    }
}

/// A scope's quota counts derived keys as it counts SEP keys: a full scope refuses a new key of
/// any source, other scopes go on, and a released record or an ended window makes room.
pub async fn quotas_count_derived_keys(store: Arc<dyn Store>) {
    let clock = clock();
    let gateway = Gateway::new(&store, config().with_max_records_per_scope(2), &clock);
    let full = scope();
    let other = Scope::new(full.namespace(), "someone-else");
    let [key_from, sep, meta, argument, window] =
        params_of_each_source().map(|(_, params)| gateway.keyed(&params));

    let first = gateway.execute(&full, &key_from).await;
    let windowed = gateway.execute(&full, &window).await;
    for keyed in [&meta, &argument, &sep] {
        gateway
            .refused(&full, keyed, RejectionKind::QuotaExceeded)
            .await;
    }
    // Keys that hold a record are still answered.
    gateway
        .refused(&full, &key_from, RejectionKind::KeyInProgress)
        .await;
    let _ = gateway.execute(&other, &meta).await;

    assert_eq!(
        gateway.dedup.release(&first).await.unwrap(),
        Fenced::Applied
    );
    let _ = gateway.execute(&full, &meta).await;
    gateway
        .refused(&full, &argument, RejectionKind::QuotaExceeded)
        .await;
    // The window's record ends with its window and no longer counts.
    gateway.finish(&windowed, "pong").await;
    clock.advance(WINDOW);
    let _ = gateway.execute(&full, &argument).await;
}

/// The crash rules hold for derived keys: within the lease a duplicate is refused as in
/// progress; after it, `after-crash = reject` answers outcome-unknown and `reexecute` takes the
/// record over, fencing the dead owner off.
pub async fn crash_rules_hold_for_derived_keys(store: Arc<dyn Store>) {
    let clock = clock();
    let rejecting = Gateway::new(
        &store,
        config().with_after_crash(AfterCrash::Reject),
        &clock,
    );
    let reexecuting = Gateway::new(
        &store,
        config().with_after_crash(AfterCrash::Reexecute),
        &clock,
    );
    let scope = scope();
    let mut dead = Vec::new();
    for (source, params) in params_of_each_source() {
        let keyed = rejecting.keyed(&params);
        dead.push((source, rejecting.execute(&scope, &keyed).await, keyed));
    }
    for (_, _, keyed) in &dead {
        rejecting
            .refused(&scope, keyed, RejectionKind::KeyInProgress)
            .await;
    }
    clock.advance(LEASE);
    for (source, claim, keyed) in &dead {
        rejecting
            .refused(&scope, keyed, RejectionKind::OutcomeUnknown)
            .await;
        let taken = reexecuting.execute(&scope, keyed).await;
        assert_eq!(taken.id(), claim.id(), "{source}");
        assert_ne!(taken.owner(), claim.owner());
        let late = Outcome::Success("\"late\"".into());
        assert_eq!(
            rejecting.dedup.complete(claim, late).await.unwrap(),
            Fenced::NotOwner,
            "{source}"
        );
        reexecuting.finish(&taken, "taken over").await;
        assert_eq!(
            replayed_text(rejecting.decide(&scope, keyed).await),
            "taken over"
        );
    }
}

/// A window's record is kept for its window, not the configured retention: while it runs it
/// outlives its lease and the window, once completed it ends one window after completion, and the
/// same call then runs again. Every other source keeps the configured retention.
pub async fn a_window_keys_record_expires_with_its_window(store: Arc<dyn Store>) {
    let clock = clock();
    let gateway = Gateway::new(&store, config(), &clock);
    let scope = scope();
    let mut claims = Vec::new();
    for (source, params) in params_of_each_source() {
        let keyed = gateway.keyed(&params);
        let claim = gateway.execute(&scope, &keyed).await;
        let running = store.get(claim.id(), T0).await.unwrap().expect("running");
        let while_running = if source == KeySource::Window {
            WINDOW.max(LEASE)
        } else {
            RETENTION
        };
        assert_eq!(running.expires_at, T0.saturating_add(while_running));
        claims.push((source, claim, keyed));
    }
    clock.advance(Duration::from_secs(5));
    let completed_at = gateway.now();
    for (source, claim, _) in &claims {
        gateway.finish(claim, source.as_str()).await;
        let record = store.get(claim.id(), completed_at).await.unwrap();
        let retention = if *source == KeySource::Window {
            WINDOW
        } else {
            RETENTION
        };
        assert_eq!(
            record.expect("completed").expires_at,
            completed_at.saturating_add(retention),
            "{source}"
        );
    }
    let window_ends = completed_at.saturating_add(WINDOW);
    let (_, window_claim, window_call) = claims.pop().expect("the window's call");
    let just_before = Timestamp::from_millis(window_ends.as_millis() - 1);
    assert!(store
        .get(window_claim.id(), just_before)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        store.get(window_claim.id(), window_ends).await.unwrap(),
        None
    );
    clock.advance(WINDOW - Duration::from_millis(1));
    assert_eq!(
        replayed_text(gateway.decide(&scope, &window_call).await),
        "window"
    );
    clock.advance(Duration::from_millis(1));
    let expired = ListFilter {
        namespace: Some(scope.namespace().to_owned()),
        state: Some(StateFilter::Expired),
        ..ListFilter::default()
    };
    assert_eq!(
        keys(&list(&*store, &expired, gateway.now()).await),
        [window_claim.id().key.as_str()]
    );
    let again = gateway.execute(&scope, &window_call).await;
    assert_eq!(again.id(), window_claim.id());
    for (source, _, keyed) in &claims {
        assert_eq!(
            replayed_text(gateway.decide(&scope, keyed).await),
            source.as_str()
        );
    }
}
