//! The default scope of a server's records, one rule for every form (`wrap`, the bindings,
//! [`idempotent_stdio`](crate::stdio::idempotent_stdio)): the namespace is
//! [`server_namespace`]`(name)`, `name` being the server's own `serverInfo.name` (from its
//! `initialize` or `server/discover` result); the principal is the local user on stdio and the
//! authenticated client on HTTP. A server moved from one form to another keeps its records.
//!
//! Before this rule, `wrap` kept records under [`wrap_legacy_namespace`] and the in-process stdio
//! adapter under [`embedded_legacy_namespace`]. Those forms read records there through
//! [`LegacyNamespaceReads`], so an upgrade strands no record; they no longer decide under them
//! (a call before the server named itself waits until it has, see
//! [`StdioProxy::namespace_from_server`](crate::stdio::StdioProxy::namespace_from_server)).
//!
//! `mcp-idem proxy` learns the name from its upstream itself (its own `server/discover`, else
//! `initialize`) into a [`LearnedNamespace`], which its HTTP layer waits for before deciding a
//! call; it reads the records it kept before under [`upstream_namespace`]. The HTTP layer alone
//! keeps [`HTTP_LAYER_NAMESPACE`]: give it the namespace [`server_namespace`] returns to share
//! records with the other forms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::record::{FencingToken, Record, RecordId, Scope};
use crate::store::{
    ClaimOutcome, ClaimRequest, CompleteRequest, Fenced, ListFilter, Store, StoreFuture,
    StoreStats, TakeOverRequest,
};
use crate::time::Timestamp;

/// The default namespace of the server named `server_name` (its `serverInfo.name`):
/// `mcp-server:<server_name>`.
pub fn server_namespace(server_name: &str) -> String {
    format!("mcp-server:{server_name}")
}

/// The namespace `mcp-idem proxy` used by default before it learned its upstream's name, whose
/// records it still reads, and still uses for an upstream that will not give its name to the
/// proxy (one that wants credentials): `http:<upstream URL as written>`.
pub fn upstream_namespace(upstream_url: &str) -> String {
    format!("http:{upstream_url}")
}

/// The namespace of an [`IdempotencyLayer`](crate::http::IdempotencyLayer) given none:
/// `"default"`.
pub const HTTP_LAYER_NAMESPACE: &str = "default";

/// A namespace a gateway learns after it starts (`mcp-idem proxy`: its upstream's name, asked for
/// in the background until the upstream answers): the layer deciding calls waits for it, and
/// refuses a call rather than decide it elsewhere when it does not come in time. Cloned, it is
/// the same namespace.
#[derive(Clone, Debug)]
pub struct LearnedNamespace {
    learned: tokio::sync::watch::Receiver<Option<Arc<str>>>,
}

/// Sets the namespace of a [`LearnedNamespace`], once.
#[derive(Debug)]
pub struct NamespaceLearner {
    set: tokio::sync::watch::Sender<Option<Arc<str>>>,
}

impl LearnedNamespace {
    /// A namespace not learned yet, and what sets it.
    pub fn new() -> (NamespaceLearner, Self) {
        let (set, learned) = tokio::sync::watch::channel(None);
        (NamespaceLearner { set }, Self { learned })
    }

    /// The namespace, once learned.
    pub fn get(&self) -> Option<Arc<str>> {
        self.learned.borrow().clone()
    }

    /// The namespace, waiting for it up to `timeout`; `None` if it did not come by then (or its
    /// learner is gone without setting it).
    pub async fn wait(&self, timeout: Duration) -> Option<Arc<str>> {
        if let Some(namespace) = self.get() {
            return Some(namespace);
        }
        let mut learned = self.learned.clone();
        let waited = tokio::time::timeout(timeout, learned.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(namespace)) => namespace.clone(),
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

impl NamespaceLearner {
    /// Sets the namespace (the first one set stays).
    pub fn set(&self, namespace: impl Into<Arc<str>>) {
        let namespace = namespace.into();
        self.set.send_if_modified(|learned| {
            if learned.is_some() {
                return false;
            }
            *learned = Some(namespace);
            true
        });
    }
}

/// Longest a keyed call waits for the server's name where the records are kept under it (a server
/// that starts slowly, a first `npx -y`, answers its first request late); past it the call is
/// refused with `idempotency_scope_unknown`, not run.
pub const SERVER_NAME_TIMEOUT: Duration = Duration::from_secs(60);

/// The default principal on stdio: the local user running the server (`$USER`, else
/// `$USERNAME`, else `local-user`).
pub fn local_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "local-user".into())
}

/// The default principal of a request an HTTP server authenticated as the OAuth client
/// `client_id` (the bindings read it from their SDK's access token): `client:<client_id>`.
pub fn client_principal(client_id: &str) -> String {
    format!("client:{client_id}")
}

/// The namespace `mcp-idem wrap` used by default before [`server_namespace`], whose records it
/// still reads: `wrap:<program name>:<hash of the whole command line>`, `command` being the
/// program and its arguments.
pub fn wrap_legacy_namespace(command: &[String]) -> String {
    let mut hasher = Sha256::new();
    for arg in command {
        hasher.update((arg.len() as u64).to_le_bytes());
        hasher.update(arg.as_bytes());
    }
    let digest = hasher.finalize();
    let program = command
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("wrap:{program}:{hash}")
}

/// The namespace [`idempotent_stdio`](crate::stdio::idempotent_stdio) used by default before
/// [`server_namespace`], whose records it still reads: `embedded:<name of this executable>`.
pub fn embedded_legacy_namespace() -> String {
    let exe = std::env::current_exe().ok();
    let name = exe
        .as_deref()
        .and_then(|path| path.file_stem())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "server".into());
    format!("embedded:{name}")
}

/// A [`Store`] that also finds the records a form kept under its legacy namespace: a claim
/// under another namespace first reads the record of the same principal and key under the
/// legacy one, and when there is one, answers with it ([`ClaimOutcome::Existing`]), so the engine
/// decides on it exactly as on a record of the claim's own namespace (replay, conflict, in
/// progress, outcome unknown). A fenced write (complete, take-over, renew, release) the store
/// refuses under the claim's namespace is tried under the legacy one, so a running legacy record
/// taken over after a crash gets its outcome.
///
/// The extra read is done only while the store may hold legacy records: when
/// [`open`](Self::open) found a live one of the principal, or once this process claimed under
/// the legacy namespace itself. Otherwise every operation goes straight to the wrapped store. It
/// stops mattering once the legacy records have expired (retention).
#[derive(Debug)]
pub struct LegacyNamespaceReads {
    inner: Arc<dyn Store>,
    legacy: Arc<str>,
    active: AtomicBool,
}

impl LegacyNamespaceReads {
    /// Wraps `inner` for records kept under `legacy_namespace`, of `principal` (or of any, for
    /// a gateway that scopes by caller); looks once whether the store holds one live at `now`
    /// (the deduplicator's clock; a store that cannot answer is assumed to).
    pub async fn open(
        inner: Arc<dyn Store>,
        legacy_namespace: &str,
        principal: Option<&str>,
        now: Timestamp,
    ) -> Self {
        let filter = ListFilter {
            namespace: Some(legacy_namespace.to_owned()),
            principal: principal.map(str::to_owned),
            ..ListFilter::default()
        };
        // Latest `expires_at` first: if the first one is expired, all are.
        let active = match inner.list(&filter, now, 1).await {
            Ok(records) => records.iter().any(|record| !record.is_expired(now)),
            Err(err) => {
                tracing::debug!(error = %err, "cannot look for records under the legacy namespace; reading them");
                true
            }
        };
        if active {
            tracing::info!(
                namespace = legacy_namespace,
                "records under the legacy namespace are read too until they expire"
            );
        }
        Self {
            inner,
            legacy: legacy_namespace.into(),
            active: AtomicBool::new(active),
        }
    }

    /// Whether claims read the legacy namespace too.
    pub fn reads_legacy(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// The legacy record that stands for `id` while legacy reads are on.
    fn legacy_id(&self, id: &RecordId) -> Option<RecordId> {
        (self.reads_legacy() && id.scope.namespace() != &*self.legacy).then(|| RecordId {
            scope: Scope::new(Arc::clone(&self.legacy), id.scope.principal()),
            key: id.key.clone(),
        })
    }

    /// `first`, then `write(legacy)` if the store refused the first (the claim's record may be
    /// the legacy one).
    fn or_legacy<'a, F>(
        first: StoreFuture<'a, Fenced>,
        legacy: RecordId,
        write: F,
    ) -> StoreFuture<'a, Fenced>
    where
        F: FnOnce(RecordId) -> StoreFuture<'a, Fenced> + Send + 'a,
    {
        Box::pin(async move {
            match first.await? {
                Fenced::NotOwner => write(legacy).await,
                applied => Ok(applied),
            }
        })
    }
}

impl Store for LegacyNamespaceReads {
    fn system(&self) -> Option<&'static str> {
        self.inner.system()
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> StoreFuture<'a, ClaimOutcome> {
        if req.id.scope.namespace() == &*self.legacy {
            self.active.store(true, Ordering::Relaxed);
        }
        let Some(legacy) = self.legacy_id(&req.id) else {
            return self.inner.claim(req);
        };
        Box::pin(async move {
            match self.inner.get(&legacy, req.now).await? {
                Some(record) => Ok(ClaimOutcome::Existing(record)),
                None => self.inner.claim(req).await,
            }
        })
    }

    fn complete(&self, req: CompleteRequest) -> StoreFuture<'_, Fenced> {
        let Some(legacy) = self.legacy_id(&req.id) else {
            return self.inner.complete(req);
        };
        let first = self.inner.complete(req.clone());
        Self::or_legacy(first, legacy, move |id| {
            self.inner.complete(CompleteRequest { id, ..req })
        })
    }

    fn take_over<'a>(&'a self, req: &'a TakeOverRequest) -> StoreFuture<'a, Fenced> {
        let Some(legacy) = self.legacy_id(&req.id) else {
            return self.inner.take_over(req);
        };
        Self::or_legacy(self.inner.take_over(req), legacy, move |id| {
            let req = TakeOverRequest { id, ..req.clone() };
            Box::pin(async move { self.inner.take_over(&req).await })
        })
    }

    fn renew<'a>(
        &'a self,
        id: &'a RecordId,
        owner: FencingToken,
        lease_expires_at: Timestamp,
    ) -> StoreFuture<'a, Fenced> {
        let Some(legacy) = self.legacy_id(id) else {
            return self.inner.renew(id, owner, lease_expires_at);
        };
        Self::or_legacy(
            self.inner.renew(id, owner, lease_expires_at),
            legacy,
            move |id| Box::pin(async move { self.inner.renew(&id, owner, lease_expires_at).await }),
        )
    }

    fn release<'a>(&'a self, id: &'a RecordId, owner: FencingToken) -> StoreFuture<'a, Fenced> {
        let Some(legacy) = self.legacy_id(id) else {
            return self.inner.release(id, owner);
        };
        Self::or_legacy(self.inner.release(id, owner), legacy, move |id| {
            Box::pin(async move { self.inner.release(&id, owner).await })
        })
    }

    fn get<'a>(&'a self, id: &'a RecordId, now: Timestamp) -> StoreFuture<'a, Option<Record>> {
        self.inner.get(id, now)
    }

    fn purge_expired(&self, now: Timestamp) -> StoreFuture<'_, u64> {
        self.inner.purge_expired(now)
    }

    fn stats(&self, now: Timestamp) -> StoreFuture<'_, StoreStats> {
        self.inner.stats(now)
    }

    fn list<'a>(
        &'a self,
        filter: &'a ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> StoreFuture<'a, Vec<Record>> {
        self.inner.list(filter, now, limit)
    }

    fn delete<'a>(&'a self, id: &'a RecordId) -> StoreFuture<'a, bool> {
        self.inner.delete(id)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fingerprint::fingerprint;
    use crate::key::IdempotencyKey;
    use crate::record::{Outcome, RecordState};
    use crate::store::{MemoryStore, RecordLimits};

    const LEGACY: &str = "wrap:server:0011223344556677";

    #[test]
    fn the_rule_names_the_server() {
        assert_eq!(server_namespace("payments"), "mcp-server:payments");
        assert_eq!(client_principal("app-1"), "client:app-1");
    }

    #[test]
    fn wraps_legacy_namespaces_differ_per_command_line() {
        let a = wrap_legacy_namespace(&["python".into(), "server.py".into()]);
        let b = wrap_legacy_namespace(&["python".into(), "other.py".into()]);
        let c = wrap_legacy_namespace(&["python server.py".into()]);
        assert!(a.starts_with("wrap:python:"));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a,
            wrap_legacy_namespace(&["python".into(), "server.py".into()])
        );
        // The format of the released `wrap`: records it wrote are still found under it.
        assert_eq!(
            wrap_legacy_namespace(&["/usr/bin/python3".into(), "server.py".into()]),
            "wrap:python3:d9b9f2c799ba14ea"
        );
    }

    fn claim(namespace: &str, key: &str, arguments: &str, now: Timestamp) -> ClaimRequest {
        ClaimRequest {
            trace: None,
            id: RecordId {
                scope: Scope::new(namespace, "alice"),
                key: IdempotencyKey::from_json(&key.into(), 255).unwrap(),
            },
            fingerprint: fingerprint("charge", Some(arguments)).unwrap(),
            tool_name: "charge".into(),
            owner: FencingToken::random(),
            now,
            lease_expires_at: now.saturating_add(Duration::from_secs(30)),
            expires_at: now.saturating_add(Duration::from_secs(3600)),
            limits: RecordLimits::UNLIMITED,
        }
    }

    async fn complete(store: &dyn Store, req: &ClaimRequest, outcome: &str) -> Fenced {
        store
            .complete(CompleteRequest {
                id: req.id.clone(),
                owner: req.owner,
                outcome: Outcome::Success(outcome.into()),
                completed_at: req.now,
                expires_at: req.expires_at,
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_record_under_the_legacy_namespace_answers_a_claim_under_the_new_one() {
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let now = Timestamp::now();
        let old = claim(LEGACY, "k", "{}", now);
        assert_eq!(memory.claim(&old).await.unwrap(), ClaimOutcome::Claimed);
        assert_eq!(complete(&*memory, &old, "\"done\"").await, Fenced::Applied);

        let store = LegacyNamespaceReads::open(
            Arc::clone(&memory),
            LEGACY,
            Some("alice"),
            Timestamp::now(),
        )
        .await;
        assert!(store.reads_legacy());
        let new = claim("mcp-server:payments", "k", "{}", now);
        let ClaimOutcome::Existing(record) = store.claim(&new).await.unwrap() else {
            panic!("the legacy record was not found")
        };
        assert!(matches!(record.state, RecordState::Completed { .. }));
        assert_eq!(record.id, old.id);
        // Another principal's claim does not see it.
        let mut bob = claim("mcp-server:payments", "k", "{}", now);
        bob.id.scope = Scope::new("mcp-server:payments", "bob");
        assert_eq!(store.claim(&bob).await.unwrap(), ClaimOutcome::Claimed);
    }

    #[tokio::test]
    async fn without_legacy_records_claims_go_straight_to_the_store_until_one_is_made() {
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let store = LegacyNamespaceReads::open(
            Arc::clone(&memory),
            LEGACY,
            Some("alice"),
            Timestamp::now(),
        )
        .await;
        assert!(!store.reads_legacy());
        let now = Timestamp::now();
        let early = claim(LEGACY, "early", "{}", now);
        assert_eq!(store.claim(&early).await.unwrap(), ClaimOutcome::Claimed);
        assert!(store.reads_legacy());
        let later = claim("mcp-server:payments", "early", "{}", now);
        assert!(matches!(
            store.claim(&later).await.unwrap(),
            ClaimOutcome::Existing(_)
        ));
    }

    #[tokio::test]
    async fn expired_legacy_records_do_not_turn_the_reads_on() {
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let long_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 7_200_000);
        let old = claim(LEGACY, "k", "{}", long_ago);
        assert_eq!(memory.claim(&old).await.unwrap(), ClaimOutcome::Claimed);
        assert_eq!(complete(&*memory, &old, "1").await, Fenced::Applied);
        let store =
            LegacyNamespaceReads::open(memory, LEGACY, Some("alice"), Timestamp::now()).await;
        assert!(!store.reads_legacy());
    }

    #[tokio::test]
    async fn a_dead_legacy_claim_taken_over_gets_its_outcome() {
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let now = Timestamp::now();
        let mut old = claim(LEGACY, "k", "{}", now);
        old.lease_expires_at = now;
        assert_eq!(memory.claim(&old).await.unwrap(), ClaimOutcome::Claimed);
        let store = LegacyNamespaceReads::open(
            Arc::clone(&memory),
            LEGACY,
            Some("alice"),
            Timestamp::now(),
        )
        .await;
        let later = now.saturating_add(Duration::from_secs(1));
        let new = claim("mcp-server:payments", "k", "{}", later);
        assert!(matches!(
            store.claim(&new).await.unwrap(),
            ClaimOutcome::Existing(_)
        ));
        let take_over = TakeOverRequest {
            trace: None,
            id: new.id.clone(),
            previous_owner: old.owner,
            new_owner: new.owner,
            now: later,
            lease_expires_at: new.lease_expires_at,
            expires_at: new.expires_at,
        };
        assert_eq!(store.take_over(&take_over).await.unwrap(), Fenced::Applied);
        let renewed = store
            .renew(&new.id, new.owner, new.lease_expires_at)
            .await
            .unwrap();
        assert_eq!(renewed, Fenced::Applied);
        assert_eq!(complete(&store, &new, "2").await, Fenced::Applied);
        let record = memory.get(&old.id, later).await.unwrap().unwrap();
        assert!(matches!(record.state, RecordState::Completed { .. }));
    }

    crate::store_test_suite!(|| async {
        Arc::new(LegacyNamespaceReads {
            inner: Arc::new(MemoryStore::new()),
            legacy: LEGACY.into(),
            active: AtomicBool::new(true),
        }) as Arc<dyn Store>
    });
}
