//! What ships in `deploy/`, exercised with the real programs (docs/deploy.md): Envoy configs
//! validated and run in a real Envoy in front of the real `sluice`, the Helm chart rendered,
//! linted and validated, the Istio recipe, the Dockerfile, and the example rules. A missing
//! Envoy, helm or kubernetes-validate fails these tests with the command that installs it.

mod support;

mod envoy_configs;
mod envoy_e2e;
mod examples;
mod helm;
mod image;
mod istio;
mod ratelimit_compat;
mod rlqs;
mod ui_browser;
mod xds;
