pub(crate) mod bridge;
pub(crate) mod call;
pub(crate) mod check;
pub(crate) mod config_check;
pub(crate) mod demo;
pub(crate) mod demo_server;
mod demo_server_http;
pub(crate) mod engine_args;
pub(crate) mod inspect;
pub(crate) mod policy_args;
pub(crate) mod proxy;
pub(crate) mod scope_args;
pub(crate) mod server_args;
pub(crate) mod tools;
pub(crate) mod wrap;

/// `stop`, noting in the returned cell when it fired: the start of the shutdown grace, for
/// [`settle_completions`].
pub(crate) fn noting_when<F: std::future::Future<Output = ()>>(
    stop: F,
) -> (
    impl std::future::Future<Output = ()>,
    std::sync::Arc<std::sync::OnceLock<std::time::Instant>>,
) {
    let began = std::sync::Arc::new(std::sync::OnceLock::new());
    let noted = std::sync::Arc::clone(&began);
    let stop = async move {
        stop.await;
        let _ = noted.set(std::time::Instant::now());
    };
    (stop, began)
}

/// After a graceful stop: waits, for what is left of `grace` since `began` (the stop signal;
/// counted from now if the run ended otherwise), for the completions the deduplicator still
/// sends again in the background because the store failed them (the library's
/// [`settle_completions`](mcp_idempotency::upkeep::settle_completions), as the bindings' at exit).
pub(crate) async fn settle_completions(
    dedup: &mcp_idempotency::Deduplicator,
    grace: std::time::Duration,
    began: Option<std::time::Instant>,
) {
    mcp_idempotency::upkeep::settle_completions(dedup, grace_left(grace, began)).await;
}

/// What is left of the shutdown `grace` of a stop that `began` (all of it when none began: the
/// client left), at least a second for the spans still buffered to be sent.
pub(crate) fn grace_left(
    grace: std::time::Duration,
    began: Option<std::time::Instant>,
) -> std::time::Duration {
    grace.saturating_sub(began.map_or(std::time::Duration::ZERO, |at| at.elapsed()))
}

/// A future that resolves on SIGINT or, on Unix, SIGTERM. On Unix the handlers are installed at
/// once, when this is called (not when the future is first polled): from then on these signals no
/// longer end the process by their default action, even after the future is dropped, so that a
/// command can finish its shutdown once it has begun it.
#[cfg(unix)]
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let install = |kind: SignalKind, name: &str| {
        signal(kind)
            .map_err(|err| tracing::warn!(error = %err, "cannot handle {name}"))
            .ok()
    };
    let mut interrupt = install(SignalKind::interrupt(), "SIGINT");
    let mut terminate = install(SignalKind::terminate(), "SIGTERM");
    async move {
        tokio::select! {
            () = received(interrupt.as_mut()) => tracing::info!("SIGINT received"),
            () = received(terminate.as_mut()) => tracing::info!("SIGTERM received"),
        }
    }
}

/// Completes when `signal` is delivered; never without a handler.
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            if signal.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// A future that resolves on Ctrl-C.
#[cfg(not(unix))]
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> {
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
