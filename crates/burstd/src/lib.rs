//! # burstd: burst's Verbs service as a daemon
//!
//! One process owns the device (its port, engine threads, QPN space and
//! memory-region table) and serves any number of applications on one IP
//! address and UDP port 4791, as RXE does in the kernel:
//!
//! - **control path**: a Unix `SOCK_SEQPACKET` socket
//!   ([`burst_verbs::protocol`]), one thread per client, credentials from
//!   `SO_PEERCRED`; the socket file's owner, group and mode decide who may
//!   use RDMA;
//! - **data path**: the engine's own rings, in memfds the client maps, and
//!   a doorbell queue per client the engine reads; an idle engine sleeps
//!   on pipes (one per client and lane) clients signal only when it sleeps;
//! - **memory**: registered pages moved onto a memfd by the client library
//!   and mapped here (zero copy), or reached through the client's own
//!   `/proc/self/mem` descriptor (never by pid);
//! - **limits**: what each user's clients may hold ([`limits`]), bounded
//!   connections per user, rate-limited logs of bad input; the daemon
//!   keeps only the capabilities its open port uses ([`privilege`]);
//! - **isolation**: every handle and key a client names is checked against
//!   what it created (the engine's per-client [`burst_verbs::engine::Context`]);
//! - **cleanup**: a client that exits or dies (its socket hangs up) has
//!   all its objects destroyed at once.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use burst_verbs::engine::{ClientLink, CompChannel, Context, CqId, CreateError, PostError};
use burst_verbs::protocol::{self as p, ClientInfo, DeviceInfo, Reply, Request};
use burst_verbs::shm::Segment;
use burst_verbs::{Access, AsyncEvent, Pd, Qpn, SrqId};

pub mod capture;
pub mod cm;
pub mod devfiles;
pub mod limits;
pub mod privilege;
pub mod settings;

pub use settings::Settings;

/// One connected application.
pub struct Client {
    pid: u32,
    uid: u32,
    comm: String,
    link: ClientLink,
    ctx: Context,
    /// Completion channels, by the handle given to the client.
    channels: Mutex<HashMap<u32, Arc<CompChannel>>>,
    next_channel: AtomicU32,
    /// Requests refused (bad input, limits): logged at the 1st, 2nd, 4th...
    refusals: std::sync::atomic::AtomicU64,
}

impl Client {
    /// The segment this client maps (its async-event ring, then its
    /// doorbells; where they sit: [`Client::layout`]). What the client
    /// writes there is input the engine must survive: the `segments`
    /// fuzz target scribbles on it.
    pub fn segment(&self) -> &Segment {
        self.link.segment()
    }

    /// Where things sit in [`Client::segment`].
    pub fn layout(&self) -> burst_verbs::engine::ClientLayout {
        self.link.layout
    }

    /// Logs a refusal of this client's input or request, rate-limited (a
    /// line at the 1st, 2nd, 4th, 8th... refusal: a client flooding bad
    /// requests costs a log line per doubling) and counted.
    fn refused(&self, what: &str, why: &str) {
        let n = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                client = self.ctx.owner(),
                pid = self.pid,
                uid = self.uid,
                refusals = n,
                "{what} refused: {why}"
            );
        }
    }
}

/// The daemon's state shared by its threads.
pub struct Daemon {
    ctx: Context,
    /// The device's ports copy their packets here while `burst capture` runs.
    tap: Arc<burst_verbs::ports::Tap>,
    device: DeviceInfo,
    clients: Mutex<HashMap<u32, Arc<Client>>>,
    next_client: AtomicU32,
    /// QP1 shared by the clients' connection managers.
    router: Option<Arc<cm::Router>>,
    /// Set when `serve` returns: the router's thread ends.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// What each user's clients may hold together.
    limits: limits::Limits,
    /// The daemon's own budget across users.
    budget: limits::Limits,
    /// What each user holds (by uid), and all of them.
    usage: Mutex<(HashMap<u32, limits::Usage>, limits::Usage)>,
    /// Connections open per uid (before hello too).
    connections: Mutex<HashMap<u32, u32>>,
    /// Failures to accept or to start a client's thread (descriptors or
    /// threads ran out): logged at the 1st, 2nd, 4th...
    accept_failures: std::sync::atomic::AtomicU64,
    /// Connections refused at hello (logged at the 1st, 2nd, 4th...).
    hello_refusals: std::sync::atomic::AtomicU64,
}

/// One open connection of a user, given back when its thread ends.
struct ConnectionSlot {
    daemon: Arc<Daemon>,
    uid: u32,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self
            .daemon
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

/// What a reply carries besides its message.
pub type Answer = (Reply, Vec<OwnedFd>);

/// A system resource ran out serving one request (descriptors, memory,
/// mappings): that request is refused with the errno, the daemon goes on
/// (logged, rate-limited, with the client's other refusals).
fn resource_reply(e: std::io::Error, what: &str) -> Reply {
    let errno = match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => libc::EMFILE,
        Some(libc::ENOMEM) => libc::ENOMEM,
        Some(n) => n,
        None => libc::EIO,
    };
    Reply::error(errno, format!("{what}: {e}"))
}

fn dup_of(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

impl Daemon {
    /// A daemon serving `ctx`'s device (an engine started with
    /// `shared_rings`).
    pub fn new(ctx: Context, tap: Arc<burst_verbs::ports::Tap>) -> Arc<Daemon> {
        Daemon::with_limits(ctx, tap, limits::Limits::default())
    }

    /// [`Daemon::new`] with per-client `limits`.
    pub fn with_limits(
        ctx: Context,
        tap: Arc<burst_verbs::ports::Tap>,
        limits: limits::Limits,
    ) -> Arc<Daemon> {
        let cfg = ctx.config();
        let device = DeviceInfo {
            name: cfg.name.clone(),
            addr: cfg.addr,
            gid: ctx.gid(),
            mtu: cfg.mtu.bytes() as u32,
            interface: cfg.interface.clone(),
            lanes: cfg.threads.max(1),
            port: format!("{:?}", cfg.port).to_lowercase(),
        };
        let router = cm::Router::new(&ctx).unwrap_or_else(|e| {
            tracing::warn!("no connection management (QP1 router): {e}");
            None
        });
        Arc::new(Daemon {
            ctx,
            tap,
            device,
            clients: Mutex::default(),
            next_client: AtomicU32::new(1),
            router,
            stopping: Arc::default(),
            limits,
            budget: limits::daemon_budget(),
            usage: Mutex::default(),
            connections: Mutex::default(),
            accept_failures: Default::default(),
            hello_refusals: Default::default(),
        })
    }

    /// Accepts clients on `listener` until it fails or `stop` becomes
    /// readable (the signal handler's pipe); one thread per client, and one
    /// that routes asynchronous events to their owners.
    pub fn serve(
        self: &Arc<Daemon>,
        listener: OwnedFd,
        stop: BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("burstd-events".into())
            .spawn(move || me.route_events())?;
        if let Some(r) = &self.router {
            let (r, stop) = (Arc::clone(r), Arc::clone(&self.stopping));
            std::thread::Builder::new()
                .name("burstd-cm".into())
                .spawn(move || r.run(&stop))?;
        }
        let r = self.accept_loop(&listener, stop);
        self.stopping.store(true, Ordering::Release);
        r
    }

    fn accept_loop(
        self: &Arc<Daemon>,
        listener: &OwnedFd,
        stop: BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two live pollfds, and their count.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                return Ok(());
            }
            if fds[0].revents == 0 {
                continue;
            }
            // Running out of descriptors, memory or threads refuses one
            // client, never stops the daemon.
            let sock = match p::accept(listener.as_fd()) {
                Ok(s) => s,
                Err(e) => {
                    self.accept_failed("accept", &e);
                    // The connection stays queued: wait for a descriptor
                    // to come free instead of spinning on it.
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            let Some(slot) = self.connection_slot(&sock) else {
                continue;
            };
            let me = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("burstd-client".into())
                .spawn(move || {
                    let _slot = slot;
                    me.serve_client(sock)
                });
            if let Err(e) = spawned {
                self.accept_failed("client thread", &e);
            }
        }
    }

    fn accept_failed(&self, what: &str, e: &std::io::Error) {
        let n = self.accept_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                failures = n,
                "{what}: {e}: the client is refused, burstd goes on"
            );
        }
    }

    /// Counts a new connection against its user's limit; `None` (and the
    /// connection refused with EAGAIN) past it.
    fn connection_slot(self: &Arc<Daemon>, sock: &OwnedFd) -> Option<ConnectionSlot> {
        let uid = p::peer_credentials(sock.as_fd()).map(|c| c.1).ok()?;
        let mut open = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(uid).or_default();
        if *n >= self.limits.connections_per_uid {
            drop(open);
            let why = format!(
                "limit connections_per_uid = {} reached for uid {uid}",
                self.limits.connections_per_uid
            );
            self.accept_failed("connection", &std::io::Error::other(why.clone()));
            // Non-blocking: a client that does not read is not waited for.
            let _ = p::send_nowait(sock.as_fd(), &p::encode(&Reply::error(libc::EAGAIN, why)));
            return None;
        }
        *n += 1;
        Some(ConnectionSlot {
            daemon: Arc::clone(self),
            uid,
        })
    }

    /// Asynchronous events go to the client owning the QP, SRQ or CQ; a
    /// device fault and port changes to every client.
    fn route_events(&self) {
        loop {
            let Some(ev) = self.ctx.read_async_event() else {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            };
            let owner = match ev {
                AsyncEvent::Qp(q, _) => self.ctx.owner_of_qp(q),
                AsyncEvent::SrqLimitReached(s) => self.ctx.owner_of_srq(s),
                AsyncEvent::CqError(cq) => self.ctx.owner_of_cq(cq),
                AsyncEvent::DeviceFatal | AsyncEvent::Port { .. } => None,
            };
            // Signalled outside the lock (never write a client's
            // descriptor under one; the writes never block anyway).
            let to: Vec<Arc<Client>> = self
                .clients
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|(id, _)| owner.is_none_or(|o| o == **id))
                .map(|(_, c)| Arc::clone(c))
                .collect();
            for c in to {
                c.link.push_event(ev);
            }
        }
    }

    /// Runs one client's session, then destroys what it left behind.
    pub fn serve_client(&self, sock: OwnedFd) {
        let (pid, uid, _) = match p::peer_credentials(sock.as_fd()) {
            Ok(c) => c,
            Err(e) => {
                self.accept_failed("credentials", &e);
                return;
            }
        };
        // A client must say hello promptly: one that connects and stays
        // silent does not hold a thread for ever.
        set_recv_timeout(&sock, Some(std::time::Duration::from_secs(5)));
        let client = match self.hello(&sock, pid, uid) {
            Ok(c) => c,
            Err(e) => {
                // Rate-limited: a loop of bad hellos is not a log flood.
                let n = self.hello_refusals.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(pid, refusals = n, "client refused at hello: {e}");
                }
                let _ = p::send(
                    sock.as_fd(),
                    &p::encode(&Reply::error(libc::EPROTO, e)),
                    &[],
                );
                return;
            }
        };
        set_recv_timeout(&sock, None);
        let id = client.ctx.owner();
        tracing::info!(client = id, pid, uid, comm = %client.comm, "client connected");
        loop {
            let (msg, fds) = match p::recv(sock.as_fd()) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    let r = Reply::error(libc::EMSGSIZE, e.to_string());
                    if p::send(sock.as_fd(), &p::encode(&r), &[]).is_err() {
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            };
            let (reply, out) = self.handle_message(&client, &msg, fds);
            let out: Vec<BorrowedFd<'_>> = out.iter().map(|f| f.as_fd()).collect();
            if p::send(sock.as_fd(), &p::encode(&reply), &out).is_err() {
                break;
            }
        }
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(r) = &self.router {
            r.detach(id);
        }
        let gone = client.ctx.destroy_owned();
        {
            let mut u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mine) = u.0.get_mut(&uid) {
                mine.forget(id);
                if mine.is_empty() {
                    u.0.remove(&uid);
                }
            }
            u.1.forget(id);
        }
        tracing::info!(
            client = id,
            pid,
            qps = gone.qps.len(),
            mrs = gone.mrs.len(),
            cqs = gone.cqs.len(),
            pds = gone.pds.len(),
            "client gone; its objects destroyed"
        );
    }

    /// The first message: versions agree; the client's segment, the wake
    /// segment, the read end of its async-event pipe and its wake pipes'
    /// write ends go out (every descriptor the daemon signals or waits on
    /// is the daemon's own end of a pipe).
    fn hello(&self, sock: &OwnedFd, pid: u32, uid: u32) -> Result<Arc<Client>, String> {
        let (msg, _) = p::recv(sock.as_fd())
            .map_err(|e| e.to_string())?
            .ok_or("closed before hello")?;
        let req = p::decode::<Request>(&msg).map_err(|e| e.to_string())?;
        let Request::Hello { version, layout } = req else {
            return Err("the first message must be Hello".into());
        };
        if version != p::VERSION || layout != p::layout() {
            return Err(format!(
                "client speaks version {version} layout {layout:#x}, burstd {} layout {:#x}: \
                 use the same burst build for both",
                p::VERSION,
                p::layout()
            ));
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let (client, handout) = self.new_client(pid, uid, comm).map_err(|e| e.to_string())?;
        let l = client.link.layout;
        let wake_seg = self.ctx.wake_segment();
        let mut out: Vec<BorrowedFd<'_>> = vec![
            client
                .link
                .segment()
                .fd()
                .ok_or("client segment without memfd")?,
            wake_seg.fd().ok_or("wake segment without memfd")?,
        ];
        out.extend(handout.iter().map(|f| f.as_fd()));
        let reply = Reply::Hello {
            device: self.device.clone(),
            client: client.ctx.owner(),
            event_slots: l.event_slots,
            bells_offset: l.bells_offset,
            bells_stride: l.bells_stride,
            bells_depth: l.bells_depth,
            segment_len: l.len,
            wake_len: wake_seg.len() as u64,
        };
        if let Err(e) = p::send(sock.as_fd(), &p::encode(&reply), &out) {
            // Its doorbells were already being read: stop that.
            client.ctx.destroy_owned();
            return Err(e.to_string());
        }
        self.admit(&client);
        Ok(client)
    }

    /// A new client's number, engine handle and shared segment.
    fn new_client(
        &self,
        pid: u32,
        uid: u32,
        comm: String,
    ) -> std::io::Result<(Arc<Client>, Vec<OwnedFd>)> {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let ctx = self.ctx.for_client(id);
        let (link, handout) = ctx.attach_client()?;
        let c = Arc::new(Client {
            pid,
            uid,
            comm,
            link,
            ctx,
            channels: Mutex::default(),
            next_channel: AtomicU32::new(1),
            refusals: Default::default(),
        });
        Ok((c, handout))
    }

    /// Lists a client (events reach it, the tool shows it).
    fn admit(&self, c: &Arc<Client>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(c.ctx.owner(), Arc::clone(c));
    }

    /// Decodes and runs one message of client `c`, as the socket loop
    /// does: a malformed message gets an error reply.
    pub fn handle_message(&self, c: &Client, msg: &[u8], fds: Vec<OwnedFd>) -> Answer {
        match p::decode::<Request>(msg) {
            Ok(req) => {
                tracing::debug!(client = c.ctx.owner(), ?req, "request");
                self.handle(c, req, fds)
            }
            Err(e) => {
                c.refused("message", &e.to_string());
                (Reply::error(libc::EINVAL, e.to_string()), Vec::new())
            }
        }
    }

    /// A client that is this process, without a socket (the fuzz target
    /// and tests drive [`Daemon::handle_message`] with it).
    pub fn local_client(&self) -> std::io::Result<Arc<Client>> {
        let (c, _) = self.new_client(std::process::id(), 0, "local".into())?;
        self.admit(&c);
        Ok(c)
    }

    /// One request of a client, within its limits: what it creates is
    /// counted against them first, what it destroys given back after.
    fn handle(&self, c: &Client, req: Request, fds: Vec<OwnedFd>) -> Answer {
        let charge = charge_of(&req, fds.len());
        if let Some((kind, cost)) = charge {
            let admitted = {
                let mut u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
                let mine =
                    u.0.entry(c.uid)
                        .or_default()
                        .admit(&self.limits, kind, cost);
                mine.and_then(|()| {
                    u.1.admit(&self.budget, kind, cost).map_err(|mut r| {
                        r.message = format!("burstd's own budget: {}", r.message);
                        r
                    })
                })
            };
            if let Err(r) = admitted {
                c.refused(kind.name(), &r.message);
                return (Reply::error(r.errno, r.message), Vec::new());
            }
        }
        let release = release_of(&req);
        let replaced = match &req {
            Request::ReplaceMr { old, new } => Some((u64::from(*new), u64::from(*old))),
            _ => None,
        };
        let listen = match &req {
            Request::CmListen {
                service_id,
                listen: true,
            } => Some(*service_id),
            _ => None,
        };
        let (reply, out) = self.dispatch(c, req, fds);
        let id = c.ctx.owner();
        let created = match (&reply, charge) {
            (Reply::Error { errno, message, .. }, _) => {
                if *errno != libc::EBUSY {
                    c.refused("request", message);
                }
                None
            }
            (Reply::Done, Some((kind, cost))) => listen.map(|sid| (kind, sid, cost)),
            (r, Some((kind, cost))) => created_handle(r).map(|h| (kind, h, cost)),
            _ => None,
        };
        let mut u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((kind, h, cost)) = created {
            u.0.entry(c.uid).or_default().add(id, kind, h, cost);
            u.1.add(id, kind, h, cost);
        } else if let (Reply::Done, Some((kind, h))) = (&reply, release) {
            u.0.entry(c.uid).or_default().remove(id, kind, h);
            u.1.remove(id, kind, h);
        }
        if let (Reply::Mr { .. }, Some((from, to))) = (&reply, replaced) {
            u.0.entry(c.uid)
                .or_default()
                .rename(id, limits::Kind::Mr, from, to);
            u.1.rename(id, limits::Kind::Mr, from, to);
        }
        drop(u);
        (reply, out)
    }

    /// Runs one request.
    fn dispatch(&self, c: &Client, req: Request, fds: Vec<OwnedFd>) -> Answer {
        match req {
            r @ (Request::AllocMw { .. }
            | Request::AllocPd
            | Request::DeallocMw { .. }
            | Request::DeallocPd { .. }
            | Request::DeregMr { .. }
            | Request::ReplaceMr { .. }
            | Request::RegMr { .. }
            | Request::RegMrCopy { .. }) => self.memory(c, r, fds),
            r @ (Request::CreateCompChannel
            | Request::CreateCq { .. }
            | Request::DestroyCompChannel { .. }
            | Request::DestroyCq { .. }) => self.completion(c, r, fds),
            r @ (Request::CreateAh { .. }
            | Request::CreateQp { .. }
            | Request::CreateSrq { .. }
            | Request::DestroyAh { .. }
            | Request::DestroyQp { .. }
            | Request::DestroySrq { .. }
            | Request::ModifyQp { .. }
            | Request::ModifySrq { .. }
            | Request::Multicast { .. }
            | Request::QueryQp { .. }) => self.queues(c, r, fds),
            r => self.device(c, r, fds),
        }
    }

    /// Requests for pDs, memory regions and windows.
    fn memory(&self, c: &Client, req: Request, fds: Vec<OwnedFd>) -> Answer {
        let ctx = &c.ctx;
        let none = Vec::new();
        let mut fds = fds.into_iter();
        let r = match req {
            Request::AllocPd => match ctx.try_alloc_pd() {
                Ok(pd) => Reply::Pd { pd: pd.0 },
                Err(e) => Reply::failed(e, "alloc_pd"),
            },
            Request::DeallocPd { pd } => match ctx.dealloc_pd(Pd(pd)) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "dealloc_pd"),
            },
            Request::RegMr {
                pd,
                offset,
                len,
                iova,
                access,
                pieces,
            } => {
                let fds: Vec<OwnedFd> = fds.by_ref().collect();
                if fds.len() != pieces.len() {
                    return (
                        Reply::error(libc::EINVAL, "reg_mr: one memfd per run of pages"),
                        none,
                    );
                }
                let pieces = fds
                    .into_iter()
                    .zip(pieces)
                    .map(|(fd, (off, l))| (fd, off, l))
                    .collect();
                self.reg_mapped(ctx, pieces, pd, offset, len, iova, access)
            }
            Request::RegMrCopy {
                pd,
                addr,
                len,
                iova,
                access,
            } => {
                let Some(mem) = fds.next() else {
                    return (
                        Reply::error(
                            libc::EINVAL,
                            "reg_mr: a single-copy registration comes with the client's /proc/self/mem",
                        ),
                        none,
                    );
                };
                if let Err(why) = privilege::check_self_mem(&mem) {
                    return (Reply::error(libc::EINVAL, format!("reg_mr: {why}")), none);
                }
                let mem = Arc::new(mem);
                match ctx.reg_mr_foreign(Pd(pd), mem, addr, len as usize, iova, Access(access)) {
                    Ok(keys) => Reply::Mr { keys },
                    Err(e) => Reply::failed(e, "reg_mr"),
                }
            }
            Request::ReplaceMr { old, new } => match ctx.replace_mr(old, new) {
                Ok(keys) => Reply::Mr { keys },
                Err(e) => Reply::failed(e, "rereg_mr"),
            },
            Request::DeregMr { lkey } => match ctx.dereg_mr(lkey) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "dereg_mr"),
            },
            Request::AllocMw { pd, kind } => match ctx.alloc_mw(Pd(pd), kind) {
                Ok(keys) => Reply::Mw { keys },
                Err(e) => Reply::failed(e, "alloc_mw"),
            },
            Request::DeallocMw { handle } => match ctx.dealloc_mw(handle) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "dealloc_mw"),
            },
            other => Reply::error(
                libc::EINVAL,
                format!("not a {} request: {other:?}", "memory"),
            ),
        };
        (r, none)
    }

    /// Requests for completion channels and CQs.
    fn completion(&self, c: &Client, req: Request, _: Vec<OwnedFd>) -> Answer {
        let ctx = &c.ctx;
        let none = Vec::new();
        let r = match req {
            Request::CreateCompChannel => {
                let (ch, reader) = match ctx.comp_channel_for_client() {
                    Ok(c) => c,
                    Err(e) => return (resource_reply(e, "create_comp_channel"), none),
                };
                let id = c.next_channel.fetch_add(1, Ordering::Relaxed);
                c.channels
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id, ch);
                return (Reply::Channel { id }, vec![reader]);
            }
            Request::DestroyCompChannel { id } => {
                let mut chans = c.channels.lock().unwrap_or_else(|e| e.into_inner());
                match chans.get(&id) {
                    None => Reply::error(libc::EINVAL, "no such channel"),
                    // A CQ still reports to it.
                    Some(ch) if Arc::strong_count(ch) > 1 => {
                        Reply::error(libc::EBUSY, "destroy_comp_channel: CQs still use it")
                    }
                    Some(_) => {
                        chans.remove(&id);
                        Reply::Done
                    }
                }
            }
            Request::CreateCq { depth, channel } => {
                let ch = match channel {
                    None => None,
                    Some(id) => {
                        match c
                            .channels
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(&id)
                        {
                            Some(ch) => Some(Arc::clone(ch)),
                            None => return (Reply::error(libc::EINVAL, "no such channel"), none),
                        }
                    }
                };
                match ctx
                    .try_create_cq(depth as usize, ch)
                    .and_then(|cq| Ok((cq, ctx.cq_segment(cq)?)))
                {
                    Ok((cq, (seg, slots))) => {
                        return segment_answer(
                            Reply::Cq {
                                cq: cq.0,
                                slots: slots as u32,
                                len: seg.len() as u64,
                            },
                            &seg,
                        )
                    }
                    Err(e) => Reply::failed(e, "create_cq"),
                }
            }
            Request::DestroyCq { cq } => match ctx.destroy_cq(CqId(cq)) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "destroy_cq"),
            },
            other => Reply::error(
                libc::EINVAL,
                format!("not a {} request: {other:?}", "completion"),
            ),
        };
        (r, none)
    }

    /// Requests for qPs, SRQs and address handles.
    fn queues(&self, c: &Client, req: Request, _: Vec<OwnedFd>) -> Answer {
        let ctx = &c.ctx;
        let none = Vec::new();
        let r = match req {
            Request::CreateQp {
                init,
                send_cq,
                recv_cq,
            } => match ctx.create_qp_with(&init, CqId(send_cq), CqId(recv_cq)) {
                Ok(qp) => match ctx.qp_segment(qp.qpn()) {
                    Ok((seg, _, _, lane)) => {
                        return segment_answer(
                            Reply::Qp {
                                qpn: qp.qpn().value(),
                                cfg: *qp.config(),
                                lane: lane as u32,
                                len: seg.len() as u64,
                            },
                            &seg,
                        )
                    }
                    Err(e) => Reply::failed(e, "create_qp"),
                },
                Err(e) => Reply::failed(e, "create_qp"),
            },
            Request::DestroyQp { qpn } => match qpn_of(qpn).and_then(|q| ctx.destroy_qp(q)) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "destroy_qp"),
            },
            Request::ModifyQp { qpn, attr } => match qpn_of(qpn) {
                Ok(q) => match ctx.modify_qp(q, &attr) {
                    Ok(Ok(())) => Reply::Done,
                    Ok(Err(v)) => Reply::failed(CreateError::Verbs(v), "modify_qp"),
                    Err(e) => Reply::failed(e, "modify_qp"),
                },
                Err(e) => Reply::failed(e, "modify_qp"),
            },
            Request::Multicast { qpn, mgid, attach } => match qpn_of(qpn) {
                Ok(q) => match ctx.multicast(q, mgid, attach) {
                    Ok(Ok(())) => Reply::Done,
                    Ok(Err(v)) => Reply::failed(CreateError::Verbs(v), "multicast"),
                    Err(e) => Reply::failed(e, "multicast"),
                },
                Err(e) => Reply::failed(e, "multicast"),
            },
            Request::QueryQp { qpn } => match qpn_of(qpn) {
                Ok(q) => match ctx.query_qp(q) {
                    Ok((state, cfg)) => Reply::QpState { state, cfg },
                    Err(e) => Reply::failed(e, "query_qp"),
                },
                Err(e) => Reply::failed(e, "query_qp"),
            },
            Request::CreateSrq {
                pd,
                max_wr,
                max_sge,
            } => match ctx.create_srq(Pd(pd), max_wr, max_sge) {
                Ok(srq) => match ctx.srq_segment(srq.id()) {
                    Ok((seg, _)) => {
                        return segment_answer(
                            Reply::Srq {
                                srq: srq.id().0,
                                len: seg.len() as u64,
                            },
                            &seg,
                        )
                    }
                    Err(e) => Reply::failed(e, "create_srq"),
                },
                Err(e) => Reply::failed(e, "create_srq"),
            },
            Request::DestroySrq { srq } => match ctx.destroy_srq(SrqId(srq)) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "destroy_srq"),
            },
            Request::ModifySrq { srq, max_wr, limit } => {
                match ctx.modify_srq(SrqId(srq), max_wr, limit) {
                    Ok(()) => Reply::Done,
                    Err(e) => Reply::failed(e, "modify_srq"),
                }
            }
            Request::CreateAh { gid, sgid_index } => match ctx.create_ah_from(gid, sgid_index) {
                Ok(ah) => Reply::Ah { ah },
                Err(PostError::Refused(v)) => Reply::failed(CreateError::Verbs(v), "create_ah"),
                Err(e) => Reply::failed(e, "create_ah"),
            },
            Request::DestroyAh { ah } => match ctx.destroy_ah(ah) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::failed(e, "destroy_ah"),
            },
            other => Reply::error(
                libc::EINVAL,
                format!("not a {} request: {other:?}", "queues"),
            ),
        };
        (r, none)
    }

    /// Requests for the device, the daemon's own requests and connection management.
    fn device(&self, c: &Client, req: Request, fds: Vec<OwnedFd>) -> Answer {
        let ctx = &c.ctx;
        let none = Vec::new();
        let mut fds = fds.into_iter();
        let r = match req {
            Request::Hello { .. } => Reply::error(libc::EPROTO, "hello twice"),
            Request::Gids => match ctx.gid_table() {
                Ok(t) => Reply::Gids(t),
                Err(e) => Reply::failed(e, "query_gid"),
            },
            Request::Counters => match self.ctx.counters() {
                Ok(cn) => Reply::Counters(Box::new(cn)),
                Err(e) => Reply::failed(e, "counters"),
            },
            Request::Settle => {
                self.ctx.settle_lanes();
                Reply::Done
            }
            Request::Clients => Reply::Clients(self.clients_for(c.uid)),
            Request::QpCounters { qpn } => self.qp_counters(c, qpn),
            Request::CmAttach => {
                let (Some(r), Some(fd)) = (&self.router, fds.next()) else {
                    return (
                        Reply::error(libc::EINVAL, "CM attach without a socket, or no QP1"),
                        none,
                    );
                };
                r.attach(ctx.owner(), fd);
                Reply::Done
            }
            Request::CmListen {
                service_id,
                listen: true,
            } if c.uid != 0 && privileged_service(service_id) => Reply::error(
                libc::EACCES,
                format!(
                    "service {service_id:#x}: a port under 1024 is root's, as the kernel's \
                     rdma_cm reserves it for CAP_NET_BIND_SERVICE"
                ),
            ),
            Request::CmListen { service_id, listen } => match &self.router {
                Some(r) if r.listen(ctx.owner(), service_id, listen) => Reply::Done,
                Some(_) => Reply::error(
                    libc::EADDRINUSE,
                    format!("service {service_id:#x}: another application listens on it"),
                ),
                None => Reply::error(libc::ENOSYS, "no QP1 on this device"),
            },
            Request::Capture { packets } => {
                // Everything on the wire, whoever's QP it is: root only.
                if c.uid != 0 {
                    return (
                        Reply::error(libc::EPERM, "capturing the device's traffic needs root"),
                        none,
                    );
                }
                let Some(fd) = fds.next() else {
                    return (
                        Reply::error(libc::EINVAL, "capture without a descriptor"),
                        none,
                    );
                };
                match capture::start(Arc::clone(&self.tap), fd, packets) {
                    Ok(()) => Reply::Done,
                    Err(e) => Reply::error(libc::EIO, format!("capture: {e}")),
                }
            }
            other => Reply::error(libc::EINVAL, format!("not a device request: {other:?}")),
        };
        (r, none)
    }

    #[allow(clippy::too_many_arguments)]
    fn reg_mapped(
        &self,
        ctx: &Context,
        pieces: Vec<(OwnedFd, u64, u64)>,
        pd: u32,
        offset: u64,
        len: u64,
        iova: u64,
        access: u32,
    ) -> Reply {
        let pages = match Segment::from_pieces(pieces) {
            Ok(s) => Arc::new(s),
            Err(e) => return Reply::error(libc::EINVAL, format!("reg_mr: {e}")),
        };
        if offset
            .checked_add(len)
            .is_none_or(|e| e > pages.len() as u64)
        {
            return Reply::error(libc::EINVAL, "reg_mr: the range is not inside its pages");
        }
        match ctx.reg_mr_mapped(
            Pd(pd),
            pages,
            offset as usize,
            len as usize,
            iova,
            Access(access),
        ) {
            Ok(keys) => Reply::Mr { keys },
            Err(e) => Reply::failed(e, "reg_mr"),
        }
    }

    /// A QP's counters: the asking client's own QP, or (root) anyone's.
    fn qp_counters(&self, c: &Client, qpn: u32) -> Reply {
        let Some(q) = Qpn::new(qpn) else {
            return Reply::error(libc::EINVAL, "no such QP");
        };
        let owner = match self.ctx.owner_of_qp(q) {
            Some(o) if o == c.ctx.owner() || c.uid == 0 => o,
            _ => return Reply::error(libc::EINVAL, "no such QP"),
        };
        match self.ctx.for_client(owner).qp_counters(q) {
            Ok(cn) => Reply::QpCounters(Box::new(cn)),
            Err(e) => Reply::failed(e, "qp counters"),
        }
    }

    /// The clients a user may see: all of them for root, else its own.
    fn clients_for(&self, uid: u32) -> Vec<ClientInfo> {
        let clients: Vec<(u32, Arc<Client>)> = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, c)| (*id, Arc::clone(c)))
            .collect();
        // A snapshot of each user's usage: the lock is not held across the
        // engine calls below (another client's requests would wait on them).
        let usage: HashMap<u32, Vec<(String, u64, u64)>> = self
            .usage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .iter()
            .map(|(uid, u)| (*uid, u.report(&self.limits)))
            .collect();
        let mut v: Vec<ClientInfo> = clients
            .iter()
            .filter(|(_, c)| uid == 0 || c.uid == uid)
            .map(|(id, c)| {
                let o = c.ctx.owned();
                ClientInfo {
                    id: *id,
                    pid: c.pid,
                    uid: c.uid,
                    comm: c.comm.clone(),
                    pds: o.pds,
                    mrs: o.mrs,
                    cqs: o.cqs.iter().map(|q| q.0).collect(),
                    qps: o
                        .qps
                        .iter()
                        .map(|q| {
                            let state = c
                                .ctx
                                .query_qp(*q)
                                .map_or("?".into(), |(s, _)| format!("{s:?}").to_uppercase());
                            (q.value(), state)
                        })
                        .collect(),
                    srqs: o.srqs.iter().map(|s| s.0).collect(),
                    usage: usage.get(&c.uid).cloned().unwrap_or_default(),
                    refused: c.refusals.load(Ordering::Relaxed),
                }
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Clients connected now.
    pub fn client_count(&self) -> usize {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Waits until one of `fds` is ready or `timeout` passes.
pub(crate) fn poll_all(fds: &mut [libc::pollfd], timeout: std::time::Duration) {
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: a live slice of pollfds and its length.
    let _ = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

/// `SO_RCVTIMEO` (`None`: block).
fn set_recv_timeout(sock: &OwnedFd, t: Option<std::time::Duration>) {
    use std::os::fd::AsRawFd;
    let t = t.unwrap_or_default();
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt with a live timeval of the stated size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

/// An rdma_cm service ID of a port under 1024 (the kernel's rdma_cm
/// refuses to bind those without CAP_NET_BIND_SERVICE: EACCES).
fn privileged_service(service_id: u64) -> bool {
    burst_cm::rdma::PortSpace::from_service_id(service_id).is_some_and(|(_, port)| port < 1024)
}

/// What a request creates and costs, to check against the limits.
fn charge_of(req: &Request, fds: usize) -> Option<(limits::Kind, limits::Cost)> {
    use limits::{Cost, Kind};
    Some(match req {
        Request::AllocPd => (Kind::Pd, Cost::none()),
        Request::RegMr { len, .. } => (Kind::Mr, Cost::mr(*len, fds as u64)),
        Request::RegMrCopy { len, .. } => (Kind::Mr, Cost::mr(*len, 0)),
        Request::AllocMw { .. } => (Kind::Mw, Cost::none()),
        Request::CreateCompChannel => (Kind::Channel, Cost::none()),
        Request::CreateCq { depth, .. } => (Kind::Cq, Cost::cq(u64::from(*depth))),
        Request::CreateQp { init, .. } => {
            let recv = if init.srq.is_some() {
                0
            } else {
                init.caps.max_recv_wr
            };
            (
                Kind::Qp,
                Cost::wqes(u64::from(init.caps.max_send_wr) + u64::from(recv)),
            )
        }
        Request::CreateSrq { max_wr, .. } => (Kind::Srq, Cost::wqes(u64::from(*max_wr))),
        Request::CreateAh { .. } => (Kind::Ah, Cost::none()),
        Request::CmListen { listen: true, .. } => (Kind::Listen, Cost::none()),
        _ => return None,
    })
}

/// What a request destroys (given back once it succeeded).
fn release_of(req: &Request) -> Option<(limits::Kind, u64)> {
    use limits::Kind;
    Some(match req {
        Request::DeallocPd { pd } => (Kind::Pd, u64::from(*pd)),
        Request::DeregMr { lkey } => (Kind::Mr, u64::from(*lkey)),
        Request::DeallocMw { handle } => (Kind::Mw, u64::from(*handle)),
        Request::DestroyCq { cq } => (Kind::Cq, u64::from(*cq)),
        Request::DestroyQp { qpn } => (Kind::Qp, u64::from(*qpn)),
        Request::DestroySrq { srq } => (Kind::Srq, u64::from(*srq)),
        Request::DestroyAh { ah } => (Kind::Ah, u64::from(*ah)),
        Request::DestroyCompChannel { id } => (Kind::Channel, u64::from(*id)),
        Request::CmListen {
            service_id,
            listen: false,
        } => (Kind::Listen, *service_id),
        _ => return None,
    })
}

/// The handle a successful create replied with.
fn created_handle(r: &Reply) -> Option<u64> {
    Some(u64::from(match r {
        Reply::Pd { pd } => *pd,
        Reply::Mr { keys } => keys.lkey,
        Reply::Mw { keys } => keys.handle,
        Reply::Channel { id } => *id,
        Reply::Cq { cq, .. } => *cq,
        Reply::Qp { qpn, .. } => *qpn,
        Reply::Srq { srq, .. } => *srq,
        Reply::Ah { ah } => *ah,
        _ => return None,
    }))
}

fn qpn_of(v: u32) -> Result<Qpn, CreateError> {
    Qpn::new(v).ok_or(CreateError::Post(PostError::NoSuch))
}

/// A reply with a segment's memfd.
fn segment_answer(r: Reply, seg: &Segment) -> Answer {
    match seg.fd().map(dup_of) {
        Some(Ok(fd)) => (r, vec![fd]),
        _ => (
            Reply::error(libc::EIO, "segment without a memfd"),
            Vec::new(),
        ),
    }
}

/// Creates the socket at `path` with `mode` and, if given, `group`.
pub fn listen(path: &Path, mode: u32, group: Option<&str>) -> std::io::Result<OwnedFd> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let fd = p::listen(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(g) = group {
        let gid = group_id(g).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("no group named {g}"))
        })?;
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    Ok(fd)
}

/// The gid of group `name` (from /etc/group).
fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
    })
}

/// Where burstd listens unless told otherwise.
pub fn default_socket() -> PathBuf {
    PathBuf::from("/run/burst/burstd.sock")
}

#[cfg(test)]
mod tests {
    use burst_cm::rdma::PortSpace;

    #[test]
    fn rdma_cm_ports_under_1024_are_roots() {
        assert!(super::privileged_service(PortSpace::Tcp.service_id(80)));
        assert!(super::privileged_service(PortSpace::Udp.service_id(1023)));
        assert!(!super::privileged_service(PortSpace::Tcp.service_id(1024)));
        assert!(!super::privileged_service(PortSpace::Tcp.service_id(18515)));
        // Not an rdma_cm service ID (an IB CM application's own): no port.
        assert!(!super::privileged_service(0x1234));
    }
}
