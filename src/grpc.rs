//! The gRPC face: `ShouldRateLimit` hands the wire request to [`crate::wire::decide`] (protobuf
//! to domain types, the engine, and back). [`status_of`] is the one place where errors become gRPC statuses. With the
//! `otel` feature the engine's request span joins the caller's trace (`traceparent` or B3 in
//! the request's metadata: `telemetry::propagation`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::engine::{Engine, EngineError};
use crate::proto as pb;
use crate::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::telemetry::propagation::join_caller_trace;
use crate::transport::SizeLimited;
use crate::wire::decide;

/// The `envoy.service.ratelimit.v3.RateLimitService` implementation.
#[derive(Clone)]
pub(crate) struct RateLimiter {
    engine: Arc<Engine>,
}

impl RateLimiter {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        RateLimiter { engine }
    }

    /// The tonic service, ready to add to a server. A request whose encoded size is over
    /// `input.max_request_bytes` is refused before it is read, with `RESOURCE_EXHAUSTED`.
    pub(crate) fn into_service(self) -> RlsService {
        let max = self.engine.input_limits().max_request_bytes;
        SizeLimited::new(
            RateLimitServiceServer::new(self).max_decoding_message_size(max),
            max,
        )
    }
}

/// The RLS service as served (see [`SizeLimited`]).
pub(crate) type RlsService = SizeLimited<RateLimitServiceServer<RateLimiter>>;

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let work = decide(&self.engine, request);
        let answer = join_caller_trace(&metadata, work)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(answer))
    }
}

/// Maps an engine error to the status Envoy sees: a malformed request is
/// `INVALID_ARGUMENT`; a backend failure is `UNAVAILABLE`, so that Envoy's
/// `failure_mode_deny` decides.
pub(crate) fn status_of(error: &EngineError) -> Status {
    match error {
        EngineError::InvalidArgument(m) => Status::invalid_argument(m.clone()),
        EngineError::Backend(e) => Status::unavailable(e.to_string()),
    }
}
