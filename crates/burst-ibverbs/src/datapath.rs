//! The data path the applications' inline verbs call through the context's
//! ops table: post_send, post_recv, post_srq_recv, poll_cq, req_notify_cq;
//! and the `ibv_wr_*` extended post-send API of QPs from `ibv_create_qp_ex`.
//!
//! Work requests go into the QP's ring with no lookup (the QP object holds
//! its ring handle); inline data is copied from the application's buffers
//! here, as `ibv_post_send` promises.

use std::ffi::{c_int, c_void};

use burst_verbs::engine::PostError;
use burst_verbs::Qpn;
use burst_verbs::{
    wr_opcode, InlineData, MwBind, NetworkHeader, QpType, RecvWr, SendOp, SendWr, SgList, Sge,
    UdDest, WorkCompletion,
};

use crate::abi::*;
use crate::guard;
use crate::objects::{ctx_of, ours, Ah, Cq, Mr, Mw, Qp, Srq, WrBatch};

const SEND_FENCE: u32 = 1;
const SEND_SIGNALED: u32 = 2;
const SEND_SOLICITED: u32 = 4;
const SEND_INLINE: u32 = 8;

/// Reads an SGE array from the application (EINVAL for a negative count,
/// a null list, or more entries than a work request holds; the QP's own
/// limit is checked when the WR is posted, once, by the engine).
///
/// # Safety
/// `sg` must point to `n` readable SGEs when `n > 0`.
unsafe fn sg_list(sg: *const ibv_sge, n: c_int) -> Result<SgList, c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    let mut l = SgList::new();
    if n == 0 {
        return Ok(l);
    }
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(sg, n) };
    for e in s {
        l.push(Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        })
        .map_err(|v| v.errno())?;
    }
    Ok(l)
}

/// The WR's inline bytes, read now from the SGEs' addresses (EINVAL past
/// what an inline buffer holds; the QP's `max_inline_data` is checked when
/// the WR is posted).
///
/// # Safety
/// Each SGE must name readable process memory.
unsafe fn gather_inline(list: &[Sge]) -> Result<InlineData, c_int> {
    // SAFETY: forwarded contract.
    unsafe { burst_verbs::gather_inline(list) }.map_err(|v| v.errno())
}

/// IBV_ACCESS_ZERO_BASED, which a type 1 bind refuses (as RXE's provider).
const ACCESS_ZERO_BASED: u32 = 1 << 5;

/// A window bind as the transport takes it: `mw` gets `rkey` over what
/// `info` names (no region and a zero length unbind a type 1 window). The
/// binding rules themselves are checked when the bind executes (burst-mem),
/// and a refusal completes with IBV_WC_MW_BIND_ERR, as on RXE.
fn bind_op(mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<SendOp, c_int> {
    let Some(m) = ours!(Mw, mw) else {
        return Err(libc::EINVAL);
    };
    let mr_lkey = match ours!(Mr, info.mr) {
        Some(r) => r.raw.lkey,
        None if info.addr == 0 && info.length == 0 => 0,
        None => return Err(libc::EINVAL),
    };
    // The window is named by its index; the tag (low 8 bits) is the
    // application's to step, so a stale `mw->rkey` still names it.
    Ok(SendOp::BindMw(MwBind {
        mw_rkey: m.raw.handle << 8 | (m.raw.rkey & 0xff),
        new_rkey: rkey,
        mr_lkey,
        addr: info.addr,
        len: info.length,
        access: info.mw_access_flags,
    }))
}

/// Posts one `ibv_send_wr`: it becomes a [`SendWr`] (SGEs and inline bytes
/// held in place, no allocation) that the engine checks and posts.
/// `more`: WRs of the same list follow (see `QueuePair::post_send_more`).
fn post_one(q: &Qp, w: &ibv_send_wr, more: bool) -> Result<(), c_int> {
    // SAFETY: the WR's sg_list holds num_sge entries (caller's contract).
    let list = unsafe { sg_list(w.sg_list, w.num_sge) }?;
    let imm = u32::from_be(w.imm_data);
    let (addr, rkey) = (w.wr[0], w.wr[1] as u32);
    let op = match u8::try_from(w.opcode).unwrap_or(u8::MAX) {
        wr_opcode::RDMA_WRITE => SendOp::Write {
            remote_addr: addr,
            rkey,
        },
        wr_opcode::RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
            remote_addr: addr,
            rkey,
            imm,
        },
        wr_opcode::SEND => SendOp::Send,
        wr_opcode::SEND_WITH_IMM => SendOp::SendWithImm(imm),
        wr_opcode::RDMA_READ => SendOp::Read {
            remote_addr: addr,
            rkey,
        },
        wr_opcode::ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: w.wr[0],
            compare: w.wr[1],
            swap: w.wr[2],
            rkey: w.wr[3] as u32,
        },
        wr_opcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: w.wr[0],
            add: w.wr[1],
            rkey: w.wr[3] as u32,
        },
        // invalidate_rkey is host order (not __be32).
        wr_opcode::LOCAL_INV => SendOp::LocalInv(w.imm_data),
        wr_opcode::BIND_MW => bind_op(w.bind_mw.mw, w.bind_mw.rkey, &w.bind_mw.bind_info)?,
        wr_opcode::SEND_WITH_INV => SendOp::SendWithInv(w.imm_data),
        // The 8 bytes to store are the SGE's (or inline), at wr.rdma's place.
        wr_opcode::ATOMIC_WRITE => SendOp::AtomicWrite {
            remote_addr: addr,
            rkey,
        },
        _ => {
            tracing::warn!(opcode = w.opcode, "ibv_post_send: opcode not supported");
            return Err(libc::EINVAL);
        }
    };
    // A local operation carries no data (RXE ignores the flag there).
    let inline = w.send_flags & SEND_INLINE != 0 && !op.is_local();
    let inline_data = if inline {
        // SAFETY: inline SGEs name the application's readable buffers.
        Some(unsafe { gather_inline(&list) }?)
    } else {
        None
    };
    let ud = if q.qp_type == QpType::Ud {
        let Some(ah) = ours!(Ah, w.wr[0] as usize as *mut ibv_ah) else {
            return Err(libc::EINVAL);
        };
        Some(UdDest {
            remote_qpn: Qpn::from_wire(w.wr[1] as u32),
            remote_qkey: (w.wr[1] >> 32) as u32,
            ah: ah.index,
        })
    } else {
        None
    };
    let wr = SendWr {
        wr_id: w.wr_id,
        op,
        // A local operation gathers nothing.
        sg_list: if op.is_local() { SgList::new() } else { list },
        signaled: q.sq_sig_all || w.send_flags & SEND_SIGNALED != 0,
        fence: w.send_flags & SEND_FENCE != 0,
        solicited: w.send_flags & SEND_SOLICITED != 0,
        inline,
        ud,
        inline_data,
    };
    if more {
        q.qp.post_send_more(&wr)
    } else {
        q.qp.post_send(&wr)
    }
    .map_err(PostError::errno)
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1 windows): posts the bind on `qp`
/// with the window's next rkey (`ibv_inc_rkey`) and, once posted, gives the
/// window that rkey (rdma-core's RXE provider does the same; an error
/// completion leaves the application to undo it).
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    guard("ibv_bind_mw", libc::EIO, || {
        let (Some(q), Some(m)) = (ours!(Qp, qp), ours!(Mw, mw)) else {
            return libc::EINVAL;
        };
        if bind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a readable ibv_mw_bind (caller's contract).
        let b = unsafe { &*bind };
        if m.raw.type_ != 1 || b.bind_info.mw_access_flags & ACCESS_ZERO_BASED != 0 {
            return libc::EINVAL;
        }
        let rkey = (m.raw.rkey & !0xff) | (m.raw.rkey.wrapping_add(1) & 0xff);
        let op = match bind_op(mw, rkey, &b.bind_info) {
            Ok(op) => op,
            Err(e) => return e,
        };
        let mut wr = SendWr::new(b.wr_id, op, SgList::new());
        wr.signaled = q.sq_sig_all || b.send_flags & SEND_SIGNALED != 0;
        wr.fence = b.send_flags & SEND_FENCE != 0;
        if let Err(e) = q.qp.post_send(&wr) {
            return e.errno();
        }
        // SAFETY: the application's window, which it does not touch while
        // binding it (the Verbs contract); rdma-core writes it the same way.
        unsafe { (*mw).rkey = rkey };
        0
    })
}

/// `ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        let Some(q) = ours!(Qp, qp) else {
            return libc::EINVAL;
        };
        // A list goes out together, at its last WR (an RNIC's one
        // doorbell per list).
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a readable WR list (caller's contract).
            let w = unsafe { &*cur };
            let r = post_one(q, w, !w.next.is_null());
            if let Err(e) = r {
                if cur != wr {
                    // The WRs before it were posted: they leave now.
                    q.qp.send_posted();
                }
                if !bad.is_null() {
                    // SAFETY: writable out-pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// An `ibv_recv_wr` as a [`RecvWr`].
fn recv_wr(w: &ibv_recv_wr) -> Result<RecvWr, c_int> {
    Ok(RecvWr {
        wr_id: w.wr_id,
        // SAFETY: the WR's sg_list holds num_sge entries (caller's contract).
        sg_list: unsafe { sg_list(w.sg_list, w.num_sge) }?,
    })
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        let Some(q) = ours!(Qp, qp) else {
            return libc::EINVAL;
        };
        let on_srq = !q.raw.qp_base.srq.is_null();
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a readable WR list (caller's contract).
            let w = unsafe { &*cur };
            let r = if on_srq {
                Err(libc::EINVAL)
            } else {
                recv_wr(w).and_then(|r| q.qp.post_recv(&r).map_err(PostError::errno))
            };
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: writable out-pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || {
        let Some(s) = ours!(Srq, srq) else {
            return libc::EINVAL;
        };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a readable WR list (caller's contract).
            let w = unsafe { &*cur };
            let r = recv_wr(w).and_then(|r| s.srq.post_recv(&r).map_err(PostError::errno));
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: writable out-pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// The RoCE packet type mlx5 reports in `ibv_wc.sl` of a UD receive over
/// Ethernet (UDP bit 3 | L3 type: IPv6 1, IPv4 2): UCX finds the
/// destination GID in the GRH area by it. A C-ABI convention, kept here.
fn roce_sl(h: NetworkHeader) -> u8 {
    match h {
        NetworkHeader::Ipv6 => 0x8 | 1,
        NetworkHeader::Ipv4 => 0x8 | 2,
    }
}

fn wc_of(w: &WorkCompletion) -> ibv_wc {
    // imm_data and invalidate_rkey share the field (a union in rdma-core).
    let imm = match (w.imm_data, w.invalidated_rkey) {
        (Some(i), _) => i.to_be(),
        (None, Some(k)) => k,
        (None, None) => 0,
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.value(),
        src_qp: w.src_qp.value(),
        wc_flags: w.wc_flags(),
        pkey_index: 0,
        slid: 0,
        sl: w.grh.map_or(0, roce_sl),
        dlid_path_bits: 0,
    }
}

/// `ops.poll_cq`: up to `n` completions, never blocking.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let Some(q) = ours!(Cq, cq) else {
        return -libc::EINVAL;
    };
    if n <= 0 || wc.is_null() {
        return 0;
    }
    let mut got = 0;
    while got < n {
        // Only a poll that has found nothing yet may step the lane
        // (`CompletionQueue::poll_held`). A thread-wide rule (no step on
        // the first empty poll after any completion) was measured and
        // dropped: `ib_write_lat` spins on memory and is placed only by the
        // steps of its polls.
        let next = if got == 0 {
            q.handle.poll()
        } else {
            q.handle.poll_held()
        };
        let Some(w) = next else {
            // burstd is gone: an error, not an empty CQ forever.
            if got == 0 && q.handle.device_failed() {
                return -libc::EIO;
            }
            break;
        };
        // SAFETY: the caller's array holds n entries; got < n.
        unsafe { wc.add(got as usize).write(wc_of(&w)) };
        got += 1;
    }
    got
}

// ------------------------------------------------------- ibv_cq_ex polling

/// Steps the CQ to its next completion: ENOENT when there is none, EIO
/// once burstd is gone. Only `ibv_start_poll` (`first`) may step the lane
/// for it; `ibv_next_poll` takes what the ring holds (see `poll_cq`).
fn step_cq(q: &Cq, cqx: *mut ibv_cq, first: bool) -> c_int {
    let w = if first {
        q.handle.poll()
    } else {
        q.handle.poll_held()
    };
    let Some(w) = w else {
        return if q.handle.device_failed() {
            libc::EIO
        } else {
            libc::ENOENT
        };
    };
    let wc = wc_of(&w);
    // SAFETY: `cqx` is this CQ's own ibv_cq_ex (the caller polls it); the
    // status and wr_id fields are the application's to read, ours to set.
    unsafe {
        let ex = &raw mut (*cqx.cast::<Cq>()).ex;
        (*ex).status = wc.status;
        (*ex).wr_id = wc.wr_id;
    }
    *q.current.lock().unwrap_or_else(|e| e.into_inner()) = wc;
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq, attr: *mut u32) -> c_int {
    let Some(q) = ours!(Cq, cq) else {
        return libc::EINVAL;
    };
    // `struct ibv_poll_cq_attr { uint32_t comp_mask; }`: no bit is defined.
    // SAFETY: a readable attribute (caller's contract), or null.
    if unsafe { attr.as_ref() }.is_some_and(|m| *m != 0) {
        return libc::EINVAL;
    }
    step_cq(q, cq, true)
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq) -> c_int {
    match ours!(Cq, cq) {
        Some(q) => step_cq(q, cq, false),
        None => libc::EINVAL,
    }
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq) {}

/// The current completion of an extended CQ.
fn current_wc(cq: *mut ibv_cq) -> ibv_wc {
    match ours!(Cq, cq) {
        Some(q) => *q.current.lock().unwrap_or_else(|e| e.into_inner()),
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        None => unsafe { std::mem::zeroed() },
    }
}

/// `ibv_wc_read_<field>`: one field of the current completion.
macro_rules! cq_read {
    ($($name:ident: $ty:ty = |$w:ident| $e:expr;)*) => {$(
        unsafe extern "C" fn $name(cq: *mut ibv_cq) -> $ty {
            let $w = current_wc(cq);
            $e
        }
    )*};
}

cq_read! {
    read_opcode: u32 = |w| w.opcode;
    read_vendor_err: u32 = |w| w.vendor_err;
    read_byte_len: u32 = |w| w.byte_len;
    read_imm_data: u32 = |w| w.imm_data;
    read_qp_num: u32 = |w| w.qp_num;
    read_src_qp: u32 = |w| w.src_qp;
    read_wc_flags: u32 = |w| w.wc_flags;
    read_slid: u32 = |w| u32::from(w.slid);
    read_sl: u8 = |w| w.sl;
    read_dlid_path_bits: u8 = |w| w.dlid_path_bits;
}

/// Fills the entry points of an extended CQ (the reads RXE offers; the
/// others stay null, as in rdma-core's providers).
pub(crate) fn fill_cq_ex(ex: &mut ibv_cq_ex_tail) {
    ex.start_poll = start_poll as Fp;
    ex.next_poll = next_poll as Fp;
    ex.end_poll = end_poll as Fp;
    ex.read[cqx::OPCODE] = read_opcode as Fp;
    ex.read[cqx::VENDOR_ERR] = read_vendor_err as Fp;
    ex.read[cqx::BYTE_LEN] = read_byte_len as Fp;
    ex.read[cqx::IMM_DATA] = read_imm_data as Fp;
    ex.read[cqx::QP_NUM] = read_qp_num as Fp;
    ex.read[cqx::SRC_QP] = read_src_qp as Fp;
    ex.read[cqx::WC_FLAGS] = read_wc_flags as Fp;
    ex.read[cqx::SLID] = read_slid as Fp;
    ex.read[cqx::SL] = read_sl as Fp;
    ex.read[cqx::DLID_PATH_BITS] = read_dlid_path_bits as Fp;
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    let Some(q) = ours!(Cq, cq) else {
        return libc::EINVAL;
    };
    // SAFETY: a CQ of ours stores the context it was made on.
    let Some(c) = (unsafe { ctx_of(q.raw.context) }) else {
        return libc::EINVAL;
    };
    // Solicited-only arming fires on any completion: allowed (a superset).
    match c.ctx.req_notify_cq(q.id) {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

// ------------------------------------------------------------ ibv_wr_*

/// Runs `f` on the QP behind a `ibv_qp_ex` and its batch.
fn with_batch(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut WrBatch)) {
    let Some(q) = ours!(Qp, qpx) else { return };
    let mut b = q.wr.lock().unwrap_or_else(|e| e.into_inner());
    f(q, &mut b);
}

/// Starts a WR with the `wr_id` and `wr_flags` the application wrote.
fn begin(qpx: *mut ibv_qp_ex, op: SendOp) {
    with_batch(qpx, |q, b| {
        let (id, flags) = (q.raw.wr_id, q.raw.wr_flags);
        let mut wr = SendWr::new(id, op, SgList::new());
        wr.signaled = q.sq_sig_all || flags & SEND_SIGNALED != 0;
        wr.fence = flags & SEND_FENCE != 0;
        wr.solicited = flags & SEND_SOLICITED != 0;
        wr.inline = flags & SEND_INLINE != 0 && !op.is_local();
        b.wrs.push(wr);
    });
}

/// Applies `f` to the WR being built (an error if there is none).
fn current(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut SendWr) -> Result<(), c_int>) {
    with_batch(qpx, |q, b| {
        let r = match b.wrs.last_mut() {
            Some(w) => f(q, w),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r {
            if b.error == 0 {
                b.error = e;
            }
        }
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, b| *b = WrBatch::default());
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    guard("ibv_wr_complete", libc::EIO, || {
        let Some(q) = ours!(Qp, qpx) else {
            return libc::EINVAL;
        };
        let b = std::mem::take(&mut *q.wr.lock().unwrap_or_else(|e| e.into_inner()));
        if b.error != 0 {
            return b.error;
        }
        // The batch goes out together, at its last WR, as a list does.
        for (i, wr) in b.wrs.iter().enumerate() {
            let r = if i + 1 < b.wrs.len() {
                q.qp.post_send_more(wr)
            } else {
                q.qp.post_send(wr)
            };
            if let Err(e) = r {
                if i > 0 {
                    q.qp.send_posted();
                }
                return e.errno();
            }
        }
        0
    })
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |_, b| *b = WrBatch::default());
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    begin(qpx, SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    begin(qpx, SendOp::SendWithImm(u32::from_be(imm)));
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    begin(qpx, SendOp::SendWithInv(rkey));
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qpx, SendOp::Write { remote_addr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    let imm = u32::from_be(imm);
    begin(
        qpx,
        SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm,
        },
    );
}

unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if info.is_null() {
        with_batch(qpx, |_, b| b.error = libc::EINVAL);
        return;
    }
    // SAFETY: a readable bind info (caller's contract).
    match bind_op(mw, rkey, unsafe { &*info }) {
        Ok(op) => begin(qpx, op),
        Err(e) => with_batch(qpx, |_, b| {
            if b.error == 0 {
                b.error = e;
            }
        }),
    }
}

unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    begin(qpx, SendOp::LocalInv(rkey));
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(qpx, SendOp::Read { remote_addr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(
        qpx,
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    begin(
        qpx,
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

/// `ibv_wr_atomic_write`: the 8 bytes at `value` are captured now (as
/// inline data; the WR takes no SGE), as RXE's provider copies them into
/// its WQE.
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    value: *const c_void,
) {
    begin(qpx, SendOp::AtomicWrite { remote_addr, rkey });
    current(qpx, |q, w| {
        if value.is_null() {
            return Err(libc::EINVAL);
        }
        set_inline(q, w, &[(value as u64, 8)])
    });
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    current(qpx, |q, w| {
        w.sg_list = [Sge { addr, length, lkey }].into();
        finish_inline(q, w)
    });
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    current(qpx, |q, w| {
        let n = c_int::try_from(n).map_err(|_| libc::EINVAL)?;
        // SAFETY: the caller's list holds n SGEs.
        w.sg_list = unsafe { sg_list(list, n) }?;
        finish_inline(q, w)
    });
}

/// An inline WR's bytes are captured as soon as its SGEs are known.
fn finish_inline(_q: &Qp, w: &mut SendWr) -> Result<(), c_int> {
    if w.inline {
        // SAFETY: inline SGEs name the application's readable buffers.
        w.inline_data = Some(unsafe { gather_inline(&w.sg_list) }?);
    }
    Ok(())
}

#[repr(C)]
struct ibv_data_buf {
    addr: *mut c_void,
    length: usize,
}

/// `ibv_wr_set_inline_data{,_list}`: the bytes are captured now; the WR's
/// SGE list becomes one entry of their total length (what the checks at
/// post compare the inline size with).
fn set_inline(_q: &Qp, w: &mut SendWr, bufs: &[(u64, usize)]) -> Result<(), c_int> {
    let len: usize = bufs.iter().map(|b| b.1).sum();
    let pieces: Vec<Sge> = bufs
        .iter()
        .map(|&(addr, n)| Sge {
            addr,
            length: u32::try_from(n).unwrap_or(u32::MAX),
            lkey: 0,
        })
        .collect();
    // SAFETY: the application's buffers, readable (its contract).
    let d = unsafe { burst_verbs::gather_inline(&pieces) }.map_err(|v| v.errno())?;
    w.inline_data = Some(d);
    w.sg_list = [Sge {
        addr: bufs.first().map_or(0, |b| b.0),
        length: len as u32,
        lkey: 0,
    }]
    .into();
    w.inline = true;
    Ok(())
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    current(qpx, |q, w| set_inline(q, w, &[(addr as u64, length)]));
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    current(qpx, |q, w| {
        if list.is_null() && n > 0 {
            return Err(libc::EINVAL);
        }
        let l = if n == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's list holds n buffers.
            unsafe { std::slice::from_raw_parts(list, n) }
        };
        let bufs: Vec<(u64, usize)> = l.iter().map(|b| (b.addr as u64, b.length)).collect();
        set_inline(q, w, &bufs)
    });
}

unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    current(qpx, |_, w| {
        let Some(a) = ours!(Ah, ah) else {
            return Err(libc::EINVAL);
        };
        w.ud = Some(UdDest {
            remote_qpn: Qpn::from_wire(remote_qpn),
            remote_qkey,
            ah: a.index,
        });
        Ok(())
    });
}

/// Fills the `ibv_wr_*` pointers of a QP created with send-ops flags.
pub(crate) fn install_wr_ops(q: &mut ibv_qp_ex) {
    let o = &mut q.ops;
    o[wrop::ATOMIC_CMP_SWP] = wr_atomic_cmp_swp as Fp;
    o[wrop::ATOMIC_FETCH_ADD] = wr_atomic_fetch_add as Fp;
    o[wrop::BIND_MW] = wr_bind_mw as Fp;
    o[wrop::LOCAL_INV] = wr_local_inv as Fp;
    o[wrop::RDMA_READ] = wr_rdma_read as Fp;
    o[wrop::RDMA_WRITE] = wr_rdma_write as Fp;
    o[wrop::RDMA_WRITE_IMM] = wr_rdma_write_imm as Fp;
    o[wrop::SEND] = wr_send as Fp;
    o[wrop::SEND_IMM] = wr_send_imm as Fp;
    o[wrop::SEND_INV] = wr_send_inv as Fp;
    o[wrop::SET_UD_ADDR] = wr_set_ud_addr as Fp;
    o[wrop::SET_INLINE_DATA] = wr_set_inline_data as Fp;
    o[wrop::SET_INLINE_DATA_LIST] = wr_set_inline_data_list as Fp;
    o[wrop::SET_SGE] = wr_set_sge as Fp;
    o[wrop::SET_SGE_LIST] = wr_set_sge_list as Fp;
    o[wrop::START] = wr_start as Fp;
    o[wrop::COMPLETE] = wr_complete as Fp;
    o[wrop::ABORT] = wr_abort as Fp;
    o[wrop::ATOMIC_WRITE] = wr_atomic_write as Fp;
}
