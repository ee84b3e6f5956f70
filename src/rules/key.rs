//! State keys: an injective, escaped text encoding of what a limiter state belongs to.

use std::sync::Arc;

use super::{Entry, Match};
use crate::config::model::Algorithm;

pub fn descriptor_part(domain: &str, entries: &[Entry], matched: Option<&Match>) -> String {
    let _ = (domain, entries, matched);
    todo!("keys")
}

pub fn state_key(descriptor_part: &str, algorithm: Algorithm, period_nanos: u64) -> Arc<[u8]> {
    let _ = (descriptor_part, algorithm, period_nanos);
    todo!("keys")
}
