//! sluice's wire API, generated from the `.proto` files beside this crate (protox and
//! tonic-prost-build: no `protoc` needed), shared by the server (`sluice`) and the client
//! library (`sluice-client`). It depends on prost, prost-types, tonic-prost and tonic's
//! codegen and channel only, never on either side.
//!
//! # Layout
//!
//! Modules follow the protobuf packages; each holds the messages, and for a service its
//! `*_client` (with `connect` over a tonic `Channel`) and `*_server` modules.
//!
//! | module | package | spoken |
//! |---|---|---|
//! | [`envoy::service::ratelimit::v3`] | Envoy's Rate Limit Service (RLS) | served |
//! | [`envoy::service::rate_limit_quota::v3`] | the Rate Limit Quota Service (RLQS) | served |
//! | [`sluice::v1`] | `sluice.v1.Throttle`, CL.THROTTLE as gRPC | served |
//! | [`kuadrant::service::ratelimit::v1`] | Kuadrant's `CheckRateLimit` and `Report` | served |
//! | [`envoy::extensions::common::ratelimit::v3`], [`envoy::config::core::v3`], `envoy::r#type::v3` | the messages those import | |
//! | [`envoy::service::discovery::v3`] | xDS discovery and ADS (rules over xDS) | as a client |
//! | [`ratelimit::config::ratelimit::v3`] | envoyproxy/ratelimit's `RateLimitConfig` | as a client |
//! | [`google::rpc`] | `google.rpc.Status` (an xDS NACK's `error_detail`) | |
//!
//! [`FILE_DESCRIPTOR_SET`] is what gRPC server reflection serves: the served packages only.

#![forbid(unsafe_code)]
#![allow(clippy::all, missing_docs)]

pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
        /// The xDS discovery messages and ADS (rules over xDS).
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

/// Kuadrant's rate-limit service (limitador's `CheckRateLimit` and `Report`).
pub mod kuadrant {
    pub mod service {
        pub mod ratelimit {
            pub mod v1 {
                tonic::include_proto!("kuadrant.service.ratelimit.v1");
            }
        }
    }
}

pub mod sluice {
    pub mod v1 {
        tonic::include_proto!("sluice.v1");
    }
}

/// Rules over xDS: envoyproxy/ratelimit's `RateLimitConfig`.
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// `google.rpc.Status` (an xDS NACK's `error_detail`).
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// The encoded file descriptor set of the protos the server answers (and the well-known types
/// they import), for server reflection; the xDS client's are not in it.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sluice_descriptor.bin"));
