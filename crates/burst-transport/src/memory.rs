//! The memory interface the transport is given by its caller. The transport
//! never dereferences an address itself: burst-mem (or the simulator)
//! implements this trait, performs every key, PD, bounds and permission check,
//! and moves the bytes (through the copy engine in the real stack).

use crate::types::Sge;

/// Remote access kinds checked against a memory region's rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemoteAccess {
    /// IBV_ACCESS_REMOTE_WRITE.
    Write,
    /// IBV_ACCESS_REMOTE_READ.
    Read,
    /// IBV_ACCESS_REMOTE_ATOMIC.
    Atomic,
}

/// An 8-byte atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Write `swap` if the value equals `compare`.
    CompareSwap {
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Add `add`.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// No region has this key (or it was invalidated).
    #[error("invalid key {0:#x}")]
    BadKey(u32),
    /// The range leaves the region.
    #[error("access out of the region's bounds")]
    OutOfBounds,
    /// The region does not grant this access.
    #[error("access not permitted by the region")]
    NoAccess,
    /// The region belongs to another protection domain.
    #[error("protection domain mismatch")]
    PdMismatch,
    /// An atomic address is not 8-byte aligned.
    #[error("misaligned atomic address")]
    Misaligned,
}

/// Memory as the transport sees it. Offsets into SGE lists are byte offsets
/// into the concatenation of the SGEs.
pub trait Memory {
    /// Checks that every SGE names a region of `pd` with room for its range
    /// (and LOCAL_WRITE when `write`).
    fn check_local(&self, pd: u32, sges: &[Sge], write: bool) -> Result<(), MemError>;
    /// Copies `out.len()` bytes starting at `offset` of the SGE list.
    fn read_local(&self, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), MemError>;
    /// Places `data` at `offset` of the SGE list.
    fn write_local(&mut self, sges: &[Sge], offset: u64, data: &[u8]) -> Result<(), MemError>;
    /// Checks a remote access of `len` bytes at `va` through `rkey` for a QP of `pd`.
    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        access: RemoteAccess,
    ) -> Result<(), MemError>;
    /// Reads remote-accessible memory (already checked).
    fn read_remote(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), MemError>;
    /// Writes remote-accessible memory (already checked).
    fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError>;
    /// Checks and executes an atomic; returns the original value.
    fn atomic(&mut self, pd: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;
    /// Invalidates `rkey` (SEND WITH INVALIDATE).
    fn invalidate(&mut self, pd: u32, rkey: u32) -> Result<(), MemError>;
}

/// Walks `len` bytes starting `offset` bytes into the concatenation of an SGE
/// list, calling `f(sge, address, done, n)` for each piece: `n` bytes at
/// `address` within `sge`, which are bytes `done..done + n` of the walk.
/// Fails with [`MemError::OutOfBounds`] when the list is too short. The one
/// scatter/gather walk that every [`Memory`] implementation shares.
pub fn walk_sges(
    sges: &[Sge],
    mut offset: u64,
    len: u64,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut done = 0u64;
    if len == 0 {
        return Ok(());
    }
    for s in sges {
        let l = u64::from(s.length);
        if offset >= l {
            offset -= l;
            continue;
        }
        let take = (l - offset).min(len - done);
        f(s, s.addr + offset, done as usize, take as usize)?;
        done += take;
        offset = 0;
        if done == len {
            return Ok(());
        }
    }
    Err(MemError::OutOfBounds)
}
