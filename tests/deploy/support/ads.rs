//! A management server for the xDS tests (sluice's `xds` source, and Envoy Gateway's role in
//! the ratelimit compatibility test): every ADS stream gets the current snapshot, and each
//! later one; every request received is passed on to the test. [`snapshot`] makes the
//! response that carries a set of rules.

use std::pin::Pin;

use prost::Message as _;
use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use sluice::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;
use sluice::xds::TYPE_URL;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub(crate) struct Ads {
    pub snapshot: watch::Receiver<Option<DiscoveryResponse>>,
    pub requests: mpsc::UnboundedSender<DiscoveryRequest>,
    /// Ends every stream when cancelled.
    pub kill: CancellationToken,
}

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let mut snapshot = self.snapshot.clone();
        let requests = self.requests.clone();
        let kill = self.kill.clone();
        tokio::spawn(async move {
            let read = async {
                while let Ok(Some(r)) = incoming.message().await {
                    let _ = requests.send(r);
                }
            };
            let write = async {
                snapshot.mark_changed();
                while snapshot.changed().await.is_ok() {
                    let current = snapshot.borrow_and_update().clone();
                    if let Some(s) = current
                        && tx.send(Ok(s)).await.is_err()
                    {
                        return;
                    }
                }
            };
            tokio::select! {
                () = read => {}
                () = write => {}
                () = kill.cancelled() => {}
            }
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The response of version `version` that carries `configs` (one resource per domain).
pub(crate) fn snapshot(version: &str, configs: &[RateLimitConfig]) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        resources: configs
            .iter()
            .map(|c| prost_types::Any {
                type_url: TYPE_URL.into(),
                value: c.encode_to_vec(),
            })
            .collect(),
        type_url: TYPE_URL.into(),
        nonce: format!("nonce-{version}"),
        ..Default::default()
    }
}
