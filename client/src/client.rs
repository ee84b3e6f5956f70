//! The connection to sluice and the calls: [`Client::throttle`], [`Client::acquire`],
//! [`Client::should_rate_limit`], under a timeout and a [`FailPolicy`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::pb::sluice::v1::throttle_client::ThrottleClient;
use crate::{AcquireError, Error, RateLimit, RlsVerdict, Source, Throttle, Verdict};

/// What a call that gets no answer in time (sluice down, its backend down, too slow) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailPolicy {
    /// Return the error (the default).
    #[default]
    Error,
    /// Admit: a [`Verdict`] with `limited: false` and [`Source::FailedOpen`].
    Open,
    /// Refuse: a [`Verdict`] with `limited: true` and [`Source::FailedClosed`].
    Closed,
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    tls: Option<ClientTlsConfig>,
    timeout: Duration,
    policy: FailPolicy,
}

/// The default time a call may take, connecting included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

impl ClientBuilder {
    /// TLS (and mTLS, with an identity) to an `https://` URL.
    pub fn tls(mut self, tls: ClientTlsConfig) -> ClientBuilder {
        self.tls = Some(tls);
        self
    }

    /// The most one call may take; past it the fail policy decides.
    pub fn timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// What a call answers when sluice cannot decide (unreachable, time-out, error).
    pub fn fail_policy(mut self, policy: FailPolicy) -> ClientBuilder {
        self.policy = policy;
        self
    }

    /// A client that connects on its first call (and reconnects after failures): it can be
    /// built while sluice is down.
    pub fn connect_lazy(self) -> Result<Client, Error> {
        let endpoint = self.endpoint()?;
        Ok(self.client(endpoint.connect_lazy()))
    }

    /// A client connected now.
    pub async fn connect(self) -> Result<Client, Error> {
        let endpoint = self.endpoint()?;
        let channel = tokio::time::timeout(self.timeout, endpoint.connect())
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
            .map_err(|e| Error::Status(tonic::Status::unavailable(e.to_string())))?;
        Ok(self.client(channel))
    }

    fn endpoint(&self) -> Result<Endpoint, Error> {
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| Error::Config(format!("{}: {e}", self.url)))?
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| Error::Config(e.to_string()))?;
        }
        Ok(endpoint)
    }

    fn client(&self, channel: Channel) -> Client {
        Client {
            throttle: ThrottleClient::new(channel.clone()),
            rls: RateLimitServiceClient::new(channel),
            timeout: self.timeout,
            policy: self.policy,
        }
    }
}

/// A client of sluice: cheap to clone (clones share one HTTP/2 connection).
///
/// ```no_run
/// use std::time::Duration;
/// use sluice_client::{Client, FailPolicy, Limit, Throttle};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::builder("http://127.0.0.1:8081")
///     .timeout(Duration::from_millis(200))
///     .fail_policy(FailPolicy::Open)
///     .connect_lazy()?;
/// let verdict = client
///     .throttle(Throttle::key("user:42", Limit::per_minute(30).max_burst(15)))
///     .await?;
/// if verdict.limited {
///     println!("retry after {:?}", verdict.retry_after);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    throttle: ThrottleClient<Channel>,
    rls: RateLimitServiceClient<Channel>,
    timeout: Duration,
    policy: FailPolicy,
}

impl Client {
    /// A builder for `url` (`http://host:port`, or `https://` with [`ClientBuilder::tls`]).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            tls: None,
            timeout: DEFAULT_TIMEOUT,
            policy: FailPolicy::Error,
        }
    }

    /// The policy for calls that get no answer.
    pub fn fail_policy(&self) -> FailPolicy {
        self.policy
    }

    /// One `sluice.v1.Throttle` call, under the timeout and the fail policy. An
    /// `INVALID_ARGUMENT` answer is always an error: no policy hides a wrong request.
    pub async fn throttle(&self, call: Throttle) -> Result<Verdict, Error> {
        match self.throttle_once(&call).await {
            Ok(v) => Ok(v),
            Err(e) => self.apply_policy(e),
        }
    }

    async fn throttle_once(&self, call: &Throttle) -> Result<Verdict, Error> {
        let mut client = self.throttle.clone();
        let answer = self.within(client.throttle(call.to_proto())).await?;
        Ok(Verdict::from_proto(answer.into_inner()))
    }

    fn apply_policy(&self, e: Error) -> Result<Verdict, Error> {
        let invalid = matches!(&e, Error::Status(s) if s.code() == tonic::Code::InvalidArgument);
        match self.policy {
            FailPolicy::Open if !invalid => Ok(Verdict::failed(Source::FailedOpen)),
            FailPolicy::Closed if !invalid => Ok(Verdict::failed(Source::FailedClosed)),
            _ => Err(e),
        }
    }

    /// Waits until `call` is admitted and takes it, trying again after each retry time
    /// sluice gives, for at most `max_wait`.
    ///
    /// A denied try takes nothing (Throttle calls are all or nothing), so dropping this
    /// future while it waits takes nothing either; only the final, admitted try takes the
    /// quantity. A fail-open policy admits at once; a fail-closed one (or none) gives up
    /// with [`AcquireError::Failed`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sluice_client::{Client, Limit, Throttle};
    ///
    /// # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error>> {
    /// // Send at most 10 emails a second, waiting politely for our turn.
    /// client
    ///     .acquire(Throttle::key("smtp", Limit::per_second(10)), Duration::from_secs(30))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(
        &self,
        call: Throttle,
        max_wait: Duration,
    ) -> Result<Verdict, AcquireError> {
        let deadline = Instant::now() + max_wait;
        loop {
            // The retry time counts from sluice's decision, which came after the send: waking
            // from the send time is never late (a try a little early is simply told again).
            let sent = Instant::now();
            let verdict = match self.throttle_once(&call).await {
                Ok(v) => v,
                Err(e) => match self.apply_policy(e) {
                    Ok(v) if !v.limited => return Ok(v),
                    Ok(_) => return Err(AcquireError::Failed(Error::Timeout(self.timeout))),
                    Err(e) => return Err(AcquireError::Failed(e)),
                },
            };
            if !verdict.limited {
                return Ok(verdict);
            }
            let Some(wait) = verdict.retry_after else {
                return Err(AcquireError::Never(verdict));
            };
            let wake = sent + wait;
            if wake > deadline {
                return Err(AcquireError::Deadline { retry_after: wait });
            }
            tokio::time::sleep_until(wake).await;
        }
    }

    /// One Envoy RLS `ShouldRateLimit` call against sluice's rules, under the timeout. The
    /// fail policy does not apply: the caller decides what a missing answer means for RLS.
    ///
    /// ```no_run
    /// use sluice_client::{Client, RateLimit};
    ///
    /// # async fn run(client: Client) -> Result<(), sluice_client::Error> {
    /// let verdict = client
    ///     .should_rate_limit(RateLimit::domain("api").descriptor([("user", "alice")]))
    ///     .await?;
    /// println!("over limit: {}", verdict.over_limit);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn should_rate_limit(&self, request: RateLimit) -> Result<RlsVerdict, Error> {
        let mut client = self.rls.clone();
        let answer = self
            .within(client.should_rate_limit(request.to_proto()))
            .await?;
        Ok(RlsVerdict::from_proto(answer.into_inner()))
    }

    pub(crate) fn throttle_stub(&self) -> ThrottleClient<Channel> {
        self.throttle.clone()
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) async fn within<T>(
        &self,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(answer) => answer.map_err(Error::Status),
            Err(_) => Err(Error::Timeout(self.timeout)),
        }
    }
}
