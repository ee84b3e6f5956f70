//! `kuadrant.service.ratelimit.v1.RateLimitService` on the gRPC port: limitador's
//! `CheckRateLimit` (would a request of cost 1 be admitted? nothing counted) and `Report`
//! (count `hits_addend`, 0 meaning 1, whatever the limits' state; always OK), over the
//! limitador-format namespaces. Handlers convert and delegate to the engine; errors map to
//! statuses in [`crate::grpc::status_of`].

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::engine::limitador::Counting;
use crate::engine::{Code, Engine, EngineError};
use crate::grpc::status_of;
use crate::proto::kuadrant::service::ratelimit::v1::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use crate::proto::{self as pb, rate_limit_response::Code as PbCode};
use crate::transport::SizeLimited;
use crate::wire::from_proto;

/// The Kuadrant service over the engine.
#[derive(Clone)]
pub struct Kuadrant {
    engine: Arc<Engine>,
}

/// The Kuadrant service as served (see [`SizeLimited`]).
pub(crate) type KuadrantService = SizeLimited<RateLimitServiceServer<Kuadrant>>;

impl Kuadrant {
    pub fn new(engine: Arc<Engine>) -> Kuadrant {
        Kuadrant { engine }
    }

    /// The tonic service; a request over `input.max_request_bytes` is `RESOURCE_EXHAUSTED`.
    pub(crate) fn into_service(self) -> KuadrantService {
        let max = self.engine.input_limits().max_request_bytes;
        SizeLimited::new(
            RateLimitServiceServer::new(self).max_decoding_message_size(max),
            max,
        )
    }

    async fn answer(
        &self,
        request: pb::RateLimitRequest,
        counting: Counting,
    ) -> Result<pb::RateLimitResponse, EngineError> {
        let mut request = from_proto(request)?;
        if counting == Counting::CheckOnly {
            // limitador checks a cost of 1, whatever the request's hits_addend.
            request.hits_addend = 1;
        }
        let answer = self.engine.decide_limitador(&request, counting).await?;
        let code = match answer.code {
            Code::Ok => PbCode::Ok,
            Code::OverLimit => PbCode::OverLimit,
            Code::Unknown => PbCode::Unknown,
        };
        Ok(pb::RateLimitResponse {
            overall_code: code.into(),
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl RateLimitService for Kuadrant {
    async fn check_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let answer = self.answer(request.into_inner(), Counting::CheckOnly).await;
        answer.map(Response::new).map_err(|e| status_of(&e))
    }

    async fn report(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let answer = self.answer(request.into_inner(), Counting::CountOnly).await;
        answer.map(Response::new).map_err(|e| status_of(&e))
    }
}
