//! The size of a request: tonic's codec refuses a message over its decoding limit, and
//! [`SizeLimited`] gives that refusal sluice's status, `RESOURCE_EXHAUSTED` naming the setting.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

/// A gRPC service as served. tonic refuses a message over its decoding limit with
/// `OUT_OF_RANGE`; sluice answers every input bound with `INVALID_ARGUMENT` or, for the size of
/// a request, `RESOURCE_EXHAUSTED` naming the setting, so this wrapper rewrites that one answer.
/// The wrapped services (`ShouldRateLimit`, `Throttle`) never answer `OUT_OF_RANGE` themselves,
/// so nothing else is rewritten.
#[derive(Clone)]
pub struct SizeLimited<S> {
    inner: S,
    max_request_bytes: usize,
}

impl<S> SizeLimited<S> {
    /// `inner` must already refuse messages over `max_request_bytes` (tonic's
    /// `max_decoding_message_size`); this wrapper only rewrites the status of that refusal.
    pub(crate) fn new(inner: S, max_request_bytes: usize) -> Self {
        SizeLimited {
            inner,
            max_request_bytes,
        }
    }
}

impl<S: NamedService> NamedService for SizeLimited<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for SizeLimited<S>
where
    S: Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
            Future = BoxFuture<http::Response<tonic::body::Body>, Infallible>,
        >,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        let max = self.max_request_bytes;
        Box::pin(async move {
            let mut response = answer.await?;
            too_large_is_resource_exhausted(response.headers_mut(), max);
            Ok(response)
        })
    }
}

/// `OUT_OF_RANGE` and `RESOURCE_EXHAUSTED` as the `grpc-status` header writes them (the
/// numbers of the gRPC status codes).
const OUT_OF_RANGE: &str = "11";
const RESOURCE_EXHAUSTED: &str = "8";

/// A trailers-only answer of `OUT_OF_RANGE` (tonic's decoding limit) becomes
/// `RESOURCE_EXHAUSTED`, its message prefixed with the setting that was exceeded.
pub(super) fn too_large_is_resource_exhausted(headers: &mut http::HeaderMap, max: usize) {
    // Every answer passes here: the common case is one comparison, no allocation.
    if headers.get("grpc-status").map(|v| v.as_bytes()) != Some(OUT_OF_RANGE.as_bytes()) {
        return;
    }
    headers.insert(
        "grpc-status",
        http::HeaderValue::from_static(RESOURCE_EXHAUSTED),
    );
    // The message is percent-encoded on the wire; the prefix needs no encoding.
    let tonic_says = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let message = format!("request over input.max_request_bytes = {max}: {tonic_says}");
    if let Ok(v) = http::HeaderValue::from_str(&message) {
        headers.insert("grpc-message", v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_numbers_are_tonics() {
        assert_eq!(OUT_OF_RANGE, (tonic::Code::OutOfRange as i32).to_string());
        assert_eq!(
            RESOURCE_EXHAUSTED,
            (tonic::Code::ResourceExhausted as i32).to_string()
        );
    }

    #[test]
    fn only_out_of_range_is_rewritten() {
        let mut ok = http::HeaderMap::new();
        ok.insert("grpc-status", http::HeaderValue::from_static("0"));
        too_large_is_resource_exhausted(&mut ok, 10);
        assert_eq!(ok.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
        assert!(ok.get("grpc-message").is_none());
        let mut big = http::HeaderMap::new();
        big.insert("grpc-status", http::HeaderValue::from_static("11"));
        too_large_is_resource_exhausted(&mut big, 10);
        assert_eq!(
            big.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"8"[..])
        );
        let message = big.get("grpc-message").and_then(|v| v.to_str().ok());
        assert_eq!(message, Some("request over input.max_request_bytes = 10: "));
    }
}
