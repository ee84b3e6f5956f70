//! Compiles the wire protos with protox (no `protoc` needed) and tonic-prost-build, and writes
//! the encoded file descriptor set that server reflection serves.

use std::path::PathBuf;

/// What the server answers: generated, and served by reflection.
const SERVED: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "sluice/v1/throttle.proto",
    "kuadrant/service/ratelimit/v1/rls.proto",
];

/// Spoken as a client only (rules over xDS, the server's `src/xds/`): generated, but not in
/// the set that server reflection serves, which lists what the server answers.
const CLIENT_ONLY: &[&str] = &[
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The .proto files sit in this crate's directory, beside Cargo.toml and src/.
    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(SERVED)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("sluice_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    compiler.open_files(CLIENT_ONLY)?;
    // Every file read, imports included: an edit to src/ does not rerun the code generation.
    for path in compiler.files().filter_map(|f| f.path()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
