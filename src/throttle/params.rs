//! A Throttle request checked against the input bounds and turned into limiter terms: every
//! invalid parameter is refused with a message naming its field (`keys[2].period_ms`).

use std::sync::Arc;

use crate::config::model::{Algorithm, Charge, SLIDING_LOG_MAX_QUOTA};
use crate::config::settings::InputSettings;
use crate::limiter::LimitParams;
use crate::proto::sluice::v1::{self as pb, throttle_key::Id};

const NANOS_PER_MS: u64 = 1_000_000;

/// One key of a request, ready for the limiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPlan {
    pub key: Arc<[u8]>,
    pub limit: LimitParams,
    /// Units taken (or given back); 0 checks only.
    pub cost: u64,
    pub refund: bool,
    /// The most the key admits at once (CL.THROTTLE's `limit`).
    pub capacity: u64,
}

impl KeyPlan {
    /// The cost can never be admitted: more than the key ever holds.
    pub fn never(&self) -> bool {
        !self.refund && self.cost > self.capacity
    }

    /// The limiter may deny it (a refund or a check is always admitted).
    pub(crate) fn may_deny(&self) -> bool {
        !self.refund && self.cost > 0
    }
}

/// Checks a request and plans each of its keys.
pub fn plan(request: &pb::ThrottleRequest, input: &InputSettings) -> Result<Vec<KeyPlan>, String> {
    if request.keys.is_empty() {
        return Err("keys must not be empty".to_owned());
    }
    if request.keys.len() > input.max_descriptors {
        return Err(format!(
            "keys: {} keys, more than input.max_descriptors = {}",
            request.keys.len(),
            input.max_descriptors
        ));
    }
    if request.name.len() > input.max_key_bytes {
        return Err(format!(
            "name: {} bytes, more than input.max_key_bytes = {}",
            request.name.len(),
            input.max_key_bytes
        ));
    }
    request
        .keys
        .iter()
        .enumerate()
        .map(|(i, k)| plan_key(k, input).map_err(|e| format!("keys[{i}].{e}")))
        .collect()
}

fn plan_key(k: &pb::ThrottleKey, input: &InputSettings) -> Result<KeyPlan, String> {
    let key: &[u8] = match &k.id {
        Some(Id::Key(s)) => s.as_bytes(),
        Some(Id::KeyBytes(b)) => b,
        None => &[],
    };
    if key.is_empty() {
        return Err("key: give a non-empty key (or key_bytes)".to_owned());
    }
    if key.len() > input.max_value_bytes {
        return Err(format!(
            "key: {} bytes, more than input.max_value_bytes = {}",
            key.len(),
            input.max_value_bytes
        ));
    }
    let algorithm = algorithm(k.algorithm)?;
    let (period_nanos, interval) = period(k)?;
    let capacity = capacity(k, algorithm, interval)?;
    let (cost, refund) = cost(k, interval)?;
    Ok(KeyPlan {
        key: super::key::state_key(key, algorithm, k.period_ms),
        limit: LimitParams {
            algorithm,
            quota: k.count,
            period_nanos,
            burst: u32::try_from(capacity).unwrap_or(u32::MAX),
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        },
        cost,
        refund,
        capacity,
    })
}

/// A holds key checked against the input bounds: its state key, slots and lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldKey {
    pub key: Arc<[u8]>,
    pub slots: u32,
    pub lease_nanos: u64,
}

/// Checks a holds call's key, slots and lease (and its name, as a Throttle call's).
pub(crate) fn hold_key(
    key: &[u8],
    slots: u32,
    lease_ms: u64,
    name: &str,
    input: &InputSettings,
) -> Result<HoldKey, String> {
    if name.len() > input.max_key_bytes {
        return Err(format!(
            "name: {} bytes, more than input.max_key_bytes = {}",
            name.len(),
            input.max_key_bytes
        ));
    }
    if key.is_empty() {
        return Err("key: give a non-empty key (or key_bytes)".to_owned());
    }
    if key.len() > input.max_value_bytes {
        return Err(format!(
            "key: {} bytes, more than input.max_value_bytes = {}",
            key.len(),
            input.max_value_bytes
        ));
    }
    if slots == 0 || slots > SLIDING_LOG_MAX_QUOTA {
        return Err(format!(
            "slots must be from 1 to {SLIDING_LOG_MAX_QUOTA}, got {slots}"
        ));
    }
    if lease_ms == 0 {
        return Err("lease_ms must be at least 1".to_owned());
    }
    let lease_nanos = lease_ms.checked_mul(NANOS_PER_MS).ok_or_else(|| {
        format!(
            "lease_ms: {lease_ms} overflows (at most {})",
            u64::MAX / NANOS_PER_MS
        )
    })?;
    Ok(HoldKey {
        key: super::key::state_key(key, Algorithm::Concurrency, lease_ms),
        slots,
        lease_nanos,
    })
}

fn algorithm(raw: i32) -> Result<Algorithm, String> {
    use pb::Algorithm as A;
    Ok(match A::try_from(raw) {
        Ok(A::Unspecified | A::Funnel) => Algorithm::Funnel,
        Ok(A::TokenBucket) => Algorithm::TokenBucket,
        Ok(A::FixedWindow) => Algorithm::FixedWindow,
        Ok(A::SlidingWindow) => Algorithm::SlidingWindow,
        Ok(A::SlidingLog) => Algorithm::SlidingLog,
        Err(_) => return Err(format!("algorithm: unknown value {raw}")),
    })
}

/// The period in nanoseconds, and the interval of one unit (period / count, rounded up).
fn period(k: &pb::ThrottleKey) -> Result<(u64, u64), String> {
    if k.count == 0 {
        return Err("count must be at least 1".to_owned());
    }
    if k.period_ms == 0 {
        return Err("period_ms must be at least 1".to_owned());
    }
    let nanos = k.period_ms.checked_mul(NANOS_PER_MS).ok_or_else(|| {
        format!(
            "period_ms: {} overflows (at most {})",
            k.period_ms,
            u64::MAX / NANOS_PER_MS
        )
    })?;
    Ok((nanos, nanos.div_ceil(u64::from(k.count))))
}

/// What the key admits at once: max_burst + 1 for the buckets (CL.THROTTLE's `limit`), the
/// count for the windows. The buckets' full level (capacity x interval) must fit in time.
fn capacity(k: &pb::ThrottleKey, algorithm: Algorithm, interval: u64) -> Result<u64, String> {
    match algorithm {
        Algorithm::Funnel | Algorithm::TokenBucket => {
            let capacity = k
                .max_burst
                .checked_add(1)
                .ok_or_else(|| format!("max_burst: at most {}", u32::MAX - 1))?;
            let capacity = u64::from(capacity);
            capacity.checked_mul(interval).ok_or_else(|| {
                "max_burst: (max_burst + 1) x period_ms / count overflows".to_owned()
            })?;
            Ok(capacity)
        }
        Algorithm::SlidingLog if k.count > SLIDING_LOG_MAX_QUOTA => Err(format!(
            "count: sliding_log keeps one entry per admitted unit: at most \
             {SLIDING_LOG_MAX_QUOTA}, got {}",
            k.count
        )),
        _ => Ok(u64::from(k.count)),
    }
}

/// The cost (1 when not set) and whether it is given back.
fn cost(k: &pb::ThrottleKey, interval: u64) -> Result<(u64, bool), String> {
    let quantity = k.quantity.unwrap_or(1);
    let cost = quantity.unsigned_abs();
    cost.checked_mul(interval)
        .ok_or_else(|| format!("quantity: {quantity} x period_ms / count overflows"))?;
    Ok((cost, k.refund || quantity < 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(f: impl FnOnce(&mut pb::ThrottleKey)) -> pb::ThrottleRequest {
        let mut k = pb::ThrottleKey {
            id: Some(Id::Key("k".to_owned())),
            max_burst: 15,
            count: 30,
            period_ms: 60_000,
            ..Default::default()
        };
        f(&mut k);
        pb::ThrottleRequest {
            keys: vec![k],
            name: String::new(),
        }
    }

    fn err(request: pb::ThrottleRequest) -> String {
        plan(&request, &InputSettings::default()).expect_err("invalid")
    }

    #[test]
    fn cl_throttle_parameters() {
        let p = plan(&key(|_| {}), &InputSettings::default()).expect("valid");
        assert_eq!(p[0].capacity, 16);
        assert_eq!(p[0].limit.burst, 16);
        assert_eq!(p[0].limit.quota, 30);
        assert_eq!(p[0].limit.period_nanos, 60_000_000_000);
        assert_eq!((p[0].cost, p[0].refund), (1, false));
        let refund = plan(&key(|k| k.quantity = Some(-3)), &InputSettings::default());
        assert_eq!(refund.map(|p| (p[0].cost, p[0].refund)), Ok((3, true)));
        let check = plan(&key(|k| k.quantity = Some(0)), &InputSettings::default());
        assert_eq!(check.map(|p| p[0].may_deny()), Ok(false));
    }

    #[test]
    fn each_invalid_field_is_named() {
        assert_eq!(
            err(key(|k| k.count = 0)),
            "keys[0].count must be at least 1"
        );
        assert_eq!(
            err(key(|k| k.period_ms = 0)),
            "keys[0].period_ms must be at least 1"
        );
        assert!(err(key(|k| k.period_ms = u64::MAX)).starts_with("keys[0].period_ms: "));
        assert!(err(key(|k| k.max_burst = u32::MAX)).starts_with("keys[0].max_burst: "));
        assert!(err(key(|k| k.quantity = Some(i64::MIN))).starts_with("keys[0].quantity: "));
        assert!(err(key(|k| k.id = None)).starts_with("keys[0].key: "));
        assert!(err(key(|k| k.algorithm = 99)).starts_with("keys[0].algorithm: "));
        let mut many = key(|_| {});
        many.keys = vec![many.keys[0].clone(); 65];
        assert!(err(many).starts_with("keys: 65 keys, more than input.max_descriptors"));
        let long = key(|k| k.id = Some(Id::KeyBytes(vec![b'x'; 16 * 1024 + 1])));
        assert!(err(long).contains("input.max_value_bytes"));
        let named = pb::ThrottleRequest {
            name: "n".repeat(300),
            ..key(|_| {})
        };
        assert!(err(named).starts_with("name: "));
        assert_eq!(
            err(pb::ThrottleRequest::default()),
            "keys must not be empty"
        );
    }

    #[test]
    fn text_and_bytes_are_one_key() {
        let text = plan(&key(|_| {}), &InputSettings::default());
        let bytes = plan(
            &key(|k| k.id = Some(Id::KeyBytes(b"k".to_vec()))),
            &InputSettings::default(),
        );
        assert_eq!(text, bytes);
    }

    #[test]
    fn hold_keys_are_checked() {
        let input = InputSettings::default();
        let id: &[u8] = b"jobs";
        let ok = hold_key(id, 10, 1000, "", &input).expect("valid");
        assert_eq!(&*ok.key, b"throttle:{jobs}:concurrency:1000ms");
        assert_eq!((ok.slots, ok.lease_nanos), (10, 1_000_000_000));
        let err = |slots, lease, id: &[u8]| hold_key(id, slots, lease, "", &input);
        assert!(err(0, 1000, id).is_err_and(|e| e.starts_with("slots must be")));
        assert!(err(10_001, 1000, id).is_err_and(|e| e.starts_with("slots must be")));
        assert!(err(1, 0, id).is_err_and(|e| e.starts_with("lease_ms must")));
        assert!(err(1, u64::MAX, id).is_err_and(|e| e.starts_with("lease_ms: ")));
        assert!(err(1, 1, b"").is_err_and(|e| e.starts_with("key: ")));
    }
}
