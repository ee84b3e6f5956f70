//! The generated wire types: the `sluice-proto` crate (`proto/`), re-exported under the same
//! paths (`crate::proto::envoy::...`, [`FILE_DESCRIPTOR_SET`]), plus short names for the RLS
//! types every front end uses.

pub use sluice_proto::*;

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor};
pub use envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response, rate_limit_service_client,
    rate_limit_service_server,
};
pub use envoy::r#type::v3::RateLimitUnit;
