//! `algorithm: concurrency` on both backends (docs/holds.md): the same steps go to the memory
//! backend and to two `sluice` replicas sharing one real `redis-server` (deny cache on, on one
//! manual clock), in turn; every step must give identical outcomes everywhere, and the holds
//! must keep the bounds: a release answering a denied request frees nothing, a release never
//! frees more than is held, a lost release frees its slot after one lease, and the Redis key
//! is one sorted set of records scored by expiry.

use std::sync::Arc;

use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::{Batch, BatchOutcome, Hit, LimitParams, Limiter, RedisLimiter};
use sluice::testing::limits;
use sluice::testing::redis::RedisServer;

use crate::support::limiters::Backends;

const SEC: u64 = 1_000_000_000;
const KEY: &str = "{holds}:concurrency:2s";
const OTHER: &str = "{holds}:funnel:1s";

/// `slots` slots, each hold leased for two seconds, keeping pending denials (`charge:
/// always`, the default of the rules for this algorithm).
fn slots(n: u32) -> LimitParams {
    LimitParams {
        charge: Charge::Always,
        ..limits::limit(Algorithm::Concurrency, n, 2 * SEC)
    }
}

/// An acquisition of `cost` (negative: a release) in descriptor `group`.
fn hold(limit: LimitParams, cost: i64, group: usize) -> Hit {
    Hit {
        refund: cost < 0,
        group,
        ..limits::hit(KEY, limit, cost.unsigned_abs())
    }
}

impl Backends {
    /// One batch on both backends (on the next replica in turn); their common outcome.
    async fn check(&mut self, hits: Vec<Hit>) -> BatchOutcome {
        let batch = Batch { hits };
        let expected = self.memory.check(&batch).await.expect("memory never fails");
        let replica = &self.replicas[self.step % 2];
        self.step += 1;
        let got = replica.check(&batch).await.expect("redis answers");
        assert_eq!(got, expected, "step {}: {batch:#?}", self.step);
        expected
    }

    async fn admitted(&mut self, hits: Vec<Hit>) -> bool {
        self.check(hits).await.admitted
    }

    fn advance(&self, nanos: u64) {
        self.clock.advance(nanos);
    }
}

#[tokio::test]
async fn a_denied_requests_release_frees_nothing() {
    let mut b = Backends::start();
    let l = slots(2);
    assert!(b.admitted(vec![hold(l, 1, 0)]).await);
    b.advance(SEC / 10);
    assert!(b.admitted(vec![hold(l, 1, 0)]).await);
    // Denied again and again, through both replicas (the deny cache must not answer them:
    // each leaves a pending denial).
    for _ in 0..4 {
        let denied = b.check(vec![hold(l, 1, 0)]).await;
        assert!(!denied.admitted);
        assert!(!denied.hits[0].from_local_cache);
    }
    // The denied requests' releases come: they free nothing.
    for _ in 0..4 {
        assert!(b.admitted(vec![hold(l, -1, 0)]).await);
        assert!(!b.admitted(vec![hold(l, 1, 0)]).await, "still two held");
        assert!(
            b.admitted(vec![hold(l, -1, 0)]).await,
            "that denial's release"
        );
    }
    let members = b.members(KEY);
    assert_eq!(members.len(), 3, "the id and two holds: {members:?}");
    assert_eq!(members[0], "n");
    assert!(
        members[1..].iter().all(|m| m.starts_with("a:")),
        "{members:?}"
    );
    // An admitted request's release frees its slot.
    assert!(b.admitted(vec![hold(l, -1, 0)]).await);
    let r = b.check(vec![hold(l, 1, 0)]).await;
    assert!(r.admitted);
    assert_eq!(r.hits[0].remaining, 0);
}

#[tokio::test]
async fn a_release_never_frees_more_than_is_held() {
    let mut b = Backends::start();
    let l = slots(3);
    assert!(b.admitted(vec![hold(l, 2, 0)]).await);
    assert!(b.admitted(vec![hold(l, -5, 0)]).await);
    assert!(b.members(KEY).is_empty(), "all released, the key is gone");
    // A release with nothing held is not kept as credit.
    assert!(b.admitted(vec![hold(l, -3, 0)]).await);
    for _ in 0..3 {
        assert!(b.admitted(vec![hold(l, 1, 0)]).await);
    }
    assert!(!b.admitted(vec![hold(l, 1, 0)]).await);
}

#[tokio::test]
async fn a_lost_release_frees_its_slot_after_one_lease() {
    let mut b = Backends::start();
    let l = slots(1);
    assert!(b.admitted(vec![hold(l, 1, 0)]).await);
    b.advance(SEC);
    let denied = b.check(vec![hold(l, 1, 0)]).await;
    assert!(!denied.admitted);
    assert_eq!(
        denied.hits[0].reset_nanos, SEC,
        "the hold expires one lease after it began"
    );
    // (A microsecond: the script's unit.)
    b.advance(SEC - 1_000);
    assert!(!b.admitted(vec![hold(l, 1, 0)]).await);
    b.advance(1_000);
    assert!(b.admitted(vec![hold(l, 1, 0)]).await, "one lease later");
    // The pending denials expire too: two leases later nothing is left.
    b.advance(2 * SEC);
    assert!(b.admitted(vec![hold(l, 0, 0)]).await);
    assert!(b.members(KEY).is_empty(), "{:?}", b.members(KEY));
}

/// A request denied by another of its limits takes no hold, but keeps a pending denial: its
/// release (Envoy sends one for every request) must not free another request's slot.
#[tokio::test]
async fn a_request_denied_by_another_limit_leaves_a_pending_denial() {
    let mut b = Backends::start();
    let l = slots(2);
    let one_per_second = limits::limit(Algorithm::Funnel, 1, SEC);
    let other = || Hit {
        group: 1,
        ..limits::hit(OTHER, one_per_second, 1)
    };
    assert!(b.admitted(vec![hold(l, 1, 0), other()]).await);
    let r = b.check(vec![hold(l, 1, 0), other()]).await;
    assert!(!r.admitted);
    assert_eq!((r.hits[0].admitted, r.hits[1].admitted), (true, false));
    assert_eq!(b.members(KEY).len(), 3, "the id, a hold, a pending denial");
    // The second request's release, then a third request: one slot is free, not two.
    assert!(b.admitted(vec![hold(l, -1, 0)]).await);
    assert!(b.admitted(vec![hold(l, 1, 0)]).await);
    assert!(!b.admitted(vec![hold(l, 1, 0)]).await);
}

/// With `charge: admitted` (a layout whose releases come from admitted requests only), a
/// denied request keeps nothing, and a release frees a hold at once.
#[tokio::test]
async fn charge_admitted_keeps_no_pending_denial() {
    let mut b = Backends::start();
    let l = LimitParams {
        charge: Charge::Admitted,
        ..slots(1)
    };
    assert!(b.admitted(vec![hold(l, 1, 0)]).await);
    assert!(!b.admitted(vec![hold(l, 1, 0)]).await);
    assert_eq!(
        b.members(KEY).len(),
        2,
        "the id and the hold: {:?}",
        b.members(KEY)
    );
    assert!(b.admitted(vec![hold(l, -1, 0)]).await);
    assert!(
        b.admitted(vec![hold(l, 1, 0)]).await,
        "the release freed the hold"
    );
}

/// Many requests in flight at random through both replicas: the admitted holds never exceed
/// the slots, and every release of a denied request is absorbed by its pending denial.
#[tokio::test]
async fn random_traffic_never_holds_more_than_the_slots() {
    let mut b = Backends::start();
    let l = slots(4);
    let mut in_flight = 0u32;
    let mut denied_pending = 0u32;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..300 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        b.advance(SEC / 1000);
        match rng % 3 {
            0 | 1 => {
                let r = b.check(vec![hold(l, 1, 0)]).await;
                if r.admitted {
                    in_flight += 1;
                } else {
                    denied_pending += 1;
                }
            }
            _ if denied_pending > 0 => {
                assert!(b.admitted(vec![hold(l, -1, 0)]).await);
                denied_pending -= 1;
            }
            _ if in_flight > 0 => {
                assert!(b.admitted(vec![hold(l, -1, 0)]).await);
                in_flight -= 1;
            }
            _ => {}
        }
        assert!(in_flight <= 4, "admitted {in_flight} on 4 slots");
        let r = b.check(vec![hold(l, 0, 0)]).await;
        assert_eq!(
            r.hits[0].remaining,
            u64::from(4 - in_flight),
            "releases in order: the holds counted are the requests in flight"
        );
    }
}

const HOLD_RULES: &str = "domain: inflight\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}\n";

/// `/counters` shows a key's holds and when its oldest expires, `sluice_rule_holds` the most
/// held, and a release shows at once.
async fn holds_are_visible(server: &sluice::testing::TestServer, exact: bool) {
    use sluice::testing::grpc::{Code, call, client, desc, overall, req, with_hits};
    use sluice::testing::http;
    let mut c = client(server).await;
    let take = || req("inflight", vec![with_hits(desc(&[("tenant", "acme")]), 1)]);
    for _ in 0..2 {
        assert_eq!(overall(&call(&mut c, take()).await), Code::Ok);
    }
    let page = http::get(server.admin_addr, "/counters?domain=inflight").await;
    let page: serde_json::Value = serde_json::from_str(&page.body).expect("JSON");
    let key = &page["keys"][0];
    assert_eq!(key["algorithm"], "concurrency", "{page}");
    assert_eq!(key["holds"], 2, "{page}");
    assert_eq!(key["remaining"], 1, "{page}");
    let oldest = key["oldest_hold_expires_seconds"]
        .as_f64()
        .expect("an expiry");
    assert!(oldest > 55.0 && oldest <= 60.0, "{oldest}");
    if exact {
        assert_eq!(oldest, 60.0, "the manual clock has not moved");
    }
    let text = http::get(server.admin_addr, "/counters?domain=inflight&format=text").await;
    assert!(
        text.body.contains(" holds=2 oldest_hold_expires="),
        "{}",
        text.body
    );
    let metrics = http::get(server.admin_addr, "/metrics").await.body;
    let labels = [("domain", "inflight"), ("rule", "tenant")];
    assert_eq!(
        http::sample(&metrics, "sluice_rule_holds", &labels),
        Some(2.0)
    );
    let mut release = with_hits(desc(&[("tenant", "acme")]), 1);
    release.is_negative_hits = true;
    assert_eq!(
        overall(&call(&mut c, req("inflight", vec![release])).await),
        Code::Ok
    );
    let page = http::get(server.admin_addr, "/counters?domain=inflight").await;
    let page: serde_json::Value = serde_json::from_str(&page.body).expect("JSON");
    assert_eq!(page["keys"][0]["holds"], 1, "{page}");
    // The admin page: the most held since its previous poll, then the last decision's.
    for want in [2, 1] {
        let data = http::get(server.admin_addr, "/ui/data").await;
        let data: serde_json::Value = serde_json::from_str(&data.body).expect("JSON");
        let rule = &data["rules"][0]["rules"][0];
        assert_eq!(rule["holds"], want, "{rule}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_are_visible_memory() {
    let server = sluice::testing::TestServer::start(HOLD_RULES).await;
    holds_are_visible(&server, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_are_visible_redis() {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1000).expect("valid Redis settings");
    let settings = sluice::config::settings::Settings::default();
    let server =
        sluice::testing::TestServer::start_over(settings, HOLD_RULES, Arc::new(limiter)).await;
    holds_are_visible(&server, false).await;
}
