//! What the service refuses, and why, in its own terms: a [`Kind`] a caller
//! can act on (its own fault, or the server's) and a message for a person.
//! The faces map it to their wire (the Charon API's `Error`, a gRPC status)
//! in one place each; nothing here knows a wire.

use crate::store::copies::CopyError;
use crate::store::leases::LeaseError;

/// Why an operation was refused (docs/copy-limits.md#errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The request itself is wrong: names, counts, a ttl.
    Malformed,
    /// No such namespace or resource.
    UnknownResource,
    /// The resource is of another kind than the operation needs.
    WrongKind,
    /// This session does not hold what it gives back.
    NotHeld,
    /// No such transfer, or it expired.
    UnknownTransfer,
    /// Past a cap on one session or one call.
    TooMany,
    /// No such reservation held: unknown, expired, or already settled.
    UnknownReservation,
    /// A refund after the window it names.
    WindowOver,
    /// The store did not answer.
    StoreUnavailable,
    /// This server left the copy log: its holds are the others' to release.
    Resigned,
    /// A bug, or state the server cannot read.
    Internal,
    /// The session ended while the operation waited; no client reads the
    /// answer, but the metrics count it.
    Cancelled,
}

impl Kind {
    /// The kind as the API and the metrics name it (`MALFORMED`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Malformed => "MALFORMED",
            Kind::UnknownResource => "UNKNOWN_RESOURCE",
            Kind::WrongKind => "WRONG_KIND",
            Kind::NotHeld => "NOT_HELD",
            Kind::UnknownTransfer => "UNKNOWN_TRANSFER",
            Kind::TooMany => "TOO_MANY",
            Kind::UnknownReservation => "UNKNOWN_RESERVATION",
            Kind::WindowOver => "WINDOW_OVER",
            Kind::StoreUnavailable => "STORE_UNAVAILABLE",
            Kind::Resigned => "RESIGNED",
            Kind::Internal => "INTERNAL",
            Kind::Cancelled => "CANCELLED",
        }
    }

    /// A server error: retrying, elsewhere or later, may succeed. A client
    /// error fails again if repeated as it is.
    pub fn is_server_error(self) -> bool {
        matches!(
            self,
            Kind::StoreUnavailable | Kind::Resigned | Kind::Internal
        )
    }
}

/// A refused operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: Kind,
    pub message: String,
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(Kind::Malformed, message)
    }

    pub fn is_server_error(&self) -> bool {
        self.kind.is_server_error()
    }
}

impl From<CopyError> for Error {
    fn from(error: CopyError) -> Self {
        let kind = match &error {
            CopyError::Unavailable(_) => Kind::StoreUnavailable,
            CopyError::Resigned(_) => Kind::Resigned,
            CopyError::UnknownTransfer => Kind::UnknownTransfer,
            CopyError::Internal(_) => Kind::Internal,
        };
        Error::new(kind, error.to_string())
    }
}

impl From<LeaseError> for Error {
    fn from(error: LeaseError) -> Self {
        let kind = match &error {
            LeaseError::Invalid(_) => Kind::Malformed,
            LeaseError::Unavailable(_) => Kind::StoreUnavailable,
        };
        Error::new(kind, error.to_string())
    }
}
