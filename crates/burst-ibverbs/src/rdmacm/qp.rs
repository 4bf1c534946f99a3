//! The QP of an id: the application's `ibv_qp` driven by burst-verbs'
//! rdma_cm through [`CmQp`], `rdma_create_qp` (with the library's own CQs
//! when the application gives none), `rdma_init_qp_attr`, and the SRQ.

use std::ffi::c_int;
use std::ptr;
use std::sync::Arc;

use burst_verbs::rdma_cm::{AddressVector, CmQp, CmQpAttr};
use burst_verbs::{QpState, QpType, Qpn};

use super::abi::*;
use super::*;
use crate::verbs::*;

/// An application's `ibv_qp` as the Rust CM sees it.
struct CQp(*mut ibv_qp);

// SAFETY: a QP of ours; its verbs are thread-safe entry points, and it is
// detached from the id (rdma_destroy_qp, sync_qp) before it is destroyed.
unsafe impl Send for CQp {}
// SAFETY: as above.
unsafe impl Sync for CQp {}

impl CmQp for CQp {
    fn qpn(&self) -> Qpn {
        // SAFETY: a live QP of ours (see the Send impl).
        Qpn::from_wire(unsafe { (*self.0).qp_num })
    }

    fn qp_type(&self) -> QpType {
        // SAFETY: as above.
        match unsafe { (*self.0).qp_type } {
            IBV_QPT_UC => QpType::Uc,
            IBV_QPT_UD => QpType::Ud,
            _ => QpType::Rc,
        }
    }

    fn modify(&self, steps: &[CmQpAttr]) -> std::io::Result<()> {
        // What the REQ and REP agreed beyond IBA's attributes (ECE): the C
        // QP applies it at RTR, as after the application's ibv_set_ece.
        if let Some(sr) = steps.iter().find_map(|s| s.attr.selective_repeat) {
            set_agreed_ece(self.0, sr);
        }
        let wait: Vec<Option<bool>> = steps.iter().map(|s| s.attr.wait_for_peer).collect();
        let steps: Vec<(ibv_qp_attr, c_int)> = steps.iter().map(ibv_attr_of).collect();
        // One trip to the engine for the transitions; the C struct's
        // recorded state follows.
        match modify_qp_steps(self.0, &steps, &wait) {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

/// The Rust id's QP made the one in `id->qp` (an application may set the
/// field itself, or clear it).
pub(super) fn sync_qp(id: &Id) {
    let raw = id.qp();
    let attached = id.cm.qp();
    if raw.is_null() {
        if attached.is_some() {
            id.cm.set_qp(None);
        }
        return;
    }
    let qp = CQp(raw);
    if attached.is_none_or(|a| a.qpn() != qp.qpn()) {
        id.cm.set_qp(Some(Arc::new(qp)));
    }
}

/// An address vector as `ibv_ah_attr`.
pub(super) fn ah_attr_of(av: &AddressVector) -> ibv_ah_attr {
    let mut ah = ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    ah.grh.dgid = av.dgid;
    ah.grh.sgid_index = av.sgid_index;
    ah.grh.hop_limit = av.hop_limit;
    ah
}

/// The CM's attributes as `ibv_modify_qp` takes them.
fn ibv_attr_of(c: &CmQpAttr) -> (ibv_qp_attr, c_int) {
    let t = &c.attr;
    let mut a = ibv_qp_attr::default();
    let mut m = 0;
    let mut set = |bit: c_int, on: bool| {
        if on {
            m |= bit;
        }
        on
    };
    if let Some(s) = t.state {
        set(M_STATE, true);
        a.qp_state = s.ibv();
    }
    if let Some(x) = t.access {
        set(M_ACCESS_FLAGS, true);
        a.qp_access_flags = (if x.remote_write { 2 } else { 0 }
            | if x.remote_read { 4 } else { 0 }
            | if x.remote_atomic { 8 } else { 0 }) as _;
    }
    if set(M_PKEY_INDEX, t.pkey_index.is_some()) {
        a.pkey_index = t.pkey_index.unwrap_or(0);
    }
    if set(M_PORT, t.port.is_some()) {
        a.port_num = t.port.unwrap_or(1);
    }
    if set(M_QKEY, t.qkey.is_some()) {
        a.qkey = t.qkey.unwrap_or(0);
    }
    if let Some(av) = &c.av {
        set(M_AV, true);
        a.ah_attr = ah_attr_of(av);
    }
    if let Some(mtu) = t.path_mtu {
        set(M_PATH_MTU, true);
        a.path_mtu = u32::from(mtu.ibv_mtu());
    }
    if let Some(q) = t.dest_qpn {
        set(M_DEST_QPN, true);
        a.dest_qp_num = q.value();
    }
    if let Some(p) = t.rq_psn {
        set(M_RQ_PSN, true);
        a.rq_psn = p.value();
    }
    if set(M_MAX_DEST_RD_ATOMIC, t.max_dest_rd_atomic.is_some()) {
        a.max_dest_rd_atomic = t.max_dest_rd_atomic.unwrap_or(0);
    }
    if set(M_MIN_RNR_TIMER, t.min_rnr_timer.is_some()) {
        a.min_rnr_timer = t.min_rnr_timer.unwrap_or(0);
    }
    if let Some(p) = t.sq_psn {
        set(M_SQ_PSN, true);
        a.sq_psn = p.value();
    }
    if set(M_TIMEOUT, t.timeout.is_some()) {
        a.timeout = t.timeout.unwrap_or(0);
    }
    if set(M_RETRY_CNT, t.retry_cnt.is_some()) {
        a.retry_cnt = t.retry_cnt.unwrap_or(0);
    }
    if set(M_RNR_RETRY, t.rnr_retry.is_some()) {
        a.rnr_retry = t.rnr_retry.unwrap_or(0);
    }
    if set(M_MAX_QP_RD_ATOMIC, t.max_rd_atomic.is_some()) {
        a.max_rd_atomic = t.max_rd_atomic.unwrap_or(0);
    }
    (a, m)
}

pub(super) fn create_qp_on(id: &Arc<Id>, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> c_int {
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
        match own_cq_pair(id, verbs, attr) {
            Ok(()) => own_cqs = true,
            Err(e) => return fail(e),
        }
    }
    // SAFETY: a PD of ours and the caller's init attributes.
    let qp = unsafe { create_qp(pd, attr) };
    if qp.is_null() {
        // SAFETY: reads errno set by create_qp.
        let e = unsafe { *libc::__errno_location() };
        if own_cqs {
            destroy_own_cqs(id);
        }
        return fail(e);
    }
    if let Err(e) = id.cm.attach_qp(Arc::new(CQp(qp))) {
        // SAFETY: the QP just made, not yet published.
        unsafe { destroy_qp(qp) };
        if own_cqs {
            destroy_own_cqs(id);
        }
        return fail_io(&e);
    }
    // SAFETY: our live id.
    unsafe {
        (*raw).qp = qp;
        (*raw).pd = pd;
    }
    id.ep().own_cqs |= own_cqs;
    0
}

/// The library's own channels and CQs for the id's QP (cq_context = id).
fn own_cq_pair(id: &Id, verbs: *mut ibv_context, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let raw = id.raw();
    let mk = |n: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        // SAFETY: the id's context, open.
        let ch = unsafe { create_comp_channel(verbs) };
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: as above; `ch` was just made.
        let cq = unsafe { create_cq(verbs, n.max(1) as c_int, raw.cast(), ch, 0) };
        if cq.is_null() {
            // SAFETY: `ch` is ours and unused.
            unsafe { destroy_comp_channel(ch) };
            return Err(libc::ENOMEM);
        }
        Ok((ch, cq))
    };
    let (sch, scq) = mk(attr.cap.max_send_wr)?;
    let (rch, rcq) = match mk(attr.cap.max_recv_wr) {
        Ok(v) => v,
        Err(e) => {
            // SAFETY: made just above, unused.
            unsafe {
                destroy_cq(scq);
                destroy_comp_channel(sch);
            }
            return Err(e);
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
    Ok(())
}

fn destroy_own_cqs(id: &Id) {
    let raw = id.raw();
    // SAFETY: our live id; the CQs and channels were made by
    // own_cq_pair and nothing else uses them once the QP is gone.
    unsafe {
        for (cq, ch) in [
            (&raw mut (*raw).send_cq, &raw mut (*raw).send_cq_channel),
            (&raw mut (*raw).recv_cq, &raw mut (*raw).recv_cq_channel),
        ] {
            if !(*cq).is_null() {
                destroy_cq(*cq);
                *cq = ptr::null_mut();
            }
            if !(*ch).is_null() {
                destroy_comp_channel(*ch);
                *ch = ptr::null_mut();
            }
        }
    }
}

unsafe extern "C" fn rdma_create_qp(
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
export!("rdma_create_qp", "RDMACM_1.0", rdma_create_qp);

unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
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
export!("rdma_create_qp_ex", "RDMACM_1.0", rdma_create_qp_ex);

pub(super) unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        let Some(this) = id_of(id) else { return };
        this.cm.set_qp(None);
        let qp = this.qp();
        if !qp.is_null() {
            // SAFETY: the id's QP, given up by the application.
            unsafe {
                destroy_qp(qp);
                (*this.raw()).qp = ptr::null_mut();
            }
        }
        let own = std::mem::take(&mut this.ep().own_cqs);
        if own {
            destroy_own_cqs(&this);
        }
    })
}
export!("rdma_destroy_qp", "RDMACM_1.0", rdma_destroy_qp);

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
        // SAFETY: a readable and writable attr (caller's contract).
        let state = unsafe { (*attr).qp_state };
        let Some(state) = QpState::from_ibv(state) else {
            return fail(libc::EINVAL);
        };
        match this.cm.qp_attr(state) {
            Ok(a) => {
                let (a, m) = ibv_attr_of(&a);
                // SAFETY: as above; mask is a writable int.
                unsafe {
                    *attr = a;
                    *mask = m;
                }
                0
            }
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_init_qp_attr", "RDMACM_1.2", init_qp_attr);

// ------------------------------------------------------------------ SRQ

unsafe extern "C" fn rdma_create_srq(
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
        let srq = unsafe { create_srq(pd, attr) };
        if srq.is_null() {
            return -1;
        }
        // SAFETY: our live id.
        unsafe { (*this.raw()).srq = srq };
        this.ep().own_srq = true;
        0
    })
}
export!("rdma_create_srq", "RDMACM_1.0", rdma_create_srq);

pub(super) unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard("rdma_destroy_srq", (), || {
        let Some(this) = id_of(id) else { return };
        let raw = this.raw();
        // SAFETY: our live id and its SRQ, given up by the application.
        unsafe {
            if !(*raw).srq.is_null() {
                destroy_srq((*raw).srq);
                (*raw).srq = ptr::null_mut();
            }
        }
        this.ep().own_srq = false;
    })
}
export!("rdma_destroy_srq", "RDMACM_1.0", rdma_destroy_srq);
