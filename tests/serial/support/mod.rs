//! Helpers of the serial tests: a small Chrome DevTools Protocol client (`cdp`) that drives a
//! real headless Chromium.

pub(crate) mod cdp;
