//! The keys denied most, per domain, over the last minute and the last hour, in bounded
//! memory: a Space-Saving sketch per time slice, off the request path's locks.
//!
//! # Sketch
//!
//! Space-Saving keeps at most [`K`] counters. A denied key already counted adds its cost to
//! its counter; a new one takes a free counter, or else replaces the smallest one, inheriting
//! its count (`count = min + cost`). The counts always add up to the cost of every denial
//! seen, `N`, so the smallest is at most `N / K`, and for every key:
//! `0 <= estimate - true <= N / K` when it holds a counter, `true <= N / K` when it does not.
//!
//! # Slices, shards, error bound
//!
//! Time is cut in slices (the minute: 6 of 10 s; the hour: 6 of 10 min). Each slice has
//! [`SHARDS`] sketches; a denial goes to the one its key hashes to, or, when that one is
//! locked (another thread is in it), to the next free one: a request never waits for a lock
//! here (`try_lock`). In the rare case every one is busy the denial is dropped, and counted.
//! A window reads the slices that started within it (the current one included: "the last
//! minute" covers 50 to 60 s) and adds the counters of one key across them. Each sketch keeps
//! its own bound, and the bounds add up, so every count reported is within
//! `N / K + dropped` of the truth, `N` the cost of the window's denials in that domain
//! (`error_bound` in the answer): a key denied more than twice that is always listed.
//!
//! # Memory
//!
//! Per domain, at most `(6 + 6) x SHARDS x K` counters, each with its key's text cut to
//! [`MAX_KEY_BYTES`]: [`TopDenied::max_counters`]. Domains are the configured ones (the
//! engine reports no other); a domain gone from the rules is dropped at the next scrape.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ahash::RandomState;
use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;

use crate::engine::DescriptorReport;

/// Counters per sketch.
pub const K: usize = 256;
/// Sketches per slice.
pub(crate) const SHARDS: usize = 4;
/// A key's text is cut to this many bytes (its counter is still that of the whole key).
pub(crate) const MAX_KEY_BYTES: usize = 256;

/// A window of time: its slices' length and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Minute,
    Hour,
}

impl Window {
    pub const ALL: [Window; 2] = [Window::Minute, Window::Hour];

    fn slice_secs(self) -> u64 {
        match self {
            Window::Minute => 10,
            Window::Hour => 600,
        }
    }

    const SLICES: usize = 6;

    pub fn as_str(self) -> &'static str {
        match self {
            Window::Minute => "minute",
            Window::Hour => "hour",
        }
    }

    pub fn parse(text: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.as_str() == text)
    }
}

/// One key as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Heavy {
    /// The descriptor's entries, `k1=v1|k2=v2` (escaped as in state keys; cut to
    /// [`MAX_KEY_BYTES`]).
    pub key: String,
    /// The rule's path (empty for a client's override).
    pub rule: String,
    /// Estimated denied cost in the window.
    pub denied: u64,
}

/// The keys denied most in one domain and window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Top {
    /// Heaviest first.
    pub keys: Vec<Heavy>,
    /// Denied cost seen in the window (all keys).
    pub total: u64,
    /// Every `denied` is within this of the true count.
    pub error_bound: u64,
}

/// The sketches of every domain.
pub(crate) struct TopDenied {
    domains: RwLock<HashMap<String, Arc<DomainTop>, RandomState>>,
    hasher: RandomState,
    start: Instant,
    dropped: AtomicU64,
}

struct DomainTop {
    windows: [Slices; 2],
}

struct Slices {
    window: Window,
    slices: Box<[[Mutex<Sketch>; SHARDS]]>,
}

impl Default for TopDenied {
    fn default() -> Self {
        TopDenied {
            domains: RwLock::new(HashMap::default()),
            hasher: RandomState::new(),
            start: Instant::now(),
            dropped: AtomicU64::new(0),
        }
    }
}

impl TopDenied {
    /// The most counters one domain may hold.
    pub(crate) const fn max_counters() -> usize {
        2 * Window::SLICES * SHARDS * K
    }

    /// Counts a denied descriptor (the request path: never waits for a lock).
    pub(super) fn record(&self, r: &DescriptorReport<'_>) {
        if !r.over || r.refund {
            return;
        }
        let hash = self.hasher.hash_one(r.entries);
        let now = self.start.elapsed().as_secs();
        let Some(domain) = self.domain(r.domain) else {
            return;
        };
        let cost = r.cost.max(1);
        let mut name = None;
        for slices in &domain.windows {
            let epoch = now / slices.window.slice_secs();
            let slice = &slices.slices[(epoch as usize) % Window::SLICES];
            let made = (0..SHARDS).find_map(|i| {
                let mut sketch = slice[(hash as usize + i) % SHARDS].try_lock()?;
                sketch.add(epoch, hash, cost, || {
                    name.get_or_insert_with(|| describe(r)).clone()
                });
                Some(())
            });
            if made.is_none() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn domain(&self, name: &str) -> Option<Arc<DomainTop>> {
        if let Some(d) = self.domains.read().get(name) {
            return Some(d.clone());
        }
        let mut all = self.domains.write();
        let d = all
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(DomainTop::new()));
        Some(d.clone())
    }

    /// The `n` keys of `domain` denied most in `window`.
    pub(crate) fn top(&self, domain: &str, window: Window, n: usize) -> Top {
        let Some(d) = self.domains.read().get(domain).cloned() else {
            return Top::default();
        };
        let now = self.start.elapsed().as_secs();
        let slices = &d.windows[window as usize];
        let epoch = now / window.slice_secs();
        let oldest = epoch.saturating_sub(Window::SLICES as u64 - 1);
        let mut merged: HashMap<u64, Heavy> = HashMap::new();
        let mut total = 0;
        for shard in slices.slices.iter().flatten() {
            let sketch = shard.lock();
            if sketch.epoch < oldest || sketch.epoch > epoch {
                continue;
            }
            for c in &sketch.counters {
                total += c.count;
                let e = merged.entry(c.hash).or_insert_with(|| Heavy {
                    key: c.key.0.to_string(),
                    rule: c.key.1.to_string(),
                    denied: 0,
                });
                e.denied += c.count;
            }
        }
        let mut keys: Vec<Heavy> = merged.into_values().collect();
        keys.sort_by(|a, b| b.denied.cmp(&a.denied).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(n);
        Top {
            keys,
            total,
            error_bound: total.div_ceil(K as u64) + self.dropped.load(Ordering::Relaxed),
        }
    }

    /// The denied cost of one key (a descriptor's entries) of `domain` in `window`, and the
    /// bound on its error (as [`Top::error_bound`]): a key no counter holds reads 0.
    pub(crate) fn denied(
        &self,
        domain: &str,
        entries: &[crate::rules::Entry],
        window: Window,
    ) -> (u64, u64) {
        let Some(d) = self.domains.read().get(domain).cloned() else {
            return (0, 0);
        };
        let hash = self.hasher.hash_one(entries);
        let now = self.start.elapsed().as_secs();
        let slices = &d.windows[window as usize];
        let epoch = now / window.slice_secs();
        let oldest = epoch.saturating_sub(Window::SLICES as u64 - 1);
        let (mut denied, mut total) = (0, 0);
        for shard in slices.slices.iter().flatten() {
            let sketch = shard.lock();
            if sketch.epoch < oldest || sketch.epoch > epoch {
                continue;
            }
            total += sketch.counters.iter().map(|c| c.count).sum::<u64>();
            if let Some(c) = sketch.at.get(&hash).and_then(|&i| sketch.counters.get(i)) {
                denied += c.count;
            }
        }
        let bound = total.div_ceil(K as u64) + self.dropped.load(Ordering::Relaxed);
        (denied, bound)
    }

    /// The domains with sketches.
    pub(crate) fn domains(&self) -> Vec<String> {
        let mut names: Vec<String> = self.domains.read().keys().cloned().collect();
        names.sort();
        names
    }

    /// Counters held, all domains together.
    pub(crate) fn counters_held(&self) -> usize {
        let domains: Vec<Arc<DomainTop>> = self.domains.read().values().cloned().collect();
        domains
            .iter()
            .flat_map(|d| d.windows.iter())
            .flat_map(|s| s.slices.iter().flatten())
            .map(|s| s.lock().counters.len())
            .sum()
    }

    /// Forgets domains no longer configured.
    pub(super) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.domains.write().retain(|name, _| keep(name));
    }

    /// Denials dropped because every sketch of their slice was busy.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl DomainTop {
    fn new() -> DomainTop {
        DomainTop {
            windows: Window::ALL.map(|window| Slices {
                window,
                slices: (0..Window::SLICES)
                    .map(|_| std::array::from_fn(|_| Mutex::new(Sketch::default())))
                    .collect(),
            }),
        }
    }
}

/// A key's text and rule.
type Name = (Arc<str>, Arc<str>);

fn describe(r: &DescriptorReport<'_>) -> Name {
    let mut key = String::new();
    for (i, e) in r.entries.iter().enumerate() {
        if i > 0 {
            key.push('|');
        }
        crate::rules::key::escape_into(&mut key, &e.key);
        key.push('=');
        crate::rules::key::escape_into(&mut key, &e.value);
        if key.len() > MAX_KEY_BYTES {
            break;
        }
    }
    if key.len() > MAX_KEY_BYTES {
        let mut cut = MAX_KEY_BYTES;
        while !key.is_char_boundary(cut) {
            cut -= 1;
        }
        key.truncate(cut);
    }
    let rule = r.matched.map(|m| {
        let segments: Vec<String> = m
            .path()
            .iter()
            .map(|r| crate::rules::naming::segment(r))
            .collect();
        segments.join(".")
    });
    (key.into(), rule.unwrap_or_default().into())
}

struct Counter {
    hash: u64,
    key: Name,
    count: u64,
}

/// One Space-Saving sketch of one slice: counters in an indexed min-heap by count.
#[derive(Default)]
struct Sketch {
    /// The slice it counts (slices are reused: an older epoch is cleared first).
    epoch: u64,
    /// A min-heap by `count`.
    counters: Vec<Counter>,
    /// Where each key's counter is in the heap.
    at: HashMap<u64, usize, RandomState>,
}

impl Sketch {
    fn add(&mut self, epoch: u64, hash: u64, cost: u64, name: impl FnOnce() -> Name) {
        if self.epoch != epoch {
            self.epoch = epoch;
            self.counters.clear();
            self.at.clear();
        }
        if let Some(&i) = self.at.get(&hash) {
            if let Some(c) = self.counters.get_mut(i) {
                c.count += cost;
            }
            self.sift_down(i);
            return;
        }
        if self.counters.len() < K {
            let counter = Counter {
                hash,
                key: name(),
                count: cost,
            };
            self.counters.push(counter);
            let last = self.counters.len() - 1;
            self.at.insert(hash, last);
            self.sift_up(last);
            return;
        }
        // Replace the smallest: the new key inherits its count.
        let Some(min) = self.counters.first_mut() else {
            return;
        };
        self.at.remove(&min.hash);
        min.hash = hash;
        min.key = name();
        min.count += cost;
        self.at.insert(hash, 0);
        self.sift_down(0);
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.counters.swap(a, b);
        for i in [a, b] {
            if let Some(c) = self.counters.get(i) {
                self.at.insert(c.hash, i);
            }
        }
    }

    fn count(&self, i: usize) -> u64 {
        self.counters.get(i).map_or(u64::MAX, |c| c.count)
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.count(parent) <= self.count(i) {
                break;
            }
            self.swap(parent, i);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if self.count(l) < self.count(least) {
                least = l;
            }
            if self.count(r) < self.count(least) {
                least = r;
            }
            if least == i {
                return;
            }
            self.swap(i, least);
            i = least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Entry;

    fn deny(top: &TopDenied, value: &str) {
        let entries = [Entry::new("user", value)];
        top.record(&DescriptorReport::denied("d", &entries));
    }

    #[test]
    fn a_skewed_flood_keeps_its_heavy_keys_first_within_the_bound() {
        let top = TopDenied::default();
        let heavy = [
            ("h0", 3000u64),
            ("h1", 2500),
            ("h2", 2000),
            ("h3", 1500),
            ("h4", 1000),
        ];
        let mut truth: HashMap<String, u64> = HashMap::new();
        // 100,000 distinct light keys, denied once or twice, the heavy ones interleaved.
        for i in 0..100_000u64 {
            let light = format!("light{i}");
            for _ in 0..(1 + i % 2) {
                deny(&top, &light);
                *truth.entry(format!("user={light}")).or_default() += 1;
            }
            for (name, n) in heavy {
                if i % (100_000 / n) == 0 {
                    deny(&top, name);
                    *truth.entry(format!("user={name}")).or_default() += 1;
                }
            }
        }
        let all = top.top("d", Window::Hour, usize::MAX);
        let n: u64 = truth.values().sum();
        assert_eq!(all.total, n);
        assert_eq!(all.error_bound, n.div_ceil(K as u64));
        let names: Vec<&str> = all.keys.iter().take(5).map(|h| h.key.as_str()).collect();
        assert_eq!(
            names,
            ["user=h0", "user=h1", "user=h2", "user=h3", "user=h4"]
        );
        for h in &all.keys {
            let t = truth.get(&h.key).copied().unwrap_or(0);
            assert!(h.denied.abs_diff(t) <= all.error_bound, "{h:?} true {t}");
        }
        assert!(top.counters_held() <= TopDenied::max_counters());
        assert!(all.keys.len() <= 2 * SHARDS * K);
    }

    #[test]
    fn the_heap_keeps_the_smallest_count_on_top() {
        let mut s = Sketch::default();
        let name = || -> Name { (Arc::from("k"), Arc::from("")) };
        for i in 0..(3 * K as u64) {
            s.add(1, i % (K as u64 + 7), 1 + i % 5, name);
            let min = s.counters.iter().map(|c| c.count).min();
            assert_eq!(s.counters.first().map(|c| c.count), min);
            assert_eq!(s.at.len(), s.counters.len());
        }
        s.add(2, 99, 1, name);
        assert_eq!(s.counters.len(), 1);
    }
}
