//! Loading rules files: YAML in, a validated [`RulesModel`] or every error out.
//!
//! A rules file holds one or more domains, as YAML documents separated by `---` (empty
//! documents are skipped). A document that is a sequence of limitador limits (empty, or whose
//! first item has `namespace`, `max_value` or `seconds`) is a limitador limits file instead,
//! read by the `limitador` module (see docs/limitador-compat.md); its errors take the same
//! form, with paths such as `[2].conditions[0]`. The format is envoyproxy/ratelimit's, plus sluice's extensions
//! (`rate_limits`, `unit_multiplier`, `algorithm`, `burst`, `charge`, `borrow`). The file is
//! parsed into a marked YAML tree (every node knows its line) and walked by hand, key by key,
//! collecting every error rather than stopping at the first. Each error reads
//! `file:line: path: message`, for example
//! `rules/api.yaml:14: descriptors[2].rate_limit.unit: unknown unit 'minutes'`. The path is
//! that of the offending key, or of the mapping holding an unknown or missing key; it is
//! empty (and left out) for errors about a whole document or file. The line is 1-based, and
//! 0 for errors about a whole file (missing, unreadable). Errors come file by file, by line.
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | `files` | expanding paths (directories walked for `*.yaml`/`*.yml`) and reading files |
//! | `tree` | parsing into marked YAML, node lines and kinds, mappings checked for unknown keys |
//! | `scalar` | typed field values (string, bool, u32) and `metadata` as JSON |
//! | `document` | a domain document and its descriptor tree |
//! | `limit` | `rate_limit` / `rate_limits` and every limit setting |
//! | `algorithm` | `algorithm`, its default, and the settings only some algorithms take |
//! | `limitador` | limitador limits files: every limit's keys, CEL compiled at load |
//!
//! # Values
//!
//! - A string field also takes a number or boolean, as written (`value: 0x1F` is `"0x1F"`,
//!   `value: 1.10` is `"1.10"`). Null counts as absent (or as empty where that is checked).
//! - A boolean field takes `true` or `false` (also `True`, `TRUE`, ...), and, unquoted, the
//!   YAML 1.1 spellings envoyproxy/ratelimit accepts (`yes`, `no`, `on`, `off`, `y`, `n`, in
//!   the same three cases); null is false. A quoted `"true"` is a string, hence an error.
//! - An integer field takes a whole number from 0 to 4294967295 (decimal, `0x`, `0o`); a
//!   quoted number is a string, hence an error.
//! - Any other null field counts as absent, except `rate_limits`, which must not be empty.
//! - `metadata` may hold any plain YAML and becomes JSON (scalars become strings, numbers,
//!   booleans or null; keys become strings).
//! - Anchors and aliases are expanded (the parser caps expansion); custom tags (`!foo`) are
//!   refused wherever a value is read.
//!
//! # Validation rules
//!
//! One test fixture per rule lives in `tests/fixtures/rules/invalid/`, named in parentheses
//! below. `'x'`, `N` and `...` stand for the offending name, number or description.
//!
//! - **YAML syntax** (`yaml_syntax.yaml`): `invalid YAML: <parser message> (column N)` at the
//!   line the parser reports; it is the file's only error, as nothing else can be checked.
//!   A key written twice in one mapping is such an error: `invalid YAML: duplicated key in
//!   mapping (column N)` (`yaml_duplicate_key.yaml`).
//! - **Nesting** (`nesting_too_deep.yaml`): a line indented more than 100 columns, or holding
//!   more than 50 block indicators (`- `, `? `, `: `), is refused before parsing with
//!   `nested too deeply (...)`, so that no input can exhaust the stack.
//! - **Unknown key** (`unknown_key.yaml`): `unknown key 'x'`, at the mapping holding it. Keys
//!   are checked per context: `unit` is unknown on a descriptor, `key` inside a limit, and so
//!   on. (`duplicate key 'x'` is reported for two keys equal only as text, e.g. `1` and `"1"`
//!   in `metadata`: `metadata_duplicate_key.yaml`.)
//! - **Wrong type** (`wrong_type.yaml`): `expected a mapping|a sequence|a string|true or
//!   false|plain YAML data|a plain key, got ...`, where `...` is e.g. `a sequence`,
//!   `a string ('maybe')`, `an integer (5)`, `null` or `a node tagged !foo`. Also a document
//!   that is not a mapping (`document_not_mapping.yaml`) and a mapping key that is not a
//!   plain scalar (`key_not_plain.yaml`).
//! - **Bad integer** (`integer_invalid.yaml`): `must not be negative, got -5`,
//!   `must be at most 4294967295, got N`, `expected an integer, got a number (1.5)`.
//! - **Domain missing or empty** (`domain_missing.yaml`): `missing domain` (on the document),
//!   `domain: must not be empty`.
//! - **Duplicate domain** (`domain_duplicate.yaml`), in one file or across files, at the
//!   second definition: `domain: duplicate domain 'x' (first defined at file:line)`.
//! - **Descriptor key missing or empty** (`descriptor_key_missing.yaml`): `missing key` (on
//!   the descriptor), `key: must not be empty`.
//! - **Duplicate descriptor** (`descriptor_duplicate.yaml`): at one level, two rules with the
//!   same key and value, or two key-only rules (no or empty `value`) for one key:
//!   `duplicate descriptor 'key_value' (first defined at line N)`, or `'key'` for key-only.
//!   Key and value are compared apart, so `a`/`b_c` and `a_b`/`c` do not collide.
//! - **`rate_limit` with `rate_limits`** (`rate_limit_and_rate_limits.yaml`), on the
//!   descriptor: `rate_limit and rate_limits cannot be used together; use one of them`.
//! - **Empty `rate_limits`** (`rate_limits_empty.yaml`), an empty list or null:
//!   `rate_limits: must list at least one limit`.
//! - **Missing unit** (`unit_missing.yaml`), on a limit that is not unlimited:
//!   `missing unit (second, minute, hour, day, week, month or year)`.
//! - **Unknown unit** (`unit_unknown.yaml`): `unit: unknown unit 'x'`. Units are
//!   case-insensitive.
//! - **Unlimited with a unit** (`unlimited_with_unit.yaml`): `unlimited: true` together with
//!   `unit`, or with any other setting of a limited limit (`unit_multiplier`, `algorithm`,
//!   `burst`, `charge`, `borrow`, `on_deny`, `block_for`, `time_zone`, `hold_id`): `unit: unit must not
//!   be set on an unlimited limit`.
//!   `requests_per_unit`, `name` and `replaces` stay allowed, as envoyproxy/ratelimit files
//!   carry them.
//! - **Unlimited among several limits** (`unlimited_in_list.yaml`), in a `rate_limits` list
//!   of more than one: `rate_limits[i].unlimited: an unlimited limit must be the only limit
//!   of its descriptor`. A list of one unlimited limit is an unlimited policy.
//! - **Empty `replaces` name** (`replaces_empty_name.yaml`): `replaces[i].name: must not be
//!   empty`, or `replaces[i]: missing name of the limit to replace`.
//! - **Replacing itself** (`replaces_self.yaml`): `replaces[i].name: a limit cannot replace
//!   itself ('x')`.
//! - **`share_threshold` without wildcard** (`share_threshold_without_wildcard.yaml`):
//!   `share_threshold: share_threshold needs a wildcard value (containing '*'), got
//!   'key_value'` (or `'key'`).
//! - **`unit_multiplier: 0`** (`unit_multiplier_zero.yaml`): `unit_multiplier: must be at
//!   least 1`.
//! - **Period over 100 years** (`period_too_long.yaml`), unit x multiplier longer than 100
//!   years of 365 days: `unit_multiplier: a period of N x unit is longer than 100 years`.
//! - **Capacity over 100 years** (`capacity_too_long.yaml`), a funnel or token bucket whose full
//!   burst drains in more than 100 years (`burst x period / requests_per_unit`), past which
//!   its nanosecond times would overflow: `burst: a burst of B at Q per period takes N years to
//!   drain (...)`.
//! - **`burst: 0`** (`burst_zero.yaml`): `burst: must be at least 1`. Without `burst`, the
//!   burst is `requests_per_unit`.
//! - **Unknown algorithm** (`algorithm_unknown.yaml`): `algorithm: unknown algorithm 'x'
//!   (expected funnel, token_bucket, fixed_window, sliding_window, sliding_log or
//!   concurrency)`; names are lower case. A limit without `algorithm` takes `limits.default_algorithm` from the
//!   settings ([`LoadOptions`]), and the checks below apply to that algorithm.
//! - **`burst` without a capacity** (`burst_without_capacity.yaml`): `burst` on a window
//!   algorithm: `burst: burst only applies to funnel and token_bucket; this limit's algorithm
//!   is x`, followed by ` (limits.default_algorithm)` when the limit names no algorithm.
//! - **`borrow` without a capacity** (`borrow_without_capacity.yaml`): `borrow: true` on a
//!   window algorithm: `borrow: borrow only applies to funnel and token_bucket, whose debt is
//!   paid back at their rate (a window forgets it when the window passes); this limit's
//!   algorithm is x` (same suffix). `borrow: false` is accepted everywhere.
//! - **`sliding_log` over its cap** (`sliding_log_over_cap.yaml`): more than 10000
//!   `requests_per_unit` with `sliding_log`: `requests_per_unit: sliding_log keeps one entry
//!   per admitted request: requests_per_unit must be at most 10000 with it, got N
//!   (sliding_window needs two counters whatever the quota); this limit's algorithm is
//!   sliding_log` (same suffix).
//! - **`concurrency` misused** (`concurrency_invalid.yaml`): more than 10000 slots
//!   (`requests_per_unit: concurrency keeps one hold per admitted request: requests_per_unit
//!   (the slots) must be at most 10000 with it, got N; this limit's algorithm is
//!   concurrency`); `burst` and `borrow: true` as for any algorithm without a capacity. Its
//!   charge is `always` unless written (a denied request keeps a pending denial), whatever the
//!   domain's or the settings' default (docs/holds.md).
//! - **A bad `hold_id`** (`hold_id_invalid.yaml`): on another algorithm (`hold_id: hold_id
//!   names a request's hold: it needs algorithm: concurrency`), empty (`hold_id: must name the
//!   descriptor entry that carries the request's id (e.g. request_id)`), two limits of one
//!   descriptor naming different keys (`hold_id 'b' differs from <path>'s 'a': the limits of
//!   one descriptor name a request's hold by one entry`), on an unlimited limit.
//! - **Unknown charge** (`charge_unknown.yaml`): `charge: unknown charge 'x' (expected
//!   admitted or always)`.
//! - **A bad `on_deny`** (`on_deny_invalid.yaml`): a key other than `body`, `content_type`,
//!   `headers` (`on_deny: unknown key 'x'`); a body over 4096 bytes or a value over 1024
//!   (`at most N bytes`); more than 16 headers (`at most 16 headers`); a header name that is
//!   not an HTTP token (`not a valid header name`), `content-type` among the headers (`set
//!   content_type instead`), a header Envoy frames itself (`a header Envoy sets itself`); a
//!   line break or NUL in a value (`a header value cannot hold a line break or NUL`).
//! - **A bad `block_for`** (`block_for_invalid.yaml`): not a number with a unit `ms`, `s`,
//!   `m`, `h` or `d` (a bare number is seconds): `block_for: invalid duration 'x' (expected a
//!   number and a unit: ms, s, m, h or d, e.g. 30s or 10m)`; 0 or more than 30 days: `must be
//!   more than 0 and at most 30 days, got 'x'`.
//! - **A bad `time_zone`** (`time_zone_invalid.yaml`): a name the bundled tz database does
//!   not know: `time_zone: unknown time zone 'x' (expected an IANA name such as
//!   Europe/Berlin)`; on an algorithm other than `fixed_window` (`time_zone only applies to
//!   fixed_window (calendar windows); this limit's algorithm is x`); with unit second, minute
//!   or hour (`unit x has no calendar meaning (use day, week, month or year)`); with
//!   `unit_multiplier`, reported on it (`time_zone windows are one calendar unit long:
//!   unit_multiplier must not be set with it`).
//! - **Limits sharing a state** (`limits_share_state.yaml`): two limits of one descriptor
//!   with the same algorithm and the same period (unit x multiplier: `60 x second` equals
//!   `1 x minute`), reported on the later one: `same algorithm (funnel) and period (60s) as
//!   descriptors[0].rate_limits[0]: the two limits would share one state`.
//! - **`metadata` not a mapping** (`metadata_not_mapping.yaml`): `metadata: expected a
//!   mapping, got ...`.
//! - **Files**: a missing or unreadable path gives `file:0: <operating system message>`
//!   (tested with temporary files); a file that is not UTF-8 gives `not valid UTF-8 (rules
//!   files must be UTF-8)` at the line of the first bad byte (`not_utf8.yaml`).
//!
//! # Files
//!
//! [`load_paths`] takes files and directories. A directory contributes every `*.yaml` and
//! `*.yml` file (any letter case) in it and in its subdirectories, following symlinks,
//! ignoring every name that starts with `.` (Kubernetes ConfigMap internals such as `..data`),
//! sorted by path. A file named explicitly is loaded whatever its extension. No files at all
//! is an empty model, not an error.

mod algorithm;
mod calendar;
mod deny;
mod document;
mod files;
mod limit;
mod limitador;
mod scalar;
mod tree;

#[cfg(test)]
mod limitador_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::limitador::NamespaceLimit;
use super::model::{Algorithm, Charge, DomainRules, LimitDefaults, Location, RulesModel};
use super::settings::{Backend, DomainLimits, LimitsSettings, Settings};

/// One problem in a rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the file as a whole (e.g. unreadable).
    pub line: usize,
    /// The YAML path of the key, e.g. `descriptors[2].rate_limit.unit`; empty for the document.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Every error found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleErrors(pub Vec<RuleError>);

impl std::fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleErrors {}

/// The rules used when no rules path is given, and the name they are reported under.
pub const EMBEDDED_NAME: &str = "<embedded>/demo.yaml";
pub const EMBEDDED_RULES: &str = include_str!("../../../../examples/rules/demo.yaml");

/// What validation takes from the settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The algorithm of a limit that names none (`limits.default_algorithm`).
    pub default_algorithm: Algorithm,
    /// Whether a denied cost is charged, for a limit that does not say (`limits.default_charge`).
    pub default_charge: Charge,
    /// Per domain, defaults that win over the two above (`limits.domains`).
    pub domains: Arc<BTreeMap<String, DomainLimits>>,
    /// The backend keeps fixed windows only (`limiter.backend = "memcache"`): a limit of
    /// another algorithm, or with `block_for`, is an error.
    pub fixed_windows_only: bool,
    /// A domain defined again adds its top-level descriptors to the first definition
    /// (`rules.merge_domains`) instead of being an error.
    pub merge_domains: bool,
    /// A home Redis is set (`redis.global_url`, with the Redis backend): limits may be
    /// `scope: global`. Without it, a global limit is an error.
    pub global_url: bool,
}

impl LoadOptions {
    /// The defaults of `domain`'s limits, and for each whether the domain's own entry set it.
    pub fn defaults(&self, domain: &str) -> (LimitDefaults, DefaultsFrom) {
        let own = self.domains.get(domain);
        let algorithm = own.and_then(|d| d.algorithm);
        let charge = own.and_then(|d| d.charge);
        let global = own.and_then(|d| d.scope) == Some(super::model::Scope::Global);
        let defaults = LimitDefaults {
            algorithm: algorithm.unwrap_or(self.default_algorithm),
            charge: charge.unwrap_or(self.default_charge),
            global,
        };
        let from = DefaultsFrom {
            algorithm: algorithm.is_some(),
            charge: charge.is_some(),
            global,
        };
        (defaults, from)
    }
}

/// Whether a domain's defaults came from its own `limits.domains` entry (`true`) or from the
/// global settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultsFrom {
    pub algorithm: bool,
    pub charge: bool,
    /// The domain is global (`limits.domains."D".scope = "global"`).
    pub global: bool,
}

impl From<&LimitsSettings> for LoadOptions {
    fn from(limits: &LimitsSettings) -> LoadOptions {
        LoadOptions {
            default_algorithm: limits.default_algorithm,
            default_charge: limits.default_charge,
            domains: Arc::new(limits.domains.clone()),
            fixed_windows_only: false,
            merge_domains: false,
            global_url: false,
        }
    }
}

impl From<&Settings> for LoadOptions {
    /// The limits' defaults, what the backend can keep, and `rules.merge_domains`.
    fn from(settings: &Settings) -> LoadOptions {
        LoadOptions {
            fixed_windows_only: settings.limiter.backend == Backend::Memcache,
            merge_domains: settings.rules.merge_domains,
            global_url: settings.limiter.backend == Backend::Redis
                && settings.redis.global_url.is_some(),
            ..(&settings.limits).into()
        }
    }
}

/// Loads every rules file of `paths` (files, or directories of `*.yaml`/`*.yml`), with the
/// default options (a limit without `algorithm` is a funnel).
pub fn load_paths(paths: &[PathBuf]) -> Result<RulesModel, RuleErrors> {
    load_paths_with(paths, LoadOptions::default())
}

/// Loads every rules file of `paths` with `options` (e.g. `(&settings.limits).into()`).
pub fn load_paths_with(paths: &[PathBuf], options: LoadOptions) -> Result<RulesModel, RuleErrors> {
    let mut loader = Loader::new(options);
    for found in files::expand(paths) {
        match found.and_then(|path| files::read(&path).map(|text| (path, text))) {
            Ok((path, text)) => loader.add(path, &text),
            Err(e) => loader.errors.push(e),
        }
    }
    loader.finish()
}

/// Validates already-read files, given as (name, text) pairs, with the default options.
pub fn from_sources(sources: &[(PathBuf, String)]) -> Result<RulesModel, RuleErrors> {
    from_sources_with(sources, LoadOptions::default())
}

/// Validates already-read files, given as (name, text) pairs, with `options`.
pub fn from_sources_with(
    sources: &[(PathBuf, String)],
    options: LoadOptions,
) -> Result<RulesModel, RuleErrors> {
    let mut loader = Loader::new(options);
    for (path, text) in sources {
        loader.add(path.clone(), text);
    }
    loader.finish()
}

/// Parses and validates the documents of one file, with the default options.
pub fn parse_file(file: &Path, text: &str) -> Result<Vec<DomainRules>, RuleErrors> {
    let mut loader = Loader::new(LoadOptions::default());
    loader.add(file.to_path_buf(), text);
    loader.finish().map(|model| model.domains)
}

/// Files checked so far: their domains and errors, and every domain name seen (even in a
/// document with errors) so a duplicate is always reported.
struct Loader {
    options: LoadOptions,
    domains: Vec<DomainRules>,
    /// The limits of limitador-format files, in file order.
    namespaces: Vec<NamespaceLimit>,
    seen: HashMap<String, Location>,
    errors: Vec<RuleError>,
}

impl Loader {
    fn new(options: LoadOptions) -> Loader {
        Loader {
            options,
            domains: Vec::new(),
            namespaces: Vec::new(),
            seen: HashMap::new(),
            errors: Vec::new(),
        }
    }

    fn add(&mut self, file: PathBuf, text: &str) {
        let mut ctx = tree::Ctx::new(Arc::new(file), text);
        ctx.options = self.options.clone();
        let docs = tree::parse(&mut ctx);
        for doc in &docs {
            if limitador::is_limits_file(doc) {
                let limits = limitador::limits(doc, &mut ctx);
                limitador::check_unique(&self.namespaces, &limits, &mut ctx);
                self.namespaces.extend(limits);
            } else if let Some(domain) = document::domain(doc, &mut ctx) {
                self.add_domain(domain, &mut ctx);
            }
        }
        ctx.errors.sort_by_key(|e| e.line);
        self.errors.append(&mut ctx.errors);
    }

    /// A limitador namespace must not also be a ratelimit domain: one request could not be
    /// decided by both.
    fn check_namespaces(&mut self) {
        for limit in &self.namespaces {
            if let Some(domain) = self.seen.get(&limit.namespace) {
                self.errors.push(RuleError {
                    file: limit.location.file.as_ref().clone(),
                    line: limit.location.line,
                    path: String::new(),
                    message: format!(
                        "namespace '{}' is also a domain of a rules file (at {domain})",
                        limit.namespace
                    ),
                });
            }
        }
    }

    /// Adds a domain's rules: a new domain, or (with `merge_domains`) its top-level
    /// descriptors to the domain's first definition; otherwise a domain seen before is an
    /// error.
    fn add_domain(&mut self, domain: DomainRules, ctx: &mut tree::Ctx<'_>) {
        let Some(first) = self.seen.get(&domain.domain) else {
            let location = domain.location.clone();
            self.seen.insert(domain.domain.clone(), location);
            self.domains.push(domain);
            return;
        };
        if !self.options.merge_domains {
            let message = format!(
                "duplicate domain '{}' (first defined at {first})",
                domain.domain
            );
            ctx.error(domain.location.line, "domain", message);
            return;
        }
        match self.domains.iter_mut().find(|d| d.domain == domain.domain) {
            Some(into) => document::merge(into, domain.descriptors, ctx),
            None => self.domains.push(domain),
        }
    }

    fn finish(mut self) -> Result<RulesModel, RuleErrors> {
        self.check_namespaces();
        if self.errors.is_empty() {
            Ok(RulesModel {
                domains: self.domains,
                namespaces: self.namespaces,
                default_algorithm: self.options.default_algorithm,
            })
        } else {
            Err(RuleErrors(self.errors))
        }
    }
}
