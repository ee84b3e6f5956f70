//! What can go wrong on a call.

use std::time::Duration;

use crate::Verdict;

/// A call that got no answer from sluice.
#[derive(Debug)]
pub enum Error {
    /// The address or TLS settings are unusable.
    Config(String),
    /// sluice answered with an error status (`INVALID_ARGUMENT` for a bad request,
    /// `UNAVAILABLE` when its backend is down, or a transport failure).
    Status(tonic::Status),
    /// No answer within the client's timeout.
    Timeout(Duration),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(m) => write!(f, "invalid client settings: {m}"),
            Error::Status(s) => write!(f, "sluice answered {:?}: {}", s.code(), s.message()),
            Error::Timeout(d) => write!(f, "no answer from sluice within {d:?}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Error {
        Error::Status(status)
    }
}

/// Why [`Client::acquire`](crate::Client::acquire) gave up.
#[derive(Debug)]
pub enum AcquireError {
    /// The quantity is more than some key ever admits: waiting cannot help.
    Never(Verdict),
    /// The next try would come after the deadline; `retry_after` is what sluice last said.
    Deadline {
        /// What sluice last said to wait.
        retry_after: Duration,
    },
    /// sluice could not decide, and the fail policy does not admit.
    Failed(Error),
}

impl std::fmt::Display for AcquireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AcquireError::Never(_) => write!(f, "the quantity is more than a key ever admits"),
            AcquireError::Deadline { retry_after } => {
                write!(
                    f,
                    "not admitted before the deadline (retry after {retry_after:?})"
                )
            }
            AcquireError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AcquireError {}
