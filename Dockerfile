# syntax=docker/dockerfile:1
#
# The sluice container image: a Rust build stage, then a distroless runtime (glibc, CA
# certificates, no shell) running as the non-root user 65532.
#
#   docker build -t sluice:0.1.0 .
#   docker run --rm -p 8081:8081 -p 8080:8080 sluice:0.1.0
#
# With no rules mounted it serves the demo rules (examples/rules/demo.yaml); mount a directory
# of rules files over /etc/sluice/rules (the Helm chart mounts a ConfigMap there). The chart
# in deploy/helm/sluice runs this image (repository `sluice`, tag = the crate's version).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit cache mounts). The image
# is built with `otel`, so span export (`log.otlp_endpoint`, or `TRACING_ENABLED` when started
# as `ratelimit`) works in it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features otel --bin sluice \
    && install -D -m 0755 target/release/sluice /out/sluice \
    && mkdir -p /out/bin && ln -s /usr/local/bin/sluice /out/bin/ratelimit

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/sluice /usr/local/bin/sluice
# /bin/ratelimit, the command Envoy Gateway and Istio's sample run: started under that name,
# sluice reads envoyproxy/ratelimit's environment (docs/ratelimit-compat.md).
COPY --from=build /out/bin/ /bin/
COPY examples/rules/demo.yaml /etc/sluice/rules/demo.yaml
# Inside a container, listen on every interface (sluice's own default is loopback).
ENV SLUICE_SERVER__GRPC_LISTEN=0.0.0.0:8081 \
    SLUICE_SERVER__ADMIN_LISTEN=0.0.0.0:8080 \
    SLUICE_LOG__FORMAT=json
# gRPC (Envoy's rate_limit_service), admin HTTP (/healthz, /readyz, /metrics, ...); as
# /bin/ratelimit also the debug port 6070.
EXPOSE 8081 8080
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--rules", "/etc/sluice/rules"]
