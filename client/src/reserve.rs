//! Reservations on `sluice.v1.Throttle` (docs/holds.md, "Reservations"): charge an estimate
//! to a key's limit before the work, settle it to what the work really used after. A
//! [`Reservation`] is settled by [`Reservation::commit`] or [`Reservation::cancel`]; dropped
//! without either, it sends nothing and its estimate stays charged (as for a caller that
//! crashed: sluice keeps an uncommitted reservation's estimate when its ttl ends).

use std::time::Duration;

use tonic::transport::Channel;

use crate::pb::sluice::v1::throttle_client::ThrottleClient;
use crate::pb::sluice::v1::{self as pb, commit_request, reserve_request};
use crate::{Client, Error, Limit};

/// A reservation to ask for: `amount` of `key`'s `limit`, open for `ttl` (sent in whole
/// milliseconds; sluice takes 1 ms to a day). The commit names the same key and limit.
///
/// ```
/// use std::time::Duration;
/// use sluice_client::{Limit, Reserve};
///
/// // 2,000 tokens of a tenant's 100,000 per hour, settled within 5 minutes.
/// let ask = Reserve::key("tenant:7", Limit::per_hour(100_000).max_burst(99_999), 2_000,
///     Duration::from_secs(300)).name("llm");
/// assert_eq!(ask.to_proto().amount, 2_000);
/// assert_eq!(ask.to_proto().ttl_ms, 300_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    key: Vec<u8>,
    limit: Limit,
    amount: u64,
    ttl: Duration,
    name: String,
}

impl Reserve {
    /// A reservation of `amount` on `key`'s `limit`, open for `ttl` until its commit.
    pub fn key(key: impl Into<Vec<u8>>, limit: Limit, amount: u64, ttl: Duration) -> Reserve {
        Reserve {
            key: key.into(),
            limit,
            amount,
            ttl,
            name: String::new(),
        }
    }

    /// The metric label of the calls.
    pub fn name(mut self, name: impl Into<String>) -> Reserve {
        self.name = name.into();
        self
    }

    /// The Reserve request.
    pub fn to_proto(&self) -> pb::ReserveRequest {
        let (max_burst, count, period_ms, algorithm) = self.limit.to_fields();
        pb::ReserveRequest {
            id: Some(reserve_request::Id::KeyBytes(self.key.clone())),
            max_burst,
            count,
            period_ms,
            algorithm,
            amount: self.amount,
            ttl_ms: u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            name: self.name.clone(),
        }
    }

    fn commit(&self, reservation_id: u64, actual: u64) -> pb::CommitRequest {
        let (max_burst, count, period_ms, algorithm) = self.limit.to_fields();
        pb::CommitRequest {
            id: Some(commit_request::Id::KeyBytes(self.key.clone())),
            max_burst,
            count,
            period_ms,
            algorithm,
            reservation_id,
            actual,
            name: self.name.clone(),
        }
    }
}

/// Why no reservation was made.
#[derive(Debug)]
pub enum ReserveError {
    /// The limit does not admit the amount now (nothing was charged); it would after
    /// `retry_after`.
    Refused {
        /// How long until the amount would be admitted.
        retry_after: Duration,
    },
    /// sluice did not answer, or refused the request (`INVALID_ARGUMENT`;
    /// `RESOURCE_EXHAUSTED` when the key has 1000 reservations open). No fail policy applies:
    /// a reservation must name a record.
    Failed(Error),
}

impl std::fmt::Display for ReserveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReserveError::Refused { retry_after } => {
                write!(
                    f,
                    "the limit does not admit the amount (retry after {retry_after:?})"
                )
            }
            ReserveError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReserveError {}

/// An estimate charged on sluice, open until committed, cancelled or its ttl ends. Dropping
/// it sends nothing: the estimate stays charged.
#[derive(Debug)]
pub struct Reservation {
    stub: ThrottleClient<Channel>,
    timeout: Duration,
    reserve: Reserve,
    id: u64,
    remaining: u64,
}

/// How a commit settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// The reservation was open and is settled; false: it had expired (or was already
    /// settled) and nothing was charged or given back.
    pub settled: bool,
    /// Charged beyond the estimate (an overshoot, owed even over the limit).
    pub charged: u64,
    /// Given back to the key (the estimate not used).
    pub given_back: u64,
    /// The key is over its limit after the commit (in debt), until `retry_after`.
    pub owed: bool,
    /// When owed: how long until the debt is paid and a check passes again.
    pub retry_after: Option<Duration>,
    /// What the key would still admit now.
    pub remaining: u64,
}

impl Reservation {
    /// The reservation's id on sluice.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the key would still admit just after the reservation was made.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Settles the reservation to `actual`: the estimate not used is given back, an
    /// overshoot is charged (and owed, even over the limit).
    pub async fn commit(self, actual: u64) -> Result<Settlement, Error> {
        let mut stub = self.stub.clone();
        let call = stub.commit(self.reserve.commit(self.id, actual));
        let answer = match tokio::time::timeout(self.timeout, call).await {
            Ok(answer) => answer.map_err(Error::Status)?.into_inner(),
            Err(_) => return Err(Error::Timeout(self.timeout)),
        };
        Ok(Settlement {
            settled: answer.settled,
            charged: answer.charged,
            given_back: answer.given_back,
            owed: answer.owed,
            retry_after: u64::try_from(answer.retry_after_ms)
                .ok()
                .map(Duration::from_millis),
            remaining: answer.remaining,
        })
    }

    /// Gives the whole estimate back (a commit of 0).
    pub async fn cancel(self) -> Result<Settlement, Error> {
        self.commit(0).await
    }
}

impl Client {
    /// Charges an estimate now, or says when the limit would admit it.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sluice_client::{Client, Limit, Reserve};
    ///
    /// # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let limit = Limit::per_minute(10_000).max_burst(9_999);
    /// let reservation = client
    ///     .reserve(Reserve::key("tenant:7", limit, 800, Duration::from_secs(60)))
    ///     .await?;
    /// // ... the work, which used 650 ...
    /// reservation.commit(650).await?; // 150 given back
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reserve(&self, reserve: Reserve) -> Result<Reservation, ReserveError> {
        let mut stub = self.throttle_stub();
        let answer = self
            .within(stub.reserve(reserve.to_proto()))
            .await
            .map_err(ReserveError::Failed)?
            .into_inner();
        if !answer.admitted {
            let ms = u64::try_from(answer.retry_after_ms).unwrap_or(0);
            return Err(ReserveError::Refused {
                retry_after: Duration::from_millis(ms),
            });
        }
        Ok(Reservation {
            stub,
            timeout: self.call_timeout(),
            reserve,
            id: answer.reservation_id,
            remaining: answer.remaining,
        })
    }
}
