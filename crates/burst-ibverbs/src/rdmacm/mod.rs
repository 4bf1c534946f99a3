//! The drop-in `librdmacm.so.1`: rdma_cm's calls over burst-cm (the IB CM
//! on QP1 of burst's devices), with the semantics the real library and
//! the kernel's RDMA CM give applications (`design/ibverbs-abi.md` §5):
//! asynchronous address and route resolution, event channels with a
//! pollable descriptor, the QP moved through INIT, RTR and RTS for the
//! application, REQ/REP/RTU with the rdma_cm private-data header,
//! DREQ/DREP (answered at once), SIDR for `RDMA_PS_UDP`, synchronous ids
//! (`rdma_create_ep`, a NULL channel) and `rdma_getaddrinfo`.
//!
//! Not yet: multicast (`rdma_join_multicast` fails with ENOSYS), ECE,
//! rsockets, and daemon mode (the CM runs on the process's embedded
//! engine; with `BURST_DAEMON` set, binding and resolving fail with
//! ENOSYS and say why).

mod abi;
mod addr;
mod events;

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use burst_cm::rdma::{CmaHeader, PortSpace};
use burst_cm::{reason, ConnId};
use burst_cm::{CmSidrRep, CmSidrReq};
use burst_verbs::cm::CmService;
use burst_verbs::eventfd::EventFd;
use burst_verbs::{Psn, Qpn};

use self::abi::*;
use crate::abi::*;
use crate::{guard, set_errno};

/// `errno` and -1, the way librdmacm's int calls fail.
fn fail(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

// ------------------------------------------------------------- devices

/// The CM side of one device: the library's own context and default PD
/// (what `id->verbs` and `id->pd` point at) and its connection manager.
pub(crate) struct DevCm {
    index: usize,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    svc: CmService,
    gid: [u8; 16],
    /// The index of `gid` in the device's GID table: what the address
    /// vectors the CM hands out name as their source (as the kernel's CM
    /// finds the GID of the bound address).
    sgid_index: u8,
    /// Active MTU, as `enum ibv_mtu` (1 = 256 ... 5 = 4096).
    mtu: u8,
    max_rd_atomic: u8,
}

// SAFETY: the raw pointers are the library's own context and PD, which
// live for the process and are used through thread-safe entry points.
unsafe impl Send for DevCm {}
// SAFETY: as above.
unsafe impl Sync for DevCm {}

static DEVCMS: Mutex<Vec<Option<Arc<DevCm>>>> = Mutex::new(Vec::new());

/// The CM of device `index`, started on first use.
fn devcm(index: usize) -> Result<Arc<DevCm>, c_int> {
    let mut all = DEVCMS.lock().unwrap_or_else(|e| e.into_inner());
    if all.len() <= index {
        all.resize(index + 1, None);
    }
    if let Some(d) = &all[index] {
        return Ok(Arc::clone(d));
    }
    let devs = crate::device::devices();
    let Some(dev) = devs.get(index) else {
        return Err(libc::ENODEV);
    };
    // SAFETY: a device of our own list.
    let ctx = unsafe { crate::device::open_device(ptr::from_ref(&dev.raw).cast_mut()) };
    if ctx.is_null() {
        // SAFETY: reads the calling thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    // SAFETY: `ctx` was just opened by us.
    let c = unsafe { crate::objects::ctx_of(ctx) }.ok_or(libc::EIO)?;
    let svc = CmService::start(
        &c.ctx,
        Box::new(move |e| guard("burst CM event", (), || events::on_cm_event(index, e))),
    )
    .map_err(|e| {
        crate::log_line(&format!("burst: rdma_cm on {}: {e}", dev.cfg.name));
        e.raw_os_error().unwrap_or(libc::ENOSYS)
    })?;
    // SAFETY: `ctx` is ours and open.
    let pd = unsafe { crate::verbs::alloc_pd(ctx) };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    let attr = c.ctx.query_device();
    let d = Arc::new(DevCm {
        index,
        ctx,
        pd,
        svc,
        gid: c.ctx.gid(),
        sgid_index: c.ctx.sgid_index_for(c.ctx.gid()),
        mtu: c.ctx.query_port().active_mtu.ibv_mtu(),
        max_rd_atomic: attr.max_qp_rd_atom.min(255) as u8,
    });
    all[index] = Some(Arc::clone(&d));
    Ok(d)
}

// ------------------------------------------------------------ channels

/// An event channel: the C struct first; a descriptor readable while
/// events are queued (one count per event).
#[repr(C)]
pub(crate) struct Chan {
    raw: rdma_event_channel,
    efd: EventFd,
    q: Mutex<VecDeque<Box<Ev>>>,
    /// Threads inside `rdma_get_cm_event` (a channel destroyed under one
    /// is left allocated).
    waiters: AtomicU32,
}

/// An event: the C struct first, its private data, and the id it is for.
#[repr(C)]
pub(crate) struct Ev {
    raw: rdma_cm_event,
    data: [u8; 256],
    id: Arc<Id>,
}

fn new_chan() -> Result<*mut Chan, c_int> {
    let efd = EventFd::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&efd);
    let p = Box::into_raw(Box::new(Chan {
        raw: rdma_event_channel { fd },
        efd,
        q: Mutex::new(VecDeque::new()),
        waiters: AtomicU32::new(0),
    }));
    live_chans(|l| l.insert(p as usize));
    Ok(p)
}

/// Channels made and not destroyed (see [`LIVE`]).
static LIVE_CHANS: Mutex<Option<std::collections::HashSet<usize>>> = Mutex::new(None);

fn live_chans<R>(f: impl FnOnce(&mut std::collections::HashSet<usize>) -> R) -> R {
    let mut g = LIVE_CHANS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Default::default))
}

/// The channel behind an application's pointer, if it is a live one.
fn chan_of<'a>(p: *mut rdma_event_channel) -> Option<&'a Chan> {
    if p.is_null() || !live_chans(|l| l.contains(&(p as usize))) {
        return None;
    }
    // SAFETY: a live channel made by `new_chan` (the C struct first); it
    // is freed only by rdma_destroy_event_channel, and then only when no
    // thread waits in it (a caller racing its own destroy is its bug, as
    // with rdma-core).
    Some(unsafe { &*p.cast::<Chan>() })
}

// ------------------------------------------------------------------ ids

/// Where an id is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    /// REQ or SIDR_REQ sent.
    Connecting,
    /// Passive: the request is the application's to answer.
    RequestRcvd,
    /// Active: REP received, no QP (rping -q): `rdma_establish` is next.
    RepRcvd,
    /// Passive: REP sent, waiting for the RTU.
    Accepting,
    Established,
    Disconnected,
}

/// What the two sides agreed on for the QP.
#[derive(Debug, Clone, Copy, Default)]
struct Negotiated {
    remote_qpn: u32,
    /// The PSN in the peer's REQ/REP: where our sends start.
    remote_psn: u32,
    /// The PSN in our REQ/REP: where the peer's sends start.
    my_psn: u32,
    /// `enum ibv_mtu`.
    mtu: u8,
    /// Our QP's max_dest_rd_atomic.
    responder_resources: u8,
    /// Our QP's max_rd_atomic.
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    /// Local ACK timeout (4.096 us * 2^t): ours in the REQ, the REQ's on
    /// the passive side, as the kernel's CM does.
    ack_timeout: u8,
}

/// The ACK timeout the kernel's RDMA CM gives RoCE QPs (packet life time
/// 18, about 1 s): short enough to recover a loss, long enough for a slow
/// peer (RXE on an emulated CPU).
const DEFAULT_ACK_TIMEOUT: u8 = 18;

struct IdState {
    phase: Phase,
    ps: PortSpace,
    dev: Option<usize>,
    /// The device's GID index for its address ([`DevCm::sgid_index`]).
    sgid_index: u8,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    /// The port this id holds in its space (released on destroy).
    port_held: Option<u16>,
    conn: Option<ConnId>,
    peer: Option<IpAddr>,
    neg: Negotiated,
    /// The library made the CQs and channels (rdma_create_qp with none).
    own_cqs: bool,
    /// rdma_create_ep: the QP attributes and PD for rdma_get_request.
    ep_attr: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    /// rdma_create_ep: private data for rdma_connect (ai_connect).
    ep_connect: Vec<u8>,
    /// rdma_create_ep made the SRQ.
    own_srq: bool,
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`.
    ack_timeout: Option<u8>,
}

/// An rdma_cm id: the C struct first (the application's pointer is to
/// it); the application writes `context`, `qp` and the CQ fields itself.
#[repr(C)]
pub(crate) struct Id {
    raw: std::cell::UnsafeCell<rdma_cm_id>,
    path: std::cell::UnsafeCell<ibv_sa_path_rec>,
    st: Mutex<IdState>,
    /// Events handed to the application and not yet acked.
    unacked: AtomicU32,
    /// Created without a channel: every call waits for its event.
    sync: bool,
}

// SAFETY: the C struct is written by us under `st`'s lock or before the
// id is published, and by the application (its own fields); the Rust
// state is behind a mutex.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Id {
    fn raw(&self) -> *mut rdma_cm_id {
        self.raw.get()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The QP the application (or rdma_create_qp) attached.
    fn qp(&self) -> *mut ibv_qp {
        // SAFETY: a pointer-sized field of our live struct; the
        // application may write it from another thread (a stale read is
        // what the real library would see too).
        unsafe { ptr::read_volatile(&raw const (*self.raw()).qp) }
    }

    fn channel(&self) -> *mut rdma_event_channel {
        // SAFETY: as for `qp`.
        unsafe { ptr::read_volatile(&raw const (*self.raw()).channel) }
    }
}

/// The ids handed to the application and not destroyed: a pointer that is
/// not one of them (destroyed already, never made) is refused with EINVAL
/// instead of being dereferenced (perftest calls rdma_resolve_addr on an
/// id it destroyed after a rejected connection).
static LIVE: Mutex<Option<std::collections::HashSet<usize>>> = Mutex::new(None);

fn live<R>(f: impl FnOnce(&mut std::collections::HashSet<usize>) -> R) -> R {
    let mut g = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Default::default))
}

/// The id behind an application's pointer, with a reference of its own.
fn id_of(p: *mut rdma_cm_id) -> Option<Arc<Id>> {
    if p.is_null() {
        return None;
    }
    let p = p.cast::<Id>().cast_const();
    live(|l| {
        if !l.contains(&(p as usize)) {
            tracing::warn!("rdma_cm: {p:?} is not a live rdma_cm_id (destroyed?): EINVAL");
            return None;
        }
        // SAFETY: a live id (checked under the lock that destroy takes):
        // made by `new_id` with `Arc::into_raw`, and the application's
        // reference is still held, so adding one is sound.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    })
}

fn new_id(
    chan: *mut rdma_event_channel,
    context: *mut c_void,
    ps: PortSpace,
    qp_type: u32,
    sync: bool,
) -> Arc<Id> {
    // SAFETY: rdma_cm_id is plain data (pointers and integers).
    let mut raw: rdma_cm_id = unsafe { std::mem::zeroed() };
    raw.channel = chan;
    raw.context = context;
    raw.ps = ps.value();
    raw.qp_type = qp_type;
    raw.port_num = 1;
    raw.route.addr.ibaddr.pkey = 0xffff;
    let id = Arc::new(Id {
        raw: std::cell::UnsafeCell::new(raw),
        path: std::cell::UnsafeCell::new(ibv_sa_path_rec::default()),
        st: Mutex::new(IdState {
            phase: Phase::Idle,
            ps,
            dev: None,
            sgid_index: 0,
            src: None,
            dst: None,
            port_held: None,
            conn: None,
            peer: None,
            neg: Negotiated::default(),
            own_cqs: false,
            ep_attr: None,
            ep_connect: Vec::new(),
            own_srq: false,
            ack_timeout: None,
        }),
        unacked: AtomicU32::new(0),
        sync,
    });
    // SAFETY: the path record lives as long as the id.
    unsafe { (*id.raw()).route.path_rec = id.path.get() };
    id
}

/// Hands the application its reference to `id`.
fn publish(id: Arc<Id>) -> *mut rdma_cm_id {
    let p = Arc::into_raw(id);
    live(|l| l.insert(p as usize));
    p.cast::<rdma_cm_id>().cast_mut()
}

/// Takes back the application's reference (rdma_destroy_id); `false` if
/// it was not live.
fn unpublish(p: *mut rdma_cm_id) -> bool {
    let p = p.cast::<Id>().cast_const();
    live(|l| {
        if !l.remove(&(p as usize)) {
            return false;
        }
        // SAFETY: the application's reference, made by `publish`, given up
        // once (it was in the live set until just now).
        drop(unsafe { Arc::from_raw(p) });
        true
    })
}

// ------------------------------------------------------------- registry

/// Which id a connection, a listen or a port belongs to.
#[derive(Default)]
struct Registry {
    conns: HashMap<(usize, u32), Arc<Id>>,
    listeners: Vec<Arc<Id>>,
    /// (port space, port) held by an id.
    ports: std::collections::HashSet<(u32, u16)>,
}

static REG: Mutex<Option<Registry>> = Mutex::new(None);

fn with_reg<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REG.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Registry::default))
}

fn register_conn(dev: usize, conn: ConnId, id: &Arc<Id>) {
    with_reg(|r| r.conns.insert((dev, conn.0), Arc::clone(id)));
}

fn unregister_conn(dev: usize, conn: ConnId) {
    with_reg(|r| r.conns.remove(&(dev, conn.0)));
}

fn conn_id(dev: usize, conn: ConnId) -> Option<Arc<Id>> {
    with_reg(|r| r.conns.get(&(dev, conn.0)).cloned())
}

/// Takes `port` (0: an ephemeral one) in `ps`.
fn take_port(ps: PortSpace, port: u16) -> Result<u16, c_int> {
    with_reg(|r| {
        let key = |p| (ps.value(), p);
        if port != 0 {
            if !r.ports.insert(key(port)) {
                return Err(libc::EADDRINUSE);
            }
            return Ok(port);
        }
        // The kernel's default ephemeral range.
        let mut seed = [0u8; 2];
        let _ = getrandom::fill(&mut seed);
        let start = u16::from_ne_bytes(seed) % (60999 - 32768);
        for i in 0..(60999 - 32768) {
            let p = 32768 + (start + i) % (60999 - 32768);
            if r.ports.insert(key(p)) {
                return Ok(p);
            }
        }
        Err(libc::EADDRNOTAVAIL)
    })
}

fn release_port(ps: PortSpace, port: u16) {
    with_reg(|r| r.ports.remove(&(ps.value(), port)));
}

// --------------------------------------------------------------- events

/// Queues an event on `id`'s channel.
fn post(id: &Arc<Id>, event: u32, status: c_int, fill: impl FnOnce(&mut Ev)) {
    let Some(chan) = chan_of(id.channel()) else {
        return;
    };
    // SAFETY: rdma_cm_event is plain data; all-zero is valid.
    let raw: rdma_cm_event = unsafe { std::mem::zeroed() };
    let mut ev = Box::new(Ev {
        raw,
        data: [0; 256],
        id: Arc::clone(id),
    });
    ev.raw.id = id.raw();
    ev.raw.event = event;
    ev.raw.status = status;
    // The event is boxed already: private data pointers into `data` stay.
    fill(&mut ev);
    chan.q
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(ev);
    chan.efd.signal();
}

/// Sync ids: waits for the id's next event, keeps it in `id->event`, and
/// turns an error event into the errno the call returns.
fn complete(id: &Arc<Id>) -> c_int {
    let raw = id.raw();
    // SAFETY: our live id; only this (sync) id's caller touches `event`.
    unsafe {
        if !(*raw).event.is_null() {
            ack_cm_event((*raw).event);
            (*raw).event = ptr::null_mut();
        }
    }
    let mut ev: *mut rdma_cm_event = ptr::null_mut();
    // SAFETY: the id's own channel; `ev` is a live out-pointer.
    if unsafe { get_cm_event(id.channel(), &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: as above; `ev` came from get_cm_event.
    unsafe { (*raw).event = ev };
    // SAFETY: a live event of ours.
    let (kind, status) = unsafe { ((*ev).event, (*ev).status) };
    if status != 0 {
        return fail(if kind == ev::REJECTED {
            libc::ECONNREFUSED
        } else {
            status.abs()
        });
    }
    0
}

// ---------------------------------------------------------- entry points

unsafe extern "C" fn create_event_channel() -> *mut rdma_event_channel {
    guard("rdma_create_event_channel", ptr::null_mut(), || {
        crate::init_logging();
        match new_chan() {
            Ok(c) => c.cast(),
            Err(e) => {
                set_errno(e);
                ptr::null_mut()
            }
        }
    })
}
export!(
    "rdma_create_event_channel",
    "RDMACM_1.0",
    create_event_channel
);

unsafe extern "C" fn destroy_event_channel(channel: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", (), || {
        let Some(c) = chan_of(channel) else { return };
        live_chans(|l| l.remove(&(channel as usize)));
        if c.waiters.load(Ordering::Acquire) > 0 {
            // A thread still blocks in rdma_get_cm_event (rping at exit):
            // leave the channel to it.
            return;
        }
        // SAFETY: made by new_chan; the application gives it up.
        drop(unsafe { Box::from_raw(channel.cast::<Chan>()) });
    })
}
export!(
    "rdma_destroy_event_channel",
    "RDMACM_1.0",
    destroy_event_channel
);

fn qp_type_of(ps: PortSpace) -> u32 {
    if ps.is_datagram() {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    }
}

fn create_id_common(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
    qp_type: Option<u32>,
) -> c_int {
    crate::init_logging();
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let Some(ps) = PortSpace::from_value(ps) else {
        tracing::warn!(ps, "rdma_create_id: unknown port space");
        return fail(libc::EINVAL);
    };
    let sync = channel.is_null();
    let chan = if sync {
        match new_chan() {
            Ok(c) => c.cast(),
            Err(e) => return fail(e),
        }
    } else {
        channel
    };
    let new = new_id(
        chan,
        context,
        ps,
        qp_type.unwrap_or_else(|| qp_type_of(ps)),
        sync,
    );
    // SAFETY: a writable out-pointer (caller's contract).
    unsafe { *id = publish(new) };
    0
}

unsafe extern "C" fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard("rdma_create_id", -1, || {
        create_id_common(channel, id, context, ps, None)
    })
}
export!("rdma_create_id", "RDMACM_1.0", create_id);

unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        let (dev, conn, ps, port, listening, sync) = {
            let st = this.lock();
            (
                st.dev,
                st.conn,
                st.ps,
                st.port_held,
                st.phase == Phase::Listening,
                this.sync,
            )
        };
        if let (Some(dev), Some(conn)) = (dev, conn) {
            unregister_conn(dev, conn);
            if let Ok(d) = devcm(dev) {
                d.svc.with(|cm, now| cm.release(now, conn));
            }
        }
        if listening {
            unlisten(&this);
        }
        if let Some(port) = port {
            release_port(ps, port);
        }
        // Sync ids: the last event is acked with the id.
        // SAFETY: our live id.
        unsafe {
            let raw = this.raw();
            if !(*raw).event.is_null() {
                ack_cm_event((*raw).event);
                (*raw).event = ptr::null_mut();
            }
        }
        // Queued, never fetched events go; fetched ones must be acked.
        if let Some(chan) = chan_of(this.channel()) {
            let mut q = chan.q.lock().unwrap_or_else(|e| e.into_inner());
            let before = q.len();
            q.retain(|e| !Arc::ptr_eq(&e.id, &this));
            for _ in q.len()..before {
                chan.efd.drain();
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while this.unacked.load(Ordering::Acquire) > 0 {
            if std::time::Instant::now() > deadline {
                tracing::warn!(
                    "rdma_destroy_id: events of the id were never acked; destroying anyway"
                );
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let chan = this.channel();
        drop(this);
        unpublish(id);
        if sync {
            // SAFETY: the id's private channel, no longer used.
            unsafe { destroy_event_channel(chan) };
        }
        0
    })
}
export!("rdma_destroy_id", "RDMACM_1.0", destroy_id);

fn unlisten(id: &Arc<Id>) {
    let services: Vec<(usize, u64)> = {
        let st = id.lock();
        let Some((_, port)) = st.src.map(|s| ((), s.port())) else {
            return;
        };
        let svc = st.ps.service_id(port);
        addr::devices_for(st.src.map(|s| s.ip()))
            .into_iter()
            .map(|d| (d, svc))
            .collect()
    };
    let last = with_reg(|r| {
        r.listeners.retain(|l| !Arc::ptr_eq(l, id));
        services
            .iter()
            .filter(|(_, svc)| {
                !r.listeners.iter().any(|l| {
                    let st = l.lock();
                    st.src.is_some_and(|s| st.ps.service_id(s.port()) == *svc)
                })
            })
            .copied()
            .collect::<Vec<_>>()
    });
    for (dev, svc) in last {
        if let Ok(d) = devcm(dev) {
            d.svc.unlisten(svc);
        }
    }
}

/// Fills the id's addresses, device and GIDs.
fn set_route(id: &Id, st: &mut IdState, d: &DevCm) {
    st.dev = Some(d.index);
    st.sgid_index = d.sgid_index;
    let raw = id.raw();
    // SAFETY: our live id; the application reads these fields only after
    // the event that says they are set.
    unsafe {
        (*raw).verbs = d.ctx;
        if (*raw).pd.is_null() {
            (*raw).pd = d.pd;
        }
        (*raw).port_num = 1;
        if let Some(s) = st.src {
            addr::write_sockaddr(&mut (*raw).route.addr.src_addr, s);
        }
        if let Some(t) = st.dst {
            addr::write_sockaddr(&mut (*raw).route.addr.dst_addr, t);
        }
        (*raw).route.addr.ibaddr.sgid = d.gid;
        (*raw).route.addr.ibaddr.pkey = 0xffff;
        if let Some(p) = st.peer {
            (*raw).route.addr.ibaddr.dgid = burst_cm::rdma::gid_of(p);
        }
        let path = &mut *id.path.get();
        path.sgid = d.gid;
        path.dgid = (*raw).route.addr.ibaddr.dgid;
        path.pkey = 0xffffu16.to_be();
        path.mtu = d.mtu;
        path.hop_limit = 64;
        path.reversible = 1;
        path.numb_path = 1;
        path.packet_life_time = 14;
    }
}

unsafe extern "C" fn bind_addr(id: *mut rdma_cm_id, sa: *mut libc::sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        let (Some(this), Some(a)) = (id_of(id), addr::read_sockaddr(sa)) else {
            return fail(libc::EINVAL);
        };
        let mut st = this.lock();
        if st.phase != Phase::Idle {
            return fail(libc::EINVAL);
        }
        let dev = if a.ip().is_unspecified() {
            None
        } else {
            match addr::device_of_local(a.ip()) {
                Some(d) => Some(d),
                None => {
                    tracing::warn!(addr = %a.ip(), "rdma_bind_addr: not an address of a burst device");
                    return fail(libc::EADDRNOTAVAIL);
                }
            }
        };
        let port = match take_port(st.ps, a.port()) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        st.port_held = Some(port);
        st.src = Some(SocketAddr::new(a.ip(), port));
        st.phase = Phase::Bound;
        if let Some(dev) = dev {
            match devcm(dev) {
                Ok(d) => set_route(&this, &mut st, &d),
                Err(e) => {
                    st.port_held = None;
                    st.phase = Phase::Idle;
                    release_port(st.ps, port);
                    return fail(e);
                }
            }
        } else {
            // SAFETY: our live id.
            unsafe {
                addr::write_sockaddr(
                    &mut (*this.raw()).route.addr.src_addr,
                    SocketAddr::new(a.ip(), port),
                )
            };
        }
        0
    })
}
export!("rdma_bind_addr", "RDMACM_1.0", bind_addr);

unsafe extern "C" fn listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        let (svc, devs) = {
            let mut st = this.lock();
            if st.phase == Phase::Idle {
                // Listening unbound: the wildcard address, an ephemeral port.
                match take_port(st.ps, 0) {
                    Ok(p) => {
                        st.port_held = Some(p);
                        st.src = Some(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), p));
                    }
                    Err(e) => return fail(e),
                }
            } else if st.phase != Phase::Bound {
                return fail(libc::EINVAL);
            }
            st.phase = Phase::Listening;
            let Some(src) = st.src else {
                return fail(libc::EINVAL);
            };
            (
                st.ps.service_id(src.port()),
                addr::devices_for(Some(src.ip())),
            )
        };
        if devs.is_empty() {
            return fail(libc::ENODEV);
        }
        for dev in devs {
            let d = match devcm(dev) {
                Ok(d) => d,
                Err(e) => return fail(e),
            };
            // Several listeners (other addresses) may share a service ID.
            if let Err(e) = d.svc.listen(svc) {
                tracing::warn!("rdma_listen: {e}");
                this.lock().phase = Phase::Bound;
                return fail(e.raw_os_error().unwrap_or(match e.kind() {
                    std::io::ErrorKind::AddrInUse => libc::EADDRINUSE,
                    _ => libc::EIO,
                }));
            }
        }
        with_reg(|r| r.listeners.push(Arc::clone(&this)));
        0
    })
}
export!("rdma_listen", "RDMACM_1.0", listen);

unsafe extern "C" fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        let (Some(this), Some(dst)) = (id_of(id), addr::read_sockaddr(dst)) else {
            return fail(libc::EINVAL);
        };
        let src = addr::read_sockaddr(src);
        {
            let mut st = this.lock();
            if !matches!(st.phase, Phase::Idle | Phase::Bound) {
                return fail(libc::EINVAL);
            }
            let src_ip = st
                .src
                .map(|s| s.ip())
                .filter(|ip| !ip.is_unspecified())
                .or_else(|| src.map(|s| s.ip()).filter(|ip| !ip.is_unspecified()));
            let Some((dev, local_ip, peer)) = addr::resolve(src_ip, dst.ip()) else {
                drop(st);
                post(&this, ev::ADDR_ERROR, -libc::ENETUNREACH, |_| {});
                return if this.sync {
                    fail(libc::ENETUNREACH)
                } else {
                    0
                };
            };
            let d = match devcm(dev) {
                Ok(d) => d,
                Err(e) => return fail(e),
            };
            if st.port_held.is_none() {
                let want = src.map_or(0, |s| s.port());
                match take_port(st.ps, want) {
                    Ok(p) => st.port_held = Some(p),
                    Err(e) => return fail(e),
                }
            }
            let port = st.port_held.unwrap_or(0);
            st.src = Some(SocketAddr::new(local_ip, port));
            st.dst = Some(dst);
            st.peer = Some(peer);
            st.phase = Phase::AddrResolved;
            set_route(&this, &mut st, &d);
        }
        post(&this, ev::ADDR_RESOLVED, 0, |_| {});
        if this.sync {
            return complete(&this);
        }
        0
    })
}
export!("rdma_resolve_addr", "RDMACM_1.0", resolve_addr);

unsafe extern "C" fn resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        {
            let mut st = this.lock();
            if st.phase != Phase::AddrResolved {
                return fail(libc::EINVAL);
            }
            st.phase = Phase::RouteResolved;
            // SAFETY: our live id.
            unsafe { (*this.raw()).route.num_paths = 1 };
        }
        post(&this, ev::ROUTE_RESOLVED, 0, |_| {});
        if this.sync {
            return complete(&this);
        }
        0
    })
}
export!("rdma_resolve_route", "RDMACM_1.0", resolve_route);

// ------------------------------------------------------------------ QPs

/// `rdma_init_qp_attr`'s answer for `state`, from what the two sides
/// agreed on (REQ and REP).
fn qp_attr_for(st: &IdState, qp_type: u32, state: u32) -> Result<(ibv_qp_attr, c_int), c_int> {
    use crate::verbs::*;
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    let n = st.neg;
    let ud = qp_type == IBV_QPT_UD;
    let connected = matches!(
        st.phase,
        Phase::RequestRcvd
            | Phase::Accepting
            | Phase::RepRcvd
            | Phase::Established
            | Phase::Connecting
    );
    let mask = match state {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = burst_cm::rdma::RDMA_UDP_QKEY;
                M_STATE | M_PKEY_INDEX | M_PORT | M_QKEY
            } else {
                // As the kernel's CM: remote writes once connected, reads
                // and atomics when the peer may issue them.
                if connected {
                    a.qp_access_flags = 2 | if n.responder_resources > 0 { 4 | 8 } else { 0 };
                }
                M_STATE | M_PKEY_INDEX | M_PORT | M_ACCESS_FLAGS
            }
        }
        IBV_QPS_RTR if ud => M_STATE,
        IBV_QPS_RTR => {
            if !connected {
                return Err(libc::EINVAL);
            }
            let Some(peer) = st.peer else {
                return Err(libc::EINVAL);
            };
            a.path_mtu = u32::from(n.mtu);
            a.dest_qp_num = n.remote_qpn;
            // A CM message's starting PSN is the one its sender's receive
            // queue expects (the kernel's reading, which RXE and RNICs
            // follow): ours in our REQ/REP, the peer's sends start at it.
            a.rq_psn = n.my_psn;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid = burst_cm::rdma::gid_of(peer);
            a.ah_attr.grh.sgid_index = st.sgid_index;
            a.ah_attr.grh.hop_limit = 64;
            let mut m = M_STATE | M_AV | M_PATH_MTU | M_DEST_QPN | M_RQ_PSN;
            if qp_type == IBV_QPT_RC {
                a.max_dest_rd_atomic = n.responder_resources;
                a.min_rnr_timer = 12;
                m |= M_MAX_DEST_RD_ATOMIC | M_MIN_RNR_TIMER;
            }
            m
        }
        IBV_QPS_RTS => {
            a.sq_psn = if ud { 0 } else { n.remote_psn };
            let mut m = M_STATE | M_SQ_PSN;
            if qp_type == IBV_QPT_RC {
                a.timeout = n.ack_timeout;
                a.retry_cnt = n.retry_count.min(7);
                a.rnr_retry = n.rnr_retry_count.min(7);
                a.max_rd_atomic = n.initiator_depth;
                m |= M_TIMEOUT | M_RETRY_CNT | M_RNR_RETRY | M_MAX_QP_RD_ATOMIC;
            }
            m
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask))
}

fn modify(qp: *mut ibv_qp, mut a: ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    // SAFETY: a QP of ours (the id's) and a live attribute struct.
    match unsafe { crate::verbs::modify_qp(qp, &mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves the id's QP through INIT (again, for the access flags), RTR and
/// RTS with the agreed values, as librdmacm does before accepting and on
/// the reply.
fn ready_qp(id: &Id, st: &IdState) -> Result<(), c_int> {
    let qp = id.qp();
    if qp.is_null() {
        return Ok(());
    }
    // SAFETY: our live id.
    let qp_type = unsafe { (*qp).qp_type };
    let steps =
        [IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS].map(|state| qp_attr_for(st, qp_type, state));
    let steps: Vec<_> = steps.into_iter().collect::<Result<_, _>>()?;
    // One trip to the engine for the three transitions.
    match crate::verbs::modify_qp_steps(qp, &steps) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Moves the id's QP to the error state (flushing its work requests).
fn qp_to_error(id: &Id) {
    let qp = id.qp();
    if qp.is_null() {
        return;
    }
    let a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    let _ = modify(qp, a, crate::verbs::M_STATE);
}

fn create_qp_on(id: &Arc<Id>, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> c_int {
    let raw = id.raw();
    // SAFETY: our live id.
    let (verbs, id_pd) = unsafe { ((*raw).verbs, (*raw).pd) };
    if verbs.is_null() {
        // No address resolved or bound to a device yet.
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() { id_pd } else { pd };
    if attr.qp_type == 0 {
        // Applications leave it to the id (rdma_client zeroes the struct).
        // SAFETY: our live id.
        attr.qp_type = unsafe { (*raw).qp_type };
    }
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    let mut own_cqs = false;
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        // The library's own channels and CQs, cq_context = id.
        let mk = |n: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
            // SAFETY: the id's context, open.
            let ch = unsafe { crate::verbs::create_comp_channel(verbs) };
            if ch.is_null() {
                return Err(libc::ENOMEM);
            }
            // SAFETY: as above; `ch` was just made.
            let cq =
                unsafe { crate::verbs::create_cq(verbs, n.max(1) as c_int, raw.cast(), ch, 0) };
            if cq.is_null() {
                // SAFETY: `ch` is ours and unused.
                unsafe { crate::verbs::destroy_comp_channel(ch) };
                return Err(libc::ENOMEM);
            }
            Ok((ch, cq))
        };
        let (sch, scq) = match mk(attr.cap.max_send_wr) {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        let (rch, rcq) = match mk(attr.cap.max_recv_wr) {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: made just above, unused.
                unsafe {
                    crate::verbs::destroy_cq(scq);
                    crate::verbs::destroy_comp_channel(sch);
                }
                return fail(e);
            }
        };
        // SAFETY: our live id.
        unsafe {
            (*raw).send_cq_channel = sch;
            (*raw).send_cq = scq;
            (*raw).recv_cq_channel = rch;
            (*raw).recv_cq = rcq;
        }
        attr.send_cq = scq;
        attr.recv_cq = rcq;
        own_cqs = true;
    }
    // SAFETY: a PD of ours and the caller's init attributes.
    let qp = unsafe { crate::verbs::create_qp(pd, attr) };
    if qp.is_null() {
        // SAFETY: reads errno set by create_qp.
        let e = unsafe { *libc::__errno_location() };
        if own_cqs {
            destroy_own_cqs(id);
        }
        return fail(e);
    }
    let st = id.lock();
    let Ok((a, m)) = qp_attr_for(&st, attr.qp_type, IBV_QPS_INIT) else {
        return fail(libc::EINVAL);
    };
    let mut steps = vec![(a, m)];
    if attr.qp_type == IBV_QPT_UD {
        // UD is ready at once: RTR, then RTS with PSN 0.
        for s in [IBV_QPS_RTR, IBV_QPS_RTS] {
            if let Ok(v) = qp_attr_for(&st, IBV_QPT_UD, s) {
                steps.push(v);
            }
        }
    }
    drop(st);
    let e = crate::verbs::modify_qp_steps(qp, &steps);
    if e != 0 {
        // SAFETY: the QP just made, not yet published.
        unsafe { crate::verbs::destroy_qp(qp) };
        if own_cqs {
            destroy_own_cqs(id);
        }
        return fail(e);
    }
    // SAFETY: our live id.
    unsafe {
        (*raw).qp = qp;
        (*raw).pd = pd;
    }
    id.lock().own_cqs |= own_cqs;
    0
}

fn destroy_own_cqs(id: &Id) {
    let raw = id.raw();
    // SAFETY: our live id; the CQs and channels were made by
    // create_qp_on and nothing else uses them once the QP is gone.
    unsafe {
        for (cq, ch) in [
            (&raw mut (*raw).send_cq, &raw mut (*raw).send_cq_channel),
            (&raw mut (*raw).recv_cq, &raw mut (*raw).recv_cq_channel),
        ] {
            if !(*cq).is_null() {
                crate::verbs::destroy_cq(*cq);
                *cq = ptr::null_mut();
            }
            if !(*ch).is_null() {
                crate::verbs::destroy_comp_channel(*ch);
                *ch = ptr::null_mut();
            }
        }
    }
}

unsafe extern "C" fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_qp", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a writable init attr (caller's contract); cap is written back.
        create_qp_on(&this, pd, unsafe { &mut *attr })
    })
}
export!("rdma_create_qp", "RDMACM_1.0", create_qp);

unsafe extern "C" fn create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a writable extended init attr (caller's contract).
        let a = unsafe { &mut *attr };
        let mut base = a.base();
        // IBV_QP_INIT_ATTR_PD
        let pd = if a.comp_mask & 1 != 0 {
            a.pd
        } else {
            ptr::null_mut()
        };
        let r = create_qp_on(&this, pd, &mut base);
        a.cap = base.cap;
        a.send_cq = base.send_cq;
        a.recv_cq = base.recv_cq;
        r
    })
}
export!("rdma_create_qp_ex", "RDMACM_1.0", create_qp_ex);

unsafe extern "C" fn destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        let Some(this) = id_of(id) else { return };
        let qp = this.qp();
        if !qp.is_null() {
            // SAFETY: the id's QP, given up by the application.
            unsafe {
                crate::verbs::destroy_qp(qp);
                (*this.raw()).qp = ptr::null_mut();
            }
        }
        let own = std::mem::take(&mut this.lock().own_cqs);
        if own {
            destroy_own_cqs(&this);
        }
    })
}
export!("rdma_destroy_qp", "RDMACM_1.0", destroy_qp);

unsafe extern "C" fn init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard("rdma_init_qp_attr", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if attr.is_null() || mask.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: our live id.
        let qp_type = unsafe { (*this.raw()).qp_type };
        // SAFETY: a readable and writable attr (caller's contract).
        let state = unsafe { (*attr).qp_state };
        let st = this.lock();
        match qp_attr_for(&st, qp_type, state) {
            Ok((a, m)) => {
                // SAFETY: as above; mask is a writable int.
                unsafe {
                    *attr = a;
                    *mask = m;
                }
                0
            }
            Err(e) => fail(e),
        }
    })
}
export!("rdma_init_qp_attr", "RDMACM_1.2", init_qp_attr);

// ------------------------------------------------------- connect / accept

/// The caller's private data, checked against what the message carries.
fn private_data<'a>(p: *const c_void, len: u8, max: usize) -> Result<&'a [u8], c_int> {
    if len == 0 || p.is_null() {
        return Ok(&[]);
    }
    if usize::from(len) > max {
        tracing::warn!(len, max, "private data longer than the message carries");
        return Err(libc::EINVAL);
    }
    // SAFETY: `len` readable bytes at `p` (caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), usize::from(len)) })
}

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_ne_bytes(b) & 0xff_ffff
}

/// 0xff means "the device's maximum"; anything above it is refused.
fn resources(v: u8, max: u8) -> Result<u8, c_int> {
    match v {
        0xff => Ok(max),
        v if v <= max => Ok(v),
        _ => Err(libc::EINVAL),
    }
}

unsafe extern "C" fn connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_connect", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: NULL or a readable conn param (caller's contract).
        let p = unsafe { param.as_ref() }.copied();
        let r = {
            let mut st = this.lock();
            connect_locked(&this, &mut st, p)
        };
        if let Err(e) = r {
            return fail(e);
        }
        if this.sync {
            return complete(&this);
        }
        0
    })
}
export!("rdma_connect", "RDMACM_1.0", connect);

fn connect_locked(id: &Arc<Id>, st: &mut IdState, p: Option<rdma_conn_param>) -> Result<(), c_int> {
    if st.phase != Phase::RouteResolved {
        return Err(libc::EINVAL);
    }
    let (Some(dev), Some(src), Some(dst), Some(peer)) = (st.dev, st.src, st.dst, st.peer) else {
        return Err(libc::EINVAL);
    };
    let d = devcm(dev)?;
    let qp = id.qp();
    let saved = std::mem::take(&mut st.ep_connect);
    let user: Vec<u8> = match &p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            let max = if st.ps.is_datagram() {
                burst_cm::rdma::SIDR_REQ_PRIVATE_DATA
            } else {
                burst_cm::rdma::REQ_PRIVATE_DATA
            };
            private_data(p.private_data, p.private_data_len, max)?.to_vec()
        }
        _ => saved,
    };
    let hdr = CmaHeader { src, dst: dst.ip() };
    let service_id = st.ps.service_id(dst.port());
    if st.ps.is_datagram() {
        let mut req = CmSidrReq {
            request_id: 0,
            pkey: 0xffff,
            service_id,
            private_data: [0; 216],
        };
        hdr.emit(&mut req.private_data);
        let n = user.len().min(burst_cm::rdma::SIDR_REQ_PRIVATE_DATA);
        req.private_data[36..36 + n].copy_from_slice(&user[..n]);
        let conn = d
            .svc
            .with(|cm, now| cm.sidr_request(now, peer, req))
            .map_err(|e| e.errno())?;
        st.conn = Some(conn);
        st.phase = Phase::Connecting;
        register_conn(dev, conn, id);
        return Ok(());
    }
    let qpn = if qp.is_null() {
        p.map(|p| p.qp_num)
            .filter(|&n| n != 0)
            .ok_or(libc::EINVAL)?
    } else {
        // SAFETY: the id's live QP.
        unsafe { (*qp).qp_num }
    };
    let (rr, id_depth) = match &p {
        Some(p) => (
            resources(p.responder_resources, d.max_rd_atomic)?,
            resources(p.initiator_depth, d.max_rd_atomic)?,
        ),
        None => (0, 0),
    };
    let my_psn = random_psn();
    let mut req = burst_cm::req_template(
        service_id,
        Qpn::new(qpn).ok_or(libc::EINVAL)?,
        Psn::new(my_psn),
    );
    req.responder_resources = rr;
    req.initiator_depth = id_depth;
    req.retry_count = p.map_or(7, |p| p.retry_count.min(7));
    req.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count.min(7));
    req.end_to_end_flow_control = p.is_none_or(|p| p.flow_control != 0);
    // SAFETY: our live id.
    req.srq = !unsafe { (*id.raw()).srq }.is_null() || p.is_some_and(|p| p.srq != 0);
    // SAFETY: the id's live QP (when there is one).
    if !qp.is_null() && unsafe { (*qp).qp_type } == IBV_QPT_UC {
        req.transport = burst_cm::CmTransport::Uc;
    }
    req.path_mtu = d.mtu;
    let ack_timeout = st.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT);
    req.primary_path.local_ack_timeout = ack_timeout;
    req.primary_path.local_gid = d.gid;
    req.primary_path.remote_gid = burst_cm::rdma::gid_of(peer);
    hdr.emit(&mut req.private_data);
    req.private_data[36..36 + user.len()].copy_from_slice(&user);
    st.neg = Negotiated {
        my_psn,
        mtu: d.mtu,
        responder_resources: rr,
        initiator_depth: id_depth,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        ack_timeout,
        ..Negotiated::default()
    };
    st.phase = Phase::Connecting;
    // Registered before the REQ leaves: the reply may beat this call's return.
    let conn = d.svc.with(|cm, now| {
        let r = cm.connect(now, peer, req);
        if let Ok(c) = r {
            register_conn(dev, c, id);
        }
        r
    });
    match conn {
        Ok(c) => {
            st.conn = Some(c);
            Ok(())
        }
        Err(e) => {
            st.phase = Phase::RouteResolved;
            Err(e.errno())
        }
    }
}

unsafe extern "C" fn accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_accept", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: NULL or a readable conn param (caller's contract).
        let p = unsafe { param.as_ref() }.copied();
        let r = {
            let mut st = this.lock();
            accept_locked(&this, &mut st, p)
        };
        if let Err(e) = r {
            return fail(e);
        }
        // SAFETY: our live id.
        let ud = unsafe { (*this.raw()).qp_type } == IBV_QPT_UD;
        if this.sync && !ud {
            return complete(&this);
        }
        0
    })
}
export!("rdma_accept", "RDMACM_1.0", accept);

fn accept_locked(id: &Arc<Id>, st: &mut IdState, p: Option<rdma_conn_param>) -> Result<(), c_int> {
    if st.phase != Phase::RequestRcvd {
        return Err(libc::EINVAL);
    }
    let (Some(dev), Some(conn)) = (st.dev, st.conn) else {
        return Err(libc::EINVAL);
    };
    let d = devcm(dev)?;
    let qp = id.qp();
    if st.ps.is_datagram() {
        let qpn = match (qp.is_null(), p) {
            // SAFETY: the id's live QP.
            (false, _) => unsafe { (*qp).qp_num },
            (true, Some(p)) if p.qp_num != 0 => p.qp_num,
            _ => return Err(libc::EINVAL),
        };
        let mut rep = CmSidrRep {
            request_id: 0,
            status: burst_cm::sidr_status::OK,
            add_info_length: 0,
            qpn: Qpn::new(qpn).ok_or(libc::EINVAL)?,
            service_id: 0,
            qkey: burst_cm::rdma::RDMA_UDP_QKEY,
            class_port_info: [0; 72],
            private_data: [0; 136],
        };
        if let Some(p) = p {
            let pd = private_data(p.private_data, p.private_data_len, 136)?;
            rep.private_data[..pd.len()].copy_from_slice(pd);
        }
        if let Some(sid) = st.src.map(|s| st.ps.service_id(s.port())) {
            rep.service_id = sid;
        }
        d.svc
            .with(|cm, now| cm.sidr_reply(now, conn, rep))
            .map_err(|e| e.errno())?;
        unregister_conn(dev, conn);
        st.conn = None;
        st.phase = Phase::Established;
        return Ok(());
    }
    // The request's values were stored, swapped, at CONNECT_REQUEST.
    if let Some(p) = p {
        st.neg.responder_resources = match p.responder_resources {
            0xff => st.neg.responder_resources,
            v => resources(v, d.max_rd_atomic)?,
        };
        st.neg.initiator_depth = match p.initiator_depth {
            0xff => st.neg.initiator_depth,
            v => resources(v, d.max_rd_atomic)?,
        };
    }
    let user = match &p {
        Some(p) => private_data(
            p.private_data,
            p.private_data_len,
            burst_cm::rdma::REP_PRIVATE_DATA,
        )?,
        None => &[],
    };
    let qpn = if qp.is_null() {
        p.map(|p| p.qp_num)
            .filter(|&n| n != 0)
            .ok_or(libc::EINVAL)?
    } else {
        // SAFETY: the id's live QP.
        unsafe { (*qp).qp_num }
    };
    st.phase = Phase::Accepting;
    if let Err(e) = ready_qp(id, st) {
        st.phase = Phase::RequestRcvd;
        tracing::warn!(errno = e, "rdma_accept: the QP could not be made ready");
        return Err(e);
    }
    let mut rep =
        burst_cm::rep_template(Qpn::new(qpn).ok_or(libc::EINVAL)?, Psn::new(st.neg.my_psn));
    rep.responder_resources = st.neg.responder_resources;
    rep.initiator_depth = st.neg.initiator_depth;
    rep.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count.min(7));
    rep.end_to_end_flow_control = p.is_none_or(|p| p.flow_control != 0);
    // SAFETY: our live id.
    rep.srq = !unsafe { (*id.raw()).srq }.is_null() || p.is_some_and(|p| p.srq != 0);
    rep.private_data[..user.len()].copy_from_slice(user);
    d.svc
        .with(|cm, now| cm.accept(now, conn, rep))
        .map_err(|e| e.errno())
}

unsafe extern "C" fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard("rdma_reject", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        let mut st = this.lock();
        let (Some(dev), Some(conn)) = (st.dev, st.conn) else {
            return fail(libc::EINVAL);
        };
        if st.phase != Phase::RequestRcvd {
            return fail(libc::EINVAL);
        }
        let d = match devcm(dev) {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        let r = if st.ps.is_datagram() {
            let pd = match private_data(data, len, 136) {
                Ok(pd) => pd,
                Err(e) => return fail(e),
            };
            let mut rep = CmSidrRep {
                request_id: 0,
                status: burst_cm::sidr_status::REJECT,
                add_info_length: 0,
                qpn: Qpn::from_wire(0),
                service_id: 0,
                qkey: 0,
                class_port_info: [0; 72],
                private_data: [0; 136],
            };
            rep.private_data[..pd.len()].copy_from_slice(pd);
            d.svc.with(|cm, now| cm.sidr_reply(now, conn, rep))
        } else {
            let pd = match private_data(data, len, burst_cm::rdma::REJ_PRIVATE_DATA) {
                Ok(pd) => pd,
                Err(e) => return fail(e),
            };
            d.svc.with(|cm, _| cm.reject(conn, reason::CONSUMER, pd))
        };
        unregister_conn(dev, conn);
        st.conn = None;
        st.phase = Phase::Disconnected;
        match r {
            Ok(()) => 0,
            Err(e) => fail(e.errno()),
        }
    })
}
export!("rdma_reject", "RDMACM_1.0", reject);

unsafe extern "C" fn establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if !this.qp().is_null() {
            return fail(libc::EINVAL);
        }
        let mut st = this.lock();
        let (Some(dev), Some(conn), Phase::RepRcvd) = (st.dev, st.conn, st.phase) else {
            return fail(libc::EINVAL);
        };
        let d = match devcm(dev) {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        match d.svc.with(|cm, now| cm.establish(now, conn)) {
            Ok(()) => {
                st.phase = Phase::Established;
                0
            }
            Err(e) => fail(e.errno()),
        }
    })
}
export!("rdma_establish", "RDMACM_1.2", establish);

unsafe extern "C" fn notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard("rdma_notify", -1, || {
        // Communication established on the passive side before the RTU:
        // the CM moves the connection on (ESTABLISHED follows).
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        let st = this.lock();
        if let (Some(dev), Some(conn), Phase::Accepting) = (st.dev, st.conn, st.phase) {
            if let Ok(d) = devcm(dev) {
                let _ = d.svc.with(|cm, now| cm.establish(now, conn));
            }
        }
        0
    })
}
export!("rdma_notify", "RDMACM_1.0", notify);

unsafe extern "C" fn disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        // The QP first: its work requests flush (rping's CQ thread waits
        // for that).
        qp_to_error(&this);
        let sent = {
            let mut st = this.lock();
            match (st.phase, st.dev, st.conn) {
                (Phase::Disconnected, ..) => false,
                (Phase::Established | Phase::Accepting | Phase::RepRcvd, Some(dev), Some(conn)) => {
                    if st.ps.is_datagram() {
                        false
                    } else {
                        let d = match devcm(dev) {
                            Ok(d) => d,
                            Err(e) => return fail(e),
                        };
                        match d.svc.with(|cm, now| cm.disconnect(now, conn, &[])) {
                            Ok(()) => true,
                            // Already gone from the CM (time-wait over).
                            Err(_) => {
                                st.phase = Phase::Disconnected;
                                false
                            }
                        }
                    }
                }
                (Phase::Established, ..) => false,
                _ => return fail(libc::EINVAL),
            }
        };
        if sent && this.sync {
            return complete(&this);
        }
        0
    })
}
export!("rdma_disconnect", "RDMACM_1.0", disconnect);

// --------------------------------------------------------------- events

unsafe extern "C" fn get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        let Some(chan) = chan_of(channel) else {
            return fail(libc::EINVAL);
        };
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        chan.waiters.fetch_add(1, Ordering::AcqRel);
        let r = loop {
            // One count per queued event; a count without an event (one
            // discarded with its id) is skipped.
            if !chan.efd.read() {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EAGAIN);
                break Err(e);
            }
            let next = chan.q.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            if let Some(ev) = next {
                ev.id.unacked.fetch_add(1, Ordering::AcqRel);
                break Ok(Box::into_raw(ev));
            }
        };
        chan.waiters.fetch_sub(1, Ordering::AcqRel);
        match r {
            Ok(ev) => {
                // SAFETY: a writable out-pointer (caller's contract).
                unsafe { *event = ev.cast() };
                0
            }
            Err(e) => fail(e),
        }
    })
}
export!("rdma_get_cm_event", "RDMACM_1.0", get_cm_event);

unsafe extern "C" fn ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", -1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: events are handed out by get_cm_event as boxed `Ev`s
        // (the C struct first); the application acks each once.
        let ev = unsafe { Box::from_raw(event.cast::<Ev>()) };
        ev.id.unacked.fetch_sub(1, Ordering::AcqRel);
        0
    })
}
export!("rdma_ack_cm_event", "RDMACM_1.0", ack_cm_event);

unsafe extern "C" fn migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    guard("rdma_migrate_id", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        let to = if channel.is_null() {
            match new_chan() {
                Ok(c) => c.cast(),
                Err(e) => return fail(e),
            }
        } else {
            channel
        };
        let from = this.channel();
        // SAFETY: our live id.
        unsafe { (*this.raw()).channel = to };
        // Events of the id still queued move with it.
        if let (Some(old), Some(new)) = (chan_of(from), chan_of(to)) {
            if !ptr::eq(old, new) {
                let moved: Vec<Box<Ev>> = {
                    let mut q = old.q.lock().unwrap_or_else(|e| e.into_inner());
                    let (m, keep): (Vec<_>, Vec<_>) =
                        q.drain(..).partition(|e| Arc::ptr_eq(&e.id, &this));
                    q.extend(keep);
                    m
                };
                for e in moved {
                    old.efd.drain();
                    new.q.lock().unwrap_or_else(|e| e.into_inner()).push_back(e);
                    new.efd.signal();
                }
            }
        }
        0
    })
}
export!("rdma_migrate_id", "RDMACM_1.0", migrate_id);

unsafe extern "C" fn set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    guard("rdma_set_option", -1, || {
        if id.is_null() || optval.is_null() {
            return fail(libc::EINVAL);
        }
        match (level, optname) {
            // RDMA_OPTION_ID_ACK_TIMEOUT: a u8 exponent for the QP's timeout.
            (0, 3) => {
                let Some(this) = id_of(id) else {
                    return fail(libc::EINVAL);
                };
                // SAFETY: at least one readable byte (caller's contract).
                let t = unsafe { *optval.cast::<u8>() };
                this.lock().ack_timeout = Some(t.min(31));
                0
            }
            // TOS, REUSEADDR, AFONLY; IB PATH: accepted, with nothing to
            // change on burst's single-path RoCE.
            (0, 0..=2) | (1, 1) => 0,
            _ => fail(libc::ENOSYS),
        }
    })
}
export!("rdma_set_option", "RDMACM_1.0", set_option);

fn port_of(id: *mut rdma_cm_id, dst: bool) -> u16 {
    let Some(this) = id_of(id) else { return 0 };
    let st = this.lock();
    let a = if dst { st.dst } else { st.src };
    a.map_or(0, |a| a.port().to_be())
}

unsafe extern "C" fn get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard("rdma_get_src_port", 0, || port_of(id, false))
}
export!("rdma_get_src_port", "RDMACM_1.0", get_src_port);

unsafe extern "C" fn get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard("rdma_get_dst_port", 0, || port_of(id, true))
}
export!("rdma_get_dst_port", "RDMACM_1.0", get_dst_port);

unsafe extern "C" fn get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", ptr::null_mut(), || {
        let n = crate::device::devices().len();
        let ctxs: Vec<*mut ibv_context> = (0..n)
            .filter_map(|i| devcm(i).ok())
            .map(|d| d.ctx)
            .collect();
        // SAFETY: calloc of len+1 pointers, freed by rdma_free_devices.
        let list = unsafe { libc::calloc(ctxs.len() + 1, std::mem::size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, c) in ctxs.iter().enumerate() {
            // SAFETY: i < len + 1 slots allocated above.
            unsafe { *list.add(i) = *c };
        }
        if !num.is_null() {
            // SAFETY: a writable int (caller's contract).
            unsafe { *num = ctxs.len() as c_int };
        }
        list
    })
}
export!("rdma_get_devices", "RDMACM_1.0", get_devices);

unsafe extern "C" fn free_devices(list: *mut *mut ibv_context) {
    // SAFETY: made by get_devices' calloc (or NULL).
    unsafe { libc::free(list.cast()) };
}
export!("rdma_free_devices", "RDMACM_1.0", free_devices);

// ------------------------------------------------------------------ SRQ

unsafe extern "C" fn create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard("rdma_create_srq", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        let pd = if pd.is_null() {
            // SAFETY: our live id.
            unsafe { (*this.raw()).pd }
        } else {
            pd
        };
        if pd.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a PD of ours and the caller's init attributes.
        let srq = unsafe { crate::verbs::create_srq(pd, attr) };
        if srq.is_null() {
            return -1;
        }
        // SAFETY: our live id.
        unsafe { (*this.raw()).srq = srq };
        this.lock().own_srq = true;
        0
    })
}
export!("rdma_create_srq", "RDMACM_1.0", create_srq);

unsafe extern "C" fn destroy_srq(id: *mut rdma_cm_id) {
    guard("rdma_destroy_srq", (), || {
        let Some(this) = id_of(id) else { return };
        let raw = this.raw();
        // SAFETY: our live id and its SRQ, given up by the application.
        unsafe {
            if !(*raw).srq.is_null() {
                crate::verbs::destroy_srq((*raw).srq);
                (*raw).srq = ptr::null_mut();
            }
        }
        this.lock().own_srq = false;
    })
}
export!("rdma_destroy_srq", "RDMACM_1.0", destroy_srq);

// ----------------------------------------------------- synchronous ids

unsafe extern "C" fn create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a readable addrinfo from rdma_getaddrinfo (caller's contract).
        let r = unsafe { &*res };
        let qp_type = (r.ai_qp_type > 0).then_some(r.ai_qp_type as u32);
        let ps = if r.ai_port_space != 0 {
            r.ai_port_space as u32
        } else if qp_type == Some(IBV_QPT_UD) {
            PortSpace::Udp.value()
        } else {
            PortSpace::Tcp.value()
        };
        let mut out: *mut rdma_cm_id = ptr::null_mut();
        if create_id_common(ptr::null_mut(), &mut out, ptr::null_mut(), ps, qp_type) != 0 {
            return -1;
        }
        let Some(this) = id_of(out) else {
            return fail(libc::EIO);
        };
        let undo = |e: c_int| {
            // SAFETY: the id made above, not handed out.
            unsafe { destroy_id(out) };
            fail(e)
        };
        // SAFETY: reads errno of a failed call just made.
        let errno = || unsafe { *libc::__errno_location() };
        if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: our id and the addrinfo's address.
            if unsafe { bind_addr(out, r.ai_src_addr) } != 0 {
                return undo(errno());
            }
            if !qp_init_attr.is_null() {
                // SAFETY: a readable init attr (caller's contract).
                this.lock().ep_attr = Some((unsafe { *qp_init_attr }, pd));
            }
        } else {
            // SAFETY: as above (sync: each call waits for its event).
            if unsafe { resolve_addr(out, r.ai_src_addr, r.ai_dst_addr, 2000) } != 0 {
                return undo(errno());
            }
            // SAFETY: as above.
            if unsafe { resolve_route(out, 2000) } != 0 {
                return undo(errno());
            }
            if !qp_init_attr.is_null() {
                // SAFETY: a writable init attr (caller's contract).
                if create_qp_on(&this, pd, unsafe { &mut *qp_init_attr }) != 0 {
                    return undo(errno());
                }
            }
            if r.ai_connect_len > 0 && !r.ai_connect.is_null() {
                // SAFETY: ai_connect_len readable bytes (rdma_getaddrinfo's).
                let c = unsafe {
                    std::slice::from_raw_parts(r.ai_connect.cast::<u8>(), r.ai_connect_len)
                };
                this.lock().ep_connect = c.to_vec();
            }
        }
        // SAFETY: a writable out-pointer (caller's contract).
        unsafe { *id = out };
        0
    })
}
export!("rdma_create_ep", "RDMACM_1.0", create_ep);

unsafe extern "C" fn destroy_ep(id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", (), || {
        let Some(this) = id_of(id) else { return };
        if !this.qp().is_null() {
            // SAFETY: our id.
            unsafe { destroy_qp(id) };
        }
        let own_srq = this.lock().own_srq;
        if own_srq {
            // SAFETY: our id.
            unsafe { destroy_srq(id) };
        }
        drop(this);
        // SAFETY: our id, given up by the application.
        unsafe { destroy_id(id) };
    })
}
export!("rdma_destroy_ep", "RDMACM_1.0", destroy_ep);

unsafe extern "C" fn get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    guard("rdma_get_request", -1, || {
        let Some(l) = id_of(listen) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() || !l.sync {
            return fail(libc::EINVAL);
        }
        loop {
            let mut ev: *mut rdma_cm_event = ptr::null_mut();
            // SAFETY: the listener's own channel.
            if unsafe { get_cm_event(l.channel(), &mut ev) } != 0 {
                return -1;
            }
            // SAFETY: a live event of ours.
            let (kind, child) = unsafe { ((*ev).event, (*ev).id) };
            // SAFETY: as above.
            unsafe { ack_cm_event(ev) };
            if kind != ev::CONNECT_REQUEST {
                continue;
            }
            let Some(c) = id_of(child) else {
                return fail(libc::EIO);
            };
            // The child becomes synchronous on its own channel.
            // SAFETY: our child id.
            if unsafe { migrate_id(child, ptr::null_mut()) } != 0 {
                return -1;
            }
            let saved = l.lock().ep_attr;
            if let Some((mut attr, pd)) = saved {
                if create_qp_on(&c, pd, &mut attr) != 0 {
                    return -1;
                }
            }
            // SAFETY: a writable out-pointer (caller's contract).
            unsafe { *id = child };
            return 0;
        }
    })
}
export!("rdma_get_request", "RDMACM_1.0", get_request);
