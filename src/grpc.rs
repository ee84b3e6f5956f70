//! grpc
