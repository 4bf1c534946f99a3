//! The only code of burst-mem that touches application memory: a region is a
//! raw pointer and a length, accessed through the copy engine and atomics,
//! never through Rust references (the application may touch the same bytes
//! concurrently, as RDMA allows).

use std::sync::atomic::{AtomicU64, Ordering};

use burst_dsa::{copy_from_raw, copy_to_raw, CopyEngine};
use burst_transport::AtomicOp;

use crate::Access;

/// A registered memory region.
#[derive(Debug)]
pub struct Region {
    pd: u32,
    base: *mut u8,
    len: u64,
    iova: u64,
    access: Access,
    key: u32,
}

// SAFETY: a Region is a pointer into memory whose owner promised (the
// `MrTable::register` contract) that it stays valid until deregistration;
// every access goes through raw copies or atomics, so sharing the pointer
// between the application's threads and the engine thread is sound.
unsafe impl Send for Region {}
// SAFETY: as above; no `&`/`&mut` to the bytes is ever created.
unsafe impl Sync for Region {}

impl Region {
    /// # Safety
    /// `base` must be valid for `len` bytes of reads and writes for the
    /// region's lifetime.
    pub(crate) unsafe fn new(
        pd: u32,
        base: *mut u8,
        len: u64,
        iova: u64,
        access: Access,
        key: u32,
    ) -> Region {
        Region {
            pd,
            base,
            len,
            iova,
            access,
            key,
        }
    }

    /// Protection domain.
    pub fn pd(&self) -> u32 {
        self.pd
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Key.
    pub fn key(&self) -> u32 {
        self.key
    }
    /// IOVA of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for an empty region (never: registration refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of `iova..iova+len` inside the region, if it fits.
    pub fn offset_of(&self, iova: u64, len: u64) -> Option<u64> {
        let off = iova.checked_sub(self.iova)?;
        (off.checked_add(len)? <= self.len).then_some(off)
    }

    /// Copies out of the region. `off + out.len()` must be within bounds
    /// (checked by [`Region::offset_of`]); out-of-range requests copy nothing.
    pub fn read(&self, engine: &impl CopyEngine, off: u64, out: &mut [u8]) {
        if self.offset_of(self.iova + off, out.len() as u64).is_none() {
            return;
        }
        // SAFETY: the range lies inside the registered region (checked just
        // above), which the registration contract keeps valid.
        unsafe { copy_from_raw(engine, out, self.base.add(off as usize)) }
    }

    /// Copies into the region (bounds as for [`Region::read`]).
    pub fn write(&self, engine: &impl CopyEngine, off: u64, data: &[u8]) {
        if self.offset_of(self.iova + off, data.len() as u64).is_none() {
            return;
        }
        // SAFETY: as in `read`; `data` is a Rust slice, so it cannot alias the
        // application region through a reference we created.
        unsafe { copy_to_raw(engine, self.base.add(off as usize), data) }
    }

    /// Executes an 8-byte atomic at `off`; `None` when the host address is
    /// not 8-byte aligned or out of bounds.
    pub fn atomic(&self, off: u64, op: AtomicOp) -> Option<u64> {
        self.offset_of(self.iova + off, 8)?;
        // SAFETY: in bounds (checked above) of the registered region.
        let p = unsafe { self.base.add(off as usize) };
        if (p as usize) % 8 != 0 {
            return None;
        }
        // SAFETY: `p` is 8-byte aligned and valid for 8 bytes for the
        // region's lifetime; all of burst's accesses to it are atomic.
        let cell = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        Some(match op {
            AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap { compare, swap } => {
                match cell.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        })
    }
}
