//! Properties of the pieces, with no server: each algorithm through the memory backend on a
//! manual clock (rate bounds, exact retry times, denials that change nothing, agreement with
//! the pure algorithm), state keys, and the inputs the fuzzers once found.

mod support;

mod fixed_window;
mod funnel;
mod fuzz_regressions;
mod returns;
mod rules_keys;
mod sliding_log;
mod sliding_window;
mod token_bucket;
