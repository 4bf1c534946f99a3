#![doc = include_str!("../README.md")]

mod cm;
#[cfg(feature = "libibverbs")]
mod ibv;
mod landing;
mod pool;
mod rdma;
mod session;
mod tcp;

use std::time::Duration;

#[cfg(feature = "libibverbs")]
pub use ibv::{IbvDevice, IbvSession};
pub use pool::Pool;
pub use rdma::{Endpoint, RdmaSession, SessionOptions};
pub use tcp::TcpSession;

/// One piece of a batch: `len` bytes between `local` (an offset in this
/// side's pool) and `remote` (an offset in the peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Offset in the local pool.
    pub local: u64,
    /// Offset in the peer's pool.
    pub remote: u64,
    /// Bytes.
    pub len: u32,
}

/// What a batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Local to remote; the peer is told when the batch has landed.
    Write,
    /// Remote to local (RDMA only).
    Read,
}

/// A submitted batch (its number on this session).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// A batch of writes that landed in this side's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    /// The sender's batch number.
    pub batch: BatchId,
    /// Bytes the batch wrote.
    pub bytes: u64,
}

/// Why a transfer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XferError {
    /// A segment lies outside the local or the remote pool.
    #[error("segment {segment}: {what} range {offset}+{len} outside the pool ({pool} bytes)")]
    OutOfRange {
        /// Its index in the batch.
        segment: usize,
        /// "local" or "remote".
        what: &'static str,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u32,
        /// The pool's size.
        pool: u64,
    },
    /// A segment's transfer failed (the peer went away, refused access).
    #[error("batch {batch} {}: {status}", segment.map_or("notification".to_string(), |s| format!("segment {s}")))]
    Segment {
        /// The batch.
        batch: u64,
        /// The segment's index in it (`None`: the landing notification).
        segment: Option<usize>,
        /// What the device or socket said.
        status: String,
    },
    /// The session failed earlier (its QPs or connections are gone).
    #[error("session failed: {0}")]
    Broken(String),
    /// Nothing happened in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The backend cannot do this.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// Setting the session up failed.
    #[error("setup: {0}")]
    Setup(String),
    /// No such batch in flight.
    #[error("no batch {0} in flight")]
    NoSuchBatch(u64),
}

/// A session to one peer: the same calls over RDMA ([`RdmaSession`]) and
/// TCP ([`TcpSession`]).
pub trait Transfer {
    /// Starts a batch; returns once every segment is handed to the
    /// transport (waiting while the outstanding work is at its bound).
    fn submit(&mut self, op: Op, segments: &[Segment]) -> Result<BatchId, XferError>;
    /// Waits until the batch is done on this side; returns its bytes.
    /// Every submitted batch is waited for once: its record is kept
    /// until then.
    fn wait(&mut self, id: BatchId, timeout: Duration) -> Result<u64, XferError>;
    /// Waits for the next batch of the peer's writes to land here.
    fn wait_landed(&mut self, timeout: Duration) -> Result<Landed, XferError>;
    /// Work requests posted and the time posting took (RDMA: the engine
    /// API's cost per request, waits for room excluded).
    fn post_stats(&self) -> Option<(u64, Duration)> {
        None
    }
}

/// A boxed session is a session (so a program can pick its transport at
/// run time: `Box<dyn Transfer + Send>`).
impl<T: Transfer + ?Sized> Transfer for Box<T> {
    fn submit(&mut self, op: Op, segments: &[Segment]) -> Result<BatchId, XferError> {
        (**self).submit(op, segments)
    }
    fn wait(&mut self, id: BatchId, timeout: Duration) -> Result<u64, XferError> {
        (**self).wait(id, timeout)
    }
    fn wait_landed(&mut self, timeout: Duration) -> Result<Landed, XferError> {
        (**self).wait_landed(timeout)
    }
    fn post_stats(&self) -> Option<(u64, Duration)> {
        (**self).post_stats()
    }
}

/// Checks `segments` against both pools' sizes.
fn check(segments: &[Segment], local: u64, remote: u64) -> Result<u64, XferError> {
    let mut bytes = 0;
    for (i, s) in segments.iter().enumerate() {
        for (what, offset, pool) in [("local", s.local, local), ("remote", s.remote, remote)] {
            if offset
                .checked_add(u64::from(s.len))
                .is_none_or(|end| end > pool)
            {
                return Err(XferError::OutOfRange {
                    segment: i,
                    what,
                    offset,
                    len: s.len,
                    pool,
                });
            }
        }
        bytes += u64::from(s.len);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_outside_either_pool_are_named() {
        let seg = |local, remote, len| Segment { local, remote, len };
        assert_eq!(check(&[seg(0, 0, 8), seg(8, 8, 8)], 16, 16), Ok(16));
        assert!(matches!(
            check(&[seg(0, 0, 8), seg(12, 0, 8)], 16, 64),
            Err(XferError::OutOfRange {
                segment: 1,
                what: "local",
                ..
            })
        ));
        assert!(matches!(
            check(&[seg(0, u64::MAX, 8)], 16, 64),
            Err(XferError::OutOfRange {
                segment: 0,
                what: "remote",
                ..
            })
        ));
    }
}
