//! The control plane: where a context's control verbs run. A [`Context`]
//! holds one [`ControlPlane`]: [`InProcess`] when the engine is this
//! process's (embedded mode, and burstd serving its clients), or burstd's
//! client ([`crate::client::Remote`]) in daemon mode. Posting and polling
//! never come here: both homes share the same rings.
//!
//! Adding a control verb: a method here, its in-process body, and (for
//! daemon mode) its protocol message with the client's side of it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use burst_mem::{Access, MrKeys, MwKeys, MwType, Pd, RegError};
use burst_transport::{QpAttr, RecvWr, SendWr, VerbsError};
use burst_wire::Qpn;

use super::*;
use crate::shm::{Segment, ShmRing};
use crate::{QpInit, SrqId};

/// A registration as the control plane takes it (`ibv_reg_mr_iova2`'s
/// arguments).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Registration {
    /// The protection domain.
    pub pd: Pd,
    /// Where the memory starts in this process.
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
    /// The address peers use.
    pub iova: u64,
    /// `ibv_access_flags`.
    pub access: Access,
}

/// What [`ControlPlane::create_srq`] gives: the new SRQ's number and ring.
pub(crate) type SrqMade = Result<(SrqId, ShmRing<RecvWr>), CreateError>;

/// What [`ControlPlane::create_qp`] gives: the new QP's rings.
pub(crate) type QpMade = Result<QpRings, CreateError>;

/// The ring of an SRQ allowing `max_sge` SGEs: (slots, bytes per entry).
pub(crate) fn srq_shape(max_wr: u32, max_sge: u32) -> (usize, usize) {
    (
        ShmRing::<RecvWr>::slots_for(max_wr as usize),
        crate::entry::recv_entry_size(max_sge),
    )
}

/// Where a [`Context`]'s control verbs run. Every method gets the context
/// it serves (its owner, its rings and CQs as this process sees them).
pub(crate) trait ControlPlane: Send + Sync + std::fmt::Debug {
    /// `ibv_alloc_pd`.
    fn alloc_pd(&self, ctx: &Context) -> Result<Pd, PostError>;
    /// `ibv_dealloc_pd` (EBUSY while regions or QPs use it).
    fn dealloc_pd(&self, ctx: &Context, pd: Pd) -> Result<(), PostError>;
    /// `ibv_reg_mr_iova2`.
    ///
    /// # Safety
    /// `r`'s range must stay valid until the region is deregistered.
    unsafe fn reg_mr(&self, ctx: &Context, r: &Registration) -> Result<MrKeys, RegError>;
    /// `ibv_dereg_mr`: returns once the engine no longer uses the region.
    fn dereg_mr(&self, ctx: &Context, lkey: u32) -> Result<(), RegError>;
    /// `ibv_rereg_mr`'s step: the region registered as `new` takes over
    /// `old`'s keys ([`burst_mem::MrTable::replace`]).
    fn replace_mr(&self, ctx: &Context, old: u32, new: u32) -> Result<MrKeys, RegError>;
    /// `ibv_alloc_mw`.
    fn alloc_mw(&self, ctx: &Context, pd: Pd, kind: MwType) -> Result<MwKeys, RegError>;
    /// `ibv_dealloc_mw`.
    fn dealloc_mw(&self, ctx: &Context, handle: u32) -> Result<(), RegError>;
    /// `ibv_create_comp_channel`.
    fn create_comp_channel(&self, ctx: &Context) -> std::io::Result<Arc<CompChannel>>;
    /// `ibv_destroy_comp_channel`.
    fn destroy_comp_channel(&self, ctx: &Context, ch: &CompChannel) -> Result<(), PostError>;
    /// The memory of a new CQ ring of `slots` for `depth` entries, and its
    /// number when this plane numbers it (`None`: the context picks one).
    fn cq_memory(
        &self,
        ctx: &Context,
        depth: usize,
        slots: usize,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<(Option<CqId>, Arc<Segment>), PostError>;
    /// `ibv_destroy_cq`'s part outside this process's tables (EBUSY while
    /// a QP completes into it).
    fn destroy_cq(&self, ctx: &Context, cq: CqId) -> Result<(), PostError>;
    /// A new QP completing into `cqs` (send, receive): its number, lane
    /// and rings.
    fn create_qp(&self, ctx: &Context, init: &QpInit, cqs: (CqId, CqId)) -> QpMade;
    /// `ibv_destroy_qp` (the context's table already checked `qpn`).
    fn destroy_qp(&self, ctx: &Context, qpn: Qpn) -> Result<(), CreateError>;
    /// A new SRQ of `max_wr` receives of `max_sge` SGEs: its number and
    /// ring.
    fn create_srq(&self, ctx: &Context, pd: Pd, max_wr: u32, max_sge: u32) -> SrqMade;
    /// Runs `c` on `lane`'s core, returning once `done` says its reply is
    /// in (or the request failed to reach the core).
    fn execute(
        &self,
        ctx: &Context,
        lane: usize,
        c: Control,
        done: &dyn Fn() -> bool,
    ) -> Result<(), PostError>;
    /// `ibv_create_ah`: the AH's number.
    fn create_ah(
        &self,
        ctx: &Context,
        gid: [u8; 16],
        sgid_index: Option<u8>,
    ) -> Result<u32, PostError>;
    /// `ibv_destroy_ah`.
    fn destroy_ah(&self, ctx: &Context, ah: u32) -> Result<(), PostError>;
    /// Whether a modify may name the AH in `attr` (its owner's only).
    fn check_ah(&self, ctx: &Context, attr: &QpAttr) -> Result<(), VerbsError>;
    /// Fills `wr.inline_data` from its SGEs (`len` bytes in all) for a
    /// QP of `pd`.
    fn gather_inline(
        &self,
        ctx: &Context,
        pd: u32,
        wr: &mut SendWr,
        len: u64,
    ) -> Result<(), PostError>;
    /// Steps the data plane on the calling thread if it can; whether there
    /// was work.
    fn progress(&self, ctx: &Context) -> bool;
    /// Has the data plane take everything posted before this call (steps
    /// every lane, waiting for a core another thread holds; burstd does it
    /// for a client): what a control call that counts completions needs
    /// (`ibv_resize_cq`: a UD send posted before it has completed, as on
    /// RXE, whose provider posts and completes it in the kernel call).
    fn settle(&self, ctx: &Context);
    /// Whether the engine behind this plane is gone for good (every verb
    /// fails).
    fn gone(&self) -> bool;
    /// burstd's number for this client (`None`: not a daemon client).
    fn client_id(&self) -> Option<u32>;
    /// Sends `req` to burstd (`Invalid` in process).
    fn request(
        &self,
        req: &crate::protocol::Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(crate::protocol::Reply, Vec<std::os::fd::OwnedFd>), PostError>;
}

/// The control plane of an engine in this process: requests run on its
/// lanes' cores.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct InProcess;

impl ControlPlane for InProcess {
    fn alloc_pd(&self, ctx: &Context) -> Result<Pd, PostError> {
        let pd = ctx.shared.mrs.alloc_pd();
        ctx.shared
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pd.0, ctx.owner);
        Ok(pd)
    }

    fn dealloc_pd(&self, ctx: &Context, pd: Pd) -> Result<(), PostError> {
        ctx.check_pd(pd)?;
        let sh = &ctx.shared;
        let mrs = sh.mr_owner.lock().unwrap_or_else(|e| e.into_inner());
        let used = mrs
            .keys()
            .any(|k| sh.mrs.lookup(*k).is_some_and(|r| r.pd() == pd.0))
            || sh.mrs.pd_has_windows(pd);
        drop(mrs);
        let rings = sh.rings.read().unwrap_or_else(|e| e.into_inner());
        if used || rings.iter().flatten().any(|r| r.cfg.pd == pd.0) {
            return Err(PostError::Busy);
        }
        drop(rings);
        sh.pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pd.0);
        Ok(())
    }

    unsafe fn reg_mr(&self, ctx: &Context, r: &Registration) -> Result<MrKeys, RegError> {
        // As RXE's registration pins the pages: no fault on the data path,
        // and memory that cannot be used is refused (EFAULT) here.
        burst_mem::populate(r.ptr, r.len, r.access)?;
        // SAFETY: forwarded contract.
        ctx.register(r.pd, None, || unsafe {
            ctx.shared
                .mrs
                .register(r.pd, r.ptr, r.len, r.iova, r.access)
        })
    }

    fn dereg_mr(&self, ctx: &Context, lkey: u32) -> Result<(), RegError> {
        let mut owners = ctx
            .shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !ctx.reaches(owners.get(&lkey).map(|(o, _)| *o)) {
            return Err(RegError::NoSuchRegion);
        }
        let held = owners.remove(&lkey);
        drop(owners);
        let r = ctx.shared.mrs.deregister(lkey);
        // The daemon's mapping goes only now, after the last user let go.
        drop(held);
        r
    }

    fn replace_mr(&self, ctx: &Context, old: u32, new: u32) -> Result<MrKeys, RegError> {
        let owners = ctx
            .shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mine = |k: &u32| ctx.reaches(owners.get(k).map(|(o, _)| *o));
        if !mine(&old) || !mine(&new) {
            return Err(RegError::NoSuchRegion);
        }
        // Not held while the table waits for the old region's last user.
        drop(owners);
        let keys = ctx.shared.mrs.replace(old, new)?;
        // The new registration's record (a daemon's mapping of its pages)
        // now belongs to the old key; the old one's mapping goes only now,
        // after the table let go of its region.
        let mut owners = ctx
            .shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let fresh = owners.remove(&new);
        let held = match fresh {
            Some(f) => owners.insert(old, f),
            None => owners.remove(&old),
        };
        drop(owners);
        drop(held);
        Ok(keys)
    }

    fn alloc_mw(&self, ctx: &Context, pd: Pd, kind: MwType) -> Result<MwKeys, RegError> {
        if ctx.check_pd(pd).is_err() {
            return Err(RegError::NoSuchPd);
        }
        let keys = ctx.shared.mrs.alloc_window(pd, kind)?;
        ctx.shared
            .mw_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.handle, ctx.owner);
        Ok(keys)
    }

    fn dealloc_mw(&self, ctx: &Context, handle: u32) -> Result<(), RegError> {
        let mut owners = ctx
            .shared
            .mw_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !ctx.reaches(owners.get(&handle).copied()) {
            return Err(RegError::NoSuchRegion);
        }
        owners.remove(&handle);
        drop(owners);
        ctx.shared.mrs.dealloc_window(handle)
    }

    fn create_comp_channel(&self, _: &Context) -> std::io::Result<Arc<CompChannel>> {
        Ok(Arc::new(CompChannel::with_fd(
            crate::eventfd::EventFd::new()?,
        )))
    }

    fn destroy_comp_channel(&self, _: &Context, _: &CompChannel) -> Result<(), PostError> {
        // The channel goes with its last `Arc`.
        Ok(())
    }

    fn cq_memory(
        &self,
        ctx: &Context,
        _: usize,
        slots: usize,
        _: Option<&Arc<CompChannel>>,
    ) -> Result<(Option<CqId>, Arc<Segment>), PostError> {
        Ok((None, Arc::new(ctx.segment("burst-cq", Cq::bytes(slots))?)))
    }

    fn destroy_cq(&self, ctx: &Context, cq: CqId) -> Result<(), PostError> {
        let rings = ctx.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        if rings
            .iter()
            .flatten()
            .any(|r| r.send_cq == cq || r.recv_cq == cq)
        {
            return Err(PostError::Busy);
        }
        Ok(())
    }

    fn create_qp(&self, ctx: &Context, init: &QpInit, cqs: (CqId, CqId)) -> QpMade {
        let init = *init;
        let shape = QpShape::of(&init);
        // Round robin over the lanes; a QP with an SRQ goes where SRQs live.
        let lane = if init.srq.is_some() {
            0
        } else {
            ctx.next_lane.fetch_add(1, Ordering::Relaxed) % ctx.control.len()
        };
        let seg = Arc::new(ctx.segment("burst-qp", shape.layout().2)?);
        let (qpn, cfg) = ctx
            .call_on(lane, |reply| Control::CreateQp { init, reply })?
            .map_err(CreateError::Verbs)?;
        Ok(
            QpRings::new(seg, shape, true, qpn, lane, cfg, cqs, ctx.owner)
                .map_err(|_| PostError::Invalid)?,
        )
    }

    fn destroy_qp(&self, ctx: &Context, qpn: Qpn) -> Result<(), CreateError> {
        ctx.forget_qp(qpn);
        ctx.call_on(ctx.lane_of(qpn), |reply| Control::DestroyQp { qpn, reply })?
            .map_err(CreateError::Verbs)
    }

    fn create_srq(&self, ctx: &Context, pd: Pd, max_wr: u32, max_sge: u32) -> SrqMade {
        let (slots, entry) = srq_shape(max_wr, max_sge);
        let seg = Arc::new(ctx.segment("burst-srq", ShmRing::<RecvWr>::bytes_sized(slots, entry))?);
        let id = ctx
            .call(|reply| Control::CreateSrq {
                pd,
                max_wr,
                max_sge,
                reply,
            })?
            .map_err(CreateError::Verbs)?;
        Ok((
            id,
            ShmRing::create_sized(seg, 0, slots, entry).map_err(|_| PostError::Invalid)?,
        ))
    }

    fn execute(
        &self,
        ctx: &Context,
        lane: usize,
        c: Control,
        done: &dyn Fn() -> bool,
    ) -> Result<(), PostError> {
        ctx.control
            .get(lane)
            .ok_or(PostError::NoSuch)?
            .send(c)
            .map_err(|_| PostError::Stopped)?;
        let sh = &*ctx.shared;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if done() {
                return Ok(());
            }
            if sh.stop.load(Ordering::Acquire) || std::time::Instant::now() > deadline {
                return Err(PostError::Stopped);
            }
            // Whoever holds the core runs the request at its next step;
            // with the core free, this thread runs it (and only it: a
            // control call moves no packets).
            // Waits for the core (a futex, not a spin) if a thread steps it.
            let mut core = sh.cores[lane].lock().unwrap_or_else(|e| e.into_inner());
            core.contained(sh, |c| c.run_control(sh));
        }
    }

    fn create_ah(
        &self,
        ctx: &Context,
        gid: [u8; 16],
        sgid_index: Option<u8>,
    ) -> Result<u32, PostError> {
        ctx.create_ah_here(gid, sgid_index)
    }

    fn destroy_ah(&self, ctx: &Context, ah: u32) -> Result<(), PostError> {
        ctx.release_ah(ah, false)
    }

    fn check_ah(&self, ctx: &Context, attr: &QpAttr) -> Result<(), VerbsError> {
        let Some(ah) = attr.ah else {
            return Ok(());
        };
        let t = ctx.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
        match t.by_index.get(&ah) {
            Some(k) if k.0 == ctx.owner => Ok(()),
            _ => Err(VerbsError::InvalidValue("ah")),
        }
    }

    fn gather_inline(
        &self,
        ctx: &Context,
        pd: u32,
        wr: &mut SendWr,
        len: u64,
    ) -> Result<(), PostError> {
        // Through the one local-access check: the SGEs' lkeys must be of
        // the QP's PD.
        let mut d =
            burst_transport::InlineData::zeroed(len as usize).map_err(PostError::Refused)?;
        let mem = ctx.shared.mrs.memory();
        burst_transport::Memory::read_local(&mem, pd, &wr.sg_list, 0, &mut d)
            .map_err(|_| PostError::Invalid)?;
        wr.inline_data = Some(d);
        Ok(())
    }

    fn progress(&self, ctx: &Context) -> bool {
        ctx.step(Round::Full)
    }

    fn settle(&self, ctx: &Context) {
        ctx.settle_lanes();
    }

    fn gone(&self) -> bool {
        false
    }

    fn client_id(&self) -> Option<u32> {
        None
    }

    fn request(
        &self,
        _: &crate::protocol::Request,
        _: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(crate::protocol::Reply, Vec<std::os::fd::OwnedFd>), PostError> {
        Err(PostError::Invalid)
    }
}
