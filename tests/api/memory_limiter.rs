//! The memory backend, driven through the `Limiter` trait with a manual clock.

use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::{
    BatchOutcome, Hit, HitOutcome, LimitParams, ManualClock, MemoryLimiter, Role,
};
use sluice::testing::limits::{check_now, hit, limit};

const SEC: u64 = 1_000_000_000;
const MIN: u64 = 60 * SEC;
const START: u64 = 1_000 * SEC;

/// A funnel of `quota` per `period_nanos`.
fn per(quota: u32, period_nanos: u64) -> LimitParams {
    limit(Algorithm::Funnel, quota, period_nanos)
}

fn always(limit: LimitParams) -> LimitParams {
    LimitParams {
        charge: Charge::Always,
        ..limit
    }
}

fn in_group(group: usize, role: Role, hit: Hit) -> Hit {
    Hit { group, role, ..hit }
}

fn refund(hit: Hit) -> Hit {
    Hit {
        refund: true,
        ..hit
    }
}

fn limiter(max_keys: usize) -> (MemoryLimiter<ManualClock>, ManualClock) {
    let clock = ManualClock::at(START);
    (MemoryLimiter::with_clock(max_keys, clock.clone()), clock)
}

/// Checks a batch; the memory backend's future is always ready.
fn check(limiter: &MemoryLimiter<ManualClock>, hits: &[Hit]) -> BatchOutcome {
    check_now(limiter, hits.to_vec())
}

fn one(limiter: &MemoryLimiter<ManualClock>, hit: &Hit) -> HitOutcome {
    check(limiter, std::slice::from_ref(hit)).hits[0]
}

fn admitted(outcome: &BatchOutcome) -> Vec<bool> {
    outcome.hits.iter().map(|h| h.admitted).collect()
}

#[test]
fn burst_then_steady_rate() {
    let (l, clock) = limiter(100);
    let h = hit("k", per(10, SEC), 1);
    for left in (0..10).rev() {
        let o = one(&l, &h);
        assert!(o.admitted);
        assert_eq!(o.remaining, left);
        assert_eq!(o.reset_nanos, (10 - left) * SEC / 10);
    }
    let o = one(&l, &h);
    assert_eq!(
        (o.admitted, o.remaining, o.reset_nanos),
        (false, 0, SEC / 10)
    );
    for _ in 0..20 {
        clock.advance(SEC / 10);
        assert!(one(&l, &h).admitted);
        assert!(!one(&l, &h).admitted);
    }
    assert_eq!(l.len(), 1);
}

#[test]
fn two_limits_on_one_descriptor_consume_nothing_when_one_denies() {
    let (l, clock) = limiter(100);
    let second = hit("d|second", per(10, SEC), 1);
    let minute = hit("d|minute", per(20, MIN), 1);
    let both = [second, minute];
    for _ in 0..10 {
        assert!(check(&l, &both).admitted);
    }
    let denied = check(&l, &both);
    assert!(!denied.admitted);
    assert_eq!(admitted(&denied), [false, true]);
    assert_eq!(denied.hits[1].remaining, 10, "the minute limit kept its 10");
    clock.advance(SEC);
    for _ in 0..10 {
        assert!(check(&l, &both).admitted);
    }
    clock.advance(SEC);
    let denied = check(&l, &both);
    assert!(!denied.admitted);
    assert_eq!(
        admitted(&denied),
        [true, false],
        "the minute limit is spent"
    );
    assert_eq!(denied.hits[0].remaining, 10, "the second limit kept its 10");
}

#[test]
fn a_denying_descriptor_keeps_the_others_from_consuming() {
    let (l, _clock) = limiter(100);
    let a = in_group(0, Role::Enforced, hit("a", per(5, SEC), 1));
    let b = in_group(1, Role::Enforced, hit("b", per(1, SEC), 1));
    assert!(check(&l, &[a.clone(), b.clone()]).admitted);
    for _ in 0..3 {
        let o = check(&l, &[a.clone(), b.clone()]);
        assert!(!o.admitted);
        assert_eq!(admitted(&o), [true, false]);
        assert_eq!(o.hits[0].remaining, 4);
    }
    assert_eq!(one(&l, &hit("a", per(5, SEC), 0)).remaining, 4);
}

#[test]
fn charge_always_consumes_even_when_denied() {
    let (l, _clock) = limiter(100);
    let usage = in_group(0, Role::Enforced, hit("usage", always(per(5, SEC)), 1));
    let gate = in_group(1, Role::Enforced, hit("gate", per(1, SEC), 1));
    assert!(check(&l, &[usage.clone(), gate.clone()]).admitted);
    let o = check(&l, &[usage, gate]);
    assert!(!o.admitted);
    assert_eq!(
        o.hits[0].remaining, 3,
        "charged although the request was denied"
    );

    let big = hit("usage", always(per(5, SEC)), 10);
    assert!(!one(&l, &big).admitted);
    let probe = one(&l, &hit("usage", per(5, SEC), 0));
    assert!(!probe.admitted, "the denied cost was charged: in debt");
    // 7/5 s of debt charged, capped at one period beyond the burst (docs/algorithms.md).
    assert_eq!(probe.reset_nanos, SEC);
}

#[test]
fn a_shadow_denial_neither_denies_nor_blocks_consumption() {
    let (l, _clock) = limiter(100);
    let shadow = in_group(0, Role::Shadow, hit("shadow", per(1, SEC), 1));
    let real = in_group(1, Role::Enforced, hit("real", per(5, SEC), 1));
    assert!(check(&l, &[shadow.clone(), real.clone()]).admitted);
    let o = check(&l, &[shadow, real]);
    assert!(o.admitted);
    assert_eq!(admitted(&o), [false, true]);
    assert_eq!((o.hits[0].remaining, o.hits[1].remaining), (0, 3));
}

#[test]
fn quota_mode_denies_only_when_every_quota_descriptor_does() {
    let (l, _clock) = limiter(100);
    let small = in_group(0, Role::Quota, hit("small", per(1, SEC), 1));
    let large = in_group(1, Role::Quota, hit("large", per(3, SEC), 1));
    let both = [small, large];
    assert!(check(&l, &both).admitted);
    for left in [1, 0] {
        let o = check(&l, &both);
        assert!(o.admitted);
        assert_eq!(admitted(&o), [false, true]);
        assert_eq!(o.hits[1].remaining, left);
    }
    let o = check(&l, &both);
    assert!(!o.admitted);
    assert_eq!(admitted(&o), [false, false]);
}

#[test]
fn refunds_give_back_and_never_below_empty() {
    let (l, _clock) = limiter(100);
    assert_eq!(one(&l, &hit("k", per(5, SEC), 3)).remaining, 2);
    let back = one(&l, &refund(hit("k", per(5, SEC), 1)));
    assert_eq!((back.admitted, back.remaining), (true, 3));
    let back = one(&l, &refund(hit("k", per(5, SEC), 100)));
    assert_eq!(
        (back.admitted, back.remaining, back.reset_nanos),
        (true, 5, 0)
    );
    assert!(l.is_empty(), "an empty funnel is not stored");
    let back = one(&l, &refund(hit("never-used", per(5, SEC), 2)));
    assert_eq!(back.remaining, 5);
    assert!(l.is_empty());
}

#[test]
fn a_refund_is_applied_only_when_its_descriptor_is() {
    let (l, _clock) = limiter(100);
    assert!(one(&l, &hit("k", per(5, SEC), 4)).admitted);
    let back = in_group(0, Role::Enforced, refund(hit("k", per(5, SEC), 2)));
    let gate = in_group(1, Role::Enforced, hit("gate", per(0, SEC), 1));
    let o = check(&l, &[back, gate]);
    assert!(!o.admitted);
    let kept = HitOutcome {
        admitted: true,
        remaining: 1,
        reset_nanos: 4 * SEC / 5,
        from_local_cache: false,
    };
    assert_eq!(o.hits[0], kept);
}

#[test]
fn check_only_never_creates_a_key_and_is_over_only_in_debt() {
    let (l, _clock) = limiter(100);
    let probe = hit("k", per(5, SEC), 0);
    let o = one(&l, &probe);
    assert_eq!((o.admitted, o.remaining, o.reset_nanos), (true, 5, 0));
    assert!(l.is_empty());

    assert!(one(&l, &hit("k", per(5, SEC), 5)).admitted);
    let o = one(&l, &probe);
    assert_eq!((o.admitted, o.remaining), (true, 0), "full is not in debt");

    let borrow = LimitParams {
        borrow: true,
        ..per(5, SEC)
    };
    let (l, _clock) = limiter(100);
    assert!(one(&l, &hit("k", borrow, 7)).admitted);
    let o = one(&l, &probe);
    let debt = (false, 0, 2 * SEC / 5);
    assert_eq!((o.admitted, o.remaining, o.reset_nanos), debt);
}

#[test]
fn a_zero_quota_denies_every_cost_and_keeps_no_state() {
    let (l, _clock) = limiter(100);
    let zero = per(0, MIN);
    let o = one(&l, &hit("z", zero, 1));
    assert_eq!((o.admitted, o.remaining, o.reset_nanos), (false, 0, MIN));
    assert!(!one(&l, &hit("z", always(zero), 3)).admitted);
    let o = one(&l, &hit("z", zero, 0));
    assert_eq!((o.admitted, o.remaining), (true, 0));
    assert!(one(&l, &refund(hit("z", zero, 3))).admitted);
    assert!(l.is_empty());
}

#[test]
fn the_same_key_twice_in_one_batch_sees_itself() {
    let (l, _clock) = limiter(100);
    let twice = |cost| {
        [
            in_group(0, Role::Enforced, hit("k", per(3, SEC), cost)),
            in_group(1, Role::Enforced, hit("k", per(3, SEC), cost)),
        ]
    };
    let o = check(&l, &twice(2));
    assert!(!o.admitted);
    assert_eq!(admitted(&o), [true, false]);
    assert!(l.is_empty(), "denied: nothing consumed");

    let o = check(&l, &twice(1));
    assert!(o.admitted);
    assert_eq!(o.hits[0].remaining, 1);
    assert_eq!(o.hits[1].remaining, 1);
    assert_eq!(one(&l, &hit("k", per(3, SEC), 0)).remaining, 1);
}

#[test]
fn max_keys_holds_under_a_flood_of_unique_keys() {
    let (l, clock) = limiter(1_000);
    let hour = per(1, 3_600 * SEC);
    for i in 0..20_000 {
        clock.advance(1_000);
        assert!(one(&l, &hit(format!("flood-{i}"), hour, 1)).admitted);
        assert!(l.len() <= 1_000);
    }
    assert_eq!(l.len(), 1_000);
    let newest = one(&l, &hit("flood-19999", hour, 0));
    assert_eq!(newest.remaining, 0, "the newest key is held");
}

#[test]
fn a_full_limiter_drops_fresh_entries_then_the_one_closest_to_fresh() {
    // Below 32 keys there is a single shard, so the policy is observable from outside.
    let (l, clock) = limiter(3);
    // One unit leaks per second, burst 5.
    let lim = LimitParams {
        burst: 5,
        ..per(1, SEC)
    };
    let remaining = |key: &str| one(&l, &hit(key, lim, 0)).remaining;
    for (key, cost) in [("a", 1), ("b", 3), ("c", 2), ("d", 4)] {
        assert!(one(&l, &hit(key, lim, cost)).admitted);
        assert!(l.len() <= 3);
    }
    let left: Vec<u64> = ["a", "b", "c", "d"].map(remaining).to_vec();
    assert_eq!(left, [5, 2, 3, 1], "a (smallest tat) was evicted");

    clock.advance(2 * SEC);
    assert!(one(&l, &hit("e", lim, 1)).admitted);
    assert_eq!(l.len(), 3, "c (fresh) was dropped, b and d kept");
    let left: Vec<u64> = ["b", "c", "d", "e"].map(remaining).to_vec();
    assert_eq!(left, [4, 5, 3, 4]);

    clock.advance(3 * SEC);
    assert!(one(&l, &hit("f", lim, 1)).admitted);
    assert_eq!(l.len(), 1, "every fresh entry was dropped at once");
}

#[test]
fn sweep_drops_fresh_entries_and_counts_them() {
    let (l, clock) = limiter(100);
    for (key, cost) in [("a", 1), ("b", 2), ("c", 4)] {
        assert!(one(&l, &hit(key, per(4, 4 * SEC), cost)).admitted);
    }
    assert_eq!((l.len(), l.sweep()), (3, 0));
    clock.advance(2 * SEC);
    assert_eq!(l.len(), 3, "fresh entries linger until touched or swept");
    assert_eq!(l.sweep(), 2);
    assert_eq!((l.len(), l.sweep()), (1, 0));
    clock.advance(2 * SEC);
    assert_eq!(l.sweep(), 1);
    assert!(l.is_empty());
}

#[test]
fn concurrent_batches_in_any_key_order_stay_atomic() {
    let clock = ManualClock::at(START);
    let l = std::sync::Arc::new(MemoryLimiter::with_clock(10_000, clock));
    let lim = per(200, 3_600 * SEC);
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (l, keys) = (l.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut counts = [0u64; 8];
                for n in 0..2_000usize {
                    let (i, j) = ((t + n) % 8, (t * 3 + n * 5 + 1) % 8);
                    let hits = [
                        in_group(0, Role::Enforced, hit(&keys[i], lim, 1)),
                        in_group(1, Role::Enforced, hit(&keys[j], lim, 1)),
                    ];
                    if check(&l, &hits).admitted {
                        counts[i] += 1;
                        counts[j] += 1;
                    }
                }
                counts
            })
        })
        .collect();
    let mut total = [0u64; 8];
    for t in threads {
        for (sum, n) in total.iter_mut().zip(t.join().expect("thread")) {
            *sum += n;
        }
    }
    for (key, &n) in keys.iter().zip(&total) {
        let left = one(&l, &hit(key, lim, 0)).remaining;
        assert_eq!(
            n + left,
            200,
            "{key}: every admission consumed exactly once"
        );
    }
}
