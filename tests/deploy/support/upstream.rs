//! The upstream of an Envoy test: an HTTP stub on a loopback port, stopped when dropped.

/// An HTTP server answering 200 `upstream` to everything, stopped when dropped. A request
/// carrying `x-reply-tokens: N` gets `x-tokens-used: N` back (an LLM server reporting usage).
pub(crate) struct Upstream {
    pub port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Upstream {
    pub(crate) async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream stub");
        let port = listener.local_addr().expect("its address").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
            let mut answer = axum::http::HeaderMap::new();
            if let Some(tokens) = headers.get("x-reply-tokens") {
                answer.insert("x-tokens-used", tokens.clone());
            }
            (answer, "upstream")
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Upstream { port, _stop: stop }
    }
}
