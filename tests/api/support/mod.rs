//! Helpers of the api tests: the invalid rules fixtures with their errors. (Waiting for
//! something that happens in the background is `sluice::testing::eventually`.)

pub(crate) mod invalid_rules;
