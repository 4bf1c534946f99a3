//! Device attributes, protection domains, memory regions and windows.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::shm::Segment;

use burst_mem::{Access, MrKeys, MwKeys, MwType, Pd, RegError};

use super::*;
use crate::config::DeviceConfig;
use crate::{DeviceAttr, PortAttr};

impl Context {
    /// The device's GID.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// What the device was opened with (name, address, interface, MTU).
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr::for_gid(self.gid)
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            active: !self.shared.events.port_down.load(Ordering::Relaxed),
            ..PortAttr::with_mtu(self.config.mtu)
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        self.try_alloc_pd().unwrap_or(Pd(0))
    }

    /// [`Context::alloc_pd`], with the error a daemon client can meet.
    pub fn try_alloc_pd(&self) -> Result<Pd, PostError> {
        self.plane.alloc_pd(self)
    }

    /// `ibv_dealloc_pd`: EBUSY while regions or QPs use it.
    pub fn dealloc_pd(&self, pd: Pd) -> Result<(), PostError> {
        self.plane.dealloc_pd(self, pd)
    }

    /// `Ok` when `pd` is this handle's (a daemon client reaches only its own).
    pub(super) fn check_pd(&self, pd: Pd) -> Result<(), PostError> {
        let owners = self
            .shared
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // PDs of MrTables used directly (simulations) are unknown here.
        if self.reaches(owners.get(&pd.0).copied()) {
            Ok(())
        } else {
            Err(PostError::NoSuch)
        }
    }

    /// Whether this handle may reach an object recorded as `owner`'s: its
    /// own, and (the engine's own process only) objects no owner was
    /// recorded for.
    pub(super) fn reaches(&self, owner: Option<u32>) -> bool {
        match owner {
            Some(o) => o == self.owner,
            None => self.owner == 0,
        }
    }

    /// Registers application memory (accessed in place by the engine).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until [`Context::dereg_mr`] returns.
    pub unsafe fn reg_mr(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        // SAFETY: forwarded contract.
        unsafe { self.reg_mr_iova(pd, ptr, len, ptr as u64, access) }
    }

    /// Registers application memory that peers address from `iova`
    /// (`ibv_reg_mr_iova2`). A daemon client's pages move onto a memfd the
    /// daemon maps too ([`crate::client`]), or the daemon copies through
    /// `process_vm_readv`/`process_vm_writev` where they cannot.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until [`Context::dereg_mr`] returns.
    pub unsafe fn reg_mr_iova(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        let r = Registration {
            pd,
            ptr,
            len,
            iova,
            access,
        };
        // SAFETY: forwarded contract.
        unsafe { self.plane.reg_mr(self, &r) }
    }

    /// Registers memory the daemon mapped for a client: `len` bytes at
    /// `offset` of `pages` (memfds the client moved its pages onto),
    /// addressed as `iova`. The mapping lives until deregistration.
    pub fn reg_mr_mapped(
        &self,
        pd: Pd,
        pages: Arc<Segment>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        if offset.checked_add(len).is_none_or(|e| e > pages.len()) {
            return Err(RegError::InvalidLength);
        }
        let base = pages.as_ptr();
        // SAFETY: `pages` stays mapped while the region is registered (held
        // in `mr_owner` until `dereg_mr` has waited for the last user), and
        // `offset..offset+len` lies inside it (checked above).
        self.register(pd, Some(pages), || unsafe {
            self.shared
                .mrs
                .register(pd, base.add(offset), len, iova, access)
        })
    }

    /// Registers memory of another process that the engine reaches
    /// through `mem`, a descriptor of that process's `/proc/self/mem` it
    /// opened and handed over (one copy per access, no remapping).
    pub fn reg_mr_foreign(
        &self,
        pd: Pd,
        mem: Arc<std::os::fd::OwnedFd>,
        addr: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        self.register(pd, None, || {
            self.shared
                .mrs
                .register_foreign(pd, mem, addr, len, iova, access)
        })
    }

    /// Runs `register` if `pd` is this handle's, and records the region as
    /// its owner's (with the daemon's mapping of its pages, if any).
    pub(super) fn register(
        &self,
        pd: Pd,
        pages: Option<Arc<Segment>>,
        register: impl FnOnce() -> Result<MrKeys, RegError>,
    ) -> Result<MrKeys, RegError> {
        if self.check_pd(pd).is_err() {
            return Err(RegError::NoSuchPd);
        }
        let keys = register()?;
        self.shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.lkey, (self.owner, pages));
        Ok(keys)
    }

    /// Deregisters; returns once the engine no longer uses the region.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), RegError> {
        self.plane.dereg_mr(self, lkey)
    }

    /// `ibv_rereg_mr`'s step: the region registered as `new` takes over
    /// the keys of `old` (both this handle's), whose region is dropped once
    /// the engine no longer uses it. See [`burst_mem::MrTable::replace`].
    pub fn replace_mr(&self, old: u32, new: u32) -> Result<MrKeys, RegError> {
        self.plane.replace_mr(self, old, new)
    }

    /// `ibv_rereg_mr`: registers `ptr..ptr+len` of `pd` with `access`
    /// (peers address it from `iova`) in place of the region of `lkey`,
    /// which keeps its keys, as RXE and mlx5 keep them. A refused
    /// registration leaves the region as it was.
    ///
    /// # Safety
    /// As [`Context::reg_mr_iova`] for the new range.
    pub unsafe fn rereg_mr(
        &self,
        lkey: u32,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        // SAFETY: forwarded contract.
        let fresh = unsafe { self.reg_mr_iova(pd, ptr, len, iova, access)? };
        self.replace_mr(lkey, fresh.lkey).inspect_err(|_| {
            let _ = self.dereg_mr(fresh.lkey);
        })
    }

    /// `ibv_alloc_mw`: a memory window of `pd` (see [`burst_mem::MwType`]);
    /// it is bound by a [`burst_transport::SendOp::BindMw`] work request.
    pub fn alloc_mw(&self, pd: Pd, kind: MwType) -> Result<MwKeys, RegError> {
        self.plane.alloc_mw(self, pd, kind)
    }

    /// `ibv_dealloc_mw`.
    pub fn dealloc_mw(&self, handle: u32) -> Result<(), RegError> {
        self.plane.dealloc_mw(self, handle)
    }
}
