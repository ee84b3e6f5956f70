//! Process signals: the future that resolves when the service should stop, and the SIGHUP
//! stream that asks for a rules reload.

/// Resolves on SIGTERM or SIGINT (Ctrl-C). If a handler cannot be installed, the error is
/// logged and that signal is simply not watched.
pub async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM");
                None
            }
        };
        let on_term = async {
            match term.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = on_term => tracing::info!("SIGTERM received, shutting down"),
            _ = ctrl_c() => tracing::info!("SIGINT received, shutting down"),
        }
    }
    #[cfg(not(unix))]
    {
        ctrl_c().await;
        tracing::info!("interrupt received, shutting down");
    }
}

async fn ctrl_c() {
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %e, "cannot watch SIGINT");
        std::future::pending::<()>().await;
    }
}

/// Waits for SIGHUP, again and again: calls `on_hangup` for each. Never returns; when the
/// handler cannot be installed, the error is logged and it waits forever.
pub async fn on_hangups(on_hangup: impl Fn()) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP received, reloading the rules");
                    on_hangup();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot watch SIGHUP"),
        }
    }
    #[cfg(not(unix))]
    let _ = on_hangup;
    std::future::pending::<()>().await;
}
