//! A `tower` layer that asks sluice before a request reaches the service: the keys come from
//! each request (a function of it), an admitted request goes through with `RateLimit-*`
//! headers added to its response, a limited one is answered at once:
//!
//! - HTTP: `429 Too Many Requests` with `RateLimit-Limit`, `RateLimit-Remaining`,
//!   `RateLimit-Reset` (seconds until the key is full again) and `Retry-After` (seconds,
//!   rounded up; absent when waiting cannot help);
//! - gRPC (`content-type: application/grpc...`): status `RESOURCE_EXHAUSTED`, same headers.
//!
//! When sluice gives no answer in time, the client's [`FailPolicy`](crate::FailPolicy)
//! decides: `Open` lets the request through; `Closed` and `Error` answer `503 Service
//! Unavailable` (gRPC: `UNAVAILABLE`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Client, Source, Throttle, Verdict};

/// Limits a service by keys taken from each request.
///
/// ```
/// use axum::{Router, routing::get};
/// use sluice_client::{Client, Limit, Throttle, ThrottleLayer};
///
/// # fn app() -> Result<Router, sluice_client::Error> {
/// let client = Client::builder("http://127.0.0.1:8081").connect_lazy()?;
/// let layer = ThrottleLayer::new(client, |req: &http::Request<axum::body::Body>| {
///     let user = req.headers().get("x-user")?.to_str().ok()?;
///     Some(Throttle::key(format!("api:{user}"), Limit::per_minute(60).max_burst(9)))
/// });
/// Ok(Router::new().route("/", get(|| async { "hello" })).layer(layer))
/// # }
/// ```
pub struct ThrottleLayer<F> {
    client: Client,
    keys: Arc<F>,
}

impl<F> Clone for ThrottleLayer<F> {
    fn clone(&self) -> Self {
        ThrottleLayer {
            client: self.client.clone(),
            keys: self.keys.clone(),
        }
    }
}

impl<F> ThrottleLayer<F> {
    /// `keys` gives the call for a request, or `None` to let it through unasked.
    pub fn new(client: Client, keys: F) -> ThrottleLayer<F> {
        ThrottleLayer {
            client,
            keys: Arc::new(keys),
        }
    }
}

impl<S, F> Layer<S> for ThrottleLayer<F> {
    type Service = ThrottleService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        ThrottleService {
            inner,
            client: self.client.clone(),
            keys: self.keys.clone(),
        }
    }
}

/// The service of a [`ThrottleLayer`].
pub struct ThrottleService<S, F> {
    inner: S,
    client: Client,
    keys: Arc<F>,
}

impl<S: Clone, F> Clone for ThrottleService<S, F> {
    fn clone(&self) -> Self {
        ThrottleService {
            inner: self.inner.clone(),
            client: self.client.clone(),
            keys: self.keys.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, F, B, R> Service<Request<B>> for ThrottleService<S, F>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    F: Fn(&Request<B>) -> Option<Throttle> + Send + Sync + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The inner service that was polled ready goes into the future; a clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(call) = (self.keys)(&request) else {
            return Box::pin(inner.call(request));
        };
        let client = self.client.clone();
        let grpc = is_grpc(request.headers());
        Box::pin(async move {
            let verdict = match client.throttle(call).await {
                Ok(v) if v.source != Source::FailedClosed => v,
                _ => return Ok(unavailable(grpc)),
            };
            if verdict.limited {
                return Ok(refused(&verdict, grpc));
            }
            let mut response = inner.call(request).await?;
            rate_limit_headers(response.headers_mut(), &verdict);
            Ok(response)
        })
    }
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The status numbers of gRPC's `RESOURCE_EXHAUSTED` and `UNAVAILABLE`.
const GRPC_RESOURCE_EXHAUSTED: &str = "8";
const GRPC_UNAVAILABLE: &str = "14";

/// A limited request's answer.
fn refused<R: Default>(verdict: &Verdict, grpc: bool) -> Response<R> {
    let mut response = if grpc {
        grpc_answer(GRPC_RESOURCE_EXHAUSTED, "rate limited")
    } else {
        status_answer(StatusCode::TOO_MANY_REQUESTS)
    };
    rate_limit_headers(response.headers_mut(), verdict);
    if let Some(wait) = verdict.retry_after {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            HeaderValue::from(seconds_up(wait)),
        );
    }
    response
}

/// The answer when sluice could not decide and the policy does not let the request through.
fn unavailable<R: Default>(grpc: bool) -> Response<R> {
    if grpc {
        grpc_answer(GRPC_UNAVAILABLE, "rate limiter unavailable")
    } else {
        status_answer(StatusCode::SERVICE_UNAVAILABLE)
    }
}

fn status_answer<R: Default>(status: StatusCode) -> Response<R> {
    let mut response = Response::new(R::default());
    *response.status_mut() = status;
    response
}

/// A trailers-only gRPC answer.
fn grpc_answer<R: Default>(status: &'static str, message: &'static str) -> Response<R> {
    let mut response = Response::new(R::default());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_static(status));
    headers.insert("grpc-message", HeaderValue::from_static(message));
    response
}

/// `RateLimit-Limit`, `-Remaining` and `-Reset` of the verdict's headline key.
fn rate_limit_headers(headers: &mut HeaderMap, verdict: &Verdict) {
    let Some(key) = verdict.headline() else {
        return;
    };
    headers.insert("ratelimit-limit", HeaderValue::from(key.limit));
    headers.insert("ratelimit-remaining", HeaderValue::from(key.remaining));
    headers.insert(
        "ratelimit-reset",
        HeaderValue::from(seconds_up(key.reset_after)),
    );
}

/// Whole seconds, rounded up (HTTP's `Retry-After` has no fractions).
fn seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyVerdict;

    fn verdict() -> Verdict {
        let key = |limited, remaining, retry: Option<u64>| KeyVerdict {
            limited,
            limit: 10,
            remaining,
            retry_after: retry.map(Duration::from_millis),
            reset_after: Duration::from_millis(1500),
        };
        Verdict {
            limited: true,
            retry_after: Some(Duration::from_millis(2001)),
            keys: vec![key(false, 3, None), key(true, 0, Some(2001))],
            source: Source::Sluice,
        }
    }

    #[test]
    fn http_refusal_carries_the_headers() {
        let r: Response<String> = refused(&verdict(), false);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = r.headers();
        assert_eq!(h["retry-after"], "3");
        assert_eq!(h["ratelimit-limit"], "10");
        assert_eq!(h["ratelimit-remaining"], "0");
        assert_eq!(h["ratelimit-reset"], "2");
    }

    #[test]
    fn grpc_refusal_is_resource_exhausted() {
        let r: Response<String> = refused(&verdict(), true);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], GRPC_RESOURCE_EXHAUSTED);
        assert_eq!(
            GRPC_RESOURCE_EXHAUSTED,
            (tonic::Code::ResourceExhausted as i32).to_string()
        );
        assert_eq!(
            GRPC_UNAVAILABLE,
            (tonic::Code::Unavailable as i32).to_string()
        );
        assert_eq!(r.headers()["retry-after"], "3");
        let down: Response<String> = unavailable(true);
        assert_eq!(down.headers()["grpc-status"], GRPC_UNAVAILABLE);
        assert_eq!(
            unavailable::<String>(false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn never_has_no_retry_after() {
        let mut v = verdict();
        v.retry_after = None;
        let r: Response<String> = refused(&v, false);
        assert!(r.headers().get("retry-after").is_none());
    }
}
