//! What ships in `deploy/`, exercised with the real programs (docs/deploy.md): Envoy configs
//! validated and run in a real Envoy in front of the real `sluice`, the Helm chart rendered,
//! linted and validated, the Istio recipe, the Dockerfile, and the example rules; the Rate
//! Limit Quota Service through Envoy on the shipped recipe (`rlqs`); rules pushed over xDS by
//! an mTLS ADS server started here (`xds`); the binary as a drop-in for envoyproxy/ratelimit
//! under Envoy Gateway's and Istio's env sets (`ratelimit_compat`), its gRPC port on a Unix
//! socket behind Envoy and one domain merged from two files (`ratelimit_drop_ins`); the binary as
//! `limitador-server` behind limitador's example Envoy config (`limitador_compat`); token
//! budgets driven by Envoy Gateway's costs and AI Gateway's QuotaPolicy (`token_budgets`);
//! requests in flight held through Envoy by `algorithm: concurrency` (`concurrency`); the whole
//! service composed in process (`composition`). A missing Envoy, helm,
//! kubernetes-validate or redis-server fails these tests with the command that installs it.
//! (The admin page in a real Chromium, whose screenshots a load beside it delays, is in
//! tests/serial/.)

mod support;

mod composition;
mod concurrency;
mod envoy_configs;
mod envoy_e2e;
mod examples;
mod helm;
mod image;
mod istio;
mod limitador_compat;
mod ratelimit_compat;
mod ratelimit_drop_ins;
mod rlqs;
mod token_budgets;
mod xds;
