//! The Rate Limit Quota Service's bounds under stress: thousands of buckets on dozens of
//! streams stay within `rlqs.max_buckets` and `rlqs.max_buckets_per_stream`, in a bounded
//! growth of this process's resident size (so nothing else may run beside it).

use std::time::Duration;

use sluice::config::settings::Settings;
use sluice::testing::process::own_rss;
use sluice::testing::rlqs::*;

use crate::serial_async;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_buckets_and_dozens_of_streams_stay_within_their_bounds() {
    let _serial = serial_async().await;
    const STREAMS: usize = 40;
    const BUCKETS: usize = 300;
    let mut settings = Settings::default();
    settings.rlqs.max_buckets = 6_000;
    settings.rlqs.max_buckets_per_stream = 200;
    // Long enough that nothing expires while a loaded machine sets the streams up.
    settings.rlqs.assignment_ttl_secs = 120;
    let yaml = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
    let server = Server::start(settings, yaml).await;
    let rss_before = own_rss();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let mut stream = server.open().await;
        // Buckets 0..BUCKETS: the same tenants on every stream (shared states), in 3 reports.
        for chunk in (0..BUCKETS).collect::<Vec<_>>().chunks(100) {
            let usages = chunk
                .iter()
                .map(|b| usage(&[("tenant", &format!("t{b}"))], 1, 0, 0))
                .collect();
            stream.send(report(usages)).await;
        }
        // At most max_buckets_per_stream each, until max_buckets in all.
        let expected = 200.min(6_000usize.saturating_sub(200 * s));
        let mut assigned = 0;
        while assigned < expected {
            assigned += stream.next().await.bucket_action.len();
        }
        assert_eq!(assigned, expected, "stream {s}");
        if expected == 0 {
            stream.quiet(Duration::from_millis(200)).await;
        }
        streams.push(stream);
    }
    let held = server.rlqs.buckets();
    assert!(held <= 6_000, "held {held} buckets, above rlqs.max_buckets");
    assert_eq!(held, 6_000, "the total bound is reached: 40 x 200 asked");
    assert_eq!(server.rlqs.members(), held);
    let grown = own_rss().saturating_sub(rss_before);
    assert!(
        grown < 64 << 20,
        "{held} buckets on {STREAMS} streams took {} MiB",
        grown >> 20
    );
    assert_eq!(server.rlqs.streams(), STREAMS);
    drop(streams);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.rlqs.streams() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "streams not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((server.rlqs.buckets(), server.rlqs.members()), (0, 0));
}
