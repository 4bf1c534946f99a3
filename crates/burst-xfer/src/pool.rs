//! The memory a session moves: one page-aligned allocation, registered
//! for remote READ and WRITE when it serves RDMA.

use std::alloc::Layout;
use std::ptr::NonNull;

use burst_verbs::engine::Context;
use burst_verbs::{Access, MrKeys, Pd};

use crate::XferError;

/// A pool of memory (zeroed, page-aligned, the pages made as touched).
///
/// The peer writes into it while it is shared, so it is reached by copies
/// ([`Pool::read`], [`Pool::write`]) rather than by references; bytes a
/// transfer targets must not be read before the transfer has landed.
pub struct Pool {
    base: NonNull<u8>,
    layout: Layout,
    reg: Option<Registration>,
}

struct Registration {
    ctx: Context,
    pd: Pd,
    keys: MrKeys,
    /// The PD was made for this pool (deallocated with it).
    own_pd: bool,
}

// SAFETY: the pool owns its allocation; every access is a raw copy at an
// offset the caller names (the same contract as memory an RNIC writes).
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("len", &self.len())
            .field("rkey", &self.reg.as_ref().map(|r| r.keys.rkey))
            .finish()
    }
}

impl Pool {
    /// `len` bytes of plain memory (a TCP session's).
    pub fn new(len: usize) -> Result<Pool, XferError> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| XferError::Setup(format!("pool of {len} bytes: {e}")))?;
        // SAFETY: a non-zero size and a valid alignment.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(p)
            .ok_or_else(|| XferError::Setup(format!("no memory for a pool of {len} bytes")))?;
        Ok(Pool {
            base,
            layout,
            reg: None,
        })
    }

    /// `len` bytes registered on `ctx` for local and remote reads and
    /// writes (an RDMA session's), in a protection domain of its own.
    pub fn registered(ctx: &Context, len: usize) -> Result<Pool, XferError> {
        Pool::register(ctx, ctx.alloc_pd(), true, len)
    }

    /// `len` bytes registered in `pd` (the session's receive slots, in its
    /// pool's PD).
    pub(crate) fn registered_in(ctx: &Context, pd: Pd, len: usize) -> Result<Pool, XferError> {
        Pool::register(ctx, pd, false, len)
    }

    fn register(ctx: &Context, pd: Pd, own_pd: bool, len: usize) -> Result<Pool, XferError> {
        let mut pool = Pool::new(len)?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: the allocation lives until `Drop`, which deregisters it
        // first.
        let keys = unsafe { ctx.reg_mr(pd, pool.base.as_ptr(), len, access) }
            .map_err(|e| XferError::Setup(format!("registering {len} bytes: {e}")))?;
        pool.reg = Some(Registration {
            ctx: ctx.clone(),
            pd,
            keys,
            own_pd,
        });
        Ok(pool)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether it has no bytes (never: a pool has at least one).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Its first byte's address (what the registration covers).
    pub fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// The registration's keys (RDMA pools).
    pub fn keys(&self) -> Option<MrKeys> {
        self.reg.as_ref().map(|r| r.keys)
    }

    /// The protection domain it is registered in.
    pub(crate) fn pd(&self) -> Option<Pd> {
        self.reg.as_ref().map(|r| r.pd)
    }

    /// The raw range `offset..offset+len`, checked.
    pub(crate) fn range(&self, offset: u64, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len as u64)?;
        if end > self.len() as u64 {
            return None;
        }
        // SAFETY: inside the allocation (checked above).
        Some(unsafe { self.base.as_ptr().add(offset as usize) })
    }

    /// Copies `out.len()` bytes at `offset` out (false: out of range).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        let Some(p) = self.range(offset, out.len()) else {
            return false;
        };
        // SAFETY: `p..p+len` is inside the pool; `out` is the caller's own.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` in at `offset` (false: out of range).
    pub fn write(&self, offset: u64, data: &[u8]) -> bool {
        let Some(p) = self.range(offset, data.len()) else {
            return false;
        };
        // SAFETY: `p..p+len` is inside the pool; `data` is the caller's own.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        true
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(r) = self.reg.take() {
            if let Err(e) = r.ctx.dereg_mr(r.keys.lkey) {
                // Still in use by the engine: leaking beats freeing memory
                // it may write.
                tracing::warn!("burst-xfer: pool still registered ({e}); leaking it");
                return;
            }
            if r.own_pd {
                let _ = r.ctx.dealloc_pd(r.pd);
            }
        }
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}
