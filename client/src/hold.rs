//! Holds with ids on `sluice.v1.Throttle` (docs/holds.md): a distributed semaphore. A
//! [`Permit`] holds `count` of a key's slots until it is dropped (or [`Permit::release`]d);
//! while held, a background task extends it every third of its lease, so a long job keeps its
//! slots, and a holder that dies (its process killed, its task aborted, the permit leaked)
//! stops extending: its slots come back one lease later.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::pb::sluice::v1::throttle_client::ThrottleClient;
use crate::pb::sluice::v1::{self as pb, acquire_hold_request, hold_request};
use crate::{Client, Error};

/// A key's holds: `slots` at once, each leased for `lease` (sent in whole milliseconds; sluice
/// refuses 0). Every call for a key must name the same slots and lease.
///
/// ```
/// use std::time::Duration;
/// use sluice_client::Hold;
///
/// let gpu = Hold::key("gpu-pool", 8, Duration::from_secs(30)).count(2).name("train");
/// assert_eq!(gpu.to_proto().slots, 8);
/// assert_eq!(gpu.to_proto().count, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    key: Vec<u8>,
    slots: u32,
    lease: Duration,
    count: u32,
    name: String,
}

impl Hold {
    /// One slot of `key`'s `slots`, leased for `lease`.
    pub fn key(key: impl Into<Vec<u8>>, slots: u32, lease: Duration) -> Hold {
        Hold {
            key: key.into(),
            slots,
            lease,
            count: 1,
            name: String::new(),
        }
    }

    /// Slots the hold takes (1 by default).
    pub fn count(mut self, count: u32) -> Hold {
        self.count = count;
        self
    }

    /// The metric label of the calls.
    pub fn name(mut self, name: impl Into<String>) -> Hold {
        self.name = name.into();
        self
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// The AcquireHold request.
    pub fn to_proto(&self) -> pb::AcquireHoldRequest {
        pb::AcquireHoldRequest {
            id: Some(acquire_hold_request::Id::KeyBytes(self.key.clone())),
            slots: self.slots,
            lease_ms: self.lease_ms(),
            count: self.count,
            name: self.name.clone(),
        }
    }

    fn request(&self, hold_id: u64) -> pb::HoldRequest {
        pb::HoldRequest {
            id: Some(hold_request::Id::KeyBytes(self.key.clone())),
            slots: self.slots,
            lease_ms: self.lease_ms(),
            hold_id,
            name: self.name.clone(),
        }
    }
}

/// Why no permit was given.
#[derive(Debug)]
pub enum HoldError {
    /// The slots are taken; enough holds expire after `retry_after` (a release may free one
    /// sooner).
    Busy {
        /// How long until enough holds expire.
        retry_after: Duration,
    },
    /// No slot freed before the deadline.
    Deadline,
    /// sluice did not answer, or refused the request (`INVALID_ARGUMENT`). No fail policy
    /// applies: a permit must name a hold.
    Failed(Error),
}

impl std::fmt::Display for HoldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldError::Busy { retry_after } => {
                write!(f, "every slot is held (retry after {retry_after:?})")
            }
            HoldError::Deadline => write!(f, "no slot freed before the deadline"),
            HoldError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HoldError {}

/// Slots held on sluice until this is dropped. Dropping it sends the release from a task on
/// the current tokio runtime (outside one, nothing is sent and the hold expires after its
/// lease); [`Permit::release`] sends it and waits for the answer.
#[derive(Debug)]
pub struct Permit {
    stub: ThrottleClient<Channel>,
    timeout: Duration,
    hold: Hold,
    id: u64,
    lost: Arc<AtomicBool>,
    heartbeat: Option<JoinHandle<()>>,
    released: bool,
}

impl Permit {
    /// The hold's id on sluice.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the hold is still held as far as this permit knows: false once an extension
    /// found it gone (it expired: the extensions did not reach sluice within a lease).
    pub fn is_held(&self) -> bool {
        !self.lost.load(Ordering::Relaxed)
    }

    /// Releases the hold now; whether sluice still held it.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop();
        self.released = true;
        let mut stub = self.stub.clone();
        let call = stub.release_hold(self.hold.request(self.id));
        match tokio::time::timeout(self.timeout, call).await {
            Ok(answer) => Ok(answer.map_err(Error::Status)?.into_inner().found),
            Err(_) => Err(Error::Timeout(self.timeout)),
        }
    }

    fn stop(&mut self) {
        if let Some(task) = self.heartbeat.take() {
            task.abort();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.stop();
        if self.released {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut stub = self.stub.clone();
            let request = self.hold.request(self.id);
            let timeout = self.timeout;
            runtime.spawn(async move {
                let _ = tokio::time::timeout(timeout, stub.release_hold(request)).await;
            });
        }
    }
}

/// The least time between two tries of [`Client::acquire_hold_within`], and the most.
const FIRST_POLL: Duration = Duration::from_millis(5);
const LAST_POLL: Duration = Duration::from_millis(100);

impl Client {
    /// Takes the hold now, or says when to try again.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sluice_client::{Client, Hold};
    ///
    /// # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let permit = client.acquire_hold(Hold::key("exports", 4, Duration::from_secs(10))).await?;
    /// // ... the work: at most 4 at once across every process; extended while it runs ...
    /// drop(permit); // released
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_hold(&self, hold: Hold) -> Result<Permit, HoldError> {
        let mut stub = self.throttle_stub();
        let answer = self
            .within(stub.acquire_hold(hold.to_proto()))
            .await
            .map_err(HoldError::Failed)?
            .into_inner();
        if !answer.acquired {
            let ms = u64::try_from(answer.retry_after_ms).unwrap_or(0);
            return Err(HoldError::Busy {
                retry_after: Duration::from_millis(ms),
            });
        }
        Ok(self.permit(hold, answer.hold_id))
    }

    /// Takes the hold, trying again (every 5 ms at first, then less often, at most every
    /// 100 ms, never later than sluice's retry time) until a slot frees, for at most
    /// `max_wait`: a distributed semaphore. Dropping the future while it waits takes nothing.
    pub async fn acquire_hold_within(
        &self,
        hold: Hold,
        max_wait: Duration,
    ) -> Result<Permit, HoldError> {
        let deadline = Instant::now() + max_wait;
        let mut poll = FIRST_POLL;
        loop {
            match self.acquire_hold(hold.clone()).await {
                Err(HoldError::Busy { retry_after }) => {
                    let wake = Instant::now() + poll.min(retry_after.max(Duration::from_millis(1)));
                    if wake > deadline {
                        return Err(HoldError::Deadline);
                    }
                    tokio::time::sleep_until(wake).await;
                    poll = (poll * 2).min(LAST_POLL);
                }
                other => return other,
            }
        }
    }

    fn permit(&self, hold: Hold, id: u64) -> Permit {
        let lost = Arc::new(AtomicBool::new(false));
        let every = (hold.lease / 3).max(Duration::from_millis(1));
        let stub = self.throttle_stub();
        let timeout = self.call_timeout();
        let heartbeat = {
            let mut stub = stub.clone();
            let request = hold.request(id);
            let lost = lost.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let answer =
                        tokio::time::timeout(timeout, stub.extend_hold(request.clone())).await;
                    // A failed call is tried again at the next beat; a hold found gone is lost.
                    if let Ok(Ok(answer)) = answer
                        && !answer.into_inner().found
                    {
                        lost.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            })
        };
        Permit {
            stub,
            timeout,
            hold,
            id,
            lost,
            heartbeat: Some(heartbeat),
            released: false,
        }
    }
}
