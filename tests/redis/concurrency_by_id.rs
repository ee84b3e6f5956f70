//! `algorithm: concurrency` with holds named by the request (`hold_id`, docs/holds.md), on
//! both backends: the same steps go to the memory backend and to two `sluice` replicas on one
//! real `redis-server` (one manual clock), in turn, and must give identical outcomes. An
//! admitted request's hold is stored under its id, a denied one leaves nothing, a release
//! frees only the hold with its id; then through the server's gRPC path with a rules file:
//! the id entry is matched but not keyed, and an id too long is `INVALID_ARGUMENT`.

use std::sync::Arc;

use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::concurrency::{BY_ID, MAX_HOLD_ID_BYTES, hold_id};
use sluice::limiter::{Batch, BatchOutcome, Hit, LimitParams, Limiter, RedisLimiter};
use sluice::testing::limits;
use sluice::testing::redis::RedisServer;

use crate::support::limiters::Backends;

const SEC: u64 = 1_000_000_000;
const KEY: &str = "{byid}:concurrency:2s";
const OTHER: &str = "{byid}:funnel:1s";

/// `n` slots leased for two seconds, `charge: always` (the rules' default for the algorithm:
/// it must not matter to a hit naming its hold).
fn slots(n: u32) -> LimitParams {
    LimitParams {
        charge: Charge::Always,
        ..limits::limit(Algorithm::Concurrency, n, 2 * SEC)
    }
}

/// Request `id`'s acquisition of `cost` (negative: its release).
fn named(limit: LimitParams, id: &str, cost: i64) -> Hit {
    Hit {
        refund: cost < 0,
        hold: std::num::NonZeroU64::new(hold_id(id.as_bytes())),
        ..limits::hit(KEY, limit, cost.unsigned_abs())
    }
}

/// One batch on both backends (the next replica in turn); their common outcome.
async fn check(b: &mut Backends, hits: Vec<Hit>) -> BatchOutcome {
    let batch = Batch { hits };
    let expected = b.memory.check(&batch).await.expect("memory never fails");
    let replica = &b.replicas[b.step % 2];
    b.step += 1;
    let got = replica.check(&batch).await.expect("redis answers");
    assert_eq!(got, expected, "step {}: {batch:#?}", b.step);
    expected
}

async fn admitted(b: &mut Backends, hits: Vec<Hit>) -> bool {
    check(b, hits).await.admitted
}

/// The slots held now (a check of cost 0 reports what is left).
async fn held(b: &mut Backends, l: LimitParams) -> u64 {
    let r = check(b, vec![limits::hit(KEY, l, 0)]).await;
    u64::from(l.quota) - r.hits[0].remaining
}

#[tokio::test]
async fn a_denied_requests_release_frees_nothing_and_nothing_is_kept_for_it() {
    let mut b = Backends::start();
    let l = slots(2);
    assert!(admitted(&mut b, vec![named(l, "a", 1)]).await);
    assert!(admitted(&mut b, vec![named(l, "b", 1)]).await);
    for id in ["c", "d", "e"] {
        let denied = check(&mut b, vec![named(l, id, 1)]).await;
        assert!(!denied.admitted);
        assert!(
            !denied.hits[0].from_local_cache,
            "the deny cache never answers"
        );
    }
    let members = b.members(KEY);
    assert_eq!(
        members.len(),
        3,
        "the id and two holds, no denial: {members:?}"
    );
    for m in &members[1..] {
        let id: u64 = m
            .split(':')
            .nth(1)
            .expect("a:<id>:<count>")
            .parse()
            .expect("a number");
        assert!(m.starts_with("a:") && m.ends_with(":1"), "{m}");
        assert!((BY_ID..2 * BY_ID).contains(&id), "{m}");
    }
    // The denied requests' releases free nothing; an admitted one's frees its slot at once,
    // however many denials are still to be released.
    for id in ["c", "d"] {
        assert!(admitted(&mut b, vec![named(l, id, -1)]).await);
        assert_eq!(held(&mut b, l).await, 2);
    }
    assert!(admitted(&mut b, vec![named(l, "a", -1)]).await);
    assert_eq!(held(&mut b, l).await, 1, "a's release freed a's slot");
    assert!(admitted(&mut b, vec![named(l, "f", 1)]).await);
    assert!(admitted(&mut b, vec![named(l, "e", -1)]).await);
    assert_eq!(held(&mut b, l).await, 2, "e was denied: b and f still held");
}

#[tokio::test]
async fn a_release_frees_only_its_own_hold_and_unknown_ids_free_nothing() {
    let mut b = Backends::start();
    let l = slots(3);
    assert!(admitted(&mut b, vec![named(l, "a", 1)]).await);
    assert!(admitted(&mut b, vec![named(l, "b", 2)]).await);
    assert!(!admitted(&mut b, vec![named(l, "c", 1)]).await);
    assert!(admitted(&mut b, vec![named(l, "unknown", -1)]).await);
    assert_eq!(held(&mut b, l).await, 3, "an unknown id frees nothing");
    // b's release frees b's two slots and nothing of a; again, nothing.
    assert!(admitted(&mut b, vec![named(l, "b", -5)]).await);
    assert_eq!(held(&mut b, l).await, 1, "never more than b held");
    assert!(admitted(&mut b, vec![named(l, "b", -1)]).await);
    assert_eq!(held(&mut b, l).await, 1, "b was released already");
    // The same id acquired twice adds up under it (each needs its slot); a release of 1
    // frees 1 of it.
    assert!(admitted(&mut b, vec![named(l, "a", 1)]).await);
    assert!(admitted(&mut b, vec![named(l, "d", 1)]).await);
    assert!(
        !admitted(&mut b, vec![named(l, "a", 1)]).await,
        "a holds 2, d 1"
    );
    assert!(admitted(&mut b, vec![named(l, "a", -1)]).await);
    assert_eq!(held(&mut b, l).await, 2);
    assert!(admitted(&mut b, vec![named(l, "a", -1)]).await);
    assert!(admitted(&mut b, vec![named(l, "d", -1)]).await);
    assert_eq!(held(&mut b, l).await, 0);
    assert!(b.members(KEY).is_empty(), "all released, the key is gone");
}

#[tokio::test]
async fn a_lost_release_frees_its_slot_after_one_lease_and_a_late_one_nothing() {
    let mut b = Backends::start();
    let l = slots(1);
    assert!(admitted(&mut b, vec![named(l, "lost", 1)]).await);
    b.clock.advance(SEC);
    let denied = check(&mut b, vec![named(l, "x", 1)]).await;
    assert!(!denied.admitted);
    assert_eq!(
        denied.hits[0].reset_nanos, SEC,
        "one lease after it was taken"
    );
    b.clock.advance(SEC - 1_000);
    assert!(!admitted(&mut b, vec![named(l, "y", 1)]).await);
    b.clock.advance(1_000);
    assert!(
        admitted(&mut b, vec![named(l, "z", 1)]).await,
        "one lease later"
    );
    // The lost hold's release, arriving late, frees nothing: not z's slot.
    assert!(admitted(&mut b, vec![named(l, "lost", -1)]).await);
    assert_eq!(held(&mut b, l).await, 1);
    b.clock.advance(2 * SEC);
    assert_eq!(held(&mut b, l).await, 0);
}

/// A request denied by another of its limits takes no hold and leaves nothing: its release
/// frees nothing.
#[tokio::test]
async fn a_request_denied_by_another_limit_leaves_nothing() {
    let mut b = Backends::start();
    let l = slots(2);
    let one_per_second = limits::limit(Algorithm::Funnel, 1, SEC);
    let other = || Hit {
        group: 1,
        ..limits::hit(OTHER, one_per_second, 1)
    };
    let named_in = |id: &str, cost| Hit {
        group: 0,
        ..named(l, id, cost)
    };
    assert!(admitted(&mut b, vec![named_in("a", 1), other()]).await);
    let r = check(&mut b, vec![named_in("b", 1), other()]).await;
    assert!(!r.admitted);
    assert_eq!((r.hits[0].admitted, r.hits[1].admitted), (true, false));
    assert_eq!(b.members(KEY).len(), 2, "the id and a's hold");
    assert!(admitted(&mut b, vec![named_in("b", -1)]).await);
    assert_eq!(held(&mut b, l).await, 1, "b's release freed nothing");
}

/// Requests at random, released in any order, through both replicas: the holds counted are
/// exactly the admitted requests in flight, whatever the denials.
#[tokio::test]
async fn random_traffic_counts_exactly_the_requests_in_flight() {
    let mut b = Backends::start();
    let l = slots(4);
    let mut in_flight: Vec<String> = Vec::new();
    let mut denied: Vec<String> = Vec::new();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for n in 0..300 {
        b.clock.advance(SEC / 1000);
        let r = next();
        match r % 4 {
            0 | 1 => {
                let id = format!("req-{n}");
                if admitted(&mut b, vec![named(l, &id, 1)]).await {
                    in_flight.push(id);
                } else {
                    denied.push(id);
                }
            }
            2 if !denied.is_empty() => {
                let id = denied.swap_remove((next() as usize) % denied.len());
                assert!(admitted(&mut b, vec![named(l, &id, -1)]).await);
            }
            _ if !in_flight.is_empty() => {
                let id = in_flight.swap_remove((next() as usize) % in_flight.len());
                assert!(admitted(&mut b, vec![named(l, &id, -1)]).await);
            }
            _ => {}
        }
        assert!(in_flight.len() <= 4);
        assert_eq!(held(&mut b, l).await, in_flight.len() as u64, "step {n}");
    }
}

const RULES: &str = "domain: inflight\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, hold_id: request_id}\n";

/// Through the server: `[tenant, request_id]` takes a hold on the tenant's one key, a release
/// frees its own only, a request without an id is anonymous, and an id too long is refused.
async fn through_the_server(server: &sluice::testing::TestServer) {
    use sluice::testing::grpc::{Code, call, client, desc, overall, req, with_hits};
    use sluice::testing::http;
    let mut c = client(server).await;
    let take = |id: &str| {
        let d = desc(&[("tenant", "acme"), ("request_id", id)]);
        req("inflight", vec![with_hits(d, 1)])
    };
    let release = |id: &str| {
        let mut d = with_hits(desc(&[("tenant", "acme"), ("request_id", id)]), 1);
        d.is_negative_hits = true;
        req("inflight", vec![d])
    };
    assert_eq!(overall(&call(&mut c, take("r1")).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, take("r2")).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, take("r3")).await), Code::OverLimit);
    // r3's release (denied) frees nothing; r1's frees r1's.
    assert_eq!(overall(&call(&mut c, release("r3")).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, take("r4")).await), Code::OverLimit);
    assert_eq!(overall(&call(&mut c, release("r1")).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, take("r5")).await), Code::Ok);
    // One key for every request id: the id is no part of it.
    let page = http::get(server.admin_addr, "/counters?domain=inflight").await;
    let page: serde_json::Value = serde_json::from_str(&page.body).expect("JSON");
    let keys = page["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{page}");
    assert_eq!(keys[0]["holds"], 2, "{page}");
    assert!(!page.to_string().contains("r5"), "{page}");
    // Without an id: the anonymous behaviour (a hold taken, a release frees one).
    let anonymous = || req("inflight", vec![with_hits(desc(&[("tenant", "solo")]), 1)]);
    assert_eq!(overall(&call(&mut c, anonymous()).await), Code::Ok);
    // An id longer than the bound: INVALID_ARGUMENT, nothing taken.
    let long = "x".repeat(MAX_HOLD_ID_BYTES + 1);
    let err = c.should_rate_limit(take(&long)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("hold id"), "{}", err.message());
    let ok = "y".repeat(MAX_HOLD_ID_BYTES);
    assert_eq!(overall(&call(&mut c, take(&ok)).await), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_server_memory() {
    let server = sluice::testing::TestServer::start(RULES).await;
    through_the_server(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_server_redis() {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1000).expect("valid Redis settings");
    let settings = sluice::config::settings::Settings::default();
    let server = sluice::testing::TestServer::start_over(settings, RULES, Arc::new(limiter)).await;
    through_the_server(&server).await;
}
