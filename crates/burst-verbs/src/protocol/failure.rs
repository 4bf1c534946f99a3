//! Errors as they cross the socket: typed, so a client returns the very
//! error the daemon's control plane did.

use crate::engine::{CreateError, PostError};
use burst_mem::RegError;
use burst_transport::{QpState, VerbsError};
use serde::{Deserialize, Serialize};

/// A [`VerbsError`] as it crosses the socket (its message as text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireVerbsError {
    /// Which variant.
    pub kind: u8,
    /// The state of `InvalidState`.
    pub state: Option<QpState>,
    /// The text of the variants that carry one.
    pub what: String,
}

impl From<VerbsError> for WireVerbsError {
    fn from(e: VerbsError) -> WireVerbsError {
        let (kind, state, what) = match e {
            VerbsError::InvalidState(s) => (0, Some(s), ""),
            VerbsError::MissingAttr(w) => (1, None, w),
            VerbsError::UnexpectedAttr(w) => (2, None, w),
            VerbsError::InvalidValue(w) => (3, None, w),
            VerbsError::QueueFull => (4, None, ""),
            VerbsError::TooManySge => (5, None, ""),
            VerbsError::BadWr(w) => (6, None, w),
            VerbsError::Busy(w) => (7, None, w),
            VerbsError::Unsupported(w) => (8, None, w),
        };
        WireVerbsError {
            kind,
            state,
            what: what.into(),
        }
    }
}

/// `s` as a `&'static str`: the texts of errors are a small fixed set (the
/// transport's literals), kept once each; past 256 distinct ones a generic
/// text stands in.
fn intern(s: &str) -> &'static str {
    static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = seen.iter().find(|k| **k == s) {
        return k;
    }
    if seen.len() >= 256 {
        return "(reported by burstd)";
    }
    let k: &'static str = Box::leak(s.to_owned().into_boxed_str());
    seen.push(k);
    k
}

impl WireVerbsError {
    /// Back to the transport's error.
    pub fn into_verbs(self) -> VerbsError {
        let w = intern(&self.what);
        match self.kind {
            0 => VerbsError::InvalidState(self.state.unwrap_or(QpState::Err)),
            1 => VerbsError::MissingAttr(w),
            2 => VerbsError::UnexpectedAttr(w),
            3 => VerbsError::InvalidValue(w),
            4 => VerbsError::QueueFull,
            5 => VerbsError::TooManySge,
            7 => VerbsError::Busy(w),
            8 => VerbsError::Unsupported(w),
            _ => VerbsError::BadWr(w),
        }
    }
}

/// A verb's error as it crosses the socket: burstd sends the error its
/// in-process control plane returned, the client returns the same value
/// (no errno or message decoding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Failure {
    /// [`PostError::Full`].
    Full,
    /// [`PostError::NoSuch`].
    NoSuch,
    /// [`PostError::Invalid`].
    Invalid,
    /// [`PostError::Stopped`].
    Stopped,
    /// [`PostError::Busy`].
    Busy,
    /// [`PostError::Refused`].
    Refused(WireVerbsError),
    /// [`CreateError::Verbs`].
    Verbs(WireVerbsError),
    /// A registration verb's [`RegError`].
    Reg(RegError),
    /// A system call failed in the daemon (descriptors, memory): its errno.
    Os(i32),
}

impl From<PostError> for Failure {
    fn from(e: PostError) -> Failure {
        match e {
            PostError::Full => Failure::Full,
            PostError::NoSuch => Failure::NoSuch,
            PostError::Invalid => Failure::Invalid,
            PostError::Stopped => Failure::Stopped,
            PostError::Busy => Failure::Busy,
            PostError::Refused(v) => Failure::Refused(v.into()),
        }
    }
}

impl From<CreateError> for Failure {
    fn from(e: CreateError) -> Failure {
        match e {
            CreateError::Post(p) => p.into(),
            CreateError::Verbs(v) => Failure::Verbs(v.into()),
        }
    }
}

impl From<RegError> for Failure {
    fn from(e: RegError) -> Failure {
        Failure::Reg(e)
    }
}

impl Failure {
    /// The error of a reply the daemon made itself (a limit, a bad
    /// request), from its errno.
    pub fn of_errno(errno: i32) -> Failure {
        match errno {
            libc::ENOMEM => Failure::Full,
            libc::EBUSY => Failure::Busy,
            libc::EIO => Failure::Stopped,
            libc::EINVAL => Failure::Invalid,
            libc::ENOENT => Failure::NoSuch,
            n => Failure::Os(n),
        }
    }

    /// rdma-core's errno for it.
    pub fn errno(&self) -> i32 {
        match self {
            Failure::Os(n) => *n,
            Failure::Reg(e) => e.errno(),
            Failure::Verbs(v) => v.clone().into_verbs().errno(),
            f => f.clone().post().errno(),
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Failure::Os(n) => std::io::Error::from_raw_os_error(*n).to_string(),
            Failure::Reg(e) => e.to_string(),
            Failure::Verbs(v) => v.clone().into_verbs().to_string(),
            f => f.clone().post().to_string(),
        }
    }

    /// As a [`PostError`] (a registration error as the closest one).
    pub fn post(self) -> PostError {
        match self {
            Failure::Full => PostError::Full,
            Failure::NoSuch => PostError::NoSuch,
            Failure::Invalid => PostError::Invalid,
            Failure::Stopped => PostError::Stopped,
            Failure::Busy => PostError::Busy,
            Failure::Refused(v) | Failure::Verbs(v) => PostError::Refused(v.into_verbs()),
            Failure::Reg(RegError::Exhausted) => PostError::Full,
            Failure::Reg(RegError::InUse) => PostError::Busy,
            Failure::Reg(_) => PostError::Invalid,
            Failure::Os(libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EAGAIN) => {
                PostError::Full
            }
            Failure::Os(_) => PostError::Invalid,
        }
    }

    /// As a [`CreateError`].
    pub fn create(self) -> CreateError {
        match self {
            Failure::Verbs(v) => CreateError::Verbs(v.into_verbs()),
            f => CreateError::Post(f.post()),
        }
    }

    /// As a [`RegError`].
    pub fn reg(self) -> RegError {
        match self {
            Failure::Reg(e) => e,
            Failure::NoSuch => RegError::NoSuchRegion,
            Failure::Busy => RegError::InUse,
            Failure::Invalid => RegError::InvalidLength,
            _ => RegError::Exhausted,
        }
    }

    /// As an `std::io::Error` of its errno.
    pub fn io(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno())
    }
}
