//! [`Gateways`]: the gateways a process opened, one per namespace and options, and what they do
//! as the process exits.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::{Embedded, Settings, SetupError};
use crate::stdio::DEFAULT_SHUTDOWN_GRACE;

/// The namespace and the options set: servers built per request or per session with the same
/// ones share one gateway, and so one store connection.
type Identity = (String, BTreeMap<&'static str, String>);

/// The gateways a process opened, by namespace and options (a binding keeps one of these).
#[derive(Debug, Default)]
pub struct Gateways {
    opened: Mutex<Vec<(Identity, Embedded)>>,
}

impl Gateways {
    /// None opened yet.
    pub const fn new() -> Self {
        Self {
            opened: Mutex::new(Vec::new()),
        }
    }

    /// The gateway of `settings`' namespace and options: the one opened before, or a new one
    /// (see [`Settings::open`]).
    pub async fn open(&self, settings: Settings) -> Result<Embedded, SetupError> {
        let identity = settings.identity();
        if let Some(gateway) = self.find(&identity) {
            return Ok(gateway);
        }
        let opened = settings.open().await?;
        let mut all = self.lock();
        // Opened meanwhile by another thread: that one is kept, this one closed.
        if let Some((_, gateway)) = all.iter().find(|(known, _)| *known == identity) {
            return Ok(gateway.clone());
        }
        all.push((identity, opened.clone()));
        Ok(opened)
    }

    /// As the process exits: waits up to [`DEFAULT_SHUTDOWN_GRACE`] in all for the outcomes
    /// every gateway still sends again to its store; returns how many are still pending. The
    /// grace is `wrap`'s default `--shutdown-grace`, so that an outcome a server keeps behind
    /// `wrap` it keeps in process too (the Python SDK's stdio client kills its server 4 s after
    /// closing its input: a longer wait would be cut short).
    pub async fn settle_at_exit(&self) -> usize {
        let gateways: Vec<Embedded> = self.lock().iter().map(|(_, g)| g.clone()).collect();
        let deadline = Instant::now() + DEFAULT_SHUTDOWN_GRACE;
        let mut pending = 0;
        for gateway in gateways {
            pending += gateway
                .settle(deadline.saturating_duration_since(Instant::now()))
                .await;
        }
        #[cfg(feature = "otel")]
        super::host::flush_telemetry(deadline.saturating_duration_since(Instant::now())).await;
        pending
    }

    /// Whether no gateway was opened.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn find(&self, identity: &Identity) -> Option<Embedded> {
        let all = self.lock();
        let found = all.iter().find(|(known, _)| known == identity);
        found.map(|(_, gateway)| gateway.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(Identity, Embedded)>> {
        self.opened.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(namespace: &str, options: &[(&str, &str)]) -> Settings {
        let mut settings = Settings::new(namespace);
        settings.set("store", "memory").unwrap();
        for (name, value) in options {
            settings.set(name, value).unwrap();
        }
        settings
    }

    #[tokio::test]
    async fn the_same_namespace_and_options_share_a_gateway_whatever_their_spelling() {
        let gateways = Gateways::new();
        assert!(gateways.is_empty());
        let first = gateways
            .open(settings("n", &[("max_key_bytes", "64")]))
            .await
            .unwrap();
        let same = gateways
            .open(settings("n", &[("maxKeyBytes", "64")]))
            .await
            .unwrap();
        let other_options = gateways
            .open(settings("n", &[("max-key-bytes", "65")]))
            .await
            .unwrap();
        let other_namespace = gateways
            .open(settings("m", &[("max-key-bytes", "64")]))
            .await
            .unwrap();
        assert_eq!(first, same);
        assert_ne!(first, other_options);
        assert_ne!(first, other_namespace);
        assert_eq!(gateways.settle_at_exit().await, 0);
    }
}
