//! The drop-in `librdmacm.so.1`: rdma-core's structs translated onto
//! burst-verbs' [`rdma_cm`](burst_verbs::rdma_cm) (`design/ibverbs-abi.md`
//! §5). What is here is C's: the `rdma_cm_id` and `rdma_cm_event` the
//! application reads, pointers checked before use, synchronous ids (a NULL
//! channel: every call waits for its event), the CQs and channels
//! `rdma_create_qp` makes, `rdma_create_ep` / `rdma_get_request`, and
//! `rdma_getaddrinfo`, multicast joins (`mcast.rs`). Connection setup
//! itself (addresses, REQ/REP/RTU, SIDR, the QP's transitions) is
//! burst-verbs'.
//!
//! rsockets (`rsocket.rs`) are burst-verbs' [`RSocket`](burst_verbs::rsocket::RSocket)
//! behind librdmacm's calls. Not yet: the ECE calls, datagram rsockets.

mod abi;
mod addr;
mod calls;
mod ep;
mod mcast;
mod qp;
mod rsocket;

use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use burst_verbs::rdma_cm::{
    CmEvent, CmEventKind, CmId, EventChannel, EventParam, PortSpace, RdmaCm,
};
use burst_verbs::QpType;

use self::abi::*;
use crate::abi::*;
use crate::{guard, set_errno};

/// `errno` and -1, the way librdmacm's int calls fail.
fn fail(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// As [`fail`], with the errno an `io::Error` carries.
fn fail_io(e: &std::io::Error) -> c_int {
    fail(e.raw_os_error().unwrap_or(libc::EIO))
}

// ------------------------------------------------------------- devices

/// What `id->verbs` and `id->pd` point at for a device: the library's own
/// context and default PD.
#[derive(Clone, Copy)]
struct CDev {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
}

// SAFETY: the library's own context and PD, which live for the process
// and are used through thread-safe entry points.
unsafe impl Send for CDev {}

static CDEVS: Mutex<Vec<Option<CDev>>> = Mutex::new(Vec::new());

/// The process's rdma_cm, over the drop-in's device list, and the process
/// it was made in. A child of fork() makes its own on first use: the
/// parent's device contexts are the parent's (through burstd, its
/// connection and its threads, which the child does not have; sharing the
/// connection mixed both processes' requests and replies: two children of
/// a parent that had listed the devices, as Python's multiprocessing
/// makes them, could not connect to each other).
static CM: Mutex<Option<(u32, &'static RdmaCm)>> = Mutex::new(None);

/// The process's rdma_cm if anything in this process used it.
fn rdma_cm_if_started() -> Option<&'static RdmaCm> {
    let pid = std::process::id();
    let cm = CM.lock().unwrap_or_else(|e| e.into_inner());
    cm.filter(|(p, _)| *p == pid).map(|(_, c)| c)
}

fn rdma_cm() -> &'static RdmaCm {
    let pid = std::process::id();
    let mut cm = CM.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, c)) = *cm {
        if p == pid {
            return c;
        }
        tracing::info!("rdma_cm: first use after fork(); devices are opened again in this process");
    }
    let first = cm.is_none();
    // The parent's per-device contexts and PDs are not this process's.
    CDEVS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let addrs = crate::device::devices()
        .iter()
        .map(|d| d.cfg.addr)
        .collect();
    // The CM's counters (retransmitted REQs, timeouts) when the process
    // ends, where the device's closing line would be (the instance lives
    // as long as the process). Decided now: at exit the logger's
    // thread-local state may be gone, so the line goes straight to
    // stderr. (A forked child inherits the registration.)
    crate::init_logging();
    if first {
        // SAFETY: registering a plain function with no arguments.
        unsafe { libc::atexit(at_exit) };
    }
    // One per process that uses rdma_cm: lives as long as the process.
    let made: &'static RdmaCm = Box::leak(Box::new(RdmaCm::new(addrs, Box::new(open_device))));
    *cm = Some((pid, made));
    made
}

/// At exit: connections the application left up are released (DREQs, as
/// the kernel's CM sends when the process's file closes) and the DREQs
/// still unanswered get their DREPs (the CM ends with the process; the
/// kernel's would go on), then the counters' lines.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(cm) = rdma_cm_if_started() else {
            return;
        };
        let left = cm.close_all(burst_verbs::cm::DISCONNECT_LINGER);
        if left > 0 && tracing::enabled!(tracing::Level::WARN) {
            eprintln!("burst: rdma_cm at exit: {left} disconnect request(s) unanswered");
        }
        if tracing::enabled!(target: "burst::counters", tracing::Level::INFO) {
            for line in cm.counters_lines("at exit") {
                eprintln!("burst: {line}");
            }
        }
    });
}

/// Opens device `index` for the CM: its context and default PD.
fn open_device(index: usize) -> std::io::Result<burst_verbs::engine::Context> {
    let err = std::io::Error::from_raw_os_error;
    let dev = crate::device::devices()
        .get(index)
        .ok_or(err(libc::ENODEV))?;
    // SAFETY: a device of our own list.
    let ctx = unsafe { crate::device::open_device(ptr::from_ref(&dev.raw).cast_mut()) };
    if ctx.is_null() {
        let e = std::io::Error::last_os_error();
        crate::log_line(&format!("burst: rdma_cm on {}: {e}", dev.cfg.name));
        return Err(e);
    }
    // SAFETY: `ctx` was just opened by us.
    let c = unsafe { crate::objects::ctx_of(ctx) }.ok_or(err(libc::EIO))?;
    // SAFETY: `ctx` is ours and open.
    let pd = unsafe { crate::verbs::alloc_pd(ctx) };
    if pd.is_null() {
        return Err(err(libc::ENOMEM));
    }
    let mut all = CDEVS.lock().unwrap_or_else(|e| e.into_inner());
    if all.len() <= index {
        all.resize(index + 1, None);
    }
    all[index] = Some(CDev { ctx, pd });
    Ok(c.ctx.clone())
}

/// Device `index`'s context and PD, opened on first use.
fn cdev(index: usize) -> Result<CDev, c_int> {
    rdma_cm()
        .context(index)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::ENODEV))?;
    let all = CDEVS.lock().unwrap_or_else(|e| e.into_inner());
    all.get(index).copied().flatten().ok_or(libc::ENODEV)
}

// ------------------------------------------------------------ channels

/// An event channel: the C struct first (its descriptor is the Rust
/// channel's).
#[repr(C)]
pub(crate) struct Chan {
    raw: rdma_event_channel,
    ch: EventChannel,
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
    let ch = EventChannel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let p = Box::into_raw(Box::new(Chan {
        raw: rdma_event_channel {
            fd: std::os::fd::AsFd::as_fd(&ch).as_raw_fd(),
        },
        ch,
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

/// What the C layer keeps for `rdma_create_qp` and `rdma_create_ep`.
#[derive(Default)]
struct EpState {
    /// The library made the CQs and channels (rdma_create_qp with none).
    own_cqs: bool,
    /// rdma_create_ep: the QP attributes and PD for rdma_get_request.
    attr: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    /// rdma_create_ep: private data for rdma_connect (ai_connect).
    connect: Vec<u8>,
    /// rdma_create_ep made the SRQ.
    own_srq: bool,
}

/// An rdma_cm id: the C struct first (the application's pointer is to
/// it; it writes `context`, `qp` and the CQ fields itself), over the Rust
/// id (whose user data points back here).
#[repr(C)]
pub(crate) struct Id {
    raw: std::cell::UnsafeCell<rdma_cm_id>,
    path: std::cell::UnsafeCell<ibv_sa_path_rec>,
    cm: CmId,
    ep: Mutex<EpState>,
    /// Events handed to the application and not yet acked.
    unacked: AtomicU32,
    /// Multicast groups joined (`rdma_join_multicast`), for the join
    /// event's context and QP attachment and for `rdma_leave_multicast`.
    mcast: Mutex<Vec<mcast::Joined>>,
    /// Without a channel of the application's (created so, or migrated
    /// to none): every call waits for its event. `rdma_migrate_id` to a
    /// channel makes it asynchronous, as librdmacm does (libfabric's
    /// verbs provider resolves an id synchronously, then moves it to its
    /// event queue's channel).
    sync: std::sync::atomic::AtomicBool,
}

// SAFETY: the C struct is written by us before the id is published or
// on calls the application makes on it, and by the application (its own
// fields); the Rust state is behind mutexes.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Id {
    fn raw(&self) -> *mut rdma_cm_id {
        self.raw.get()
    }

    fn ep(&self) -> std::sync::MutexGuard<'_, EpState> {
        self.ep.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Writes the Rust id's addresses, device and GIDs into the C struct.
    fn sync_route(&self) {
        let r = self.cm.route();
        let dev = r.device.and_then(|i| cdev(i).ok());
        let raw = self.raw();
        // SAFETY: our live id; the application reads these fields after
        // the call or event that says they are set.
        unsafe {
            if let Some(s) = r.src {
                addr::write_sockaddr(&mut (*raw).route.addr.src_addr, s);
            }
            if let Some(t) = r.dst {
                addr::write_sockaddr(&mut (*raw).route.addr.dst_addr, t);
            }
            let Some(d) = dev else { return };
            (*raw).verbs = d.ctx;
            if (*raw).pd.is_null() {
                (*raw).pd = d.pd;
            }
            (*raw).port_num = 1;
            (*raw).route.addr.ibaddr.sgid = r.sgid;
            (*raw).route.addr.ibaddr.pkey = 0xffff;
            if r.dgid != [0; 16] {
                (*raw).route.addr.ibaddr.dgid = r.dgid;
            }
            let path = &mut *self.path.get();
            path.sgid = r.sgid;
            path.dgid = (*raw).route.addr.ibaddr.dgid;
            path.pkey = 0xffffu16.to_be();
            path.mtu = r.mtu.map_or(0, |m| m.ibv_mtu());
            path.hop_limit = 64;
            path.reversible = 1;
            path.numb_path = 1;
            path.packet_life_time = 14;
        }
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
        // made by `publish` with `Arc::into_raw`, and the application's
        // reference is still held, so adding one is sound.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    })
}

/// The C id over a Rust one, if it has one and it is live.
fn id_for(cm: &CmId) -> Option<Arc<Id>> {
    match cm.user_data() {
        0 => None,
        p => id_of(p as *mut rdma_cm_id),
    }
}

/// `enum ibv_qp_type` of a QP type.
fn ibv_qp_type(t: QpType) -> u32 {
    match t {
        QpType::Rc => IBV_QPT_RC,
        QpType::Uc => IBV_QPT_UC,
        QpType::Ud => IBV_QPT_UD,
    }
}

fn new_id(
    cm: CmId,
    chan: *mut rdma_event_channel,
    context: *mut c_void,
    qp_type: u32,
    sync: bool,
) -> Arc<Id> {
    // SAFETY: rdma_cm_id is plain data (pointers and integers).
    let mut raw: rdma_cm_id = unsafe { std::mem::zeroed() };
    raw.channel = chan;
    raw.context = context;
    raw.ps = cm.port_space().value();
    raw.qp_type = qp_type;
    raw.port_num = 1;
    raw.route.addr.ibaddr.pkey = 0xffff;
    let id = Arc::new(Id {
        raw: std::cell::UnsafeCell::new(raw),
        path: std::cell::UnsafeCell::new(ibv_sa_path_rec::default()),
        cm,
        ep: Mutex::new(EpState::default()),
        unacked: AtomicU32::new(0),
        mcast: Mutex::new(Vec::new()),
        sync: std::sync::atomic::AtomicBool::new(sync),
    });
    // SAFETY: the path record lives as long as the id.
    unsafe { (*id.raw()).route.path_rec = id.path.get() };
    id
}

/// Hands the application its reference to `id`.
fn publish(id: Arc<Id>) -> *mut rdma_cm_id {
    let cm = id.cm.clone();
    let p = Arc::into_raw(id);
    live(|l| l.insert(p as usize));
    cm.set_user_data(p as usize);
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
        let id = unsafe { Arc::from_raw(p) };
        id.cm.set_user_data(0);
        true
    })
}

// --------------------------------------------------------------- events

/// The C id of an event: the id's own, or a new one for a request
/// (inheriting the listener's context and synchronous mode); `None` for an
/// event of an id the application destroyed.
fn event_id(ev: &CmEvent, channel: *mut rdma_event_channel) -> Option<Arc<Id>> {
    if let Some(id) = id_for(&ev.id) {
        return Some(id);
    }
    if ev.kind != CmEventKind::ConnectRequest {
        return None;
    }
    let listener = ev.listen_id.as_ref().and_then(id_for);
    let (context, sync) = listener.as_ref().map_or((ptr::null_mut(), false), |l| {
        // SAFETY: a live id of ours.
        (
            unsafe { (*l.raw()).context },
            l.sync.load(Ordering::Acquire),
        )
    });
    let child = new_id(
        ev.id.clone(),
        channel,
        context,
        ibv_qp_type(ev.id.qp_type()),
        sync,
    );
    child.sync_route();
    publish(Arc::clone(&child));
    Some(child)
}

/// The C event for `ev` on id `id`.
fn c_event(ev: &CmEvent, id: Arc<Id>) -> Box<Ev> {
    // SAFETY: rdma_cm_event is plain data; all-zero is valid.
    let raw: rdma_cm_event = unsafe { std::mem::zeroed() };
    let mut out = Box::new(Ev {
        raw,
        data: [0; 256],
        id,
    });
    out.raw.id = out.id.raw();
    out.raw.listen_id = ev
        .listen_id
        .as_ref()
        .and_then(id_for)
        .map_or(ptr::null_mut(), |l| l.raw());
    out.raw.event = ev.kind.value();
    out.raw.status = ev.status;
    // The event is boxed already: private data pointers into `data` stay.
    let mut keep = |d: &[u8]| -> (*const c_void, u8) {
        let n = d.len().min(out.data.len()).min(255);
        out.data[..n].copy_from_slice(&d[..n]);
        (out.data.as_ptr().cast(), n as u8)
    };
    match &ev.param {
        EventParam::None => {}
        EventParam::Conn(p) => {
            let (data, len) = keep(&p.private_data);
            out.raw.param.conn = rdma_conn_param {
                private_data: data,
                private_data_len: len,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: u8::from(p.flow_control),
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: u8::from(p.srq),
                qp_num: p.qp_num,
            };
        }
        EventParam::Ud(u) => {
            let (data, len) = keep(&u.private_data);
            let mut ah = ibv_ah_attr::default();
            if u.qp_num != 0 {
                ah = qp::ah_attr_of(&u.av);
            }
            out.raw.param.ud = rdma_ud_param {
                private_data: data,
                private_data_len: len,
                ah_attr: ah,
                qp_num: u.qp_num,
                qkey: u.qkey,
            };
        }
    }
    out
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
        return fail(if kind == CmEventKind::Rejected.value() {
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
            let ev = match chan.ch.get_event() {
                Ok(ev) => ev,
                Err(e) => break Err(e),
            };
            let Some(id) = event_id(&ev, channel) else {
                continue;
            };
            if matches!(
                ev.kind,
                CmEventKind::AddrResolved | CmEventKind::RouteResolved
            ) {
                id.sync_route();
            }
            id.unacked.fetch_add(1, Ordering::AcqRel);
            let mut out = c_event(&ev, Arc::clone(&id));
            if ev.kind == CmEventKind::MulticastJoin {
                // As librdmacm: the join's context in the event, and the
                // id's QP attached to the group now.
                mcast::on_join(&id, &mut out.raw);
            }
            break Ok(Box::into_raw(out));
        };
        chan.waiters.fetch_sub(1, Ordering::AcqRel);
        match r {
            Ok(ev) => {
                // SAFETY: a writable out-pointer (caller's contract).
                unsafe { *event = ev.cast() };
                0
            }
            Err(e) => fail_io(&e),
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

unsafe extern "C" fn get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", ptr::null_mut(), || {
        let ctxs: Vec<*mut ibv_context> = (0..rdma_cm().device_count())
            .filter_map(|i| cdev(i).ok())
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

/// The port space of a C value.
fn port_space(ps: u32) -> Option<PortSpace> {
    PortSpace::from_value(ps)
}
