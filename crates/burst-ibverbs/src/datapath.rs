//! The data path the applications' inline verbs call through the context's
//! ops table: post_send, post_recv, post_srq_recv, poll_cq, req_notify_cq;
//! and the `ibv_wr_*` extended post-send API of QPs from `ibv_create_qp_ex`.
//!
//! Work requests go into the QP's ring with no lookup (the QP object holds
//! its ring handle); inline data is copied from the application's buffers
//! here, as `ibv_post_send` promises.

use std::ffi::{c_int, c_void};

use burst_verbs::engine::{PostError, SendDesc, RING_MAX_INLINE, RING_MAX_SGE};
use burst_verbs::transport::{QpType, SendOp, SendWr, Sge, UdDest, WorkCompletion};
use burst_verbs::wire::Qpn;

use crate::abi::*;
use crate::guard;
use crate::objects::{ctx_of, ours, Ah, Cq, Qp, Srq, WrBatch};

const SEND_FENCE: u32 = 1;
const SEND_SIGNALED: u32 = 2;
const SEND_SOLICITED: u32 = 4;
const SEND_INLINE: u32 = 8;

fn errno_of(e: PostError) -> c_int {
    match e {
        PostError::Full => libc::ENOMEM,
        PostError::Stopped => libc::EIO,
        PostError::NoSuch | PostError::Invalid => libc::EINVAL,
    }
}

/// Reads an SGE array from the application.
///
/// # Safety
/// `sg` must point to `n` readable SGEs when `n > 0`.
unsafe fn sges(sg: *const ibv_sge, n: c_int) -> Vec<Sge> {
    if n <= 0 || sg.is_null() {
        return Vec::new();
    }
    // SAFETY: caller's contract.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    s.iter()
        .map(|e| Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        })
        .collect()
}

/// Copies the bytes the SGEs name into `out` (inline sends: no key
/// needed, the addresses are the application's own); `out` is their total.
///
/// # Safety
/// Each SGE must name readable process memory.
unsafe fn gather_into(list: &[Sge], out: &mut [u8]) {
    let mut at = 0;
    for s in list {
        let n = s.length as usize;
        if n > 0 {
            // SAFETY: caller's contract.
            let src = unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, n) };
            out[at..at + n].copy_from_slice(src);
            at += n;
        }
    }
}

/// [`gather_into`] a new buffer (the `ibv_wr_*` path, which owns its WRs).
///
/// # Safety
/// Each SGE must name readable process memory.
unsafe fn gather_inline(list: &[Sge]) -> Vec<u8> {
    let mut out = vec![0; list.iter().map(|s| s.length as usize).sum()];
    // SAFETY: forwarded contract.
    unsafe { gather_into(list, &mut out) };
    out
}

/// Posts one `ibv_send_wr`: its SGEs and inline bytes go through stack
/// buffers straight into the ring entry (no allocation per WR).
fn post_one(q: &Qp, w: &ibv_send_wr) -> Result<(), c_int> {
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > q.cap.max_send_sge.max(1) as usize || n > RING_MAX_SGE || (n > 0 && w.sg_list.is_null())
    {
        return Err(libc::EINVAL);
    }
    let mut list = [Sge::default(); RING_MAX_SGE];
    if n > 0 {
        // SAFETY: the WR's sg_list holds num_sge entries (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(w.sg_list, n) };
        for (d, e) in list.iter_mut().zip(src) {
            *d = Sge {
                addr: e.addr,
                length: e.length,
                lkey: e.lkey,
            };
        }
    }
    let list = &list[..n];
    let imm = u32::from_be(w.imm_data);
    let (addr, rkey) = (w.wr[0], w.wr[1] as u32);
    let op = match w.opcode {
        0 => SendOp::Write {
            remote_addr: addr,
            rkey,
        },
        1 => SendOp::WriteWithImm {
            remote_addr: addr,
            rkey,
            imm,
        },
        2 => SendOp::Send,
        3 => SendOp::SendWithImm(imm),
        4 => SendOp::Read {
            remote_addr: addr,
            rkey,
        },
        5 => SendOp::CompareSwap {
            remote_addr: w.wr[0],
            compare: w.wr[1],
            swap: w.wr[2],
            rkey: w.wr[3] as u32,
        },
        6 => SendOp::FetchAdd {
            remote_addr: w.wr[0],
            add: w.wr[1],
            rkey: w.wr[3] as u32,
        },
        // invalidate_rkey is host order (not __be32).
        9 => SendOp::SendWithInv(w.imm_data),
        other => {
            tracing::warn!(opcode = other, "ibv_post_send: opcode not supported");
            return Err(libc::EINVAL);
        }
    };
    let mut bytes = [0u8; RING_MAX_INLINE];
    let inline = if w.send_flags & SEND_INLINE != 0 {
        let len: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if len > u64::from(q.cap.max_inline_data) || len > RING_MAX_INLINE as u64 {
            return Err(libc::EINVAL);
        }
        let out = &mut bytes[..len as usize];
        // SAFETY: inline SGEs name the application's readable buffers.
        unsafe { gather_into(list, out) };
        Some(&*out)
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
    let d = SendDesc {
        wr_id: w.wr_id,
        op,
        sges: list,
        signaled: q.sq_sig_all || w.send_flags & SEND_SIGNALED != 0,
        fence: w.send_flags & SEND_FENCE != 0,
        solicited: w.send_flags & SEND_SOLICITED != 0,
        inline,
        ud,
    };
    q.qp.post_send_desc(&d).map_err(errno_of)
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
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a readable WR list (caller's contract).
            let w = unsafe { &*cur };
            let r = post_one(q, w);
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

/// Copies a receive WR's SGEs into `out`; returns how many.
fn recv_sges(w: &ibv_recv_wr, max_sge: u32, out: &mut [Sge; RING_MAX_SGE]) -> Result<usize, c_int> {
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > max_sge.max(1) as usize || n > RING_MAX_SGE || (n > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    if n > 0 {
        // SAFETY: the WR's sg_list holds num_sge entries (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(w.sg_list, n) };
        for (d, e) in out.iter_mut().zip(src) {
            *d = Sge {
                addr: e.addr,
                length: e.length,
                lkey: e.lkey,
            };
        }
    }
    Ok(n)
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
                let mut list = [Sge::default(); RING_MAX_SGE];
                recv_sges(w, q.cap.max_recv_sge, &mut list)
                    .and_then(|n| q.qp.post_recv_sges(w.wr_id, &list[..n]).map_err(errno_of))
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
            let mut list = [Sge::default(); RING_MAX_SGE];
            let r = recv_sges(w, s.max_sge, &mut list)
                .and_then(|n| s.srq.post_recv_sges(w.wr_id, &list[..n]).map_err(errno_of));
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

const WC_GRH: u32 = 1;
const WC_WITH_IMM: u32 = 2;
const WC_WITH_INV: u32 = 4;

fn wc_of(w: &WorkCompletion) -> ibv_wc {
    let mut flags = 0;
    if w.grh {
        flags |= WC_GRH;
    }
    let mut imm = 0;
    if let Some(i) = w.imm_data {
        flags |= WC_WITH_IMM;
        imm = i.to_be();
    } else if let Some(k) = w.invalidated_rkey {
        flags |= WC_WITH_INV;
        imm = k;
    }
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.value(),
        src_qp: w.src_qp.value(),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
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
        let Some(w) = q.handle.poll() else { break };
        // SAFETY: the caller's array holds n entries; got < n.
        unsafe { wc.add(got as usize).write(wc_of(&w)) };
        got += 1;
    }
    got
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
        Err(e) => errno_of(e),
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
        let mut wr = SendWr::new(id, op, Vec::new());
        wr.signaled = q.sq_sig_all || flags & SEND_SIGNALED != 0;
        wr.fence = flags & SEND_FENCE != 0;
        wr.solicited = flags & SEND_SOLICITED != 0;
        wr.inline = flags & SEND_INLINE != 0;
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
        for wr in &b.wrs {
            if let Err(e) = q.qp.post_send(wr) {
                return errno_of(e);
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

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    current(qpx, |q, w| {
        w.sg_list = burst_verbs::transport::SgList::from_slice(&[Sge { addr, length, lkey }]);
        finish_inline(q, w)
    });
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    current(qpx, |q, w| {
        if n > q.cap.max_send_sge.max(1) as usize {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's list holds n SGEs.
        w.sg_list = unsafe { sges(list, n as c_int) }.into();
        finish_inline(q, w)
    });
}

/// An inline WR's bytes are captured as soon as its SGEs are known.
fn finish_inline(q: &Qp, w: &mut SendWr) -> Result<(), c_int> {
    if w.inline {
        let len: u64 = w.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if len > u64::from(q.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        // SAFETY: inline SGEs name the application's readable buffers.
        w.inline_data = Some(unsafe { gather_inline(&w.sg_list) });
    }
    Ok(())
}

#[repr(C)]
struct ibv_data_buf {
    addr: *mut c_void,
    length: usize,
}

fn set_inline(q: &Qp, w: &mut SendWr, bufs: &[(u64, usize)]) -> Result<(), c_int> {
    let len: usize = bufs.iter().map(|b| b.1).sum();
    if len > q.cap.max_inline_data as usize {
        return Err(libc::EINVAL);
    }
    let list: Vec<Sge> = bufs
        .iter()
        .map(|&(addr, length)| Sge {
            addr,
            length: length as u32,
            lkey: 0,
        })
        .collect();
    // SAFETY: the application's buffers, readable (its contract).
    w.inline_data = Some(unsafe { gather_inline(&list) });
    w.sg_list = list.into();
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
}
