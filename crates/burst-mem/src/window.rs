//! Memory windows (IBA 10.6.7; `ibv_alloc_mw`, `ibv_bind_mw`,
//! `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`): a window grants remote rights to
//! part of a memory region under an rkey of its own, which can be moved,
//! narrowed or revoked without touching the registration.
//!
//! A window's rkey is `index << 8 | tag`, as RXE and RNICs make it: the
//! application steps the tag with `ibv_inc_rkey` at every bind, so a key
//! handed out before a rebind misses afterwards. The index is drawn at
//! random (24 bits) and never shares its upper 24 bits with a region's key,
//! so a key names a region or a window, never both.
//!
//! The rules follow RXE's `rxe_mw.c` (which cites the IBA's): a type 1
//! window is bound by `ibv_bind_mw` (unbound by a zero length) and cannot
//! be invalidated; a type 2 window is bound by a work request of a QP of
//! its protection domain, serves only that QP, must be free to be bound and
//! is freed by a local invalidate or a peer's SEND WITH INVALIDATE. The
//! region must carry `IBV_ACCESS_MW_BIND`, contain the window, and have
//! LOCAL_WRITE when the window grants remote write or atomics. A region
//! with windows bound cannot be deregistered.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use burst_transport::memory::RemoteRegion;
use burst_transport::{MemError, MwBind, QpScope};
use burst_wire::Qpn;

use crate::{Access, MrTable, Pd, RegError, Region};

/// The type of a memory window (`enum ibv_mw_type`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with `ibv_bind_mw`, any QP of its PD may use it.
    One,
    /// Type 2 (2B): bound by a work request, serves that QP only.
    Two,
}

impl MwType {
    /// From `enum ibv_mw_type` (1 or 2).
    pub fn from_verbs(v: u32) -> Option<MwType> {
        match v {
            1 => Some(MwType::One),
            2 => Some(MwType::Two),
            _ => None,
        }
    }
}

/// A memory window as allocated (`struct ibv_mw`'s fields).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwKeys {
    /// The window's handle: its index, the upper 24 bits of every rkey it
    /// takes.
    pub handle: u32,
    /// Its rkey now.
    pub rkey: u32,
}

#[derive(Debug)]
pub(crate) struct Window {
    pd: u32,
    kind: MwType,
    rkey: u32,
    binding: Option<Binding>,
}

#[derive(Debug, Clone)]
struct Binding {
    region: Arc<Region>,
    addr: u64,
    len: u64,
    access: Access,
    /// The QP a type 2 window was bound on.
    qpn: Option<Qpn>,
}

impl Window {
    fn remote(&self, b: &Binding) -> RemoteRegion {
        RemoteRegion {
            pd: self.pd,
            iova: b.addr,
            len: b.len,
            remote_write: b.access.contains(Access::REMOTE_WRITE),
            remote_read: b.access.contains(Access::REMOTE_READ),
            remote_atomic: b.access.contains(Access::REMOTE_ATOMIC),
            invalidatable: self.kind == MwType::Two,
            qpn: b.qpn,
        }
    }
}

/// Most windows a table holds (the device's `max_mw`).
pub const MAX_WINDOWS: usize = 1 << 20;

impl MrTable {
    /// Allocates a memory window of `pd` (`ibv_alloc_mw`): a type 1 window
    /// is valid but grants nothing until bound; a type 2 one is free.
    pub fn alloc_window(&self, pd: Pd, kind: MwType) -> Result<MwKeys, RegError> {
        let mut windows = self.windows.write().unwrap_or_else(|e| e.into_inner());
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= MAX_WINDOWS {
            return Err(RegError::Exhausted);
        }
        let (index, rkey) = loop {
            let k = self.draw_key();
            let index = k >> 8;
            // No region key may share the index (a key names one thing).
            if index != 0
                && !windows.contains_key(&index)
                && !(0..=0xff).any(|t| regions.contains_key(&(index << 8 | t)))
            {
                break (index, k);
            }
        };
        windows.insert(
            index,
            Window {
                pd: pd.0,
                kind,
                rkey,
                binding: None,
            },
        );
        Ok(MwKeys {
            handle: index,
            rkey,
        })
    }

    /// Frees a window (`ibv_dealloc_mw`); its binding goes with it.
    pub fn dealloc_window(&self, handle: u32) -> Result<(), RegError> {
        self.windows
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
            .map(|_| ())
            .ok_or(RegError::NoSuchRegion)
    }

    /// True when a window of `pd` exists (the PD is in use).
    pub fn pd_has_windows(&self, pd: Pd) -> bool {
        let windows = self.windows.read().unwrap_or_else(|e| e.into_inner());
        windows.values().any(|w| w.pd == pd.0)
    }

    /// Executes a bind for QP `qp` (RXE's checks, in its order).
    pub(crate) fn bind(&self, qp: QpScope, bind: &MwBind) -> Result<(), MemError> {
        let index = bind.mw_rkey >> 8;
        // The region is taken under the windows' lock, which deregistration
        // holds too: a region being deregistered is never bound.
        let mut windows = self.windows.write().unwrap_or_else(|e| e.into_inner());
        let region = if bind.len > 0 {
            Some(
                self.lookup(bind.mr_lkey)
                    .ok_or(MemError::Bind("no memory region has this lkey"))?,
            )
        } else {
            None
        };
        // By index alone: the tag is the owner's to step (type 2 windows'
        // `ibv_mw.rkey` is the application's to update, and not every
        // application does), and a bind is the owner's own operation.
        let w = windows
            .get_mut(&index)
            .ok_or(MemError::Bind("no window has this index"))?;
        if w.pd != qp.pd {
            return Err(MemError::Bind(
                "the QP's protection domain is not the window's",
            ));
        }
        let access = Access(bind.access);
        if access.contains(Access::ZERO_BASED) {
            return Err(MemError::Bind("zero-based windows are not supported"));
        }
        match w.kind {
            MwType::One => {}
            MwType::Two => {
                if w.binding.is_some() {
                    return Err(MemError::Bind("a type 2 window must be free to be bound"));
                }
                if region.is_none() {
                    return Err(MemError::Bind("a type 2 window cannot be bound to nothing"));
                }
            }
        }
        if let Some(r) = &region {
            if r.pd() != w.pd {
                return Err(MemError::Bind(
                    "the region's protection domain is not the window's",
                ));
            }
            if !r.access().contains(Access::MW_BIND) {
                return Err(MemError::Bind("the region was registered without MW_BIND"));
            }
            let writes = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
            if access.0 & writes.0 != 0 && !r.access().contains(Access::LOCAL_WRITE) {
                return Err(MemError::Bind(
                    "a writable window needs a region with local write",
                ));
            }
            if r.offset_of(bind.addr, bind.len).is_none() {
                return Err(MemError::Bind("the window leaves the region"));
            }
        }
        w.rkey = (w.rkey & !0xff) | (bind.new_rkey & 0xff);
        w.binding = region.map(|region| Binding {
            region,
            addr: bind.addr,
            len: bind.len,
            access,
            qpn: (w.kind == MwType::Two).then_some(qp.qpn),
        });
        Ok(())
    }

    /// Invalidates window `rkey` for `qp` (local invalidate, or a peer's
    /// SEND WITH INVALIDATE): a bound type 2 window of the QP becomes free.
    pub(crate) fn invalidate_window(&self, qp: QpScope, rkey: u32) -> Result<(), MemError> {
        let mut windows = self.windows.write().unwrap_or_else(|e| e.into_inner());
        let w = windows
            .get_mut(&(rkey >> 8))
            .filter(|w| w.rkey == rkey)
            .ok_or(MemError::BadKey(rkey))?;
        let b = w.binding.as_ref().ok_or(MemError::BadKey(rkey))?;
        burst_transport::memory::check_invalidate(&w.remote(b), qp)?;
        if b.qpn.is_some_and(|q| q != qp.qpn) {
            return Err(MemError::NoAccess);
        }
        w.binding = None;
        Ok(())
    }

    /// The region a window's `rkey` reaches and what the remote-access
    /// check sees of the window.
    pub(crate) fn window_view(&self, rkey: u32) -> Option<(Arc<Region>, RemoteRegion)> {
        let windows = self.windows.read().unwrap_or_else(|e| e.into_inner());
        let w = windows.get(&(rkey >> 8)).filter(|w| w.rkey == rkey)?;
        let b = w.binding.as_ref()?;
        Some((b.region.clone(), w.remote(b)))
    }
}

/// True when a window of `windows` is bound to region `lkey`.
pub(crate) fn bound_to(windows: &HashMap<u32, Window>, lkey: u32) -> bool {
    windows
        .values()
        .any(|w| w.binding.as_ref().is_some_and(|b| b.region.key() == lkey))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_transport::{Memory, RemoteAccess};

    fn scope(pd: Pd, qpn: u32) -> QpScope {
        QpScope {
            pd: pd.0,
            qpn: Qpn::from_wire(qpn),
        }
    }

    fn setup(access: Access) -> (MrTable, Pd, Vec<u8>, crate::MrKeys) {
        let t = MrTable::seeded(7);
        let pd = t.alloc_pd();
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` is returned with the table and outlives every use.
        let mr = unsafe { t.register(pd, buf.as_mut_ptr(), buf.len(), 0x10000, access) }.unwrap();
        (t, pd, buf, mr)
    }

    fn bind(mw_rkey: u32, mr: &crate::MrKeys, addr: u64, len: u64, access: Access) -> MwBind {
        MwBind {
            mw_rkey,
            new_rkey: (mw_rkey & !0xff) | ((mw_rkey + 1) & 0xff),
            mr_lkey: mr.lkey,
            addr,
            len,
            access: access.0,
        }
    }

    #[test]
    fn a_type_1_window_grants_what_it_binds_and_a_rebind_retires_the_old_key() {
        let all = Access(Access::LOCAL_WRITE.0 | Access::MW_BIND.0);
        let (t, pd, _buf, mr) = setup(all);
        let mw = t.alloc_window(pd, MwType::One).unwrap();
        let qp = scope(pd, 5);
        let mut mem = t.memory();
        // Unbound: nothing reachable.
        assert!(mem
            .check_remote(qp, mw.rkey, 0x10000, 8, RemoteAccess::Write)
            .is_err());
        let b = bind(mw.rkey, &mr, 0x10100, 256, Access::REMOTE_WRITE);
        mem.bind_window(qp, &b).unwrap();
        let k = b.new_rkey;
        mem.check_remote(qp, k, 0x10100, 256, RemoteAccess::Write)
            .unwrap();
        mem.write_remote(k, 0x10180, b"window").unwrap();
        // Outside the window, a right it does not grant, the old key.
        assert!(mem
            .check_remote(qp, k, 0x100f8, 16, RemoteAccess::Write)
            .is_err());
        assert!(mem
            .check_remote(qp, k, 0x10100, 8, RemoteAccess::Read)
            .is_err());
        assert!(mem
            .check_remote(qp, mw.rkey, 0x10100, 8, RemoteAccess::Write)
            .is_err());
        // Any QP of the PD may use a type 1 window; another PD may not.
        mem.check_remote(scope(pd, 6), k, 0x10100, 8, RemoteAccess::Write)
            .unwrap();
        assert!(mem
            .check_remote(scope(Pd(99), 5), k, 0x10100, 8, RemoteAccess::Write)
            .is_err());
        // Type 1 windows are not invalidated; the region is held.
        assert!(mem.invalidate(qp, k).is_err());
        assert!(matches!(t.deregister(mr.lkey), Err(RegError::InUse)));
        // A zero-length bind unbinds.
        let unbind = MwBind {
            len: 0,
            addr: 0,
            ..bind(k, &mr, 0, 0, Access(0))
        };
        mem.bind_window(qp, &unbind).unwrap();
        assert!(mem
            .check_remote(qp, unbind.new_rkey, 0x10100, 8, RemoteAccess::Write)
            .is_err());
        t.deregister(mr.lkey).unwrap();
    }

    #[test]
    fn a_type_2_window_serves_its_qp_until_invalidated() {
        let all = Access(Access::LOCAL_WRITE.0 | Access::MW_BIND.0);
        let (t, pd, _buf, mr) = setup(all);
        let mw = t.alloc_window(pd, MwType::Two).unwrap();
        let (qp, other) = (scope(pd, 5), scope(pd, 6));
        let mut mem = t.memory();
        let rw = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
        let b = bind(mw.rkey, &mr, 0x10000, 4096, rw);
        mem.bind_window(qp, &b).unwrap();
        let k = b.new_rkey;
        mem.check_remote(qp, k, 0x10000, 64, RemoteAccess::Read)
            .unwrap();
        assert!(mem
            .check_remote(other, k, 0x10000, 64, RemoteAccess::Read)
            .is_err());
        // Bound: a second bind is refused until it is free again.
        assert!(mem.bind_window(qp, &bind(k, &mr, 0x10000, 64, rw)).is_err());
        assert!(mem.invalidate(other, k).is_err());
        mem.invalidate(qp, k).unwrap();
        assert!(mem
            .check_remote(qp, k, 0x10000, 64, RemoteAccess::Read)
            .is_err());
        assert!(mem.invalidate(qp, k).is_err(), "already free");
        mem.bind_window(other, &bind(k, &mr, 0x10000, 64, rw))
            .unwrap();
        // A type 2 bind needs a region and a nonzero length.
        t.dealloc_window(mw.handle).unwrap();
        let mw2 = t.alloc_window(pd, MwType::Two).unwrap();
        assert!(mem
            .bind_window(qp, &bind(mw2.rkey, &mr, 0x10000, 0, rw))
            .is_err());
    }

    #[test]
    fn binds_follow_the_region_rules() {
        let mut mem_keys = Vec::new();
        // Without MW_BIND; then read-only (no local write) for a writable window.
        for (access, win) in [
            (Access::LOCAL_WRITE, Access::REMOTE_READ),
            (Access::MW_BIND, Access::REMOTE_WRITE),
        ] {
            let (t, pd, _buf, mr) = setup(access);
            let mw = t.alloc_window(pd, MwType::One).unwrap();
            let mut mem = t.memory();
            assert!(mem
                .bind_window(scope(pd, 1), &bind(mw.rkey, &mr, 0x10000, 64, win))
                .is_err());
            mem_keys.push(mw.rkey);
        }
        let (t, pd, _buf, mr) = setup(Access(Access::LOCAL_WRITE.0 | Access::MW_BIND.0));
        let mw = t.alloc_window(pd, MwType::One).unwrap();
        let mut mem = t.memory();
        let qp = scope(pd, 1);
        // Past the region's end; zero-based; another PD's QP.
        for b in [
            bind(mw.rkey, &mr, 0x10f00, 512, Access::REMOTE_READ),
            bind(
                mw.rkey,
                &mr,
                0x10000,
                64,
                Access(Access::REMOTE_READ.0 | Access::ZERO_BASED.0),
            ),
        ] {
            assert!(mem.bind_window(qp, &b).is_err());
        }
        assert!(mem
            .bind_window(
                scope(Pd(42), 1),
                &bind(mw.rkey, &mr, 0x10000, 64, Access::REMOTE_READ)
            )
            .is_err());
        // A window key never names a region and the other way round.
        assert!(t.lookup(mw.rkey).is_none());
        // PDs with windows are in use.
        assert!(t.pd_has_windows(pd));
        t.dealloc_window(mw.handle).unwrap();
        assert!(!t.pd_has_windows(pd));
    }
}
