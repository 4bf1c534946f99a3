//! The only code of burst-mem that touches application memory: a region is a
//! raw pointer and a length, accessed through the copy engine and atomics,
//! never through Rust references (the application may touch the same bytes
//! concurrently, as RDMA allows).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use burst_dsa::{copy_from_raw, copy_to_raw, CopyEngine};
use burst_transport::AtomicOp;

use crate::Access;

/// [`crate::populate`]'s system calls over `base..base+len` rounded out to
/// pages (writable when `write`). `Err` carries the errno: `ENOMEM` (not
/// mapped) or `EFAULT` (a page that cannot be faulted in, or a mapping the
/// kernel will not fault in for this access: not writable for `write`,
/// device memory — what RXE's pinning refuses — and `PROT_NONE`, which
/// RXE pins for reading but this process could not read). Kernels before
/// 5.14, which cannot populate, accept everything as before.
pub(crate) fn populate(base: *const u8, len: usize, write: bool) -> Result<(), i32> {
    let page = page_size();
    let start = base as usize & !(page - 1);
    let Some(end) = (base as usize)
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .map(|e| e & !(page - 1))
    else {
        return Err(libc::EFAULT);
    };
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    match madvise(start, end - start, advice) {
        Ok(()) => Ok(()),
        Err(e @ (libc::ENOMEM | libc::EFAULT)) => Err(e),
        // Writable but not readable (PROT_WRITE alone: readable by the CPU
        // here): RXE pins it for reading with FOLL_FORCE, and so does this.
        Err(libc::EINVAL)
            if !write && madvise(start, end - start, libc::MADV_POPULATE_WRITE).is_ok() =>
        {
            Ok(())
        }
        // EINVAL is the kernel's answer for a mapping it will not fault in
        // for this access (device memory and, for writes, a mapping that is
        // not writable: what RXE's pinning refuses; PROT_NONE, which RXE
        // pins with FOLL_FORCE but the engine could not read through this
        // process's mapping), and for an advice it does not know.
        Err(libc::EINVAL | libc::EPERM) if can_populate() => Err(libc::EFAULT),
        // Too old a kernel; EINTR, EHWPOISON: left to the first access.
        Err(_) => Ok(()),
    }
}

/// The system's page size (4096 when `sysconf` does not say, or says
/// something that is not a power of two).
///
/// ```
/// assert!(burst_mem::page_size().is_power_of_two());
/// ```
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// `madvise` with `MADV_POPULATE_READ` or `MADV_POPULATE_WRITE` (the only
/// advice passed here); `Err` carries the errno.
fn madvise(start: usize, len: usize, advice: libc::c_int) -> Result<(), i32> {
    debug_assert!(matches!(
        advice,
        libc::MADV_POPULATE_READ | libc::MADV_POPULATE_WRITE
    ));
    // SAFETY: MADV_POPULATE_* only faults pages in (as touching them would,
    // without touching them): it never changes the mapping or its contents,
    // and fails on a range that is not mapped.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EFAULT))
    }
}

/// Whether this kernel knows MADV_POPULATE_READ (5.14): asked once, on a
/// page of this thread's stack, which is mapped and readable.
fn can_populate() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        let probe = 0u8;
        let at = std::ptr::addr_of!(probe) as usize & !(page_size() - 1);
        madvise(at, page_size(), libc::MADV_POPULATE_READ).is_ok()
    })
}

#[cfg(test)]
mod populate_tests {
    use super::populate;

    fn map(prot: libc::c_int) -> *mut u8 {
        // SAFETY: a fresh anonymous mapping of this test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    /// What RXE's pinning takes and refuses, by protection and access.
    #[test]
    fn only_mappings_the_access_can_use_are_populated() {
        for (prot, read, write) in [
            (libc::PROT_READ | libc::PROT_WRITE, true, true),
            (libc::PROT_READ, true, false),
            // Writable, not readable in the kernel's view (the CPU reads it).
            (libc::PROT_WRITE, true, true),
            (libc::PROT_NONE, false, false),
        ] {
            let p = map(prot);
            assert_eq!(populate(p, 4096, false).is_ok(), read, "prot {prot} read");
            assert_eq!(populate(p, 4096, true).is_ok(), write, "prot {prot} write");
            // SAFETY: this test's mapping, never accessed.
            unsafe { libc::munmap(p.cast(), 4096) };
        }
    }
}

/// A registered memory region.
#[derive(Debug)]
pub struct Region {
    pd: u32,
    base: *mut u8,
    len: u64,
    iova: u64,
    access: Access,
    key: u32,
    /// `None`: `base` is an address of this process. Otherwise a
    /// descriptor of the other process's `/proc/self/mem`, which that
    /// process opened and handed over: `base` is an address there, reached
    /// with `pread`/`pwrite` (a daemon's single-copy path to a client's
    /// memory). The descriptor names the address space that opened it, for
    /// good: never a pid, which may be reused, or name a process after it
    /// exec'd a setuid program (the old address space is gone: accesses
    /// fail).
    mem: Option<Arc<OwnedFd>>,
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
            mem: None,
        }
    }

    /// A region at `base` of the address space `mem` (a descriptor of its
    /// `/proc/self/mem`) names.
    pub(crate) fn foreign(
        pd: u32,
        mem: Arc<OwnedFd>,
        base: u64,
        len: u64,
        iova: u64,
        access: Access,
        key: u32,
    ) -> Region {
        Region {
            pd,
            base: base as *mut u8,
            len,
            iova,
            access,
            key,
            mem: Some(mem),
        }
    }

    /// The same memory under another key (a re-registration).
    pub(crate) fn with_key(&self, key: u32) -> Region {
        Region {
            pd: self.pd,
            base: self.base,
            len: self.len,
            iova: self.iova,
            access: self.access,
            key,
            mem: self.mem.clone(),
        }
    }

    /// Copies between `local` and `len` bytes at `off` of the other
    /// address space; false if the kernel refused (the process exited or
    /// exec'd, the range is unmapped). Partial transfers are finished or
    /// reported as failures.
    fn foreign_copy(
        &self,
        mem: &OwnedFd,
        off: u64,
        local: *mut u8,
        len: usize,
        write: bool,
    ) -> bool {
        let mut done = 0usize;
        while done < len {
            let at = (self.base as u64)
                .checked_add(off + done as u64)
                .and_then(|a| libc::off_t::try_from(a).ok());
            let Some(at) = at else {
                return false;
            };
            let p = local.wrapping_add(done);
            // SAFETY: `p` covers `len - done` bytes of memory of ours the
            // caller lends us; the other side is an offset in a file (the
            // kernel checks the address space it names).
            let n = unsafe {
                if write {
                    libc::pwrite(mem.as_raw_fd(), p.cast(), len - done, at)
                } else {
                    libc::pread(mem.as_raw_fd(), p.cast(), len - done, at)
                }
            };
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        true
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

    /// The address of `len` bytes at `off`, for a region of this process
    /// in bounds (`None` for a region reached through the kernel, or out of
    /// bounds). Valid while the region is held ([`crate::MrTable::lookup`]).
    pub(crate) fn local_ptr(&self, off: u64, len: usize) -> Option<*mut u8> {
        self.offset_of(self.iova + off, len as u64)?;
        // SAFETY: in bounds of the registered region (checked above).
        self.mem
            .is_none()
            .then(|| unsafe { self.base.add(off as usize) })
    }

    /// Copies out of the region. `off + out.len()` must be within bounds
    /// (checked by [`Region::offset_of`]); out-of-range requests copy nothing.
    pub fn read(&self, engine: &impl CopyEngine, off: u64, out: &mut [u8]) {
        if self.offset_of(self.iova + off, out.len() as u64).is_none() {
            return;
        }
        if let Some(mem) = &self.mem {
            if !self.foreign_copy(mem, off, out.as_mut_ptr(), out.len(), false) {
                out.fill(0);
            }
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
        if let Some(mem) = &self.mem {
            // The kernel only reads `data` for a write.
            self.foreign_copy(mem, off, data.as_ptr().cast_mut(), data.len(), true);
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
        if let Some(mem) = &self.mem {
            // Read, modify, write through the kernel: atomic against other
            // RDMA operations (the engine runs them one at a time), not
            // against the application's own CPU accesses.
            if (self.base as usize + off as usize) % 8 != 0 {
                return None;
            }
            let mut v = [0u8; 8];
            if !self.foreign_copy(mem, off, v.as_mut_ptr(), 8, false) {
                return None;
            }
            let old = u64::from_ne_bytes(v);
            let mut n = op.apply(old).to_ne_bytes();
            self.foreign_copy(mem, off, n.as_mut_ptr(), 8, true);
            return Some(old);
        }
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
            AtomicOp::Write { value } => cell.swap(value, Ordering::SeqCst),
        })
    }
}
