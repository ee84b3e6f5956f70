//! `grpc-timeout`: past a request's deadline it is answered `CANCELLED` ("Timeout expired") and
//! its work dropped, as tonic's server does (its `transport/service/grpc_timeout.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::codegen::http::{HeaderMap, Request, Response};
use tonic::service::Routes;

/// Honours a request's `grpc-timeout` around tonic's routes.
#[derive(Clone)]
pub(super) struct GrpcTimeout(pub(super) Routes);

/// What tonic's routes answer a request with.
type Routed = <Routes as Service<Request<hyper::body::Incoming>>>::Future;

impl Service<Request<hyper::body::Incoming>> for GrpcTimeout {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<hyper::body::Incoming>) -> Answer {
        let deadline = grpc_timeout(request.headers()).map(|t| Box::pin(tokio::time::sleep(t)));
        Answer {
            routed: self.0.call(request),
            deadline,
        }
    }
}

/// A request's answer, or `CANCELLED` once its deadline (if any) passed.
pub(super) struct Answer {
    routed: Routed,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Answer {
    type Output = Result<Response<Body>, std::convert::Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(answered) = Pin::new(&mut this.routed).poll(cx) {
            return Poll::Ready(answered);
        }
        let Some(deadline) = this.deadline.as_mut() else {
            return Poll::Pending;
        };
        deadline
            .as_mut()
            .poll(cx)
            .map(|()| Ok(Status::cancelled("Timeout expired").into_http()))
    }
}

/// The `grpc-timeout` header's duration: at most 8 digits and a unit (H, M, S, m, u, n).
/// Absent or malformed: none.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_of(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().expect("header value"));
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout_of("20m"), Some(Duration::from_millis(20)));
        assert_eq!(
            timeout_of("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout_of("5n"), Some(Duration::from_nanos(5)));
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for bad in ["", "m", "123456789m", "-1m", "+1m", "1x", "1.5S", "1 S"] {
            assert_eq!(timeout_of(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
