//! Generates the client stubs from the repository's protos (protox: no `protoc` needed).

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "sluice/v1/throttle.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto");
    let mut compiler = protox::Compiler::new(["../proto"])?;
    compiler.include_imports(true).include_source_info(false);
    compiler.open_files(PROTOS)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
