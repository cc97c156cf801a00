//! [`RetryPolicy`]: how often, how long and how far apart a call is retried.

use std::time::Duration;

/// How a [`Client`](super::Client) retries a call whose outcome it did not get.
///
/// A retry always reuses the call's idempotency key, and happens only when it is safe: the server
/// advertises `tools.idempotency` (it will replay or refuse rather than run the tool twice), or
/// [`trust_idempotent_hint`](Self::with_trust_idempotent_hint) is on and the tool is annotated
/// `idempotentHint: true`. Which failures are retried is described in the
/// [module docs](super#retry-rules).
///
/// Every request sent counts as an attempt, including ones answered with
/// `idempotency_key_in_progress`, and so does a failed attempt to (re)connect. The defaults:
///
/// | setting | default |
/// |---|---|
/// | [`max_attempts`](Self::with_max_attempts) | 5 (the first try and 4 retries) |
/// | [`max_elapsed`](Self::with_max_elapsed) | 2 minutes, from the start of the call to the end of the last attempt |
/// | [`attempt_timeout`](Self::with_attempt_timeout) | 30 seconds to wait for one response |
/// | [`connect_timeout`](Self::with_connect_timeout) | 30 seconds to open a session, when one is needed |
/// | [`backoff`](Self::with_backoff) | 200 ms, doubling, at most 10 s |
/// | [`jitter`](Self::with_jitter) | on: each wait is drawn from [½ delay, delay] |
/// | [`trust_idempotent_hint`](Self::with_trust_idempotent_hint) | off |
///
/// When the server answers `idempotency_key_in_progress` or `idempotency_store_unavailable` with
/// `data.retryAfterMs`, the next attempt waits that long (plus up to a quarter more, with
/// jitter) instead of the backoff delay. A tool that runs longer than the attempt timeout keeps
/// answering "in progress" until it finishes: raise [`attempt_timeout`](Self::with_attempt_timeout) for
/// slow tools rather than [`max_attempts`](Self::with_max_attempts).
///
/// ```
/// use std::time::Duration;
/// use mcp_idempotency::client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .with_max_attempts(8)
///     .with_attempt_timeout(Duration::from_secs(10))
///     .with_max_elapsed(Duration::from_secs(60));
/// assert_eq!(policy.max_attempts(), 8);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    max_elapsed: Duration,
    attempt_timeout: Duration,
    connect_timeout: Duration,
    initial_backoff: Duration,
    max_backoff: Duration,
    jitter: bool,
    trust_idempotent_hint: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            max_elapsed: Duration::from_secs(120),
            attempt_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            jitter: true,
            trust_idempotent_hint: false,
        }
    }
}

impl RetryPolicy {
    /// One attempt, never retried; the other settings are the defaults.
    pub fn no_retries() -> Self {
        Self::default().with_max_attempts(1)
    }

    /// At most `attempts` requests (at least 1).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// No new attempt, and no wait for a response, past `elapsed` after the call started.
    pub fn with_max_elapsed(mut self, elapsed: Duration) -> Self {
        self.max_elapsed = elapsed;
        self
    }

    /// How long one attempt waits for its response before it counts as lost. rmcp then sends
    /// `notifications/cancelled`; a SEP-3182 server lets the call finish and replays it to the
    /// retry.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long an attempt may take to open a session (start the server, handshake) when it
    /// needs one. Nothing has been sent yet, so a connection that times out is retried.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Exponential backoff: the first retry waits `initial`, each next one twice as long, never
    /// more than `max`.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Draw each wait at random from [½ delay, delay] (default on), so that clients failing
    /// together do not retry together.
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// Also retry calls to a server that does not advertise `tools.idempotency`, when the tool is
    /// annotated `idempotentHint: true` (default off). Such a retry may run the tool again: the
    /// annotation, not the server, promises that this is harmless.
    pub fn with_trust_idempotent_hint(mut self, trust: bool) -> Self {
        self.trust_idempotent_hint = trust;
        self
    }

    /// See [`with_max_attempts`](Self::with_max_attempts).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// See [`with_max_elapsed`](Self::with_max_elapsed).
    pub fn max_elapsed(&self) -> Duration {
        self.max_elapsed
    }

    /// See [`with_attempt_timeout`](Self::with_attempt_timeout).
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// See [`with_connect_timeout`](Self::with_connect_timeout).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// See [`with_trust_idempotent_hint`](Self::with_trust_idempotent_hint).
    pub fn trust_idempotent_hint(&self) -> bool {
        self.trust_idempotent_hint
    }

    /// How long to wait before retry number `retry` (1 for the first retry), given the server's
    /// `retryAfterMs` hint if it sent one.
    pub(crate) fn delay(&self, retry: u32, server_hint: Option<Duration>) -> Duration {
        match server_hint {
            Some(hint) if self.jitter => hint + random_up_to(hint / 4),
            Some(hint) => hint,
            None => {
                let doublings = retry.saturating_sub(1).min(31);
                let delay = self
                    .initial_backoff
                    .saturating_mul(1 << doublings)
                    .min(self.max_backoff);
                if self.jitter {
                    delay / 2 + random_up_to(delay / 2)
                } else {
                    delay
                }
            }
        }
    }
}

/// A duration drawn uniformly from [0, max].
fn random_up_to(max: Duration) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rand::random::<u64>() % (nanos + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_without_jitter() {
        let policy = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(700))
            .with_jitter(false);
        let delays: Vec<_> = (1..=5).map(|n| policy.delay(n, None).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 700, 700]);
        assert_eq!(policy.delay(1000, None), Duration::from_millis(700));
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_delay() {
        let policy =
            RetryPolicy::default().with_backoff(Duration::from_millis(400), Duration::from_secs(1));
        for _ in 0..200 {
            let delay = policy.delay(1, None);
            assert!(delay >= Duration::from_millis(200) && delay <= Duration::from_millis(400));
        }
    }

    #[test]
    fn the_server_hint_replaces_the_backoff() {
        let hint = Some(Duration::from_millis(1000));
        let exact = RetryPolicy::default().with_jitter(false);
        assert_eq!(exact.delay(4, hint), Duration::from_millis(1000));
        let jittered = RetryPolicy::default();
        for _ in 0..200 {
            let delay = jittered.delay(4, hint);
            assert!(delay >= Duration::from_millis(1000) && delay <= Duration::from_millis(1250));
        }
    }

    #[test]
    fn at_least_one_attempt() {
        assert_eq!(
            RetryPolicy::default().with_max_attempts(0).max_attempts(),
            1
        );
        assert_eq!(RetryPolicy::no_retries().max_attempts(), 1);
    }
}
