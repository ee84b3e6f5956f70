//! The invalid rules fixtures (`tests/fixtures/rules/invalid/`, one per validation rule) and
//! the exact errors each gives, as `file:line: path: message` with the file's bare name. Used by
//! rules_validation.rs, through the loader and through `sluice check`.

pub(crate) const INVALID_DIR: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rules/invalid");

/// Each invalid fixture and the errors it must give, as `file:line: path: message`.
#[rustfmt::skip]
pub(crate) const INVALID: &[(&str, &[&str])] = &[
    ("algorithm_unknown.yaml", &[
        "algorithm_unknown.yaml:8: descriptors[0].rate_limit.algorithm: unknown algorithm 'leaky_bucket' (expected funnel, token_bucket, fixed_window, sliding_window, sliding_log or concurrency)",
        "algorithm_unknown.yaml:13: descriptors[1].rate_limits[0].algorithm: unknown algorithm 'Funnel' (expected funnel, token_bucket, fixed_window, sliding_window, sliding_log or concurrency)",
        "algorithm_unknown.yaml:16: descriptors[1].rate_limits[1].algorithm: unknown algorithm 'gcra' (expected funnel, token_bucket, fixed_window, sliding_window, sliding_log or concurrency)",
    ]),
    ("block_for_invalid.yaml", &[
        "block_for_invalid.yaml:8: descriptors[0].rate_limit.block_for: invalid duration '10 parsecs' (expected a number and a unit: ms, s, m, h or d, e.g. 30s or 10m)",
        "block_for_invalid.yaml:13: descriptors[1].rate_limit.block_for: must be more than 0 and at most 30 days, got '0s'",
        "block_for_invalid.yaml:18: descriptors[2].rate_limit.block_for: must be more than 0 and at most 30 days, got '31d'",
        "block_for_invalid.yaml:20: descriptors[3].rate_limit.block_for: block_for must not be set on an unlimited limit",
    ]),
    ("borrow_without_capacity.yaml", &[
        "borrow_without_capacity.yaml:9: descriptors[0].rate_limit.borrow: borrow only applies to funnel and token_bucket, whose debt is paid back at their rate (a window forgets it when the window passes); this limit's algorithm is fixed_window",
    ]),
    ("burst_without_capacity.yaml", &[
        "burst_without_capacity.yaml:9: descriptors[0].rate_limit.burst: burst only applies to funnel and token_bucket; this limit's algorithm is fixed_window",
        "burst_without_capacity.yaml:13: descriptors[1].rate_limits[1].burst: burst only applies to funnel and token_bucket; this limit's algorithm is fixed_window",
    ]),
    ("burst_zero.yaml", &[
        "burst_zero.yaml:8: descriptors[0].rate_limit.burst: must be at least 1",
    ]),
    ("capacity_too_long.yaml", &[
        "capacity_too_long.yaml:10: descriptors[0].rate_limit.burst: a burst of 6 at 1 per period takes 600 years to drain (burst x period / requests_per_unit must be at most 100 years)",
        "capacity_too_long.yaml:22: descriptors[2].rate_limit.burst: a burst of 3 at 1 per period takes 150 years to drain (burst x period / requests_per_unit must be at most 100 years)",
    ]),
    ("charge_unknown.yaml", &[
        "charge_unknown.yaml:8: descriptors[0].rate_limit.charge: unknown charge 'denied' (expected admitted or always)",
    ]),
    ("concurrency_invalid.yaml", &[
        "concurrency_invalid.yaml:7: descriptors[0].rate_limit.requests_per_unit: concurrency keeps one hold per admitted request: requests_per_unit (the slots) must be at most 10000 with it, got 10001; this limit's algorithm is concurrency",
        "concurrency_invalid.yaml:14: descriptors[1].rate_limit.burst: burst only applies to funnel and token_bucket; this limit's algorithm is concurrency",
        "concurrency_invalid.yaml:15: descriptors[1].rate_limit.borrow: borrow only applies to funnel and token_bucket, whose debt is paid back at their rate (a window forgets it when the window passes); this limit's algorithm is concurrency",
    ]),
    ("descriptor_duplicate.yaml", &[
        "descriptor_duplicate.yaml:9: descriptors[3]: duplicate descriptor 'k_v' (first defined at line 4)",
        "descriptor_duplicate.yaml:11: descriptors[4]: duplicate descriptor 'k' (first defined at line 6)",
        "descriptor_duplicate.yaml:17: descriptors[5].descriptors[1]: duplicate descriptor 'child_x*' (first defined at line 15)",
    ]),
    ("descriptor_key_missing.yaml", &[
        "descriptor_key_missing.yaml:4: descriptors[0]: missing key",
        "descriptor_key_missing.yaml:8: descriptors[1].key: must not be empty",
        "descriptor_key_missing.yaml:9: descriptors[2].key: must not be empty",
        "descriptor_key_missing.yaml:11: descriptors[2].descriptors[0]: missing key",
    ]),
    ("document_not_mapping.yaml", &[
        "document_not_mapping.yaml:2: expected a mapping, got a sequence",
        "document_not_mapping.yaml:4: expected a mapping, got a string ('just text')",
    ]),
    ("domain_duplicate.yaml", &[
        "domain_duplicate.yaml:6: domain: duplicate domain 'twice' (first defined at domain_duplicate.yaml:2)",
    ]),
    ("domain_missing.yaml", &[
        "domain_missing.yaml:2: missing domain",
        "domain_missing.yaml:5: domain: must not be empty",
        "domain_missing.yaml:7: domain: must not be empty",
    ]),
    ("hold_id_invalid.yaml", &[
        "hold_id_invalid.yaml:8: descriptors[0].rate_limit.hold_id: hold_id names a request's hold: it needs algorithm: concurrency",
        "hold_id_invalid.yaml:14: descriptors[1].rate_limit.hold_id: must name the descriptor entry that carries the request's id (e.g. request_id)",
        "hold_id_invalid.yaml:21: descriptors[2].rate_limits[1]: hold_id 'trace_id' differs from descriptors[2].rate_limits[0]'s 'request_id': the limits of one descriptor name a request's hold by one entry",
        "hold_id_invalid.yaml:28: descriptors[3].rate_limit.hold_id: hold_id must not be set on an unlimited limit",
    ]),
    ("integer_invalid.yaml", &[
        "integer_invalid.yaml:7: descriptors[0].rate_limit.requests_per_unit: must not be negative, got -5",
        "integer_invalid.yaml:11: descriptors[1].rate_limit.requests_per_unit: must be at most 4294967295, got 4294967296",
        "integer_invalid.yaml:15: descriptors[2].rate_limit.requests_per_unit: must be at most 4294967295, got 99999999999999999999",
        "integer_invalid.yaml:19: descriptors[3].rate_limit.requests_per_unit: expected an integer, got a number (1.5)",
        "integer_invalid.yaml:23: descriptors[4].rate_limit.requests_per_unit: expected an integer, got a string ('10')",
    ]),
    ("key_not_plain.yaml", &[
        "key_not_plain.yaml:5: descriptors[0]: expected a plain key, got a sequence",
        "key_not_plain.yaml:8: descriptors[1]: expected a plain key, got a mapping",
    ]),
    ("limits_share_state.yaml", &[
        "limits_share_state.yaml:8: descriptors[0].rate_limits[1]: same algorithm (funnel) and period (60s) as descriptors[0].rate_limits[0]: the two limits would share one state",
        "limits_share_state.yaml:13: descriptors[0].rate_limits[3]: same algorithm (funnel) and period (60s) as descriptors[0].rate_limits[0]: the two limits would share one state",
    ]),
    ("metadata_duplicate_key.yaml", &[
        "metadata_duplicate_key.yaml:5: descriptors[0].metadata: duplicate key '1'",
        "metadata_duplicate_key.yaml:10: descriptors[1].metadata.nested: duplicate key 'true'",
    ]),
    ("metadata_not_mapping.yaml", &[
        "metadata_not_mapping.yaml:5: descriptors[0].metadata: expected a mapping, got a sequence",
        "metadata_not_mapping.yaml:7: descriptors[1].metadata: expected a mapping, got a string ('owner')",
    ]),
    ("nesting_too_deep.yaml", &[
        "nesting_too_deep.yaml:103: nested too deeply (at most 100 columns of indentation and 50 nested collections on one line)",
    ]),
    ("not_utf8.yaml", &[
        "not_utf8.yaml:4: not valid UTF-8 (rules files must be UTF-8)",
    ]),
    ("on_deny_invalid.yaml", &[
        "on_deny_invalid.yaml:9: descriptors[0].rate_limit.on_deny: unknown key 'status'",
        "on_deny_invalid.yaml:15: descriptors[1].rate_limit.on_deny.headers.Content-Type: set content_type instead",
        "on_deny_invalid.yaml:15: descriptors[1].rate_limit.on_deny.headers.connection: a header Envoy sets itself",
        "on_deny_invalid.yaml:15: descriptors[1].rate_limit.on_deny.headers.x bad: not a valid header name",
        "on_deny_invalid.yaml:20: descriptors[2].rate_limit.on_deny.content_type: a header value cannot hold a line break or NUL",
    ]),
    ("period_too_long.yaml", &[
        "period_too_long.yaml:7: descriptors[0].rate_limit.unit_multiplier: a period of 101 x year is longer than 100 years",
        "period_too_long.yaml:17: descriptors[2].rate_limit.unit_multiplier: a period of 4294967295 x second is longer than 100 years",
    ]),
    ("rate_limit_and_rate_limits.yaml", &[
        "rate_limit_and_rate_limits.yaml:8: descriptors[0]: rate_limit and rate_limits cannot be used together; use one of them",
    ]),
    ("rate_limits_empty.yaml", &[
        "rate_limits_empty.yaml:5: descriptors[0].rate_limits: must list at least one limit",
        "rate_limits_empty.yaml:7: descriptors[1].rate_limits: must list at least one limit",
    ]),
    ("replaces_empty_name.yaml", &[
        "replaces_empty_name.yaml:9: descriptors[0].rate_limit.replaces[0].name: must not be empty",
        "replaces_empty_name.yaml:10: descriptors[0].rate_limit.replaces[1]: missing name of the limit to replace",
    ]),
    ("replaces_self.yaml", &[
        "replaces_self.yaml:11: descriptors[0].rate_limit.replaces[1].name: a limit cannot replace itself ('per_a')",
    ]),
    ("share_threshold_without_wildcard.yaml", &[
        "share_threshold_without_wildcard.yaml:6: descriptors[0].share_threshold: share_threshold needs a wildcard value (containing '*'), got 'path_/exact'",
        "share_threshold_without_wildcard.yaml:11: descriptors[1].share_threshold: share_threshold needs a wildcard value (containing '*'), got 'path'",
    ]),
    ("sliding_log_over_cap.yaml", &[
        "sliding_log_over_cap.yaml:7: descriptors[0].rate_limit.requests_per_unit: sliding_log keeps one entry per admitted request: requests_per_unit must be at most 10000 with it, got 10001 (sliding_window needs two counters whatever the quota); this limit's algorithm is sliding_log",
        "sliding_log_over_cap.yaml:12: descriptors[1].descriptors[0].rate_limit.borrow: borrow only applies to funnel and token_bucket, whose debt is paid back at their rate (a window forgets it when the window passes); this limit's algorithm is sliding_log",
    ]),
    ("time_zone_invalid.yaml", &[
        "time_zone_invalid.yaml:10: descriptors[0].rate_limit.time_zone: unknown time zone 'Europe/Atlantis' (expected an IANA name such as Europe/Berlin)",
        "time_zone_invalid.yaml:16: descriptors[1].rate_limit.time_zone: time_zone only applies to fixed_window (calendar windows); this limit's algorithm is funnel",
        "time_zone_invalid.yaml:22: descriptors[2].rate_limit.time_zone: time_zone aligns windows to local days, ISO weeks, calendar months or years; unit second has no calendar meaning (use day, week, month or year)",
        "time_zone_invalid.yaml:26: descriptors[3].rate_limit.unit_multiplier: time_zone windows are one calendar unit long: unit_multiplier must not be set with it",
    ]),
    ("unit_missing.yaml", &[
        "unit_missing.yaml:5: descriptors[0].rate_limit: missing unit (second, minute, hour, day, week, month or year)",
        "unit_missing.yaml:11: descriptors[1].rate_limits[1]: missing unit (second, minute, hour, day, week, month or year)",
        "unit_missing.yaml:13: descriptors[2].rate_limit: missing unit (second, minute, hour, day, week, month or year)",
    ]),
    ("unit_multiplier_zero.yaml", &[
        "unit_multiplier_zero.yaml:7: descriptors[0].rate_limit.unit_multiplier: must be at least 1",
    ]),
    ("unit_unknown.yaml", &[
        "unit_unknown.yaml:6: descriptors[0].rate_limit.unit: unknown unit 'minutes'",
        "unit_unknown.yaml:14: descriptors[2].rate_limit.unit: unknown unit '1'",
    ]),
    ("unknown_key.yaml", &[
        "unknown_key.yaml:3: unknown key 'descriptor'",
        "unknown_key.yaml:7: descriptors[0]: unknown key 'unit'",
        "unknown_key.yaml:9: descriptors[0].rate_limit: unknown key 'unti'",
        "unknown_key.yaml:14: descriptors[0].rate_limit.replaces[0]: unknown key 'key'",
        "unknown_key.yaml:17: descriptors[1]: unknown key 'domain'",
    ]),
    ("unlimited_in_list.yaml", &[
        "unlimited_in_list.yaml:8: descriptors[0].rate_limits[1].unlimited: an unlimited limit must be the only limit of its descriptor",
    ]),
    ("unlimited_with_unit.yaml", &[
        "unlimited_with_unit.yaml:7: descriptors[0].rate_limit.unit: unit must not be set on an unlimited limit",
        "unlimited_with_unit.yaml:12: descriptors[1].rate_limit.burst: burst must not be set on an unlimited limit",
        "unlimited_with_unit.yaml:13: descriptors[1].rate_limit.algorithm: algorithm must not be set on an unlimited limit",
    ]),
    ("wrong_type.yaml", &[
        "wrong_type.yaml:2: domain: expected a string, got a sequence",
        "wrong_type.yaml:5: descriptors: expected a sequence, got a mapping",
        "wrong_type.yaml:10: descriptors[0]: expected a mapping, got a string ('plain string')",
        "wrong_type.yaml:11: descriptors[1].key: expected a string, got a mapping",
        "wrong_type.yaml:12: descriptors[1].shadow_mode: expected true or false, got a string ('maybe')",
        "wrong_type.yaml:13: descriptors[1].rate_limit: expected a mapping, got a string ('second')",
        "wrong_type.yaml:15: descriptors[2].quota_mode: expected true or false, got a string ('true')",
        "wrong_type.yaml:16: descriptors[2].rate_limits: expected a sequence, got a mapping",
        "wrong_type.yaml:18: descriptors[3].value: expected a string, got a node tagged !custom",
        "wrong_type.yaml:20: descriptors[3].rate_limit.unit: expected a string, got a sequence",
        "wrong_type.yaml:21: descriptors[3].rate_limit.replaces: expected a sequence, got a string ('x')",
        "wrong_type.yaml:26: descriptors[4].metadata.nested.tagged: expected plain YAML data, got a node tagged !weird",
    ]),
    ("yaml_duplicate_key.yaml", &[
        "yaml_duplicate_key.yaml:7: invalid YAML: duplicated key in mapping (column 7)",
    ]),
    ("yaml_syntax.yaml", &[
        "yaml_syntax.yaml:5: invalid YAML: while parsing a block collection, did not find expected '-' indicator (column 4)",
    ]),
];

/// Every expected error line of the directory, file by file (in name order), line by line.
pub(crate) fn every_line() -> impl Iterator<Item = &'static str> {
    INVALID.iter().flat_map(|(_, lines)| lines.iter().copied())
}
