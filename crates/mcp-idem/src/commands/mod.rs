pub(crate) mod bridge;
pub(crate) mod call;
pub(crate) mod check;
pub(crate) mod config_check;
pub(crate) mod demo;
pub(crate) mod demo_server;
mod demo_server_http;
pub(crate) mod engine_args;
pub(crate) mod inspect;
pub(crate) mod proxy;
pub(crate) mod scope_args;
pub(crate) mod wrap;

/// Resolves on SIGINT or, on Unix, SIGTERM.
pub(crate) async fn stop_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
