//! The application's side of daemon mode: a [`Remote`] holds the control
//! socket to burstd; [`crate::engine::Context::connect`] builds a context
//! whose rings, doorbells and CQs are memory shared with the daemon, so
//! posting and polling never cross the socket.
//!
//! Registered memory: at `ibv_reg_mr` the pages of the range move onto a
//! memfd mapped at the same virtual addresses (the contents copied first,
//! then the memfd mapped over the range with `MAP_FIXED`), and the daemon
//! maps the same memfd: zero copies from then on, no kernel module. Where
//! that is impossible (file-backed or hugetlb mappings, the stack, a range
//! that straddles an earlier registration's pages) or disabled
//! (`BURST_MR=copy`), the daemon reaches the memory through a descriptor
//! of this process's `/proc/self/mem` sent with the registration (one copy
//! per access; the descriptor names this address space, never a pid).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use burst_mem::{MrKeys, MwKeys, MwType, Pd, RegError};
use burst_transport::{QpAttr, SendWr, VerbsError};
use burst_wire::Qpn;

use crate::engine::{
    srq_shape, CompChannel, Context, Control, ControlPlane, CqId, CreateError, PostError, QpMade,
    QpRings, QpShape, Registration, SrqMade,
};
use crate::protocol::{self, Failure, Reply, Request};
use crate::shm::{Segment, ShmRing};
use crate::{QpInit, SrqId};

mod connect;
mod pages;

use pages::remap;

/// How registrations reach the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrMode {
    /// Pages remapped onto a memfd the daemon maps (zero copy).
    Remap,
    /// Copied by the daemon through this process's `/proc/self/mem` (one copy).
    Copy,
}

impl MrMode {
    /// `BURST_MR=copy` forces the single-copy path.
    pub fn from_env() -> MrMode {
        match std::env::var("BURST_MR").as_deref() {
            Ok("copy") => MrMode::Copy,
            _ => MrMode::Remap,
        }
    }
}

/// The control socket to burstd and what the client keeps about it.
#[derive(Debug)]
pub struct Remote {
    sock: OwnedFd,
    /// One request at a time on the socket.
    lock: Mutex<()>,
    /// burstd is gone: every verb fails.
    dead: AtomicBool,
    /// The client's number at the daemon.
    client: u32,
    mode: MrMode,
    /// This process's `/proc/self/mem`, opened once: what a single-copy
    /// registration hands burstd (it names this address space only).
    self_mem: std::sync::OnceLock<Option<OwnedFd>>,
}

/// Opens `/proc/self/mem` for reading and writing.
fn open_self_mem() -> Option<OwnedFd> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
    {
        Ok(f) => Some(f.into()),
        Err(e) => {
            tracing::warn!("burst: cannot open /proc/self/mem for single-copy registration: {e}");
            None
        }
    }
}

impl Remote {
    pub(crate) fn new(sock: OwnedFd, client: u32, mode: MrMode) -> Remote {
        Remote {
            sock,
            lock: Mutex::new(()),
            dead: AtomicBool::new(false),
            client,
            mode,
            self_mem: std::sync::OnceLock::new(),
        }
    }

    /// The control socket (the watcher polls it for the daemon's death).
    pub(crate) fn socket(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Marks the daemon gone.
    pub(crate) fn set_dead(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// burstd's number for this client (what the `burst` tool lists).
    pub fn client(&self) -> u32 {
        self.client
    }

    /// Whether burstd is gone.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// One request and its reply.
    pub(crate) fn call(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), PostError> {
        if self.is_dead() {
            return Err(PostError::Stopped);
        }
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let gone = |e: std::io::Error| {
            tracing::error!("burstd: control socket failed: {e}");
            self.set_dead();
            PostError::Stopped
        };
        protocol::send(self.sock.as_fd(), &protocol::encode(req), fds).map_err(gone)?;
        let Some((msg, fds)) = protocol::recv(self.sock.as_fd()).map_err(gone)? else {
            tracing::error!("burstd closed the control socket");
            self.set_dead();
            return Err(PostError::Stopped);
        };
        let reply = protocol::decode::<Reply>(&msg).map_err(|e| {
            tracing::error!("burstd: bad reply: {e}");
            PostError::Invalid
        })?;
        Ok((reply, fds))
    }

    /// One request; its reply, or the typed error burstd answered with.
    fn ask(&self, req: &Request) -> Result<(Reply, Vec<OwnedFd>), protocol::Failure> {
        self.ask_with(req, &[])
    }

    /// [`Remote::ask`] with descriptors.
    fn ask_with(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), protocol::Failure> {
        match self.call(req, fds) {
            Ok((
                Reply::Error {
                    message, failure, ..
                },
                _,
            )) => {
                tracing::debug!("burstd refused {req:?}: {message}");
                Err(failure)
            }
            Ok(ok) => Ok(ok),
            Err(e) => Err(e.into()),
        }
    }

    /// A request answered by `Done`.
    fn done(&self, req: &Request) -> Result<(), protocol::Failure> {
        match self.ask(req)?.0 {
            Reply::Done => Ok(()),
            _ => Err(protocol::Failure::Invalid),
        }
    }

    /// The request of a registration of `ptr..ptr+len`: its pages moved
    /// onto memfds (zero copy), or this process's `/proc/self/mem` to
    /// reach them through (single copy).
    fn registration(
        &self,
        r: &Registration,
    ) -> Result<(Request, Option<Vec<pages::Piece>>), RegError> {
        let Registration {
            pd,
            ptr,
            len,
            iova,
            access,
        } = *r;
        if len == 0 {
            return Err(RegError::InvalidLength);
        }
        // As in embedded mode (and on RXE): a range this process cannot
        // use is refused here, and the daemon's copies take no page fault.
        burst_mem::populate(ptr, len, access)?;
        let addr = ptr as usize;
        let remapped = if self.mode == MrMode::Remap {
            match remap(addr, len) {
                Ok(a) => Some(a),
                Err(why) => {
                    tracing::info!(
                        "burst: {len} bytes at {addr:#x} stay where they are ({why}); \
                         burstd copies through this process's /proc/self/mem"
                    );
                    None
                }
            }
        } else {
            None
        };
        let req = match &remapped {
            Some((start, pieces)) => Request::RegMr {
                pd: pd.0,
                offset: (addr - start) as u64,
                len: len as u64,
                iova,
                access: access.0,
                pieces: pieces.iter().map(|p| (p.fd_offset, p.len)).collect(),
            },
            None => Request::RegMrCopy {
                pd: pd.0,
                addr: addr as u64,
                len: len as u64,
                iova,
                access: access.0,
            },
        };
        Ok((req, remapped.map(|(_, pieces)| pieces)))
    }

    /// Runs a lane's control request at the daemon and answers it on its
    /// channel.
    fn run(&self, c: Control) -> Result<(), protocol::Failure> {
        use protocol::Failure;
        let verdict = |req: &Request| match self.ask(req) {
            Ok((Reply::Done, _)) => Ok(Ok(())),
            Ok(_) => Err(Failure::Invalid),
            Err(Failure::Verbs(v) | Failure::Refused(v)) => Ok(Err(v.into_verbs())),
            Err(f) => Err(f),
        };
        match c {
            Control::DestroySrq { srq, reply } => {
                let _ = reply.send(verdict(&Request::DestroySrq { srq: srq.0 })?);
            }
            Control::ModifySrq {
                srq,
                max_wr,
                limit,
                reply,
            } => {
                let _ = reply.send(verdict(&Request::ModifySrq {
                    srq: srq.0,
                    max_wr,
                    limit,
                })?);
            }
            Control::ModifyQp { qpn, attr, reply } => {
                let _ = reply.send(verdict(&Request::ModifyQp {
                    qpn: qpn.value(),
                    attr,
                })?);
            }
            Control::ModifyQpSteps { qpn, attrs, reply } => {
                // burstd takes them one by one.
                let mut r = Ok(());
                for (i, attr) in attrs.into_iter().enumerate() {
                    if let Err(e) = verdict(&Request::ModifyQp {
                        qpn: qpn.value(),
                        attr,
                    })? {
                        r = Err((i, e));
                        break;
                    }
                }
                let _ = reply.send(r);
            }
            Control::Multicast {
                qpn,
                mgid,
                attach,
                reply,
            } => {
                let _ = reply.send(verdict(&Request::Multicast {
                    qpn: qpn.value(),
                    mgid,
                    attach,
                })?);
            }
            Control::QueryQp { qpn, reply } => {
                let r = match self.ask(&Request::QueryQp { qpn: qpn.value() }) {
                    Ok((Reply::QpState { state, cfg }, _)) => Some((state, cfg)),
                    Err(Failure::Stopped) => return Err(Failure::Stopped),
                    _ => None,
                };
                let _ = reply.send(r);
            }
            Control::Gids { reply } => match self.ask(&Request::Gids)?.0 {
                Reply::Gids(t) => {
                    let _ = reply.send(t.into_iter().map(|g| g.map(crate::ip_of_gid)).collect());
                }
                _ => return Err(Failure::Invalid),
            },
            Control::QpCounters { qpn, reply } => {
                match self.ask(&Request::QpCounters { qpn: qpn.value() })?.0 {
                    Reply::QpCounters(c) => {
                        let _ = reply.send(Some(*c));
                    }
                    _ => return Err(Failure::Invalid),
                }
            }
            Control::Counters { reply } => match self.ask(&Request::Counters)?.0 {
                Reply::Counters(c) => {
                    let _ = reply.send(*c);
                }
                _ => return Err(Failure::Invalid),
            },
            // Created and destroyed through the plane's own methods (they
            // return segments; burstd numbers and owns AHs); the congestion
            // report and fault injection stay in the daemon.
            Control::CreateQp { .. }
            | Control::DestroyQp { .. }
            | Control::CreateAh { .. }
            | Control::DestroyAh { .. }
            | Control::CreateSrq { .. }
            | Control::Congestion { .. }
            | Control::DebugPanicFor { .. } => return Err(Failure::Invalid),
        }
        Ok(())
    }
}

impl ControlPlane for Remote {
    fn alloc_pd(&self, _: &Context) -> Result<Pd, PostError> {
        match self.ask(&Request::AllocPd).map_err(Failure::post)?.0 {
            Reply::Pd { pd } => Ok(Pd(pd)),
            _ => Err(PostError::Invalid),
        }
    }

    fn dealloc_pd(&self, _: &Context, pd: Pd) -> Result<(), PostError> {
        self.done(&Request::DeallocPd { pd: pd.0 })
            .map_err(Failure::post)
    }

    unsafe fn reg_mr(&self, _: &Context, r: &Registration) -> Result<MrKeys, RegError> {
        let (req, pieces) = self.registration(r)?;
        let fds: Vec<BorrowedFd<'_>> = match &pieces {
            Some(pieces) => pieces.iter().map(|p| p.fd.as_fd()).collect(),
            None => match self.self_mem.get_or_init(open_self_mem) {
                Some(fd) => vec![fd.as_fd()],
                None => return Err(RegError::Exhausted),
            },
        };
        match self.ask_with(&req, &fds).map_err(Failure::reg)?.0 {
            Reply::Mr { keys } => Ok(keys),
            _ => Err(RegError::Exhausted),
        }
    }

    fn dereg_mr(&self, _: &Context, lkey: u32) -> Result<(), RegError> {
        self.done(&Request::DeregMr { lkey }).map_err(Failure::reg)
    }

    fn replace_mr(&self, _: &Context, old: u32, new: u32) -> Result<MrKeys, RegError> {
        match self
            .ask(&Request::ReplaceMr { old, new })
            .map_err(Failure::reg)?
            .0
        {
            Reply::Mr { keys } => Ok(keys),
            _ => Err(RegError::Exhausted),
        }
    }

    fn alloc_mw(&self, _: &Context, pd: Pd, kind: MwType) -> Result<MwKeys, RegError> {
        match self
            .ask(&Request::AllocMw { pd: pd.0, kind })
            .map_err(Failure::reg)?
            .0
        {
            Reply::Mw { keys } => Ok(keys),
            _ => Err(RegError::Exhausted),
        }
    }

    fn dealloc_mw(&self, _: &Context, handle: u32) -> Result<(), RegError> {
        self.done(&Request::DeallocMw { handle })
            .map_err(Failure::reg)
    }

    fn create_comp_channel(&self, _: &Context) -> std::io::Result<Arc<CompChannel>> {
        // burstd signals a pipe whose write end it keeps.
        match self.ask(&Request::CreateCompChannel).map_err(Failure::io)? {
            (Reply::Channel { id }, fds) => {
                let fd = fds
                    .into_iter()
                    .next()
                    .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EIO))?;
                let ch = CompChannel::with_fd(crate::eventfd::EventFd::pipe_reader(fd));
                ch.set_remote_id(id);
                Ok(Arc::new(ch))
            }
            _ => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        }
    }

    fn destroy_comp_channel(&self, _: &Context, ch: &CompChannel) -> Result<(), PostError> {
        self.done(&Request::DestroyCompChannel { id: ch.remote_id() })
            .map_err(Failure::post)
    }

    fn cq_memory(
        &self,
        _: &Context,
        depth: usize,
        _: usize,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<(Option<CqId>, Arc<Segment>), PostError> {
        let req = Request::CreateCq {
            depth: depth.min(u32::MAX as usize) as u32,
            channel: channel.map(|c| c.remote_id()),
        };
        match self.ask(&req).map_err(Failure::post)? {
            (Reply::Cq { cq, len, .. }, fds) => Ok((Some(CqId(cq)), map_one(fds, len)?)),
            _ => Err(PostError::Invalid),
        }
    }

    fn destroy_cq(&self, _: &Context, cq: CqId) -> Result<(), PostError> {
        self.done(&Request::DestroyCq { cq: cq.0 })
            .map_err(Failure::post)
    }

    fn create_qp(&self, _: &Context, init: &QpInit, cqs: (CqId, CqId)) -> QpMade {
        let shape = QpShape::of(init);
        let req = Request::CreateQp {
            init: *init,
            send_cq: cqs.0 .0,
            recv_cq: cqs.1 .0,
        };
        match self.ask(&req).map_err(Failure::create)? {
            (
                Reply::Qp {
                    qpn,
                    cfg,
                    lane,
                    len,
                },
                fds,
            ) => {
                let qpn = Qpn::new(qpn).ok_or(PostError::Invalid)?;
                let seg = map_one(fds, len)?;
                Ok(
                    QpRings::new(seg, shape, false, qpn, lane as usize, cfg, cqs, 0)
                        .map_err(|_| PostError::Invalid)?,
                )
            }
            _ => Err(PostError::Invalid.into()),
        }
    }

    fn destroy_qp(&self, ctx: &Context, qpn: Qpn) -> Result<(), CreateError> {
        self.done(&Request::DestroyQp { qpn: qpn.value() })
            .map_err(Failure::create)?;
        ctx.forget_qp(qpn);
        Ok(())
    }

    fn create_srq(&self, _: &Context, pd: Pd, max_wr: u32, max_sge: u32) -> SrqMade {
        let (slots, entry) = srq_shape(max_wr, max_sge);
        let req = Request::CreateSrq {
            pd: pd.0,
            max_wr,
            max_sge,
        };
        match self.ask(&req).map_err(Failure::create)? {
            (Reply::Srq { srq, len }, fds) => {
                let ring = ShmRing::attach_sized(map_one(fds, len)?, 0, slots, entry)
                    .map_err(|_| PostError::Invalid)?;
                Ok((SrqId(srq), ring))
            }
            _ => Err(PostError::Invalid.into()),
        }
    }

    fn execute(
        &self,
        _: &Context,
        _: usize,
        c: Control,
        _: &dyn Fn() -> bool,
    ) -> Result<(), PostError> {
        // The daemon runs it: the request crosses the control socket, and
        // its reply is in when `run` returns.
        self.run(c).map_err(Failure::post)
    }

    fn create_ah(
        &self,
        _: &Context,
        gid: [u8; 16],
        sgid_index: Option<u8>,
    ) -> Result<u32, PostError> {
        // burstd numbers and owns it.
        match self.ask(&Request::CreateAh { gid, sgid_index }) {
            Ok((Reply::Ah { ah }, _)) => Ok(ah),
            Ok(_) => Err(PostError::Invalid),
            Err(f) => Err(f.post()),
        }
    }

    fn destroy_ah(&self, _: &Context, ah: u32) -> Result<(), PostError> {
        self.done(&Request::DestroyAh { ah }).map_err(Failure::post)
    }

    fn check_ah(&self, _: &Context, _: &QpAttr) -> Result<(), VerbsError> {
        // burstd checks the AH's owner when the modify reaches it.
        Ok(())
    }

    fn gather_inline(
        &self,
        _: &Context,
        _: u32,
        wr: &mut SendWr,
        len: u64,
    ) -> Result<(), PostError> {
        debug_assert_eq!(wr.sg_list.total_len(), len);
        // SAFETY: the application passed these SGEs to ibv_post_send with
        // IBV_SEND_INLINE: readable now (rdma-core's providers memcpy them
        // the same way).
        let d = unsafe { crate::gather_inline(&wr.sg_list) }.map_err(PostError::Refused)?;
        wr.inline_data = Some(d);
        Ok(())
    }

    fn progress(&self, ctx: &Context) -> bool {
        // A daemon client has no core to step: the daemon's engine thread
        // does the work, and stays awake while this client polls (counted
        // in the wake segment). Polling an empty CQ hands the CPU over
        // instead of spinning against that thread (on a machine with fewer
        // cores than spinning threads, a 64-byte send_lat went from 2 ms to
        // microseconds).
        ctx.client_polled();
        std::thread::yield_now();
        false
    }

    fn settle(&self, _ctx: &Context) {
        // The daemon steps its lanes before it answers: what this client
        // posted before is taken (a failed call leaves the CQ as it is).
        let _ = self.call(&Request::Settle, &[]);
    }

    fn gone(&self) -> bool {
        self.is_dead()
    }

    fn client_id(&self) -> Option<u32> {
        Some(self.client)
    }

    fn request(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), PostError> {
        self.call(req, fds)
    }
}

/// Maps the one segment a reply carries.
fn map_one(fds: Vec<OwnedFd>, len: u64) -> Result<Arc<Segment>, PostError> {
    let fd = fds.into_iter().next().ok_or(PostError::Invalid)?;
    Segment::map_fd(fd, len as usize)
        .map(Arc::new)
        .map_err(|e| {
            tracing::error!("burst: cannot map a segment from burstd: {e}");
            PostError::Invalid
        })
}
