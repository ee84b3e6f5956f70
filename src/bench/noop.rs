//! The no-op RLS server: every request is OK, with one OK status per descriptor and nothing
//! else. Served like sluice's own gRPC port (same tonic server, same TCP settings), it is the
//! ceiling of gRPC on the machine that sluice is measured against.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::proto::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::transport::{ConnectionLimits, Http2Server};

/// Answers OK to everything.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok.into(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses,
            ..Default::default()
        }))
    }
}

/// Serves [`Noop`] on `listener` until `shutdown` resolves; `stream_tasks` as
/// `server.stream_tasks`, the connection limits the `[server]` defaults.
pub async fn serve_noop(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    stream_tasks: bool,
) {
    let limits = ConnectionLimits::default();
    Http2Server::new(1024, stream_tasks, limits)
        .serve(
            Routes::new(RateLimitServiceServer::new(Noop)),
            listener.into(),
            None,
            shutdown,
        )
        .await;
}
