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
//! (`BURST_MR=copy`), the daemon reaches the memory with
//! `process_vm_readv`/`process_vm_writev` (one copy per access).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use burst_mem::{Access, MrKeys, Pd, RegError};
use burst_transport::{QpConfig, VerbsError};
use burst_wire::Qpn;

use crate::engine::{CompChannel, Control, CqId, PostError};
use crate::protocol::{self, Reply, Request};
use crate::shm::Segment;
use crate::{QpInit, SrqId};

/// Pages of the application moved onto a memfd (shared with the daemon).
#[derive(Debug)]
struct Area {
    start: usize,
    end: usize,
    memfd: OwnedFd,
}

/// How registrations reach the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrMode {
    /// Pages remapped onto a memfd the daemon maps (zero copy).
    Remap,
    /// `process_vm_readv`/`writev` by the daemon (one copy).
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
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
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

    /// [`Remote::call`], an error reply turned into a `PostError`.
    fn call_ok(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), PostError> {
        match self.call(req, fds)? {
            (Reply::Error { errno, message, .. }, _) => {
                tracing::debug!("burstd refused {req:?}: {message}");
                Err(match errno {
                    libc::EBUSY => PostError::Busy,
                    libc::ENOMEM => PostError::Full,
                    libc::EIO => PostError::Stopped,
                    _ => PostError::NoSuch,
                })
            }
            ok => Ok(ok),
        }
    }

    /// A reply of the transport's verdict (`ibv_modify_qp`, destroys).
    fn verdict(&self, req: &Request) -> Result<Result<(), VerbsError>, PostError> {
        match self.call(req, &[])?.0 {
            Reply::Done => Ok(Ok(())),
            Reply::Error { verbs: Some(v), .. } => Ok(Err(v.into_verbs())),
            Reply::Error { errno, .. } if errno == libc::EBUSY => Err(PostError::Busy),
            Reply::Error { errno, .. } if errno == libc::EIO => Err(PostError::Stopped),
            _ => Err(PostError::NoSuch),
        }
    }

    pub(crate) fn alloc_pd(&self) -> Result<Pd, PostError> {
        match self.call_ok(&Request::AllocPd, &[])?.0 {
            Reply::Pd { pd } => Ok(Pd(pd)),
            _ => Err(PostError::Invalid),
        }
    }

    pub(crate) fn dealloc_pd(&self, pd: Pd) -> Result<(), PostError> {
        self.call_ok(&Request::DeallocPd { pd: pd.0 }, &[])
            .map(|_| ())
    }

    pub(crate) fn reg_mr(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        if len == 0 {
            return Err(RegError::InvalidLength);
        }
        let addr = ptr as usize;
        let remapped = if self.mode == MrMode::Remap {
            match remap(addr, len) {
                Ok(a) => Some(a),
                Err(why) => {
                    tracing::info!(
                        "burst: {len} bytes at {addr:#x} stay where they are ({why}); \
                         burstd copies through process_vm_readv/writev"
                    );
                    None
                }
            }
        } else {
            None
        };
        let (req, fd) = match &remapped {
            Some((start, fd)) => (
                Request::RegMr {
                    pd: pd.0,
                    offset: (addr - start) as u64,
                    len: len as u64,
                    iova,
                    access: access.0,
                },
                Some(fd),
            ),
            None => (
                Request::RegMrCopy {
                    pd: pd.0,
                    addr: addr as u64,
                    len: len as u64,
                    iova,
                    access: access.0,
                },
                None,
            ),
        };
        let fds: Vec<BorrowedFd<'_>> = fd.iter().map(|f| f.as_fd()).collect();
        match self.call(&req, &fds) {
            Ok((Reply::Mr { keys }, _)) => Ok(keys),
            Ok((Reply::Error { errno, message, .. }, _)) => {
                tracing::debug!("burstd refused the registration: {message}");
                Err(match errno {
                    libc::ENOMEM => RegError::Exhausted,
                    _ if message.contains("protection domain") => RegError::NoSuchPd,
                    _ if message.contains("local write") => RegError::InvalidAccess,
                    _ => RegError::InvalidLength,
                })
            }
            _ => Err(RegError::Exhausted),
        }
    }

    pub(crate) fn dereg_mr(&self, lkey: u32) -> Result<(), RegError> {
        self.call_ok(&Request::DeregMr { lkey }, &[])
            .map(|_| ())
            .map_err(|_| RegError::NoSuchRegion)
    }

    pub(crate) fn register_channel(&self, ch: &CompChannel) -> std::io::Result<()> {
        let fd = ch.borrowed_fd();
        match self.call_ok(&Request::CreateCompChannel, &[fd]) {
            Ok((Reply::Channel { id }, _)) => {
                ch.set_remote_id(id);
                Ok(())
            }
            _ => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        }
    }

    pub(crate) fn create_cq(
        &self,
        depth: usize,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<(Option<CqId>, Arc<Segment>), PostError> {
        let req = Request::CreateCq {
            depth: depth.min(u32::MAX as usize) as u32,
            channel: channel.map(|c| c.remote_id()),
        };
        match self.call_ok(&req, &[])? {
            (Reply::Cq { cq, len, .. }, fds) => Ok((Some(CqId(cq)), map_one(fds, len)?)),
            _ => Err(PostError::Invalid),
        }
    }

    pub(crate) fn destroy_cq(&self, cq: CqId) -> Result<(), PostError> {
        self.call_ok(&Request::DestroyCq { cq: cq.0 }, &[])
            .map(|_| ())
    }

    pub(crate) fn create_qp(
        &self,
        init: &QpInit,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<(Qpn, QpConfig, usize, Arc<Segment>), crate::engine::CreateError> {
        let req = Request::CreateQp {
            init: *init,
            send_cq: send_cq.0,
            recv_cq: recv_cq.0,
        };
        match self.call(&req, &[])? {
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
                Ok((qpn, cfg, lane as usize, map_one(fds, len)?))
            }
            (Reply::Error { verbs: Some(v), .. }, _) => {
                Err(crate::engine::CreateError::Verbs(v.into_verbs()))
            }
            (Reply::Error { errno, .. }, _) if errno == libc::ENOMEM => Err(PostError::Full.into()),
            _ => Err(PostError::NoSuch.into()),
        }
    }

    pub(crate) fn destroy_qp(&self, qpn: Qpn) -> Result<(), crate::engine::CreateError> {
        self.verdict(&Request::DestroyQp { qpn: qpn.value() })?
            .map_err(crate::engine::CreateError::Verbs)
    }

    pub(crate) fn create_srq(
        &self,
        pd: Pd,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<(SrqId, Arc<Segment>), crate::engine::CreateError> {
        let req = Request::CreateSrq {
            pd: pd.0,
            max_wr,
            max_sge,
        };
        match self.call(&req, &[])? {
            (Reply::Srq { srq, len }, fds) => Ok((SrqId(srq), map_one(fds, len)?)),
            (Reply::Error { verbs: Some(v), .. }, _) => {
                Err(crate::engine::CreateError::Verbs(v.into_verbs()))
            }
            _ => Err(PostError::NoSuch.into()),
        }
    }

    /// Runs a control request at the daemon and answers it on its channel.
    pub(crate) fn execute(&self, c: Control) -> Result<(), PostError> {
        match c {
            Control::DestroyQp { qpn, reply } => {
                let _ = reply.send(self.verdict(&Request::DestroyQp { qpn: qpn.value() })?);
            }
            Control::DestroySrq { srq, reply } => {
                let _ = reply.send(self.verdict(&Request::DestroySrq { srq: srq.0 })?);
            }
            Control::ModifySrq {
                srq,
                max_wr,
                limit,
                reply,
            } => {
                let _ = reply.send(self.verdict(&Request::ModifySrq {
                    srq: srq.0,
                    max_wr,
                    limit,
                })?);
            }
            Control::ModifyQp { qpn, attr, reply } => {
                let _ = reply.send(self.verdict(&Request::ModifyQp {
                    qpn: qpn.value(),
                    attr,
                })?);
            }
            Control::QueryQp { qpn, reply } => {
                let r = match self.call(&Request::QueryQp { qpn: qpn.value() }, &[])?.0 {
                    Reply::QpState { state, cfg } => Some((state, cfg)),
                    _ => None,
                };
                let _ = reply.send(r);
            }
            Control::CreateAh { gid, reply } => {
                match self.call_ok(&Request::CreateAh { gid }, &[])?.0 {
                    Reply::Ah { ah } => {
                        let _ = reply.send(ah);
                    }
                    _ => return Err(PostError::Invalid),
                }
            }
            Control::QpCounters { qpn, reply } => {
                match self
                    .call_ok(&Request::QpCounters { qpn: qpn.value() }, &[])?
                    .0
                {
                    Reply::QpCounters(c) => {
                        let _ = reply.send(Some(*c));
                    }
                    _ => return Err(PostError::Invalid),
                }
            }
            Control::Counters { reply } => match self.call_ok(&Request::Counters, &[])?.0 {
                Reply::Counters(c) => {
                    let _ = reply.send(*c);
                }
                _ => return Err(PostError::Invalid),
            },
            // Created through their own requests (they return segments);
            // the congestion report and fault injection stay in the daemon.
            Control::CreateQp { .. }
            | Control::CreateSrq { .. }
            | Control::Congestion { .. }
            | Control::DebugPanicFor { .. } => return Err(PostError::Invalid),
        }
        Ok(())
    }
}

/// Maps the one segment a reply carries.
fn map_one(fds: Vec<OwnedFd>, len: u64) -> Result<Arc<Segment>, PostError> {
    let fd = fds.into_iter().next().ok_or(PostError::Invalid)?;
    Segment::from_fd(fd, len as usize)
        .map(Arc::new)
        .map_err(|e| {
            tracing::error!("burst: cannot map a segment from burstd: {e}");
            PostError::Invalid
        })
}

/// Areas of this process moved onto memfds, for every context (a second
/// registration of the same pages must reuse the memfd: moving them again
/// would leave the first registration on pages the application no longer
/// sees).
static AREAS: Mutex<Vec<Area>> = Mutex::new(Vec::new());

/// Moves the pages of `addr..addr+len` onto a memfd (or finds the memfd
/// they are already on); returns the start of the memfd's pages and a
/// duplicate of the memfd for the daemon.
fn remap(addr: usize, len: usize) -> Result<(usize, OwnedFd), String> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or("range wraps")?
        & !(page - 1);
    let mut areas = AREAS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = areas.iter().find(|a| a.start <= start && end <= a.end) {
        let fd = a.memfd.try_clone().map_err(|e| e.to_string())?;
        return Ok((a.start, fd));
    }
    if areas.iter().any(|a| a.start < end && start < a.end) {
        return Err("the range straddles the pages of an earlier registration".into());
    }
    check_private_anonymous(start, end)?;
    let size = end - start;
    let memfd = crate::shm::memfd_create("burst-mr").map_err(|e| e.to_string())?;
    // SAFETY: ftruncate on our fresh memfd.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), size as libc::off_t) } < 0 {
        return Err(format!("ftruncate: {}", std::io::Error::last_os_error()));
    }
    // Map the memfd somewhere else first, copy the pages there, then move
    // the mapping over the range in one mremap: the range is never
    // unmapped, and writes other threads make to these pages between the
    // copy and the move are the only ones at risk (see the module docs).
    // SAFETY: a fresh shared mapping of our memfd, chosen by the kernel.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `start..end` is mapped readable (checked in /proc/self/maps)
    // and `tmp` is `size` fresh bytes.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, tmp.cast::<u8>(), size) };
    // SAFETY: moves our temporary mapping over `start..end`, which holds
    // private anonymous pages of the application that now live in the
    // memfd with the same contents.
    let moved = unsafe {
        libc::mremap(
            tmp,
            size,
            size,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: our temporary mapping, still where mmap put it.
        unsafe { libc::munmap(tmp, size) };
        return Err(format!("mremap: {e}"));
    }
    let fd = memfd.try_clone().map_err(|e| e.to_string())?;
    areas.push(Area { start, end, memfd });
    install_fork_handler();
    Ok((start, fd))
}

/// `Ok` when `start..end` lies in private, anonymous, writable mappings
/// (heap, `malloc`, anonymous `mmap`): the only memory that can move onto
/// a memfd without changing what the application sees.
fn check_private_anonymous(start: usize, end: usize) -> Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    let mut covered = start;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3).unwrap_or("");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= covered || a >= end {
            continue;
        }
        if a > covered {
            return Err("part of the range is not mapped".into());
        }
        if !perms.starts_with("rw") || !perms.ends_with('p') {
            return Err(format!("a {perms} mapping (shared or not writable)"));
        }
        if !(path.is_empty() || path == "[heap]") {
            return Err(format!("a mapping of {path}"));
        }
        covered = b;
        if covered >= end {
            return Ok(());
        }
    }
    Err("part of the range is not mapped".into())
}

/// After `fork`, the child's copy of moved pages would still be the
/// memfd, shared with the parent and the daemon; RDMA memory of a forked
/// parent is the parent's alone (rdma-core: the child gets a copy, or, with
/// `ibv_fork_init`, nothing). The child handler gives it private copies.
fn install_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn child() {
        // The child has one thread: no one holds AREAS unless the fork
        // interrupted a registration, which try_lock leaves alone.
        let Ok(mut areas) = AREAS.try_lock() else {
            return;
        };
        for a in areas.drain(..) {
            let size = a.end - a.start;
            // SAFETY: an anonymous scratch mapping of `size` bytes.
            let tmp = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if tmp == libc::MAP_FAILED {
                continue;
            }
            // SAFETY: copies the shared pages into the scratch mapping,
            // then moves the scratch pages over the range: the child's
            // pages become private with the contents they had at fork.
            unsafe {
                std::ptr::copy_nonoverlapping(a.start as *const u8, tmp.cast::<u8>(), size);
                libc::mremap(
                    tmp,
                    size,
                    size,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    a.start as *mut libc::c_void,
                );
            }
        }
    }
    ONCE.call_once(|| {
        // SAFETY: registers a child handler that only makes system calls
        // and copies memory.
        unsafe { libc::pthread_atfork(None, None, Some(child)) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_pages_move_onto_a_memfd_with_their_contents() {
        let page = page_size();
        let mut v = vec![0u8; 3 * page];
        for (i, b) in v.iter_mut().enumerate() {
            *b = i as u8;
        }
        // An unaligned range inside the vector: whole pages move.
        let addr = v.as_ptr() as usize + 100;
        let (start, fd) = remap(addr, page).unwrap();
        assert!(start <= addr);
        assert!(
            v.iter().enumerate().all(|(i, b)| *b == i as u8),
            "contents kept"
        );
        // The memfd shows the application's writes: the same pages.
        let seg = Segment::from_fd(fd, 2 * page).unwrap();
        v[100] = 0xab;
        // SAFETY: in bounds of the mapping (offset < 2 pages).
        let seen = unsafe { *seg.as_ptr().add(addr - start) };
        assert_eq!(seen, 0xab);
        // A second registration inside the same pages reuses the memfd.
        let (start2, _) = remap(addr + 8, 16).unwrap();
        assert_eq!(start2, start);
        // Keep `v` alive past the checks.
        assert_eq!(v[101], 101);
    }

    #[test]
    fn file_mappings_are_left_alone() {
        let f = tempfile_with(8192);
        // SAFETY: a private read-only mapping of our own temporary file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(remap(p as usize, 8192).is_err());
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 8192) };
    }

    fn tempfile_with(len: usize) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("burst-remap-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.set_len(len as u64).unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
