//! Holds with ids on `sluice.v1.Throttle`, against the real binary on both backends (memory,
//! and a real `redis-server`): 100 tokio tasks on 10 slots, each inside its critical section
//! only while it has the Rust client's permit, never exceed 10 at once (the peak is measured
//! with an atomic counter and printed); a killed holder (its permits leaked, its runtime gone,
//! so no release and no extension is sent) has its slots back after one lease, not before; a
//! permit outlives its lease while its extensions run; a release or an extension of an
//! unknown id frees nothing and says so; bad input is `INVALID_ARGUMENT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice::testing::process::SluiceProcess;
use sluice::testing::redis::RedisServer;
use sluice_client::pb::sluice::v1::throttle_client::ThrottleClient;
use sluice_client::pb::sluice::v1::{
    AcquireHoldRequest, HoldRequest, acquire_hold_request, hold_request,
};
use sluice_client::{Client, Hold, HoldError};
use tokio::time::Instant;

use crate::serial_async;

const LEASE: Duration = Duration::from_secs(1);

/// `sluice serve` with the demo rules and `args` (the backend) on ports from the kernel, killed on drop.
fn start_sluice(args: &[&str]) -> SluiceProcess {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules/demo.yaml");
    SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), demo.as_ref(), args, &[])
}

/// Runs `scenario` against sluice on the memory backend, then on a real redis-server.
async fn on_both_backends<F, Fut>(scenario: F)
where
    F: Fn(String, &'static str) -> Fut,
    Fut: Future<Output = ()>,
{
    let memory = start_sluice(&[]);
    scenario(memory.url(), "memory").await;
    drop(memory);
    let redis = RedisServer::start();
    let url = redis.url();
    let sluice = start_sluice(&["--backend", "redis", "--redis-url", &url]);
    scenario(sluice.url(), "redis").await;
}

async fn client(url: &str) -> Client {
    Client::builder(url.to_owned())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to sluice")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_tasks_on_ten_slots_never_exceed_ten_at_once() {
    let _serial = serial_async().await;
    on_both_backends(|url, backend| async move {
        let client = client(&url).await;
        let inside = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let (client, inside, peak) = (client.clone(), inside.clone(), peak.clone());
            tasks.spawn(async move {
                let hold = Hold::key("semaphore", 10, LEASE).name("holds");
                let permit = client
                    .acquire_hold_within(hold, Duration::from_secs(20))
                    .await
                    .expect("a slot within 20 s");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("released")
            });
        }
        let mut released = 0;
        while let Some(done) = tasks.join_next().await {
            released += usize::from(done.expect("task"));
        }
        let peak = peak.load(Ordering::SeqCst);
        println!(
            "{backend}: 100 tasks on 10 slots: peak {peak} at once, {released} releases found \
             their hold, {:?}",
            started.elapsed()
        );
        assert!(peak <= 10, "{backend}: {peak} at once on 10 slots");
        assert!(
            peak >= 5,
            "{backend}: only {peak} at once: the slots were not used"
        );
        assert_eq!(
            released, 100,
            "{backend}: every permit held its hold until released"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_slots_come_back_after_its_lease_and_a_live_one_keeps_them() {
    let _serial = serial_async().await;
    on_both_backends(|url, backend| async move {
        // The holder: its own runtime, on its own thread; it takes every slot, leaks its
        // permits (no release on drop) and its runtime ends (no more extensions): killed.
        let holder_url = url.clone();
        let taken_at = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let client = client(&holder_url).await;
                for _ in 0..3 {
                    let permit = client
                        .acquire_hold(Hold::key("killed", 3, LEASE))
                        .await
                        .expect("a free slot");
                    std::mem::forget(permit);
                }
                Instant::now()
            })
        })
        .join()
        .expect("the holder");
        let client = client(&url).await;
        match client.acquire_hold(Hold::key("killed", 3, LEASE)).await {
            Err(HoldError::Busy { retry_after }) => {
                assert!(
                    retry_after <= LEASE,
                    "{backend}: retry after {retry_after:?}"
                );
            }
            other => panic!("{backend}: every slot is held, got {other:?}"),
        }
        let permit = client
            .acquire_hold_within(Hold::key("killed", 3, LEASE), Duration::from_secs(5))
            .await
            .expect("the killed holder's slots come back");
        let after = taken_at.elapsed();
        println!("{backend}: a killed holder's slot came back {after:?} after it was taken");
        assert!(
            after >= Duration::from_millis(900),
            "{backend}: back after {after:?}"
        );
        assert!(
            after < Duration::from_secs(3),
            "{backend}: back only after {after:?}"
        );
        drop(permit);

        // A live permit outlives its lease: its extensions keep it.
        let long = client
            .acquire_hold(Hold::key("long", 1, LEASE))
            .await
            .expect("a free slot");
        tokio::time::sleep(3 * LEASE).await;
        assert!(long.is_held(), "{backend}: the extensions kept it");
        assert!(
            matches!(
                client.acquire_hold(Hold::key("long", 1, LEASE)).await,
                Err(HoldError::Busy { .. })
            ),
            "{backend}: still held after 3 leases"
        );
        assert!(
            long.release().await.expect("released"),
            "{backend}: released"
        );
        // Dropping a permit releases it.
        let dropped = client
            .acquire_hold(Hold::key("long", 1, LEASE))
            .await
            .expect("free again after the release");
        drop(dropped);
        client
            .acquire_hold_within(Hold::key("long", 1, LEASE), Duration::from_millis(500))
            .await
            .expect("free again well before the lease after a drop");
    })
    .await;
}

fn acquire(key: &str, slots: u32, count: u32) -> AcquireHoldRequest {
    AcquireHoldRequest {
        id: Some(acquire_hold_request::Id::Key(key.to_owned())),
        slots,
        lease_ms: 10_000,
        count,
        name: String::new(),
    }
}

fn touch(key: &str, slots: u32, hold_id: u64) -> HoldRequest {
    HoldRequest {
        id: Some(hold_request::Id::Key(key.to_owned())),
        slots,
        lease_ms: 10_000,
        hold_id,
        name: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_frees_nothing_and_bad_input_is_invalid_argument() {
    let _serial = serial_async().await;
    on_both_backends(|url, backend| async move {
        let mut stub = ThrottleClient::connect(url).await.expect("connect");
        let a = stub
            .acquire_hold(acquire("ids", 3, 2))
            .await
            .expect("answer")
            .into_inner();
        assert!(
            a.acquired && a.hold_id != 0 && a.held == 2,
            "{backend}: {a:?}"
        );
        let b = stub
            .acquire_hold(acquire("ids", 3, 1))
            .await
            .expect("answer")
            .into_inner();
        assert!(
            b.acquired && b.hold_id != a.hold_id && b.held == 3,
            "{backend}: {b:?}"
        );
        let full = stub
            .acquire_hold(acquire("ids", 3, 1))
            .await
            .expect("answer")
            .into_inner();
        assert!(
            !full.acquired && full.hold_id == 0 && full.held == 3,
            "{backend}: {full:?}"
        );
        assert!(
            full.retry_after_ms > 0 && full.retry_after_ms <= 10_000,
            "{backend}: {full:?}"
        );

        let unknown = a.hold_id.max(b.hold_id) + 1000;
        let r = stub
            .release_hold(touch("ids", 3, unknown))
            .await
            .expect("answer")
            .into_inner();
        assert!(
            !r.found && r.held == 3,
            "{backend}: an unknown id freed something: {r:?}"
        );
        let e = stub
            .extend_hold(touch("ids", 3, unknown))
            .await
            .expect("answer")
            .into_inner();
        assert!(!e.found && e.held == 3, "{backend}: {e:?}");
        let e = stub
            .extend_hold(touch("ids", 3, a.hold_id))
            .await
            .expect("answer")
            .into_inner();
        assert!(e.found && e.held == 3, "{backend}: {e:?}");
        let r = stub
            .release_hold(touch("ids", 3, a.hold_id))
            .await
            .expect("answer")
            .into_inner();
        assert!(
            r.found && r.held == 1,
            "{backend}: exactly the hold's 2 slots: {r:?}"
        );
        let again = stub
            .release_hold(touch("ids", 3, a.hold_id))
            .await
            .expect("answer");
        assert!(
            !again.get_ref().found && again.get_ref().held == 1,
            "{backend}: released twice"
        );
        let c = stub
            .acquire_hold(acquire("ids", 3, 2))
            .await
            .expect("answer")
            .into_inner();
        assert!(c.acquired && c.held == 3, "{backend}: {c:?}");
        assert_ne!(c.hold_id, a.hold_id, "{backend}: an id is not reused");

        let invalid = [
            (acquire("ids", 0, 1), "slots"),
            (acquire("ids", 10_001, 1), "slots"),
            (acquire("ids", 3, 4), "count"),
            (acquire("", 3, 1), "key"),
            (
                AcquireHoldRequest {
                    lease_ms: 0,
                    ..acquire("ids", 3, 1)
                },
                "lease_ms",
            ),
        ];
        for (request, field) in invalid {
            let status = stub.acquire_hold(request).await.expect_err("invalid");
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{backend}: {status:?}"
            );
            assert!(
                status.message().starts_with(field),
                "{backend}: {}",
                status.message()
            );
        }
        let status = stub
            .release_hold(touch("ids", 3, 0))
            .await
            .expect_err("invalid");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{backend}: {status:?}"
        );
        assert!(
            status.message().starts_with("hold_id"),
            "{}",
            status.message()
        );
    })
    .await;
}
