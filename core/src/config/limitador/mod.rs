//! limitador's model: namespaces of flat limits with CEL `conditions` and `variables` (see
//! docs/limitador-compat.md). A namespace is the domain of a request; every limit of it whose
//! conditions all hold and whose variables all resolve applies, keyed by the limit's identity
//! and its variables' values ([`crate::rules::limitador`] compiles and evaluates them).
//!
//! The file format is read by `config::rules_file` (its `limitador` module); `cel` compiles and
//! evaluates the expressions.

pub mod cel;
pub mod labels;

use std::num::NonZeroU32;

use self::cel::Expr;
use super::model::{Algorithm, Charge, LimitRule, Location, Unit};

/// One validated limit of a limitador limits file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceLimit {
    /// Non-empty.
    pub namespace: String,
    pub id: Option<String>,
    pub name: Option<String>,
    pub max_value: u32,
    /// The window, at most 100 years.
    pub seconds: NonZeroU32,
    /// Sorted by source text, without repeats (limitador keeps them as a set).
    pub conditions: Vec<Expr>,
    /// Sorted by source text, without repeats.
    pub variables: Vec<Expr>,
    /// `fixed_window` (limitador's) unless sluice's `algorithm` key says otherwise.
    pub algorithm: Algorithm,
    pub location: Location,
}

impl NamespaceLimit {
    /// The sluice limit this is decided with: `max_value` per `seconds` seconds, charged only
    /// when the whole request is admitted (limitador updates no counter of a limited request).
    pub fn rule(&self) -> LimitRule {
        LimitRule {
            name: self.name.clone(),
            unit: Unit::Second,
            requests_per_unit: self.max_value,
            unit_multiplier: self.seconds,
            algorithm: self.algorithm,
            burst: self.max_value,
            charge: Charge::Admitted,
            borrow: false,
            replaces: Vec::new(),
            on_deny: None,
            block_nanos: 0,
            global: false,
            time_zone: None,
            hold_id: None,
        }
    }

    /// What makes two limits the same limit, as limitador compares them: the namespace, the
    /// window, the conditions and the variables (not `max_value` nor `name`, so a reload that
    /// changes only those keeps the counters).
    pub(crate) fn same_limit(&self, other: &NamespaceLimit) -> bool {
        self.namespace == other.namespace
            && self.seconds == other.seconds
            && self.conditions == other.conditions
            && self.variables == other.variables
    }

    /// The limit's part of its counters' keys: `id:<id>` when it has an id, else a hash of
    /// its identity (stable across processes and versions).
    pub fn key_id(&self) -> String {
        if let Some(id) = &self.id {
            return format!("id:{id}");
        }
        let mut hash = Fnv::default();
        hash.write(self.namespace.as_bytes());
        hash.write(&self.seconds.get().to_be_bytes());
        for (tag, exprs) in [(b'c', &self.conditions), (b'v', &self.variables)] {
            for e in exprs {
                hash.write(&[tag]);
                hash.write(e.source().as_bytes());
            }
        }
        format!("{:016x}", hash.0)
    }
}

/// FNV-1a, 64 bits: a small stable hash (the std and ahash hashers are seeded per process).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes.iter().chain(&[0xff]) {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
