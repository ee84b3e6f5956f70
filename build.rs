//! Compiles the wire protos with protox (no `protoc` needed) and tonic-prost-build, and writes
//! the encoded file descriptor set that server reflection serves.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "sluice/v1/throttle.proto",
];

/// Spoken as a client only (rules over xDS, src/xds/): generated, but not in the set that
/// server reflection serves, which lists what the server answers.
const CLIENT_PROTOS: &[&str] = &[
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("sluice_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    compiler.open_files(CLIENT_PROTOS)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
