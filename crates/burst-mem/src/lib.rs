#![doc = include_str!("../README.md")]

mod copier;
mod raw;
mod window;

use rustc_hash::FxHashMap as HashMap;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use burst_dsa::CpuCopy;
use burst_transport::memory::{check_invalidate, check_remote_access, RemoteRegion};
use burst_transport::{
    walk_sges, AtomicOp, MemError, Memory, MwBind, Placement, QpScope, RemoteAccess, Sge,
};

pub use copier::{Copier, CopierCounters, CpuMode};
pub use raw::{page_size, Region};
pub use window::{MwKeys, MwType, MAX_WINDOWS};

/// Access rights of a memory region, with the bit values of `enum ibv_access_flags`.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// IBV_ACCESS_LOCAL_WRITE.
    pub const LOCAL_WRITE: Access = Access(1);
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: Access = Access(4);
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// IBV_ACCESS_MW_BIND: memory windows may be bound to the region.
    pub const MW_BIND: Access = Access(16);
    /// IBV_ACCESS_ZERO_BASED: a window addressed from 0 (refused here).
    pub const ZERO_BASED: Access = Access(32);
    /// IBV_ACCESS_RELAXED_ORDERING: accepted and ignored (no PCIe here).
    pub const RELAXED_ORDERING: Access = Access(1 << 20);

    /// True when every right of `other` is granted.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Any remote right.
    pub const fn any_remote(self) -> bool {
        self.0 & (2 | 4 | 8) != 0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// A protection domain handle.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pd(pub u32);

/// What a registration returns (the fields of `struct ibv_mr`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    /// Local key.
    pub lkey: u32,
    /// Remote key: the lkey, with or without remote rights, as RXE and
    /// mlx5 report it (a peer's access is refused by the region's rights,
    /// and a re-registration that grants them keeps the key).
    pub rkey: u32,
    /// Start of the region in the address space the keys use (the IOVA).
    pub addr: u64,
    /// Length.
    pub len: u64,
}

/// Why a registration call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RegError {
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (the Verbs rule).
    #[error("remote write or atomic access requires local write")]
    InvalidAccess,
    /// Zero length, or the range wraps.
    #[error("invalid length")]
    InvalidLength,
    /// No region has this key.
    #[error("no such memory region")]
    NoSuchRegion,
    /// The protection domain is not the caller's (or does not exist).
    #[error("no such protection domain")]
    NoSuchPd,
    /// The key space is exhausted.
    #[error("out of memory region slots")]
    Exhausted,
    /// Memory windows are bound to the region (unbind or free them first).
    #[error("memory windows are bound to the region")]
    InUse,
    /// The range is not mapped, or not writable where the access lets the
    /// engine write: what RXE's registration, which pins the pages,
    /// refuses ([`populate`]).
    #[error("the range is not mapped with the access asked for")]
    BadAddress,
}

impl RegError {
    /// errno as rdma-core reports it.
    pub fn errno(self) -> i32 {
        match self {
            RegError::Exhausted => 12,  // ENOMEM
            RegError::BadAddress => 14, // EFAULT
            // EINVAL also for InUse, as RXE's dereg_mr with windows bound.
            _ => 22, // EINVAL
        }
    }
}

/// Faults in `len` bytes of this process's memory at `ptr` before an
/// application's registration with `access` (`ibv_reg_mr`), as RXE's and an
/// RNIC's registration pins them: writable when the access lets the device
/// write (local write, which remote write and atomics require, or a window
/// bind: the kernel's `ib_access_writable`), readable otherwise. The
/// engine's copies then take no page fault on the data path (a fresh
/// page's first write costs a fault and a zeroed page inside a packet's
/// placement), and a range that is not mapped, or not writable where
/// writes are asked for, is refused with [`RegError::BadAddress`] (RXE's
/// `EFAULT`) instead of faulting the process at the engine's first access.
/// One difference: `PROT_NONE` memory, which RXE pins for reading (with
/// `FOLL_FORCE`), is refused too, as the engine reads it through the
/// process's own mapping. The arguments are checked first, as a
/// registration checks them.
/// The cost moves to registration, where RDMA applications expect it;
/// burst does not lock the pages. Memory a daemon maps for a client is
/// populated by the client, in its own address space.
///
/// ```
/// use burst_mem::{populate, Access, RegError};
/// let buf = vec![0u8; 8192];
/// assert_eq!(populate(buf.as_ptr(), buf.len(), Access::LOCAL_WRITE), Ok(()));
/// // Not mapped (RXE: EFAULT).
/// assert_eq!(populate(4096 as *const u8, 4096, Access::default()), Err(RegError::BadAddress));
/// assert_eq!(populate(buf.as_ptr(), 0, Access::default()), Err(RegError::InvalidLength));
/// ```
pub fn populate(ptr: *const u8, len: usize, access: Access) -> Result<(), RegError> {
    check_args(len, ptr as u64, access)?;
    // The kernel's ib_access_writable: a window bound to the region may
    // grant writes too.
    let write = access.contains(Access::LOCAL_WRITE) || access.contains(Access::MW_BIND);
    raw::populate(ptr, len, write).map_err(|errno| {
        tracing::debug!(
            "reg_mr refused: {len} bytes at {ptr:p} ({access:?}) could not be faulted in (errno {errno})"
        );
        RegError::BadAddress
    })
}

/// The Verbs rules every registration obeys: remote write and atomics
/// need local write; a length that is not zero and does not wrap.
fn check_args(len: usize, iova: u64, access: Access) -> Result<(), RegError> {
    let needs_local = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
    if access.0 & needs_local.0 != 0 && !access.contains(Access::LOCAL_WRITE) {
        return Err(RegError::InvalidAccess);
    }
    if len == 0 || iova.checked_add(len as u64).is_none() {
        return Err(RegError::InvalidLength);
    }
    Ok(())
}

/// Most regions a table holds.
const MAX_REGIONS: usize = 1 << 24;

/// The table of memory regions of one device.
#[derive(Debug, Default)]
pub struct MrTable {
    // A read lock on the hot path: registrations are rare next to lookups.
    // An RCU-style table can replace it without changing the interface.
    // Lock order: `windows` before `regions`.
    regions: RwLock<HashMap<u32, Arc<Region>>>,
    /// Memory windows by index (an rkey's upper 24 bits).
    windows: RwLock<HashMap<u32, window::Window>>,
    next_pd: AtomicU32,
    /// State of the key generator of a [`MrTable::seeded`] table (0: keys
    /// from the system's entropy source).
    key_seed: AtomicU64,
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: fall back to the clock, still unpredictable enough
        // to catch stale keys.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x5a5a_5a5a, |d| d.as_nanos() as u32);
        return t.wrapping_mul(0x9e37_79b9);
    }
    u32::from_ne_bytes(b)
}

impl MrTable {
    /// An empty table.
    pub fn new() -> MrTable {
        MrTable::default()
    }

    /// An empty table whose keys come from `seed` rather than the entropy
    /// source: a simulation that registers the same way gets the same keys,
    /// so a failing seed replays.
    pub fn seeded(seed: u64) -> MrTable {
        let t = MrTable::default();
        t.key_seed.store(seed | 1, Ordering::Relaxed);
        t
    }

    fn draw_key(&self) -> u32 {
        if self.key_seed.load(Ordering::Relaxed) == 0 {
            return random_u32();
        }
        // xorshift64 (the state is never 0: seeded odd, xorshift keeps it nonzero).
        let mut x = self.key_seed.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.key_seed.store(x, Ordering::Relaxed);
        (x >> 32) as u32
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        Pd(self.next_pd.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Registers `len` bytes at `ptr`, addressed remotely as `iova..iova+len`
    /// (`ibv_reg_mr` uses the virtual address itself; `ibv_reg_mr_iova2` any).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until
    /// [`MrTable::deregister`] of the returned key has returned.
    pub unsafe fn register(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        self.insert(len, iova, access, |key| {
            // SAFETY: the caller's contract covers `ptr..ptr+len` until
            // deregistration.
            unsafe { Region::new(pd.0, ptr, len as u64, iova, access, key) }
        })
    }

    fn insert(
        &self,
        len: usize,
        iova: u64,
        access: Access,
        region: impl FnOnce(u32) -> Region,
    ) -> Result<MrKeys, RegError> {
        check_args(len, iova, access)?;
        let windows = self.windows.read().unwrap_or_else(|e| e.into_inner());
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if regions.len() >= MAX_REGIONS {
            return Err(RegError::Exhausted);
        }
        // A fresh random key on every registration; 0 means "no key". Never
        // one whose upper 24 bits index a window.
        let key = loop {
            let k = self.draw_key();
            if k != 0 && !regions.contains_key(&k) && !windows.contains_key(&(k >> 8)) {
                break k;
            }
        };
        regions.insert(key, Arc::new(region(key)));
        Ok(MrKeys {
            lkey: key,
            rkey: key,
            addr: iova,
            len: len as u64,
        })
    }

    /// Registers `len` bytes at `addr` of another address space, named by
    /// `mem`: a descriptor of `/proc/self/mem` that its process opened and
    /// handed over (one copy per access, by `pread`/`pwrite`; a daemon's
    /// fallback where a client's pages could not be shared). The
    /// descriptor carries exactly the access its opener had to its own
    /// memory, so the table's user needs no privilege and can reach no
    /// other process; a failed copy reads as zeros and writes nothing.
    pub fn register_foreign(
        &self,
        pd: Pd,
        mem: Arc<std::os::fd::OwnedFd>,
        addr: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        self.insert(len, iova, access, |key| {
            Region::foreign(pd.0, mem, addr, len as u64, iova, access, key)
        })
    }

    /// Deregisters a region. Returns once no in-flight operation holds it, so
    /// the application may free the memory afterwards. Refused while memory
    /// windows are bound to it.
    pub fn deregister(&self, lkey: u32) -> Result<(), RegError> {
        // The windows' lock is held across the removal: no bind can take
        // the region in between.
        let windows = self.windows.read().unwrap_or_else(|e| e.into_inner());
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if !regions.contains_key(&lkey) {
            return Err(RegError::NoSuchRegion);
        }
        if window::bound_to(&windows, lkey) {
            return Err(RegError::InUse);
        }
        let region = regions.remove(&lkey).ok_or(RegError::NoSuchRegion)?;
        drop(regions);
        drop(windows);
        // No new lookup can find it now; wait for those already holding it.
        while Arc::strong_count(&region) > 1 {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// `ibv_rereg_mr`'s step: the region registered as `new` (its PD,
    /// range and access) takes over the keys of `old`, whose region is
    /// dropped. The keys stay what the application and its peers hold, as
    /// RXE and mlx5 keep them. Returns once no in-flight operation holds
    /// the old region. Refused while windows are bound to `old`.
    pub fn replace(&self, old: u32, new: u32) -> Result<MrKeys, RegError> {
        let windows = self.windows.read().unwrap_or_else(|e| e.into_inner());
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if old == new || !regions.contains_key(&old) || !regions.contains_key(&new) {
            return Err(RegError::NoSuchRegion);
        }
        if window::bound_to(&windows, old) {
            return Err(RegError::InUse);
        }
        let fresh = regions.remove(&new).ok_or(RegError::NoSuchRegion)?;
        let moved = Arc::new(fresh.with_key(old));
        let keys = MrKeys {
            lkey: old,
            rkey: old,
            addr: moved.iova(),
            len: moved.len(),
        };
        // One step under the lock: a lookup of `old` finds either region.
        let gone = regions.insert(old, moved).ok_or(RegError::NoSuchRegion)?;
        drop(regions);
        drop(windows);
        while Arc::strong_count(&gone) > 1 {
            std::thread::yield_now();
        }
        Ok(keys)
    }

    /// The region of `key`, held for the duration of an operation.
    pub fn lookup(&self, key: u32) -> Option<Arc<Region>> {
        self.regions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    /// Regions registered now.
    pub fn len(&self) -> usize {
        self.regions.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The transport's view of this table, copying on the CPU at once.
    pub fn memory(&self) -> TableMemory<'_> {
        TableMemory {
            table: self,
            copy: CpuCopy,
            copier: None,
            hot: None,
            placed: None,
        }
    }

    /// The transport's view of this table, moving payload through
    /// `copier` (a data plane's: fused gathers, offloaded copies that the
    /// caller drains), for one round of packets.
    ///
    /// The view keeps the last region it found, so the packets of a round
    /// (mostly of one region) skip the table's lock and hash: deregistering
    /// that region waits until the view is dropped. Drop it before
    /// deregistering from the same thread.
    pub fn memory_through<'a>(&'a self, copier: &'a mut Copier) -> TableMemory<'a> {
        TableMemory {
            table: self,
            copy: CpuCopy,
            copier: Some(RefCell::new(copier)),
            hot: Some(RefCell::new(None)),
            placed: None,
        }
    }

    /// Lends the region of `key` to `f`, through `hot` when the caller
    /// keeps one. Only regions are kept, never windows: a region is never
    /// invalidated (only deregistered, which waits for every holder), a
    /// window is. Lent, not cloned: a reference count changed right after
    /// a 4 KiB copy waits for the copy's stores (7% of the core bench).
    fn with_region<R>(
        &self,
        hot: Option<&HotRegion>,
        key: u32,
        f: impl FnOnce(&Arc<Region>) -> R,
    ) -> Option<R> {
        let Some(hot) = hot else {
            return self.lookup(key).map(|r| f(&r));
        };
        let mut hot = hot.borrow_mut();
        if hot.as_ref().is_none_or(|r| r.key() != key) {
            *hot = Some(self.lookup(key)?);
        }
        hot.as_ref().map(f)
    }

    /// The one local-access check: `key` names a region of `pd` holding
    /// `va..va+len` (with LOCAL_WRITE when `write`); then `f` on the region
    /// and the offset of `va` in it. Every gather, placement and post-time
    /// check of an SGE goes through it, so no path (inline data gathered
    /// by the engine included) reaches another PD's memory.
    #[allow(clippy::too_many_arguments)]
    fn local<R>(
        &self,
        hot: Option<&HotRegion>,
        pd: u32,
        key: u32,
        va: u64,
        len: u64,
        write: bool,
        f: impl FnOnce(&Arc<Region>, u64) -> R,
    ) -> Result<R, MemError> {
        self.with_region(hot, key, |r| {
            let off = r.offset_of(va, len).ok_or(MemError::OutOfBounds)?;
            if r.pd() != pd {
                return Err(MemError::PdMismatch);
            }
            if write && !r.access().contains(Access::LOCAL_WRITE) {
                return Err(MemError::NoAccess);
            }
            Ok(f(r, off))
        })
        .unwrap_or(Err(MemError::BadKey(key)))
    }

    /// A checked remote access through `rkey` (a region, or the window
    /// bound on one): `f` on the region and the offset of `va` in it.
    #[allow(clippy::too_many_arguments)]
    fn reach<R>(
        &self,
        hot: Option<&HotRegion>,
        qp: Option<QpScope>,
        rkey: u32,
        va: u64,
        len: u64,
        access: RemoteAccess,
        f: impl FnOnce(&Arc<Region>, u64) -> R,
    ) -> Result<R, MemError> {
        let mut f = Some(f);
        let mut run = |r: &Arc<Region>, view: &RemoteRegion| -> Result<R, MemError> {
            // The data path's second look (after `check_remote`) keeps the
            // view's bounds and rights, not its QP and PD.
            let qp = qp.unwrap_or(QpScope {
                pd: view.pd,
                qpn: view.qpn.unwrap_or_default(),
            });
            check_remote_access(view, qp, va, len, access)?;
            let off = r.offset_of(va, len).ok_or(MemError::OutOfBounds)?;
            // Called once: by the region's branch or the window's.
            let f = f.take().ok_or(MemError::BadKey(rkey))?;
            Ok(f(r, off))
        };
        if let Some(done) = self.with_region(hot, rkey, |r| run(r, &remote_region(r))) {
            return done;
        }
        let (r, view) = self.window_view(rkey).ok_or(MemError::BadKey(rkey))?;
        run(&r, &view)
    }
}

/// What the shared remote-access check (`burst_transport::memory`) sees of
/// a registered region.
fn remote_region(r: &Region) -> RemoteRegion {
    let a = r.access();
    RemoteRegion {
        pd: r.pd(),
        iova: r.iova(),
        len: r.len(),
        remote_write: a.contains(Access::REMOTE_WRITE),
        remote_read: a.contains(Access::REMOTE_READ),
        remote_atomic: a.contains(Access::REMOTE_ATOMIC),
        invalidatable: false,
        qpn: None,
    }
}

/// [`Memory`] over an [`MrTable`], copying through the copy engine.
#[derive(Debug)]
pub struct TableMemory<'a> {
    table: &'a MrTable,
    copy: CpuCopy,
    copier: Option<RefCell<&'a mut Copier>>,
    /// The last region found (a round's views only: [`MrTable::memory_through`]).
    hot: Option<HotRegion>,
    /// A received payload already placed ([`TableMemory::place_received_crc`]).
    placed: Option<Placed>,
}

/// The region a view found last.
type HotRegion = RefCell<Option<Arc<Region>>>;

/// Which payload was placed where: its address and length in the frame
/// (the very bytes the transport will ask to write), and the destination
/// as the transport names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placed {
    data: (usize, usize),
    at: PlacedAt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlacedAt {
    Remote {
        rkey: u32,
        va: u64,
    },
    Local {
        pd: u32,
        sges: (usize, usize),
        offset: u64,
    },
}

impl PlacedAt {
    fn of(at: &Placement<'_>) -> PlacedAt {
        match *at {
            Placement::Remote { rkey, va } => PlacedAt::Remote { rkey, va },
            Placement::Local { pd, sges, offset } => PlacedAt::Local {
                pd,
                sges: (sges.as_ptr() as usize, sges.len()),
                offset,
            },
        }
    }
}

impl TableMemory<'_> {
    /// Places a received packet's payload `data` where the transport will
    /// (`at`, from [`burst_transport::Qp::in_order_placement`]), computing
    /// its CRC-32 continued from `crc` in the same pass: the receiver checks
    /// the packet's ICRC while it places the payload instead of reading it
    /// twice. The access is checked as the transport's write checks it.
    /// The transport's own write of these bytes to that place is then
    /// skipped, once ([`TableMemory::forget_placed`] drops the note when
    /// the packet went elsewhere). `None`, with nothing noted, where the
    /// copier cannot fuse (an offloading or plain copier, memory of another
    /// process), or the access is refused; some bytes may have been placed
    /// then, and the transport's write places them again.
    ///
    /// Only for destinations that no one reads before the packet is known
    /// good: a WRITE's middle packet, a SEND's packet in a receive buffer.
    pub fn place_received_crc(&mut self, at: &Placement<'_>, data: &[u8], crc: u32) -> Option<u32> {
        self.placed = None;
        let copier = self.copier.as_mut()?.get_mut();
        let hot = self.hot.as_ref();
        let crc = match *at {
            Placement::Remote { rkey, va } => self
                .table
                .reach(
                    hot,
                    None,
                    rkey,
                    va,
                    data.len() as u64,
                    RemoteAccess::Write,
                    |r, off| copier.place_crc(r, off, data, crc),
                )
                .ok()??,
            Placement::Local { pd, sges, offset } => {
                let len = data.len() as u64;
                walk_sges(sges, offset, len, |s, va, _, l| {
                    self.table
                        .local(hot, pd, s.lkey, va, l as u64, true, |_, _| ())
                })
                .ok()?;
                let mut crc = Some(crc);
                walk_sges(sges, offset, len, |s, va, at, l| {
                    self.table
                        .local(hot, pd, s.lkey, va, l as u64, true, |r, off| {
                            crc = crc.and_then(|c| copier.place_crc(r, off, &data[at..at + l], c));
                        })
                })
                .ok()?;
                crc?
            }
        };
        self.placed = Some(Placed {
            data: (data.as_ptr() as usize, data.len()),
            at: PlacedAt::of(at),
        });
        Some(crc)
    }

    /// Drops the note of a placed payload (see
    /// [`TableMemory::place_received_crc`]).
    pub fn forget_placed(&mut self) {
        self.placed = None;
    }

    /// Whether `data` to `at` is the payload placed already (the note is
    /// used up).
    fn already_placed(&mut self, data: &[u8], at: PlacedAt) -> bool {
        let this = Placed {
            data: (data.as_ptr() as usize, data.len()),
            at,
        };
        self.placed.take_if(|p| *p == this).is_some()
    }

    /// Gathers through the copier; the CRC-32 of the bytes when it fused.
    fn gather_local(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u32>, MemError> {
        let Some(copier) = &self.copier else {
            self.read_plain(pd, sges, offset, out)?;
            return Ok(None);
        };
        let mut copier = copier.borrow_mut();
        if copier.offloads() {
            // All or nothing: a gather refused halfway must leave no copy
            // pending into a send buffer that is about to be reused.
            walk_sges(sges, offset, out.len() as u64, |s, va, _, len| {
                let hot = self.hot.as_ref();
                self.table
                    .local(hot, pd, s.lkey, va, len as u64, false, |_, _| ())
            })?;
        }
        let mut crc = copier.fuses().then_some(0);
        walk_sges(sges, offset, out.len() as u64, |s, va, at, len| {
            let hot = self.hot.as_ref();
            self.table
                .local(hot, pd, s.lkey, va, len as u64, false, |r, off| {
                    copier.gather(r, off, &mut out[at..at + len], &mut crc)
                })
        })?;
        Ok(crc)
    }

    fn read_plain(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        walk_sges(sges, offset, out.len() as u64, |s, va, at, len| {
            let hot = self.hot.as_ref();
            self.table
                .local(hot, pd, s.lkey, va, len as u64, false, |r, off| {
                    r.read(&self.copy, off, &mut out[at..at + len])
                })
        })
    }

    fn gather_remote(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<Option<u32>, MemError> {
        let len = out.len() as u64;
        let hot = self.hot.as_ref();
        self.table.reach(
            hot,
            None,
            rkey,
            va,
            len,
            RemoteAccess::Read,
            |r, off| match &self.copier {
                Some(copier) => {
                    let mut copier = copier.borrow_mut();
                    let mut crc = copier.fuses().then_some(0);
                    copier.gather(r, off, out, &mut crc);
                    crc
                }
                None => {
                    r.read(&self.copy, off, out);
                    None
                }
            },
        )
    }
}

impl Memory for TableMemory<'_> {
    fn check_local(&self, pd: u32, sges: &[Sge], write: bool) -> Result<(), MemError> {
        for s in sges {
            let len = u64::from(s.length);
            let hot = self.hot.as_ref();
            self.table
                .local(hot, pd, s.lkey, s.addr, len, write, |_, _| ())?;
        }
        Ok(())
    }

    fn read_local(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        self.gather_local(pd, sges, offset, out).map(|_| ())
    }

    fn read_local_crc(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u32>, MemError> {
        self.gather_local(pd, sges, offset, out)
    }

    fn read_remote_crc(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<Option<u32>, MemError> {
        self.gather_remote(rkey, va, out)
    }

    fn write_local(
        &mut self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        let at = PlacedAt::Local {
            pd,
            sges: (sges.as_ptr() as usize, sges.len()),
            offset,
        };
        if self.already_placed(data, at) {
            return Ok(());
        }
        // All or nothing: check every piece before placing any byte.
        walk_sges(sges, offset, data.len() as u64, |s, va, _, len| {
            let hot = self.hot.as_ref();
            self.table
                .local(hot, pd, s.lkey, va, len as u64, true, |_, _| ())
        })?;
        let mut copier = self.copier.as_mut().map(|c| &mut **c.get_mut());
        let offloads = copier.as_ref().is_some_and(|c| c.offloads());
        // An offloaded placement is one job of all its pieces (a DSA
        // batch); on the CPU each piece is copied as it is found (no
        // allocation per packet).
        let mut pieces = Vec::new();
        walk_sges(sges, offset, data.len() as u64, |s, va, at, len| {
            let hot = self.hot.as_ref();
            self.table
                .local(
                    hot,
                    pd,
                    s.lkey,
                    va,
                    len as u64,
                    true,
                    |r, off| match copier.as_deref_mut() {
                        Some(_) if offloads => pieces.push((r.clone(), off, at, len)),
                        Some(c) => c.place(r, off, &data[at..at + len]),
                        None => r.write(&self.copy, off, &data[at..at + len]),
                    },
                )
        })?;
        if let (Some(c), false) = (copier, pieces.is_empty()) {
            let job: Vec<_> = pieces
                .iter()
                .map(|(r, off, at, len)| (r, *off, &data[*at..*at + *len]))
                .collect();
            c.place_all(&job);
        }
        Ok(())
    }

    fn check_remote(
        &self,
        qp: QpScope,
        rkey: u32,
        va: u64,
        len: u64,
        access: RemoteAccess,
    ) -> Result<(), MemError> {
        self.table.reach(
            self.hot.as_ref(),
            Some(qp),
            rkey,
            va,
            len,
            access,
            |_, _| (),
        )
    }

    fn read_remote(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.gather_remote(rkey, va, out).map(|_| ())
    }

    fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError> {
        if self.already_placed(data, PlacedAt::Remote { rkey, va }) {
            return Ok(());
        }
        let len = data.len() as u64;
        let (hot, copier, copy) = (self.hot.as_ref(), &mut self.copier, &self.copy);
        self.table.reach(
            hot,
            None,
            rkey,
            va,
            len,
            RemoteAccess::Write,
            |r, off| match copier {
                Some(copier) => copier.get_mut().place(r, off, data),
                None => r.write(copy, off, data),
            },
        )
    }

    fn atomic(&mut self, qp: QpScope, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        // An atomic sees (and orders after) every copy placed before it.
        if let Some(copier) = &mut self.copier {
            copier.get_mut().fence();
        }
        let hot = self.hot.as_ref();
        self.table
            .reach(hot, Some(qp), rkey, va, 8, op.access(), |r, off| {
                r.atomic(off, op)
            })?
            .ok_or(MemError::Misaligned)
    }

    fn invalidate(&mut self, qp: QpScope, rkey: u32) -> Result<(), MemError> {
        // Memory windows and fast-registered MRs are what an invalidate
        // targets; an MR of ibv_reg_mr is never invalidatable.
        if let Some(r) = self.table.lookup(rkey) {
            return check_invalidate(&remote_region(&r), qp);
        }
        self.table.invalidate_window(qp, rkey)
    }

    fn bind_window(&mut self, qp: QpScope, bind: &MwBind) -> Result<(), MemError> {
        self.table.bind(qp, bind)
    }
}
