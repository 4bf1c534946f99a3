//! Sessions over the system's libibverbs (feature `libibverbs`): the same
//! session logic as [`crate::RdmaSession`] on any Verbs device, so one
//! workload runs on burst's drop-in libibverbs, on kernel RXE and on an
//! RNIC. The verbs a session needs go through `csrc/ibv_shim.c` (the data
//! path verbs are static inline functions of `<infiniband/verbs.h>`);
//! this module is the only caller of the shim.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

use crate::landing::NOTIFY_LEN;
use crate::rdma::Endpoint;
use crate::session::{transfer_by_session, Done, RcQps, Session, Work, RECV_SLOTS};
use crate::{Pool, Segment, SessionOptions, XferError};

/// The shim's opaque handles.
#[repr(C)]
struct RawDevice {
    _private: [u8; 0],
}
#[repr(C)]
struct RawMr {
    _private: [u8; 0],
}
#[repr(C)]
struct RawCq {
    _private: [u8; 0],
}
#[repr(C)]
struct RawQp {
    _private: [u8; 0],
}

extern "C" {
    fn xfer_ibv_open(
        name: *const c_char,
        gid_index: c_int,
        gid: *mut u8,
        out: *mut *mut RawDevice,
    ) -> c_int;
    fn xfer_ibv_close(d: *mut RawDevice);
    fn xfer_ibv_reg(
        d: *mut RawDevice,
        addr: *mut c_void,
        len: usize,
        mr: *mut *mut RawMr,
        lkey: *mut u32,
        rkey: *mut u32,
    ) -> c_int;
    fn xfer_ibv_dereg(mr: *mut RawMr) -> c_int;
    fn xfer_ibv_cq(d: *mut RawDevice, entries: c_int, out: *mut *mut RawCq) -> c_int;
    fn xfer_ibv_destroy_cq(cq: *mut RawCq) -> c_int;
    fn xfer_ibv_qp(
        d: *mut RawDevice,
        scq: *mut RawCq,
        rcq: *mut RawCq,
        max_send: u32,
        max_recv: u32,
        max_inline: u32,
        out: *mut *mut RawQp,
        qpn: *mut u32,
    ) -> c_int;
    fn xfer_ibv_destroy_qp(qp: *mut RawQp) -> c_int;
    fn xfer_ibv_connect(
        d: *mut RawDevice,
        qp: *mut RawQp,
        gid: *const u8,
        dqpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        mtu: c_int,
        timeout: u8,
        retry_cnt: u8,
        rd_atomic: u8,
    ) -> c_int;
    fn xfer_ibv_post(
        qp: *mut RawQp,
        wr_id: u64,
        op: c_int,
        laddr: u64,
        len: u32,
        lkey: u32,
        raddr: u64,
        rkey: u32,
        signaled: c_int,
    ) -> c_int;
    fn xfer_ibv_post_recv(qp: *mut RawQp, wr_id: u64, addr: u64, len: u32, lkey: u32) -> c_int;
    fn xfer_ibv_poll(cq: *mut RawCq, wr_id: *mut u64, qpn: *mut u32, status: *mut c_int) -> c_int;
    fn xfer_ibv_status_str(status: c_int) -> *const c_char;
}

fn errno(what: &str, e: c_int) -> String {
    format!("{what}: {}", std::io::Error::from_raw_os_error(e))
}

/// An opened Verbs device and a protection domain on it.
#[derive(Debug)]
pub struct IbvDevice {
    raw: *mut RawDevice,
    gid: [u8; 16],
}

// SAFETY: libibverbs' contexts and PDs may be used from any thread; the
// handle is only freed in Drop, when no session holds it any more (they
// hold an Arc).
unsafe impl Send for IbvDevice {}
// SAFETY: as above.
unsafe impl Sync for IbvDevice {}

impl IbvDevice {
    /// Opens device `name` (`None`: the first listed), addressing with GID
    /// `gid_index` of port 1.
    pub fn open(name: Option<&str>, gid_index: u8) -> Result<Arc<IbvDevice>, XferError> {
        let name = CString::new(name.unwrap_or(""))
            .map_err(|_| XferError::Setup("a device name with a NUL".into()))?;
        let (mut raw, mut gid) = (std::ptr::null_mut(), [0u8; 16]);
        // SAFETY: a NUL-terminated name, a 16-byte GID buffer and an out
        // pointer, all live for the call.
        let e = unsafe {
            xfer_ibv_open(
                name.as_ptr(),
                c_int::from(gid_index),
                gid.as_mut_ptr(),
                &mut raw,
            )
        };
        if e != 0 || raw.is_null() {
            return Err(XferError::Setup(errno(
                &format!("opening Verbs device {name:?}"),
                e,
            )));
        }
        Ok(Arc::new(IbvDevice { raw, gid }))
    }

    /// The GID sessions on it are reached at.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }
}

impl Drop for IbvDevice {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, closed once; sessions (which hold an
        // Arc) are gone.
        unsafe { xfer_ibv_close(self.raw) };
    }
}

/// A memory registration over a pool (kept alive with it).
struct Mr {
    raw: *mut RawMr,
    lkey: u32,
    rkey: u32,
}

fn register(dev: &IbvDevice, pool: &Pool) -> Result<Mr, XferError> {
    let (mut raw, mut lkey, mut rkey) = (std::ptr::null_mut(), 0, 0);
    // SAFETY: the pool's allocation, of its length; the caller keeps the
    // pool alive until the registration is dropped (see IbvQps' Drop).
    let e = unsafe {
        xfer_ibv_reg(
            dev.raw,
            pool.addr() as *mut c_void,
            pool.len(),
            &mut raw,
            &mut lkey,
            &mut rkey,
        )
    };
    if e != 0 {
        return Err(XferError::Setup(errno("ibv_reg_mr", e)));
    }
    Ok(Mr { raw, lkey, rkey })
}

/// libibverbs' QPs under a session, with what they use.
struct IbvQps {
    dev: Arc<IbvDevice>,
    qps: Vec<(*mut RawQp, u32)>,
    scq: *mut RawCq,
    rcq: *mut RawCq,
    mrs: Vec<Mr>,
    pool: Arc<Pool>,
    slots: Pool,
    peer: Endpoint,
}

// SAFETY: the session owns its QPs, CQs and registrations exclusively
// (one thread at a time: `&mut`), and libibverbs' objects may be used
// from any thread.
unsafe impl Send for IbvQps {}

impl IbvQps {
    fn pool_mr(&self) -> &Mr {
        &self.mrs[0]
    }
    fn slots_mr(&self) -> &Mr {
        &self.mrs[1]
    }

    fn poll(&self, cq: *mut RawCq) -> Option<Done> {
        let (mut wr_id, mut qpn, mut status) = (0u64, 0u32, 0 as c_int);
        // SAFETY: a CQ this session made and has not destroyed; three out
        // pointers live for the call.
        let n = unsafe { xfer_ibv_poll(cq, &mut wr_id, &mut qpn, &mut status) };
        if n == 0 {
            return None;
        }
        let error = match (n, status) {
            (1, 0) => None,
            (1, s) => {
                // SAFETY: ibv_wc_status_str returns a static string.
                let name = unsafe { std::ffi::CStr::from_ptr(xfer_ibv_status_str(s)) };
                Some(format!("{} ({s})", name.to_string_lossy()))
            }
            _ => Some("ibv_poll_cq failed".into()),
        };
        Some(Done {
            wr_id,
            lane: self.qps.iter().position(|q| q.1 == qpn).unwrap_or(0),
            error,
        })
    }
}

impl RcQps for IbvQps {
    fn count(&self) -> usize {
        self.qps.len()
    }

    fn post(&mut self, lane: usize, wr_id: u64, work: &Work, signaled: bool) -> Result<(), String> {
        let (op, laddr, len, lkey, raddr) = match work {
            Work::Write(s) | Work::Read(s) => {
                let Segment { local, remote, len } = *s;
                let op = if matches!(work, Work::Write(_)) { 0 } else { 1 };
                (
                    op,
                    self.pool.addr() + local,
                    len,
                    self.pool_mr().lkey,
                    self.peer.addr + remote,
                )
            }
            Work::Notify(b) => (2, b.as_ptr() as u64, b.len() as u32, 0, 0),
        };
        // SAFETY: a live QP of this session; the local range is inside the
        // registered pool (checked by the session against its length) or
        // the inline bytes, which the provider copies before returning.
        let e = unsafe {
            xfer_ibv_post(
                self.qps[lane].0,
                wr_id,
                op,
                laddr,
                len,
                lkey,
                raddr,
                self.peer.rkey,
                c_int::from(signaled),
            )
        };
        if e != 0 {
            return Err(errno("ibv_post_send", e));
        }
        Ok(())
    }

    fn post_slot(&mut self, slot: usize) -> Result<(), String> {
        let qp = self.qps.get(slot / RECV_SLOTS).ok_or("no such slot")?.0;
        let addr = self.slots.addr() + (slot * NOTIFY_LEN) as u64;
        // SAFETY: a live QP; the slot is inside the registered slots pool.
        let e = unsafe {
            xfer_ibv_post_recv(
                qp,
                slot as u64,
                addr,
                NOTIFY_LEN as u32,
                self.slots_mr().lkey,
            )
        };
        if e != 0 {
            return Err(errno("ibv_post_recv", e));
        }
        Ok(())
    }

    fn slots(&self) -> &Pool {
        &self.slots
    }

    fn poll_send(&mut self) -> Option<Done> {
        self.poll(self.scq)
    }

    fn poll_recv(&mut self) -> Option<Done> {
        self.poll(self.rcq)
    }
}

impl Drop for IbvQps {
    fn drop(&mut self) {
        // SAFETY: each handle was made by this session and is destroyed
        // once: the QPs, then the CQs they used, then the registrations
        // (before the pools they cover are freed, with the fields).
        unsafe {
            for (qp, _) in self.qps.drain(..) {
                xfer_ibv_destroy_qp(qp);
            }
            for cq in [self.scq, self.rcq] {
                if !cq.is_null() {
                    xfer_ibv_destroy_cq(cq);
                }
            }
            for mr in self.mrs.drain(..) {
                xfer_ibv_dereg(mr.raw);
            }
        }
    }
}

/// A session to one peer over RC QPs of a libibverbs device: the same
/// calls and the same wire behaviour as [`crate::RdmaSession`].
///
/// ```no_run
/// use std::sync::Arc;
/// use burst_xfer::{IbvDevice, IbvSession, Pool, SessionOptions};
///
/// let dev = IbvDevice::open(Some("rxe0"), 1)?;
/// let pool = Arc::new(Pool::new(1 << 20)?);
/// let session = IbvSession::connect(&dev, pool, &SessionOptions::default(), |mine| {
///     // Send `mine.to_bytes()` to the peer, return its Endpoint.
///     # let _ = mine;
///     # unimplemented!()
/// })?;
/// # Ok::<(), burst_xfer::XferError>(())
/// ```
pub struct IbvSession {
    inner: Session<IbvQps>,
}

transfer_by_session!(IbvSession);

impl std::fmt::Debug for IbvSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvSession")
            .field("qps", &self.inner.qps.qps.len())
            .finish_non_exhaustive()
    }
}

impl IbvSession {
    /// Sets a session up over `pool` on `dev`: registers the pool, makes
    /// the QPs, hands this side's [`Endpoint`] to `exchange`, which
    /// returns the peer's, and connects (INIT, RTR, RTS). Both sides call
    /// it; the peer may be an [`crate::RdmaSession`].
    pub fn connect(
        dev: &Arc<IbvDevice>,
        pool: Arc<Pool>,
        o: &SessionOptions,
        exchange: impl FnOnce(&Endpoint) -> std::io::Result<Endpoint>,
    ) -> Result<IbvSession, XferError> {
        if o.qps == 0 || o.depth < 2 {
            return Err(XferError::Setup("at least one QP, two deep".into()));
        }
        let slots = Pool::new(RECV_SLOTS * o.qps * NOTIFY_LEN)?;
        let mut q = IbvQps {
            dev: Arc::clone(dev),
            qps: Vec::with_capacity(o.qps),
            scq: std::ptr::null_mut(),
            rcq: std::ptr::null_mut(),
            mrs: Vec::with_capacity(2),
            pool,
            slots,
            peer: Endpoint {
                gid: [0; 16],
                qps: Vec::new(),
                addr: 0,
                len: 0,
                rkey: 0,
            },
        };
        // From here on, whatever fails drops `q`, which destroys what it made.
        q.mrs.push(register(dev, &q.pool)?);
        q.mrs.push(register(dev, &q.slots)?);
        let cq = |n: usize, out: &mut *mut RawCq| {
            // SAFETY: an open device and an out pointer.
            let e = unsafe { xfer_ibv_cq(dev.raw, n as c_int, out) };
            (e == 0)
                .then_some(())
                .ok_or_else(|| XferError::Setup(errno("ibv_create_cq", e)))
        };
        cq(o.depth as usize * o.qps + 1, &mut q.scq)?;
        cq(RECV_SLOTS * o.qps + 1, &mut q.rcq)?;
        let mut mine = Endpoint {
            gid: dev.gid,
            qps: Vec::with_capacity(o.qps),
            addr: q.pool.addr(),
            len: q.pool.len() as u64,
            rkey: q.pool_mr().rkey,
        };
        for _ in 0..o.qps {
            let (mut qp, mut qpn) = (std::ptr::null_mut(), 0);
            // SAFETY: an open device, this session's CQs, out pointers.
            let e = unsafe {
                xfer_ibv_qp(
                    dev.raw,
                    q.scq,
                    q.rcq,
                    o.depth,
                    RECV_SLOTS as u32,
                    NOTIFY_LEN as u32,
                    &mut qp,
                    &mut qpn,
                )
            };
            if e != 0 {
                return Err(XferError::Setup(errno("ibv_create_qp", e)));
            }
            q.qps.push((qp, qpn));
            mine.qps.push((qpn, burst_verbs::random_psn().value()));
        }
        let peer =
            exchange(&mine).map_err(|e| XferError::Setup(format!("exchanging endpoints: {e}")))?;
        if peer.qps.len() != o.qps {
            return Err(XferError::Setup(format!(
                "the peer has {} QPs, this side {}",
                peer.qps.len(),
                o.qps
            )));
        }
        for (i, &(qp, _)) in q.qps.iter().enumerate() {
            let (dqpn, rq_psn) = peer.qps[i];
            // SAFETY: an open device, a live QP, a 16-byte GID.
            let e = unsafe {
                xfer_ibv_connect(
                    dev.raw,
                    qp,
                    peer.gid.as_ptr(),
                    dqpn,
                    rq_psn,
                    mine.qps[i].1,
                    c_int::from(o.mtu.ibv_mtu()),
                    o.timeout,
                    o.retry_cnt,
                    16,
                )
            };
            if e != 0 {
                return Err(XferError::Setup(errno("ibv_modify_qp", e)));
            }
        }
        let (pool_len, peer_len) = (q.pool.len() as u64, peer.len);
        q.peer = peer;
        Ok(IbvSession {
            inner: Session::new(q, o.depth as usize, pool_len, peer_len)?,
        })
    }

    /// The local pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.inner.qps.pool
    }

    /// The device the session is on.
    pub fn device(&self) -> &Arc<IbvDevice> {
        &self.inner.qps.dev
    }
}
