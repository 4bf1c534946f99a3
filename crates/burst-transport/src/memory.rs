//! The memory interface the transport is given by its caller. The transport
//! never dereferences an address itself: burst-mem (or the simulator)
//! implements this trait, performs every key, PD, bounds and permission check,
//! and moves the bytes (through the copy engine in the real stack).

use burst_wire::Qpn;

use crate::types::{MwBind, Sge};

/// The QP a memory operation is made for: its protection domain, and its
/// number (a type 2 memory window serves only the QP it was bound on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpScope {
    /// The QP's protection domain.
    pub pd: u32,
    /// The QP's number.
    pub qpn: Qpn,
}

/// Where the transport will write a received packet's payload
/// ([`crate::Qp::in_order_placement`]), named as its [`Memory`] write
/// will name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement<'a> {
    /// [`Memory::write_remote`] at `rkey`, `va`.
    Remote {
        /// The message's remote key.
        rkey: u32,
        /// Where this packet's bytes start.
        va: u64,
    },
    /// [`Memory::write_local`] into a receive's scatter list.
    Local {
        /// The QP's protection domain.
        pd: u32,
        /// The receive WQE's scatter list.
        sges: &'a [Sge],
        /// This packet's offset in it.
        offset: u64,
    },
}

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
    /// Store `value` (RDMA ATOMIC WRITE): one 8-byte store, ordered after
    /// every earlier placement; the remote write right is what it needs.
    Write {
        /// The new value.
        value: u64,
    },
}

impl AtomicOp {
    /// The right a region must grant for it.
    pub fn access(&self) -> RemoteAccess {
        match self {
            AtomicOp::Write { .. } => RemoteAccess::Write,
            _ => RemoteAccess::Atomic,
        }
    }

    /// The value stored over `old`.
    ///
    /// ```
    /// use burst_transport::AtomicOp;
    /// assert_eq!(AtomicOp::FetchAdd { add: 2 }.apply(40), 42);
    /// assert_eq!(AtomicOp::CompareSwap { compare: 1, swap: 9 }.apply(40), 40);
    /// assert_eq!(AtomicOp::Write { value: 7 }.apply(40), 7);
    /// ```
    pub fn apply(&self, old: u64) -> u64 {
        match *self {
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            AtomicOp::Write { value } => value,
        }
    }
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
    /// A memory-window bind broke a rule of IBA 10.6.7 (window state or
    /// type, the region's MW_BIND right, the range, the rights).
    #[error("memory window bind refused: {0}")]
    Bind(&'static str),
}

/// Memory as the transport sees it. Offsets into SGE lists are byte offsets
/// into the concatenation of the SGEs.
pub trait Memory {
    /// Checks that every SGE names a region of `pd` with room for its range
    /// (and LOCAL_WRITE when `write`).
    fn check_local(&self, pd: u32, sges: &[Sge], write: bool) -> Result<(), MemError>;
    /// Copies `out.len()` bytes starting at `offset` of the SGE list, every
    /// SGE a region of `pd` (the QP's: a key of another PD reaches nothing,
    /// whoever asks, as [`Memory::check_local`] says).
    fn read_local(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MemError>;
    /// Places `data` at `offset` of the SGE list, every SGE a region of
    /// `pd` with LOCAL_WRITE.
    fn write_local(
        &mut self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> Result<(), MemError>;
    /// Checks a remote access of `len` bytes at `va` through `rkey` for QP `qp`.
    fn check_remote(
        &self,
        qp: QpScope,
        rkey: u32,
        va: u64,
        len: u64,
        access: RemoteAccess,
    ) -> Result<(), MemError>;
    /// Reads remote-accessible memory (already checked).
    fn read_remote(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), MemError>;
    /// [`Memory::read_local`] that also gives the CRC-32 of the bytes read
    /// when the copy computed it on the way (a fused copy and CRC pass);
    /// `None` when it did not (the packet's ICRC then reads them again).
    fn read_local_crc(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u32>, MemError> {
        self.read_local(pd, sges, offset, out).map(|()| None)
    }
    /// [`Memory::read_remote`] with the CRC-32 of the bytes read, as
    /// [`Memory::read_local_crc`].
    fn read_remote_crc(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<Option<u32>, MemError> {
        self.read_remote(rkey, va, out).map(|()| None)
    }
    /// Writes remote-accessible memory (already checked).
    fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError>;
    /// Checks (against [`AtomicOp::access`]) and executes an atomic;
    /// returns the original value.
    fn atomic(&mut self, qp: QpScope, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError>;
    /// Invalidates `rkey` for `qp` (SEND WITH INVALIDATE from the peer, or
    /// a local invalidate work request).
    fn invalidate(&mut self, qp: QpScope, rkey: u32) -> Result<(), MemError>;
    /// Binds a memory window on behalf of `qp` (a bind work request
    /// reaching the send queue). A memory without windows refuses.
    fn bind_window(&mut self, qp: QpScope, bind: &MwBind) -> Result<(), MemError> {
        let _ = (qp, bind);
        Err(MemError::Bind("no memory windows"))
    }
}

/// What a remote access is checked against: a memory region or a bound
/// memory window, as a key names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Its protection domain.
    pub pd: u32,
    /// First remote address (the IOVA of an MR).
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// REMOTE_WRITE granted.
    pub remote_write: bool,
    /// REMOTE_READ granted.
    pub remote_read: bool,
    /// REMOTE_ATOMIC granted.
    pub remote_atomic: bool,
    /// Whether SEND WITH INVALIDATE may invalidate its key: memory windows
    /// and fast-registered MRs, never an MR of `ibv_reg_mr` (as RXE).
    pub invalidatable: bool,
    /// The one QP it serves (a bound type 2 memory window); `None`: any
    /// QP of its protection domain.
    pub qpn: Option<Qpn>,
}

/// The one remote-access check every [`Memory`] applies once the key has
/// named a live region `r`: protection domain (and the QP of a type 2
/// window), bounds, rights, and for atomics 8-byte alignment (IBA
/// 9.7.5.1.1: the responder validates R_Key, PD, address range and access
/// rights before any side effect). Returns the offset of `va` in the region.
///
/// ```
/// use burst_transport::memory::{check_remote_access, MemError, QpScope, RemoteAccess, RemoteRegion};
/// use burst_wire::Qpn;
/// let r = RemoteRegion { pd: 1, iova: 0x1000, len: 64, remote_write: true, remote_read: false,
///     remote_atomic: true, invalidatable: false, qpn: None };
/// let qp = QpScope { pd: 1, qpn: Qpn::from_wire(17) };
/// assert_eq!(check_remote_access(&r, qp, 0x1010, 16, RemoteAccess::Write), Ok(0x10));
/// let other_pd = QpScope { pd: 2, ..qp };
/// assert_eq!(check_remote_access(&r, other_pd, 0x1010, 16, RemoteAccess::Write), Err(MemError::PdMismatch));
/// assert_eq!(check_remote_access(&r, qp, 0x1038, 16, RemoteAccess::Write), Err(MemError::OutOfBounds));
/// assert_eq!(check_remote_access(&r, qp, 0x1000, 8, RemoteAccess::Read), Err(MemError::NoAccess));
/// assert_eq!(check_remote_access(&r, qp, 0x1004, 8, RemoteAccess::Atomic), Err(MemError::Misaligned));
/// // A type 2 window bound on QP 18 serves no other QP.
/// let window = RemoteRegion { qpn: Some(Qpn::from_wire(18)), ..r };
/// assert!(check_remote_access(&window, qp, 0x1010, 16, RemoteAccess::Write).is_err());
/// ```
pub fn check_remote_access(
    r: &RemoteRegion,
    qp: QpScope,
    va: u64,
    len: u64,
    access: RemoteAccess,
) -> Result<u64, MemError> {
    if r.pd != qp.pd {
        return Err(MemError::PdMismatch);
    }
    if r.qpn.is_some_and(|q| q != qp.qpn) {
        return Err(MemError::NoAccess);
    }
    let off = va.checked_sub(r.iova).ok_or(MemError::OutOfBounds)?;
    if off.checked_add(len).is_none_or(|end| end > r.len) {
        return Err(MemError::OutOfBounds);
    }
    let granted = match access {
        RemoteAccess::Write => r.remote_write,
        RemoteAccess::Read => r.remote_read,
        RemoteAccess::Atomic => r.remote_atomic,
    };
    if !granted {
        return Err(MemError::NoAccess);
    }
    if access == RemoteAccess::Atomic && va % 8 != 0 {
        return Err(MemError::Misaligned);
    }
    Ok(off)
}

/// The one check of a SEND WITH INVALIDATE's key against the region it
/// names: same protection domain, and a kind of region that may be
/// invalidated ([`RemoteRegion::invalidatable`]).
pub fn check_invalidate(r: &RemoteRegion, qp: QpScope) -> Result<(), MemError> {
    if r.pd != qp.pd {
        return Err(MemError::PdMismatch);
    }
    if !r.invalidatable {
        return Err(MemError::NoAccess);
    }
    Ok(())
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
