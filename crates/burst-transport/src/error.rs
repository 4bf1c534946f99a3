//! Errors of the Verbs-facing calls, with the errno rdma-core returns.

/// Why a post or modify call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// The QP's state does not allow the call (or the transition).
    #[error("invalid QP state transition or call in state {0:?}")]
    InvalidState(crate::QpState),
    /// A required attribute is missing from the mask.
    #[error("missing attribute {0} for this transition")]
    MissingAttr(&'static str),
    /// An attribute is not allowed for this transition or QP type.
    #[error("attribute {0} not allowed for this transition")]
    UnexpectedAttr(&'static str),
    /// An attribute value is out of range.
    #[error("invalid value for {0}")]
    InvalidValue(&'static str),
    /// The work queue is full.
    #[error("work queue full")]
    QueueFull,
    /// More SGEs than the QP was created with.
    #[error("too many SGEs")]
    TooManySge,
    /// The work request is malformed for this QP (opcode, length, inline size).
    #[error("invalid work request: {0}")]
    BadWr(&'static str),
    /// The object is still in use (destroying an SRQ with QPs on it).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The device cannot do this here (multicast on a port without it).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
}

impl VerbsError {
    /// The errno rdma-core's providers return for this error.
    pub fn errno(self) -> i32 {
        match self {
            VerbsError::QueueFull => 12, // ENOMEM, as rdma-core providers report a full queue
            VerbsError::Busy(_) => 16,   // EBUSY
            VerbsError::Unsupported(_) => 95, // EOPNOTSUPP
            _ => 22,                     // EINVAL
        }
    }
}
