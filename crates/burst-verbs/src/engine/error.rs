//! Errors of the front-end calls.

use burst_transport::VerbsError;

/// Why a front-end call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The ring is full (errno ENOMEM, as providers report a full queue).
    Full,
    /// No such QP or CQ.
    NoSuch,
    /// An argument the call cannot take (a CQ without a channel armed,
    /// unreadable inline data).
    Invalid,
    /// The work request fails the checks `ibv_post_send` / `ibv_post_recv`
    /// make ([`crate::QpConfig::check_send`]), or the transport refused it.
    Refused(VerbsError),
    /// The engine has stopped (or, for a daemon client, burstd is gone).
    Stopped,
    /// The object is still in use (EBUSY).
    Busy,
}

impl PostError {
    /// The errno rdma-core returns for this failure.
    pub fn errno(self) -> i32 {
        match self {
            PostError::Full => libc::ENOMEM,
            PostError::Stopped => libc::EIO,
            PostError::Refused(v) => v.errno(),
            PostError::NoSuch | PostError::Invalid => libc::EINVAL,
            PostError::Busy => libc::EBUSY,
        }
    }
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Full => write!(f, "queue full"),
            PostError::NoSuch => write!(f, "no such QP, SRQ or CQ"),
            PostError::Invalid => write!(f, "invalid argument"),
            PostError::Refused(v) => write!(f, "{v}"),
            PostError::Stopped => write!(f, "the engine has stopped (or burstd is gone)"),
            PostError::Busy => write!(f, "still in use"),
        }
    }
}

impl std::error::Error for PostError {}

/// Why a create/destroy call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// The engine could not be reached, or an ID was unknown.
    Post(PostError),
    /// The transport refused (with rdma-core's errno in [`VerbsError::errno`]).
    Verbs(VerbsError),
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateError::Post(p) => write!(f, "{p}"),
            CreateError::Verbs(v) => write!(f, "{v}"),
        }
    }
}

impl std::error::Error for CreateError {}

impl From<PostError> for CreateError {
    fn from(e: PostError) -> CreateError {
        CreateError::Post(e)
    }
}

impl CreateError {
    /// The errno rdma-core would return.
    pub fn errno(self) -> i32 {
        match self {
            CreateError::Verbs(v) => v.errno(),
            CreateError::Post(PostError::Full) => libc::ENOMEM,
            CreateError::Post(PostError::Stopped) => libc::EIO,
            CreateError::Post(PostError::Busy) => libc::EBUSY,
            CreateError::Post(_) => libc::EINVAL,
        }
    }
}
