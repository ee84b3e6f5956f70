//! The caller's trace, read from a gRPC request's metadata, so that sluice's request span
//! (`should_rate_limit`) is exported as a child of the caller's span, in the caller's trace.
//!
//! Read, in this order of precedence: W3C Trace Context (`traceparent`, with `tracestate`),
//! what Envoy's OpenTelemetry tracer sends; then B3, what its Zipkin tracer sends, as the
//! single `b3` header or the `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled` and `x-b3-flags`
//! headers. A header that is missing or malformed is ignored: the request's span is then the
//! root of a new trace, as without any header. Nothing here can fail a request.
//!
//! The caller's sampling decision is kept (the tracer's sampler is parent-based): a sampled
//! caller gets sluice's span, an unsampled one does not. A B3 caller that leaves the decision
//! open (no sampling state) counts as unsampled.
//!
//! Without the `otel` feature [`join_caller_trace`] returns the request's future as it is:
//! nothing is read and nothing is added to the request path.

use std::future::Future;

use tonic::metadata::MetadataMap;

/// `work` (a request's handling) run inside the caller's trace context taken from
/// `metadata`, so that the spans it opens have the caller's span as their parent.
#[cfg(feature = "otel")]
pub(crate) fn join_caller_trace<F: Future>(
    metadata: &MetadataMap,
    work: F,
) -> opentelemetry::context::WithContext<F> {
    use opentelemetry::context::FutureExt as _;
    work.with_context(caller_context(metadata))
}

/// Without the `otel` feature: `work` itself.
#[cfg(not(feature = "otel"))]
#[inline(always)]
pub(crate) fn join_caller_trace<F: Future>(_metadata: &MetadataMap, work: F) -> F {
    work
}

#[cfg(feature = "otel")]
pub(crate) use otel::caller_context;

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::Context;
    use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags};
    use opentelemetry::trace::{TraceId, TraceState};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tonic::metadata::{KeyRef, MetadataMap};

    /// The current context with the caller's span as the remote parent, if the metadata
    /// carries a well-formed one (W3C first, then B3); else the current context unchanged.
    pub(crate) fn caller_context(metadata: &MetadataMap) -> Context {
        let carrier = Metadata(metadata);
        let current = Context::current();
        match w3c(&carrier).or_else(|| b3(&carrier)) {
            Some(parent) => current.with_remote_span_context(parent),
            None => current,
        }
    }

    /// gRPC metadata (ASCII values only) as a propagator's carrier.
    struct Metadata<'a>(&'a MetadataMap);

    impl Extractor for Metadata<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key)?.to_str().ok()
        }

        fn keys(&self) -> Vec<&str> {
            let ascii = |key| match key {
                KeyRef::Ascii(k) => Some(k.as_str()),
                KeyRef::Binary(_) => None,
            };
            self.0.keys().filter_map(ascii).collect()
        }
    }

    /// The caller's span from `traceparent` and `tracestate`, read by the W3C propagator
    /// once the header has the shape `vv-<32 hex>-<16 hex>-ff[-...]`: the propagator itself
    /// would take shorter ids (`00-abc-def-01`), which are malformed.
    fn w3c(carrier: &Metadata<'_>) -> Option<SpanContext> {
        let mut parts = carrier.get("traceparent")?.trim().split('-');
        let shaped = [2, 32, 16, 2]
            .iter()
            .all(|&width| parts.next().is_some_and(|p| p.len() == width && is_hex(p)));
        if !shaped {
            return None;
        }
        let cx = TraceContextPropagator::new().extract(carrier);
        let parent = cx.span().span_context().clone();
        parent.is_valid().then_some(parent)
    }

    /// The caller's span from B3 headers: the single `b3` header when it is well formed,
    /// else the multiple `x-b3-*` headers.
    fn b3(carrier: &dyn Extractor) -> Option<SpanContext> {
        let single = carrier.get("b3").and_then(b3_single);
        single.or_else(|| b3_multi(carrier))
    }

    /// `b3: <trace id>-<span id>[-<sampling state>[-<parent span id>]]`.
    fn b3_single(value: &str) -> Option<SpanContext> {
        let parts: Vec<&str> = value.trim().split('-').collect();
        let (trace, span) = match parts.as_slice() {
            [trace, span, rest @ ..] if rest.len() <= 2 => (*trace, *span),
            _ => return None,
        };
        let sampled = match parts.get(2) {
            Some(state) => sampling_state(state)?,
            None => false,
        };
        if let Some(parent) = parts.get(3) {
            span_id(parent)?;
        }
        remote(trace_id(trace)?, span_id(span)?, sampled)
    }

    /// `x-b3-traceid`, `x-b3-spanid`, and `x-b3-sampled` or `x-b3-flags: 1` (debug).
    fn b3_multi(carrier: &dyn Extractor) -> Option<SpanContext> {
        let trace = trace_id(carrier.get("x-b3-traceid")?)?;
        let span = span_id(carrier.get("x-b3-spanid")?)?;
        let debug = carrier.get("x-b3-flags").is_some_and(|f| f.trim() == "1");
        let sampled = match carrier.get("x-b3-sampled") {
            _ if debug => true,
            Some(state) => sampling_state(state)?,
            None => false,
        };
        remote(trace, span, sampled)
    }

    /// B3's sampling state: `1` (or `true`), `d` (debug, which implies sampled), `0` (or
    /// `false`); anything else is malformed.
    fn sampling_state(state: &str) -> Option<bool> {
        match state.trim() {
            "1" | "d" | "true" => Some(true),
            "0" | "false" => Some(false),
            _ => None,
        }
    }

    /// A 16- or 32-digit hex trace id (a 64-bit one is the low half), not all zeros.
    fn trace_id(hex: &str) -> Option<TraceId> {
        let hex = hex.trim();
        let id = match hex.len() {
            16 | 32 if is_hex(hex) => u128::from_str_radix(hex, 16).ok()?,
            _ => return None,
        };
        (id != 0).then(|| TraceId::from(id))
    }

    /// A 16-digit hex span id, not all zeros.
    fn span_id(hex: &str) -> Option<SpanId> {
        let hex = hex.trim();
        if hex.len() != 16 || !is_hex(hex) {
            return None;
        }
        let id = u64::from_str_radix(hex, 16).ok()?;
        (id != 0).then(|| SpanId::from(id))
    }

    fn is_hex(s: &str) -> bool {
        s.bytes().all(|b| b.is_ascii_hexdigit())
    }

    fn remote(trace: TraceId, span: SpanId, sampled: bool) -> Option<SpanContext> {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        Some(SpanContext::new(
            trace,
            span,
            flags,
            true,
            TraceState::default(),
        ))
    }

    #[cfg(test)]
    mod tests {
        use opentelemetry::trace::TraceContextExt as _;

        use super::*;

        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        const SPAN: &str = "00f067aa0ba902b7";

        fn parent_of(headers: &[(&'static str, &str)]) -> Option<SpanContext> {
            let mut metadata = MetadataMap::new();
            for (key, value) in headers {
                metadata.append(*key, value.parse().expect("an ASCII value"));
            }
            let cx = caller_context(&metadata);
            let span = cx.span().span_context().clone();
            span.is_valid().then_some(span)
        }

        fn ids(span: &SpanContext) -> (String, String, bool) {
            let (trace, id) = (span.trace_id().to_string(), span.span_id().to_string());
            (trace, id, span.is_sampled())
        }

        fn joined(trace: &str, sampled: bool) -> Option<(String, String, bool)> {
            let trace = format!("{trace:0>32}");
            Some((trace, SPAN.to_owned(), sampled))
        }

        #[test]
        fn traceparent_and_tracestate_give_the_remote_parent() {
            let traceparent = format!("00-{TRACE}-{SPAN}-01");
            let headers = [("traceparent", &*traceparent), ("tracestate", "edge=1")];
            let parent = parent_of(&headers).expect("a parent");
            assert!(parent.is_remote());
            assert_eq!(Some(ids(&parent)), joined(TRACE, true));
            assert_eq!(parent.trace_state().header(), "edge=1");
            let unsampled = format!("00-{TRACE}-{SPAN}-00");
            let parent = parent_of(&[("traceparent", &unsampled)]).expect("a parent");
            assert_eq!(Some(ids(&parent)), joined(TRACE, false));
        }

        #[test]
        fn b3_single_header_in_each_of_its_forms() {
            let cases = [
                (format!("{TRACE}-{SPAN}-1"), true),
                (format!("{TRACE}-{SPAN}-d"), true),
                (format!("{TRACE}-{SPAN}-0"), false),
                (format!("{TRACE}-{SPAN}"), false),
                (format!("{TRACE}-{SPAN}-1-0000000000000001"), true),
            ];
            for (value, sampled) in cases {
                let parent = parent_of(&[("b3", &value)]).map(|p| ids(&p));
                assert_eq!(parent, joined(TRACE, sampled), "b3: {value}");
            }
            let short = format!("a3ce929d0e0e4736-{SPAN}-1");
            let parent = parent_of(&[("b3", &short)]).map(|p| ids(&p));
            assert_eq!(parent, joined("a3ce929d0e0e4736", true));
        }

        #[test]
        fn b3_multiple_headers_with_sampled_or_debug() {
            let cases: [(&[(&'static str, &str)], bool); 5] = [
                (&[("x-b3-sampled", "1")], true),
                (&[("x-b3-sampled", "true")], true),
                (&[("x-b3-sampled", "0")], false),
                (&[("x-b3-flags", "1")], true),
                (&[], false),
            ];
            for (extra, sampled) in cases {
                let mut headers = vec![("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN)];
                headers.extend_from_slice(extra);
                let parent = parent_of(&headers).map(|p| ids(&p));
                assert_eq!(parent, joined(TRACE, sampled), "{extra:?}");
            }
        }

        #[test]
        fn traceparent_wins_over_b3_and_a_malformed_one_falls_back_to_it() {
            let other = "0af7651916cd43dd8448eb211c80319c";
            let traceparent = format!("00-{TRACE}-{SPAN}-01");
            let b3 = format!("{other}-{SPAN}-1");
            let both = [("traceparent", &*traceparent), ("b3", &*b3)];
            assert_eq!(parent_of(&both).map(|p| ids(&p)), joined(TRACE, true));
            let broken = [("traceparent", "00-zz-yy-01"), ("b3", &*b3)];
            assert_eq!(parent_of(&broken).map(|p| ids(&p)), joined(other, true));
        }

        #[test]
        fn malformed_or_missing_headers_give_no_parent() {
            let zeros = "0".repeat(32);
            let zero_span = "0".repeat(16);
            let bad_traceparents = [
                String::new(),
                "garbage".to_owned(),
                "00-abc-def-01".to_owned(),
                format!("00-{TRACE}-{SPAN}"),
                format!("00-{TRACE}-{SPAN}-zz"),
                format!("00-{}-{SPAN}-01", TRACE.to_uppercase()),
                format!("00-{zeros}-{SPAN}-01"),
                format!("00-{TRACE}-{zero_span}-01"),
                format!("ff-{TRACE}-{SPAN}-01"),
                format!("00-{TRACE}0-{SPAN}-01"),
                format!("00-+{}-{SPAN}-01", &TRACE[1..]),
            ];
            for value in &bad_traceparents {
                assert_eq!(parent_of(&[("traceparent", value)]), None, "{value}");
            }
            let bad_b3 = [
                "0".to_owned(),
                "1".to_owned(),
                "-".to_owned(),
                format!("{TRACE}-{SPAN}-x"),
                format!("{TRACE}-{SPAN}-1-zz"),
                format!("{TRACE}-{SPAN}-1-{SPAN}-extra"),
                format!("{}-{SPAN}-1", &TRACE[..20]),
                format!("{TRACE}-{}-1", &SPAN[..8]),
                format!("{zeros}-{SPAN}-1"),
                format!("+{}-{SPAN}-1", &TRACE[1..]),
            ];
            for value in &bad_b3 {
                assert_eq!(parent_of(&[("b3", value)]), None, "b3: {value}");
            }
            let bad_multi: [&[(&'static str, &str)]; 4] = [
                &[("x-b3-traceid", TRACE)],
                &[("x-b3-spanid", SPAN)],
                &[("x-b3-traceid", "xyz"), ("x-b3-spanid", SPAN)],
                &[
                    ("x-b3-traceid", TRACE),
                    ("x-b3-spanid", SPAN),
                    ("x-b3-sampled", "yes"),
                ],
            ];
            for headers in bad_multi {
                assert_eq!(parent_of(headers), None, "{headers:?}");
            }
            assert_eq!(parent_of(&[]), None);
        }
    }
}
