//! Request tracing: a debug-level span per request with domain, descriptor count, result and
//! latency, and nothing per request at info.

use std::io::Write;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use sluice::engine::{Descriptor, Engine, Options, Request};
use sluice::limiter::MemoryLimiter;
use sluice::rules::{Entry, RuleSet};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn engine() -> Engine {
    let yaml = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let model =
        sluice::config::rules_file::from_sources(&[("t.yaml".into(), yaml.into())]).unwrap();
    let rules = Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)));
    Engine::new(rules, Arc::new(MemoryLimiter::new(10)), Options::default())
}

fn request() -> Request {
    Request {
        domain: "test".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new("k", "v")],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Runs two requests (OK, then over the limit) under a subscriber at `level`.
async fn logs_at(level: &str) -> String {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(level))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let engine = engine();
    engine.should_rate_limit(&request()).await.unwrap();
    engine.should_rate_limit(&request()).await.unwrap();
    out.text()
}

#[tokio::test(flavor = "current_thread")]
async fn nothing_per_request_at_info() {
    let _serial = crate::serial_async().await;
    assert_eq!(logs_at("info").await, "");
}

#[tokio::test(flavor = "current_thread")]
async fn one_debug_line_per_request_with_its_span() {
    let _serial = crate::serial_async().await;
    let text = logs_at("sluice=debug").await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (line, result) in lines.iter().zip(["ok", "over_limit"]) {
        assert!(line.contains("DEBUG should_rate_limit{"), "{line}");
        assert!(line.contains("domain=test descriptors=1"), "{line}");
        assert!(line.contains(&format!("result=\"{result}\"")), "{line}");
        assert!(line.contains("latency_us="), "{line}");
        assert!(line.ends_with("answered"), "{line}");
    }
}
