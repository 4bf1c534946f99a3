//! Resources: protection domains, memory regions, completion channels and
//! queues, queue pairs, shared receive queues, address handles, events.
//!
//! Every object the application gets is a `#[repr(C)]` box whose first
//! field is the libibverbs struct, so the pointer it holds is the pointer
//! to our object. Each entry point checks its pointers for NULL and returns
//! the errno rdma-core would; beyond that, passing a pointer that is not of
//! ours is the caller's undefined behaviour, as with rdma-core.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use burst_verbs::engine::PostError;
use burst_verbs::{Access, MwType};
use burst_verbs::{AsyncEvent, QpCaps, QpInit};
use burst_verbs::{Mtu, Psn, Qpn};
use burst_verbs::{QpAccess, QpAttr, QpEvent, QpState, QpType};

use crate::abi::*;
use crate::objects::*;
use crate::{guard, set_errno};

fn boxed<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees an object made by [`boxed`].
///
/// # Safety
/// `p` must come from `boxed::<T>` and not be used afterwards.
unsafe fn free<T>(p: *mut T) {
    // SAFETY: caller's contract.
    drop(unsafe { Box::from_raw(p) });
}

fn fail_null<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    ptr::null_mut()
}

/// The context a PD/CQ/QP/… belongs to (its C struct's `context` field).
fn ctx_from<'a>(context: *mut ibv_context) -> Option<&'a Ctx> {
    // SAFETY: every object we hand out stores the context it was made on.
    unsafe { ctx_of(context) }
}

// ------------------------------------------------------------------- PD

pub(crate) unsafe extern "C" fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard("ibv_alloc_pd", ptr::null_mut(), || {
        let Some(c) = ctx_from(context) else {
            return fail_null(libc::EINVAL);
        };
        let pd = match c.ctx.try_alloc_pd() {
            Ok(pd) => pd,
            Err(e) => {
                tracing::warn!("ibv_alloc_pd refused: {e}");
                return fail_null(e.errno());
            }
        };
        boxed(Pd {
            raw: ibv_pd {
                context,
                handle: pd.0,
            },
            pd,
        })
        .cast()
    })
}
export!("ibv_alloc_pd", "IBVERBS_1.1", alloc_pd);

pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || {
        let Some(p) = ours!(Pd, pd) else {
            return libc::EINVAL;
        };
        if let Some(c) = ctx_from(p.raw.context) {
            if let Err(e) = c.ctx.dealloc_pd(p.pd) {
                tracing::warn!("ibv_dealloc_pd refused: {e}");
                return e.errno();
            }
        }
        // SAFETY: a PD of ours (caller's contract), freed once.
        unsafe { free(pd.cast::<Pd>()) };
        0
    })
}
export!("ibv_dealloc_pd", "IBVERBS_1.1", dealloc_pd);

// ------------------------------------------------------------------- MR

/// Access bits rdma-core defines as optional (ignored when unsupported):
/// relaxed ordering and the rest of IBV_ACCESS_OPTIONAL_RANGE.
const OPTIONAL_RANGE: u32 = 0x3ff0_0000;
/// IBV_ACCESS_ON_DEMAND: needs ODP, which burst does not report.
const ON_DEMAND: u32 = 0x40;

unsafe extern "C" fn reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard("ibv_reg_mr", ptr::null_mut(), || {
        let Some(p) = ours!(Pd, pd) else {
            return fail_null(libc::EINVAL);
        };
        // SAFETY: forwarded contract.
        match unsafe { register(p, addr, length, iova, access) } {
            Ok((k, access)) => boxed(Mr {
                raw: ibv_mr {
                    context: p.raw.context,
                    pd,
                    addr,
                    length,
                    handle: k.lkey,
                    lkey: k.lkey,
                    rkey: k.rkey,
                },
                iova,
                access,
            })
            .cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// Registers `addr..addr+length` on `p` with ibv_reg_mr's checks and
/// errno; returns the keys and the access kept (optional bits dropped).
///
/// # Safety
/// The application keeps the range valid until it is deregistered (the
/// Verbs contract); the engine reaches it in place.
unsafe fn register(
    p: &Pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<(burst_verbs::MrKeys, u32), c_int> {
    let c = ctx_from(p.raw.context).ok_or(libc::EINVAL)?;
    let access = access & !OPTIONAL_RANGE;
    if access & ON_DEMAND != 0 {
        tracing::warn!("ibv_reg_mr: on-demand paging is not supported");
        return Err(libc::EOPNOTSUPP);
    }
    if addr.is_null() && length > 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: forwarded contract.
    let keys = unsafe {
        c.ctx
            .reg_mr_iova(p.pd, addr.cast(), length, iova, Access(access & 0x1f))
    };
    keys.map(|k| (k, access)).map_err(|e| {
        tracing::warn!("ibv_reg_mr refused: {e}");
        e.errno()
    })
}
export!("ibv_reg_mr_iova2", "IBVERBS_1.8", reg_mr_iova2);

unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract; the IOVA is the address itself.
    unsafe { reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}
export!("ibv_reg_mr", "IBVERBS_1.1", reg_mr);

unsafe extern "C" fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr_iova2(pd, addr, length, iova, access as u32) }
}
export!("ibv_reg_mr_iova", "IBVERBS_1.7", reg_mr_iova);

unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || {
        let Some(m) = ours!(Mr, mr) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(m.raw.context) else {
            return libc::EINVAL;
        };
        // Waits until the engine no longer uses the region.
        if let Err(e) = c.ctx.dereg_mr(m.raw.lkey) {
            return e.errno();
        }
        // SAFETY: an MR of ours, freed once.
        unsafe { free(mr.cast::<Mr>()) };
        0
    })
}
export!("ibv_dereg_mr", "IBVERBS_1.1", dereg_mr);

// ------------------------------------------------------------------- MW

/// `ops.alloc_mw` (`ibv_alloc_mw`): a type 1 or type 2 window of `pd`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, kind: u32) -> *mut ibv_mw {
    guard("ibv_alloc_mw", ptr::null_mut(), || {
        let Some(p) = ours!(Pd, pd) else {
            return fail_null(libc::EINVAL);
        };
        let Some(c) = ctx_from(p.raw.context) else {
            return fail_null(libc::EINVAL);
        };
        let Some(kind_) = MwType::from_verbs(kind) else {
            tracing::warn!(kind, "ibv_alloc_mw: no such window type");
            return fail_null(libc::EINVAL);
        };
        match c.ctx.alloc_mw(p.pd, kind_) {
            Ok(k) => boxed(Mw {
                raw: ibv_mw {
                    context: p.raw.context,
                    pd,
                    rkey: k.rkey,
                    handle: k.handle,
                    type_: kind,
                },
            })
            .cast(),
            Err(e) => {
                tracing::warn!("ibv_alloc_mw refused: {e}");
                fail_null(e.errno())
            }
        }
    })
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`).
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard("ibv_dealloc_mw", libc::EIO, || {
        let Some(m) = ours!(Mw, mw) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(m.raw.context) else {
            return libc::EINVAL;
        };
        if let Err(e) = c.ctx.dealloc_mw(m.raw.handle) {
            tracing::warn!("ibv_dealloc_mw refused: {e}");
            return e.errno();
        }
        // SAFETY: a window of ours, freed once.
        unsafe { free(mw.cast::<Mw>()) };
        0
    })
}

// `enum ibv_rereg_mr_flags` and `enum ibv_rereg_mr_err_code`.
const REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
const REREG_MR_CHANGE_PD: c_int = 1 << 1;
const REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
const REREG_MR_ERR_INPUT: c_int = -1;
const REREG_MR_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: what `flags` changes (address and length, PD, access)
/// takes effect and the MR keeps its handle and its keys, as on RXE and
/// mlx5 (applications and their peers go on using the keys they hold). A
/// refused registration leaves the MR as it was (IBV_REREG_MR_ERR_CMD,
/// errno).
unsafe extern "C" fn rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard("ibv_rereg_mr", REREG_MR_ERR_CMD, || {
        let all = REREG_MR_CHANGE_TRANSLATION | REREG_MR_CHANGE_PD | REREG_MR_CHANGE_ACCESS;
        let translation = flags & REREG_MR_CHANGE_TRANSLATION != 0;
        let bad_input = flags & !all != 0
            || flags == 0
            || (translation && (addr.is_null() || length == 0))
            || (!translation && length != 0);
        let Some(m) = ours!(Mr, mr) else {
            set_errno(libc::EINVAL);
            return REREG_MR_ERR_INPUT;
        };
        if bad_input {
            set_errno(libc::EINVAL);
            return REREG_MR_ERR_INPUT;
        }
        let new_pd = if flags & REREG_MR_CHANGE_PD != 0 {
            pd
        } else {
            m.raw.pd
        };
        let (new_addr, new_len, new_iova) = if translation {
            (addr, length, addr as u64)
        } else {
            (m.raw.addr, m.raw.length, m.iova)
        };
        let new_access = if flags & REREG_MR_CHANGE_ACCESS != 0 {
            access as u32
        } else {
            m.access
        };
        let (Some(p), Some(c)) = (ours!(Pd, new_pd), ctx_from(m.raw.context)) else {
            set_errno(libc::EINVAL);
            return REREG_MR_ERR_INPUT;
        };
        // SAFETY: the application's contract for the new range, as for
        // ibv_reg_mr; the old range stays registered until the new one is.
        let (fresh, new_access) =
            match unsafe { register(p, new_addr, new_len, new_iova, new_access) } {
                Ok(r) => r,
                Err(e) => {
                    set_errno(e);
                    return REREG_MR_ERR_CMD;
                }
            };
        let (lkey, rkey) = match c.ctx.replace_mr(m.raw.lkey, fresh.lkey) {
            Ok(k) => (k.lkey, k.rkey),
            Err(e) => {
                tracing::warn!("ibv_rereg_mr refused: {e}");
                let _ = c.ctx.dereg_mr(fresh.lkey);
                set_errno(e.errno());
                return REREG_MR_ERR_CMD;
            }
        };
        // SAFETY: the caller's MR (ours); C owns the struct, so the new
        // values are written through the pointer.
        unsafe {
            let raw = &raw mut (*mr.cast::<Mr>()).raw;
            (*raw).pd = new_pd;
            (*raw).addr = new_addr;
            (*raw).length = new_len;
            (*raw).lkey = lkey;
            (*raw).rkey = rkey;
            (*mr.cast::<Mr>()).iova = new_iova;
            (*mr.cast::<Mr>()).access = new_access;
        }
        0
    })
}
export!("ibv_rereg_mr", "IBVERBS_1.1", rereg_mr);

// ---------------------------------------------------- completion channels

pub(crate) unsafe extern "C" fn create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", ptr::null_mut(), || {
        let Some(c) = ctx_from(context) else {
            return fail_null(libc::EINVAL);
        };
        let ch = match c.ctx.create_comp_channel() {
            Ok(ch) => ch,
            Err(e) => return fail_null(e.raw_os_error().unwrap_or(libc::EMFILE)),
        };
        boxed(Channel {
            raw: ibv_comp_channel {
                context,
                fd: ch.fd(),
                refcnt: 0,
            },
            ch,
            cqs: Mutex::new(HashMap::new()),
        })
        .cast()
    })
}
export!(
    "ibv_create_comp_channel",
    "IBVERBS_1.0",
    create_comp_channel
);

pub(crate) unsafe extern "C" fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    let Some(ch) = ours!(Channel, channel) else {
        return libc::EINVAL;
    };
    if !ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return libc::EBUSY;
    }
    // burstd lets go of its end (and of the channel's count in its limits).
    if let Some(c) = ctx_from(ch.raw.context) {
        if let Err(e) = c.ctx.destroy_comp_channel(&ch.ch) {
            tracing::debug!("ibv_destroy_comp_channel: {e}");
        }
    }
    // SAFETY: a channel of ours with no CQ left, freed once.
    unsafe { free(channel.cast::<Channel>()) };
    0
}
export!(
    "ibv_destroy_comp_channel",
    "IBVERBS_1.0",
    destroy_comp_channel
);

unsafe extern "C" fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        let Some(ch) = ours!(Channel, channel) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        // As rdma-core: a read of the channel's fd, which blocks unless the
        // application made it non-blocking (then EAGAIN), and fails with
        // EINTR when a signal interrupts it.
        let id = match ctx_from(ch.raw.context) {
            // Blocking: this thread waits on the device's port too and makes
            // the completion it waits for itself (one wake-up).
            Some(c) if !nonblocking(ch.ch.fd()) => {
                match c.ctx.wait_cq_event(&ch.ch, std::time::Duration::MAX) {
                    Ok(id) => id,
                    Err(e) => {
                        set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                        return -1;
                    }
                }
            }
            _ => ch.ch.read_cq_event(),
        };
        let Some(id) = id else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        let p = ch
            .cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id.0)
            .copied();
        let Some(p) = p else {
            // The CQ was destroyed after its event fired.
            set_errno(libc::EINVAL);
            return -1;
        };
        let q = p as *mut ibv_cq;
        // SAFETY: out-pointers from the caller; `q` is a live CQ of ours.
        unsafe {
            if !cq.is_null() {
                *cq = q;
            }
            if !cq_context.is_null() {
                *cq_context = (*q).cq_context;
            }
        }
        0
    })
}
export!("ibv_get_cq_event", "IBVERBS_1.1", get_cq_event);

/// Whether the application made `fd` non-blocking (`O_NONBLOCK`).
fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor number; no memory is passed (a closed
    // descriptor returns -1).
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // The count lives where rdma-core keeps it, in the public struct;
    // atomically, since acks may come from several threads.
    // SAFETY: a CQ of ours; the u32 field is aligned and only ever
    // accessed through this atomic view.
    let n = unsafe { AtomicU32::from_ptr(&raw mut (*cq).comp_events_completed) };
    n.fetch_add(nevents, Ordering::Relaxed);
}
export!("ibv_ack_cq_events", "IBVERBS_1.1", ack_cq_events);

// ------------------------------------------------------------------- CQ

pub(crate) unsafe extern "C" fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", ptr::null_mut(), || {
        match new_cq(context, cqe, cq_context, channel, comp_vector) {
            Ok(p) => p.cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// A CQ of ours (with the `ibv_cq_ex` tail, unfilled), or the errno.
fn new_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, c_int> {
    let c = ctx_from(context).ok_or(libc::EINVAL)?;
    if !(1..=MAX_CQE).contains(&cqe)
        || comp_vector < 0
        || comp_vector >= c.vctx.context.num_comp_vectors
    {
        tracing::warn!(
            cqe,
            comp_vector,
            "ibv_create_cq: size or vector out of range"
        );
        return Err(libc::EINVAL);
    }
    let ch = ours!(Channel, channel);
    let id = c
        .ctx
        .try_create_cq(cqe as usize, ch.map(|ch| Arc::clone(&ch.ch)))
        .map_err(|e| {
            tracing::warn!("ibv_create_cq refused: {e}");
            e.errno()
        })?;
    let handle = c.ctx.cq(id).ok_or(libc::EIO)?;
    // SAFETY: ibv_cq, its ex tail and ibv_wc are plain data (null function
    // pointers are None); all-zero is valid.
    let (mut raw, ex, wc): (ibv_cq, ibv_cq_ex_tail, ibv_wc) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    raw.context = context;
    raw.channel = channel;
    raw.cq_context = cq_context;
    raw.handle = id.0;
    raw.cqe = cqe;
    let p = boxed(Cq {
        raw,
        ex,
        current: Mutex::new(wc),
        handle,
        id,
        users: AtomicU32::new(0),
    });
    if let Some(ch) = ch {
        ch.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.0, p as usize);
    }
    c.cqs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.0, p as usize);
    Ok(p)
}
export!("ibv_create_cq", "IBVERBS_1.1", create_cq);

/// `ibv_resize_cq`: a new depth in 1..=MAX_CQE and not below the
/// completions the CQ holds (EINVAL otherwise, as RXE's `rxe_cq_chk_attr`).
/// The engine never overruns a CQ (completions past its ring wait in the
/// engine), so the depth is what `cq->cqe` reports; the ring keeps its
/// size.
unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard("ibv_resize_cq", libc::EIO, || {
        let Some(c) = ours!(Cq, cq) else {
            return libc::EINVAL;
        };
        if !(1..=MAX_CQE).contains(&cqe) {
            tracing::warn!(cqe, "ibv_resize_cq: size out of range");
            return libc::EINVAL;
        }
        let held = c.handle.settled_len();
        if (cqe as usize) < held {
            tracing::warn!(cqe, held, "ibv_resize_cq: fewer entries than the CQ holds");
            return libc::EINVAL;
        }
        // SAFETY: the caller's CQ (ours); C owns the struct.
        unsafe { (*cq).cqe = cqe };
        0
    })
}
export!("ibv_resize_cq", "IBVERBS_1.1", resize_cq);

// `enum ibv_create_cq_wc_flags`: what RXE's provider accepts.
const WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
const WC_EX_WITH_IMM: u64 = 1 << 1;
const WC_EX_WITH_QP_NUM: u64 = 1 << 2;
const WC_EX_WITH_SRC_QP: u64 = 1 << 3;
const WC_EX_WITH_SLID: u64 = 1 << 4;
const WC_EX_WITH_SL: u64 = 1 << 5;
const WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
const WC_EX_SUPPORTED: u64 = WC_EX_WITH_BYTE_LEN
    | WC_EX_WITH_IMM
    | WC_EX_WITH_QP_NUM
    | WC_EX_WITH_SRC_QP
    | WC_EX_WITH_SLID
    | WC_EX_WITH_SL
    | WC_EX_WITH_DLID_PATH_BITS;
// `ibv_cq_init_attr_ex.comp_mask` and `.flags`.
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
const CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex`): a CQ polled with
/// `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and read with the
/// `ibv_wc_read_*` calls `wc_flags` asks for. As RXE: byte_len, imm,
/// qp_num, src_qp, slid, sl and dlid_path_bits; no timestamps, no parent
/// domain (EOPNOTSUPP).
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq {
    guard("ibv_create_cq_ex", ptr::null_mut(), || {
        // SAFETY: a readable attribute struct (caller's contract).
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return fail_null(libc::EINVAL);
        };
        if a.wc_flags & !WC_EX_SUPPORTED != 0 {
            tracing::warn!(
                wc_flags = a.wc_flags,
                "ibv_create_cq_ex: a wc_flag burst does not offer (timestamps, cvlan, flow tag, TM)"
            );
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0)
        {
            tracing::warn!(
                comp_mask = a.comp_mask,
                flags = a.flags,
                "ibv_create_cq_ex: parent domains and CQ flags other than SINGLE_THREADED are not offered"
            );
            return fail_null(libc::EOPNOTSUPP);
        }
        let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            return fail_null(libc::EINVAL);
        };
        match new_cq(context, cqe, a.cq_context, a.channel, vector) {
            Ok(p) => {
                // SAFETY: our fresh CQ, not yet shared.
                let q = unsafe { &mut *p };
                crate::datapath::fill_cq_ex(&mut q.ex);
                p.cast()
            }
            Err(e) => fail_null(e),
        }
    })
}

pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || {
        let Some(q) = ours!(Cq, cq) else {
            return libc::EINVAL;
        };
        if q.users.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        if let Some(c) = ctx_from(q.raw.context) {
            if let Err(e) = c.ctx.destroy_cq(q.id) {
                tracing::warn!("ibv_destroy_cq refused: {e}");
                return e.errno();
            }
            c.cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&q.id.0);
        }
        if let Some(ch) = ours!(Channel, q.raw.channel) {
            ch.cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&q.id.0);
        }
        // SAFETY: a CQ of ours with no QP left, freed once.
        unsafe { free(cq.cast::<Cq>()) };
        0
    })
}
export!("ibv_destroy_cq", "IBVERBS_1.1", destroy_cq);

// ------------------------------------------------------------------- SRQ

pub(crate) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard("ibv_create_srq", ptr::null_mut(), || {
        let (Some(p), false) = (ours!(Pd, pd), init.is_null()) else {
            return fail_null(libc::EINVAL);
        };
        let Some(c) = ctx_from(p.raw.context) else {
            return fail_null(libc::EINVAL);
        };
        // SAFETY: a readable and writable ibv_srq_init_attr (caller's contract).
        let init = unsafe { &mut *init };
        let a = init.attr;
        let srq = match c.ctx.create_srq(p.pd, a.max_wr, a.max_sge) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    max_wr = a.max_wr,
                    max_sge = a.max_sge,
                    "ibv_create_srq refused: {e:?}"
                );
                return fail_null(e.errno());
            }
        };
        let id = srq.id().0;
        // SAFETY: ibv_srq is plain data; all-zero is valid.
        let mut raw: ibv_srq = unsafe { std::mem::zeroed() };
        raw.context = p.raw.context;
        raw.srq_context = init.srq_context;
        raw.pd = pd;
        raw.handle = id;
        let attr = ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: 0,
        };
        let out = boxed(Srq {
            raw,
            srq,
            max_sge: a.max_sge,
            attr: Mutex::new(attr),
            users: AtomicU32::new(0),
        });
        c.srqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, out as usize);
        out.cast()
    })
}
export!("ibv_create_srq", "IBVERBS_1.1", create_srq);

const SRQ_MAX_WR: c_int = 1;
const SRQ_LIMIT: c_int = 2;

unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        let (Some(s), false) = (ours!(Srq, srq), attr.is_null()) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(s.raw.context) else {
            return libc::EINVAL;
        };
        if mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        // SAFETY: a readable ibv_srq_attr (caller's contract).
        let a = unsafe { *attr };
        let max_wr = (mask & SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & SRQ_LIMIT != 0).then_some(a.srq_limit);
        if let Err(e) = c.ctx.modify_srq(s.srq.id(), max_wr, limit) {
            return e.errno();
        }
        let mut cur = s.attr.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = max_wr {
            cur.max_wr = n;
        }
        if let Some(l) = limit {
            cur.srq_limit = l;
        }
        0
    })
}
export!("ibv_modify_srq", "IBVERBS_1.1", modify_srq);

unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let (Some(s), false) = (ours!(Srq, srq), attr.is_null()) else {
        return libc::EINVAL;
    };
    // SAFETY: a writable ibv_srq_attr (caller's contract).
    unsafe { *attr = *s.attr.lock().unwrap_or_else(|e| e.into_inner()) };
    0
}
export!("ibv_query_srq", "IBVERBS_1.1", query_srq);

pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || {
        let Some(s) = ours!(Srq, srq) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(s.raw.context) else {
            return libc::EINVAL;
        };
        if s.users.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        if let Err(e) = c.ctx.destroy_srq(s.srq.id()) {
            return e.errno();
        }
        c.srqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&s.raw.handle);
        // SAFETY: an SRQ of ours, freed once.
        unsafe { free(srq.cast::<Srq>()) };
        0
    })
}
export!("ibv_destroy_srq", "IBVERBS_1.1", destroy_srq);

// ------------------------------------------------------------------- QP

fn qp_type_of(t: u32) -> Option<QpType> {
    match t {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        _ => None,
    }
}

/// `ibv_create_qp` and `ibv_create_qp_ex`'s common part.
fn create_qp_common(pd: *mut ibv_pd, a: &mut ibv_qp_init_attr, extended: bool) -> *mut ibv_qp {
    let Some(p) = ours!(Pd, pd) else {
        return fail_null(libc::EINVAL);
    };
    let Some(c) = ctx_from(p.raw.context) else {
        return fail_null(libc::EINVAL);
    };
    let Some(qp_type) = qp_type_of(a.qp_type) else {
        tracing::warn!(
            qp_type = a.qp_type,
            "ibv_create_qp: only RC, UC and UD are supported"
        );
        return fail_null(libc::EOPNOTSUPP);
    };
    let (Some(scq), Some(rcq)) = (ours!(Cq, a.send_cq), ours!(Cq, a.recv_cq)) else {
        tracing::warn!("ibv_create_qp: send_cq and recv_cq are required");
        return fail_null(libc::EINVAL);
    };
    let srq = ours!(Srq, a.srq);
    // Capabilities beyond the device's limits are refused by the engine
    // (EINVAL), the one place that checks them.
    let mut cap = a.cap;
    // As RXE sizes a send WQE: room for the SGEs (16 bytes each) or the
    // inline data asked for, whichever is larger, and reports it as the
    // inline capacity (rdma_xclient posts 16 inline bytes asking for 0).
    let sge_room = cap.max_send_sge.max(1).saturating_mul(16);
    if cap.max_inline_data <= burst_verbs::MAX_INLINE {
        cap.max_inline_data = cap
            .max_inline_data
            .max(sge_room.min(burst_verbs::MAX_INLINE));
    }
    let init = QpInit {
        qp_type,
        pd: p.pd,
        srq: srq.map(|s| s.srq.id()),
        caps: QpCaps {
            max_send_wr: cap.max_send_wr.max(1),
            max_recv_wr: if srq.is_some() {
                1
            } else {
                cap.max_recv_wr.max(1)
            },
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: cap.max_recv_sge.max(1),
            max_inline_data: cap.max_inline_data,
        },
    };
    let qp = match c.ctx.create_qp_with(&init, scq.id, rcq.id) {
        Ok(q) => q,
        Err(e) => {
            // Info, not a warning: libraries probe the device's limits this
            // way (libfabric's verbs provider asks for 512 inline bytes,
            // then less, until a QP is made).
            tracing::info!(?cap.max_send_wr, ?cap.max_recv_wr, ?cap.max_send_sge,
                ?cap.max_recv_sge, ?cap.max_inline_data, "ibv_create_qp refused: {e}");
            return fail_null(e.errno());
        }
    };
    // What the QP really has, written back as providers do.
    let out_cap = ibv_qp_cap {
        max_send_wr: init.caps.max_send_wr,
        max_recv_wr: if srq.is_some() {
            0
        } else {
            init.caps.max_recv_wr
        },
        max_send_sge: init.caps.max_send_sge,
        max_recv_sge: if srq.is_some() {
            0
        } else {
            init.caps.max_recv_sge
        },
        max_inline_data: cap.max_inline_data,
    };
    a.cap = out_cap;
    // SAFETY: ibv_qp_ex is plain data; all-zero is valid.
    let mut raw: ibv_qp_ex = unsafe { std::mem::zeroed() };
    raw.qp_base.context = p.raw.context;
    raw.qp_base.qp_context = a.qp_context;
    raw.qp_base.pd = pd;
    raw.qp_base.send_cq = a.send_cq;
    raw.qp_base.recv_cq = a.recv_cq;
    raw.qp_base.srq = a.srq;
    raw.qp_base.handle = qp.qpn().value();
    raw.qp_base.qp_num = qp.qpn().value();
    raw.qp_base.state = 0;
    raw.qp_base.qp_type = a.qp_type;
    if extended {
        crate::datapath::install_wr_ops(&mut raw);
    }
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    let shadow = ibv_qp_attr {
        cap: out_cap,
        ..Default::default()
    };
    let qpn = qp.qpn().value();
    let out = boxed(Qp {
        raw,
        qp,
        qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        cap: out_cap,
        extended,
        shadow: Mutex::new(shadow),
        wr: Mutex::new(Default::default()),
        ece: Mutex::new(None),
    });
    c.qps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(qpn, out as usize);
    out.cast()
}

pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard("ibv_create_qp", ptr::null_mut(), || {
        if attr.is_null() {
            return fail_null(libc::EINVAL);
        }
        // SAFETY: a readable and writable ibv_qp_init_attr (caller's contract).
        create_qp_common(pd, unsafe { &mut *attr }, false)
    })
}
export!("ibv_create_qp", "IBVERBS_1.1", create_qp);

const QP_INIT_ATTR_PD: u32 = 1;
const QP_INIT_ATTR_CREATE_FLAGS: u32 = 4;
const QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 0x40;

/// `enum ibv_qp_create_send_ops_flags`, the ones the `ibv_wr_*` path
/// supports.
mod send_ops {
    pub const WRITE: u64 = 1 << 0;
    pub const WRITE_IMM: u64 = 1 << 1;
    pub const SEND: u64 = 1 << 2;
    pub const SEND_IMM: u64 = 1 << 3;
    pub const READ: u64 = 1 << 4;
    pub const CMP_SWP: u64 = 1 << 5;
    pub const FETCH_ADD: u64 = 1 << 6;
    pub const LOCAL_INV: u64 = 1 << 7;
    pub const BIND_MW: u64 = 1 << 8;
    pub const SEND_INV: u64 = 1 << 9;
    pub const ATOMIC_WRITE: u64 = 1 << 12;
}

/// The send ops a QP of `qp_type` may ask for: RXE's per-type sets (a
/// window bind on RC and UC, a local invalidate and an atomic write on
/// RC), less FLUSH.
fn supported_send_ops(qp_type: u32) -> u64 {
    use send_ops::*;
    match qp_type_of(qp_type) {
        Some(QpType::Rc) => {
            WRITE
                | WRITE_IMM
                | SEND
                | SEND_IMM
                | READ
                | CMP_SWP
                | FETCH_ADD
                | LOCAL_INV
                | BIND_MW
                | SEND_INV
                | ATOMIC_WRITE
        }
        Some(QpType::Uc) => WRITE | WRITE_IMM | SEND | SEND_IMM | BIND_MW | SEND_INV,
        Some(QpType::Ud) => SEND | SEND_IMM,
        _ => 0,
    }
}

/// `verbs_context.create_qp_ex`: the PD, create flags (none defined for a
/// software device: RXE refuses any, as here) and send-ops flags; the QP
/// also speaks the `ibv_wr_*` API.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard("ibv_create_qp_ex", ptr::null_mut(), || {
        if attr.is_null() || ctx_from(context).is_none() {
            return fail_null(libc::EINVAL);
        }
        // SAFETY: a readable and writable ibv_qp_init_attr_ex (caller's contract).
        let a = unsafe { &mut *attr };
        let known = QP_INIT_ATTR_PD | QP_INIT_ATTR_CREATE_FLAGS | QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 || a.comp_mask & QP_INIT_ATTR_PD == 0 {
            tracing::warn!(
                comp_mask = a.comp_mask,
                "ibv_create_qp_ex: unsupported attributes (PD, CREATE_FLAGS and SEND_OPS_FLAGS are)"
            );
            return fail_null(libc::EOPNOTSUPP);
        }
        if a.comp_mask & QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            tracing::warn!(
                create_flags = a.create_flags,
                "ibv_create_qp_ex: no create flags are supported"
            );
            return fail_null(libc::EOPNOTSUPP);
        }
        let extended = a.comp_mask & QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if extended && a.send_ops_flags & !supported_send_ops(a.qp_type) != 0 {
            tracing::warn!(
                send_ops = a.send_ops_flags,
                "ibv_create_qp_ex: unsupported send ops"
            );
            return fail_null(libc::EOPNOTSUPP);
        }
        let mut base = a.base();
        let q = create_qp_common(a.pd, &mut base, extended);
        a.cap = base.cap;
        q
    })
}

unsafe extern "C" fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    match ours!(Qp, qp) {
        Some(q) if q.extended => qp.cast(),
        _ => ptr::null_mut(),
    }
}
export!("ibv_qp_to_qp_ex", "IBVERBS_1.6", qp_to_qp_ex);

pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || {
        let Some(q) = ours!(Qp, qp) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(q.raw.qp_base.context) else {
            return libc::EINVAL;
        };
        // The QP's counters die with it: the last chance to see why a run
        // stalled (BURST_LOG=burst_ibverbs=debug).
        if tracing::enabled!(tracing::Level::DEBUG) {
            if let Ok(k) = c.ctx.qp_counters(q.qp.qpn()) {
                tracing::debug!(qpn = q.qp.qpn().value(), counters = ?k, "QP destroyed");
            }
        }
        if let Err(e) = c.ctx.destroy_qp(q.qp.qpn()) {
            return e.errno();
        }
        c.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&q.qp.qpn().value());
        for cq in [q.raw.qp_base.send_cq, q.raw.qp_base.recv_cq] {
            if let Some(cq) = ours!(Cq, cq) {
                cq.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if let Some(s) = ours!(Srq, q.raw.qp_base.srq) {
            s.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: a QP of ours, freed once.
        unsafe { free(qp.cast::<Qp>()) };
        0
    })
}
export!("ibv_destroy_qp", "IBVERBS_1.1", destroy_qp);

// `enum ibv_qp_attr_mask`.
pub(crate) const M_STATE: c_int = 1;
pub(crate) const M_ACCESS_FLAGS: c_int = 8;
pub(crate) const M_PKEY_INDEX: c_int = 16;
pub(crate) const M_PORT: c_int = 32;
pub(crate) const M_QKEY: c_int = 64;
pub(crate) const M_AV: c_int = 128;
pub(crate) const M_PATH_MTU: c_int = 256;
pub(crate) const M_TIMEOUT: c_int = 512;
pub(crate) const M_RETRY_CNT: c_int = 1024;
pub(crate) const M_RNR_RETRY: c_int = 2048;
pub(crate) const M_RQ_PSN: c_int = 4096;
pub(crate) const M_MAX_QP_RD_ATOMIC: c_int = 8192;
pub(crate) const M_ALT_PATH: c_int = 16384;
pub(crate) const M_MIN_RNR_TIMER: c_int = 32768;
pub(crate) const M_SQ_PSN: c_int = 65536;
pub(crate) const M_MAX_DEST_RD_ATOMIC: c_int = 131072;
pub(crate) const M_CAP: c_int = 524288;
pub(crate) const M_DEST_QPN: c_int = 1048576;

fn mtu_of(m: u32) -> Option<Mtu> {
    u8::try_from(m).ok().and_then(Mtu::from_ibv_mtu)
}

/// The AH index the engine uses for an `ibv_ah_attr` (RoCE: GRH required).
pub(crate) fn ah_index(c: &Ctx, a: &ibv_ah_attr) -> Result<u32, c_int> {
    if a.is_global == 0 {
        // As RoCE hardware does: without a GRH there is no IP address.
        tracing::warn!("address vector without GRH (is_global = 0): RoCE needs a GID (use -g)");
        return Err(libc::EINVAL);
    }
    if a.port_num != 0 && a.port_num != 1 {
        tracing::warn!(port = a.port_num, "address vector: no such port");
        return Err(libc::EINVAL);
    }
    // The engine checks the index against the GID table (EINVAL, logged).
    match c.ctx.create_ah_from(a.grh.dgid, Some(a.grh.sgid_index)) {
        Ok(ah) => Ok(ah),
        Err(PostError::Refused(v)) => Err(v.errno()),
        Err(e) => {
            tracing::warn!("address vector: {e}");
            Err(libc::EIO)
        }
    }
}

/// The transport's attributes for `ibv_modify_qp(a, mask)` on context `c`,
/// or the errno rdma-core returns for them.
fn qp_attr_of(c: &Ctx, a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    let a = *a;
    if mask & (M_ALT_PATH | M_CAP) != 0 {
        tracing::warn!(
            mask,
            "ibv_modify_qp: alternate paths and resizing are not supported"
        );
        return Err(libc::EINVAL);
    }
    let on = |bit| mask & bit != 0;
    let mut t = QpAttr::default();
    if on(M_STATE) {
        let Some(s) = QpState::from_ibv(a.qp_state) else {
            return Err(libc::EINVAL);
        };
        t.state = Some(s);
    }
    if on(M_ACCESS_FLAGS) {
        let f = a.qp_access_flags as u32;
        // LOCAL_WRITE (1) is accepted and means nothing for a QP.
        t.access = Some(QpAccess {
            remote_write: f & 2 != 0,
            remote_read: f & 4 != 0,
            remote_atomic: f & 8 != 0,
        });
    }
    if on(M_PKEY_INDEX) {
        t.pkey_index = Some(a.pkey_index);
    }
    if on(M_PORT) {
        t.port = Some(a.port_num);
    }
    if on(M_QKEY) {
        t.qkey = Some(a.qkey);
    }
    if on(M_AV) {
        match ah_index(c, &a.ah_attr) {
            Ok(i) => t.ah = Some(i),
            Err(e) => return Err(e),
        }
    }
    if on(M_PATH_MTU) {
        let Some(m) = mtu_of(a.path_mtu) else {
            return Err(libc::EINVAL);
        };
        t.path_mtu = Some(m);
    }
    if on(M_TIMEOUT) {
        t.timeout = Some(a.timeout);
    }
    if on(M_RETRY_CNT) {
        t.retry_cnt = Some(a.retry_cnt);
    }
    if on(M_RNR_RETRY) {
        t.rnr_retry = Some(a.rnr_retry);
    }
    if on(M_RQ_PSN) {
        t.rq_psn = Some(Psn::new(a.rq_psn));
    }
    if on(M_MAX_QP_RD_ATOMIC) {
        // Initiator depth: perftest sets the *peer's* device maximum
        // here (RXE reports 128). Issuing fewer READs/atomics at once
        // than allowed is always safe, so clamp instead of refusing.
        t.max_rd_atomic = Some(a.max_rd_atomic.min(burst_verbs::MAX_RD_ATOMIC));
    }
    if on(M_MIN_RNR_TIMER) {
        t.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if on(M_SQ_PSN) {
        t.sq_psn = Some(Psn::new(a.sq_psn));
    }
    if on(M_MAX_DEST_RD_ATOMIC) {
        t.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if on(M_DEST_QPN) {
        let Some(n) = Qpn::new(a.dest_qp_num) else {
            return Err(libc::EINVAL);
        };
        t.dest_qpn = Some(n);
    }
    // CUR_STATE (2), EN_SQD_ASYNC_NOTIFY (4), PATH_MIG_STATE (1 << 18)
    // and RATE_LIMIT (1 << 25) are accepted and have no effect.
    Ok(t)
}

/// Records an applied `ibv_modify_qp` for `ibv_query_qp` and the QP's state word.
fn record(q: &Qp, qp: *mut ibv_qp, a: &ibv_qp_attr, mask: c_int) {
    let on = |bit| mask & bit != 0;
    let a = *a;
    let mut s = q.shadow.lock().unwrap_or_else(|e| e.into_inner());
    let keep_cap = s.cap;
    macro_rules! take {
        ($($bit:ident => $f:ident),*) => { $( if on($bit) { s.$f = a.$f; } )* };
    }
    take!(M_STATE => qp_state, M_ACCESS_FLAGS => qp_access_flags, M_PKEY_INDEX => pkey_index,
        M_PORT => port_num, M_QKEY => qkey, M_AV => ah_attr, M_PATH_MTU => path_mtu,
        M_TIMEOUT => timeout, M_RETRY_CNT => retry_cnt, M_RNR_RETRY => rnr_retry,
        M_RQ_PSN => rq_psn, M_MAX_QP_RD_ATOMIC => max_rd_atomic, M_MIN_RNR_TIMER => min_rnr_timer,
        M_SQ_PSN => sq_psn, M_MAX_DEST_RD_ATOMIC => max_dest_rd_atomic, M_DEST_QPN => dest_qp_num);
    s.cap = keep_cap;
    if on(M_STATE) {
        // SAFETY: the state word of our own QP struct; apps read it.
        unsafe { (*qp).state = a.qp_state };
    }
}

/// `ibv_attach_mcast` / `ibv_detach_mcast`: the group is the GID (the LID
/// means nothing on RoCE); a UD QP only.
pub(crate) fn multicast(qp: *mut ibv_qp, gid: *const [u8; 16], attach: bool) -> c_int {
    let (Some(q), false) = (ours!(Qp, qp), gid.is_null()) else {
        return libc::EINVAL;
    };
    let Some(c) = ctx_from(q.raw.qp_base.context) else {
        return libc::EINVAL;
    };
    // SAFETY: a readable GID (caller's contract).
    let mgid = unsafe { *gid };
    match c.ctx.multicast(q.qp.qpn(), mgid, attach) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            tracing::warn!(
                qpn = q.qp.qpn().value(),
                "ibv_{}_mcast refused: {e}",
                if attach { "attach" } else { "detach" }
            );
            e.errno()
        }
        Err(e) => e.errno(),
    }
}

unsafe extern "C" fn attach_mcast(qp: *mut ibv_qp, gid: *const [u8; 16], _lid: u16) -> c_int {
    guard("ibv_attach_mcast", libc::EIO, || multicast(qp, gid, true))
}
export!("ibv_attach_mcast", "IBVERBS_1.1", attach_mcast);

unsafe extern "C" fn detach_mcast(qp: *mut ibv_qp, gid: *const [u8; 16], _lid: u16) -> c_int {
    guard("ibv_detach_mcast", libc::EIO, || multicast(qp, gid, false))
}
export!("ibv_detach_mcast", "IBVERBS_1.1", detach_mcast);

pub(crate) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        let (Some(q), false) = (ours!(Qp, qp), attr.is_null()) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(q.raw.qp_base.context) else {
            return libc::EINVAL;
        };
        // SAFETY: a readable ibv_qp_attr (caller's contract).
        let a = unsafe { *attr };
        let t = match qp_attr_of(c, &a, mask) {
            Ok(t) => with_ece(q, t),
            Err(e) => return e,
        };
        if let Err(e) = q.qp.modify(&t) {
            tracing::warn!(
                qpn = q.qp.qpn().value(),
                mask,
                "ibv_modify_qp refused: {e:?}"
            );
            return e.errno();
        }
        record(q, qp, &a, mask);
        0
    })
}

/// Several `ibv_modify_qp` calls in one trip to the engine (the connection
/// manager's INIT, RTR, RTS): 0, or the errno of the first refused (those
/// before it are applied).
pub(crate) fn modify_qp_steps(
    qp: *mut ibv_qp,
    steps: &[(ibv_qp_attr, c_int)],
    wait_for_peer: &[Option<bool>],
) -> c_int {
    let Some(q) = ours!(Qp, qp) else {
        return libc::EINVAL;
    };
    let Some(c) = ctx_from(q.raw.qp_base.context) else {
        return libc::EINVAL;
    };
    let mut attrs = Vec::with_capacity(steps.len());
    for (i, (a, m)) in steps.iter().enumerate() {
        match qp_attr_of(c, a, *m) {
            Ok(mut t) => {
                // burst's own attribute, which ibv_qp_attr cannot carry.
                t.wait_for_peer = wait_for_peer.get(i).copied().flatten();
                attrs.push(with_ece(q, t));
            }
            Err(e) => return e,
        }
    }
    let (done, r) = match q.qp.modify_steps(&attrs) {
        Ok(Ok(())) => (steps.len(), 0),
        Ok(Err((i, e))) => {
            tracing::warn!(
                qpn = q.qp.qpn().value(),
                step = i,
                "QP transition refused: {e:?}"
            );
            (i, burst_verbs::engine::CreateError::Verbs(e).errno())
        }
        Err(e) => (0, e.errno()),
    };
    for (a, m) in &steps[..done] {
        record(q, qp, a, *m);
    }
    r
}
export!("ibv_modify_qp", "IBVERBS_1.1", modify_qp);

/// The transition `t` with the options `ibv_set_ece` agreed: they take
/// effect when the QP becomes ready to receive (RTR), as rdma-core's
/// providers apply them during the modify stages.
fn with_ece(q: &Qp, mut t: QpAttr) -> QpAttr {
    let ece = *q.ece.lock().unwrap_or_else(|e| e.into_inner());
    if let (Some(ece), Some(QpState::Rtr)) = (ece, t.state) {
        t.selective_repeat = Some(ece.selective_repeat());
    }
    t
}

/// The ECE options burst's rdma_cm agreed with the peer in the REQ and
/// REP, set on the QP as librdmacm does with `ibv_set_ece` before the
/// QP's RTR: `selective_repeat` is what both offered.
pub(crate) fn set_agreed_ece(qp: *mut ibv_qp, selective_repeat: bool) {
    let Some(q) = ours!(Qp, qp) else { return };
    let options = if selective_repeat {
        burst_verbs::ECE_SELECTIVE_REPEAT
    } else {
        0
    };
    *q.ece.lock().unwrap_or_else(|e| e.into_inner()) = Some(burst_verbs::Ece {
        vendor_id: burst_verbs::VENDOR_ID,
        options,
    });
}

/// `struct ibv_ece`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ibv_ece {
    pub(crate) vendor_id: u32,
    pub(crate) options: u32,
    pub(crate) comp_mask: u32,
}

/// `ibv_query_ece`: burst's vendor ID and the options the QP offers, or
/// those `ibv_set_ece` agreed once it was called.
unsafe extern "C" fn query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    guard("ibv_query_ece", libc::EIO, || {
        let (Some(q), false) = (ours!(Qp, qp), ece.is_null()) else {
            return libc::EINVAL;
        };
        let e = q
            .ece
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(burst_verbs::Ece::offered);
        let out = ibv_ece {
            vendor_id: e.vendor_id,
            options: e.options,
            comp_mask: 0,
        };
        // SAFETY: a writable ibv_ece (caller's contract), checked non-null.
        unsafe { ece.write(out) };
        0
    })
}
export!("ibv_query_ece", "IBVERBS_1.10", query_ece);

/// `ibv_set_ece`: the peer's ECE (librdmacm passes the one its REQ or REP
/// carried; NCCL the one its own exchange did). The QP keeps the options
/// both offer, applied at the move to RTR; another vendor's options are
/// refused with EINVAL (as mlx5 refuses a foreign vendor), which
/// librdmacm ignores, leaving the QP go-back-N.
unsafe extern "C" fn set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    guard("ibv_set_ece", libc::EIO, || {
        let (Some(q), false) = (ours!(Qp, qp), ece.is_null()) else {
            return libc::EINVAL;
        };
        // SAFETY: a readable ibv_ece (caller's contract), checked non-null.
        let e = unsafe { ece.read() };
        // rdma-core's own check, before any provider's.
        if e.vendor_id == 0 {
            return libc::EOPNOTSUPP;
        }
        if e.comp_mask != 0 || e.vendor_id != burst_verbs::VENDOR_ID {
            tracing::debug!(
                vendor_id = e.vendor_id,
                comp_mask = e.comp_mask,
                "ibv_set_ece: not burst's options; the QP stays go-back-N"
            );
            return libc::EINVAL;
        }
        let peer = burst_verbs::Ece {
            vendor_id: e.vendor_id,
            options: e.options,
        };
        *q.ece.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(burst_verbs::Ece::offered().agree(&peer));
        0
    })
}
export!("ibv_set_ece", "IBVERBS_1.10", set_ece);

pub(crate) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        let (Some(q), false, false) = (ours!(Qp, qp), attr.is_null(), init.is_null()) else {
            return libc::EINVAL;
        };
        let Some(c) = ctx_from(q.raw.qp_base.context) else {
            return libc::EINVAL;
        };
        let mut a = *q.shadow.lock().unwrap_or_else(|e| e.into_inner());
        // The state moves on its own (errors): ask the engine.
        if let Ok((state, _)) = c.ctx.query_qp(q.qp.qpn()) {
            a.qp_state = state.ibv();
        }
        a.cur_qp_state = a.qp_state;
        a.cap = q.cap;
        let b = &q.raw.qp_base;
        // SAFETY: writable structs from the caller.
        unsafe {
            *attr = a;
            *init = ibv_qp_init_attr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap: q.cap,
                qp_type: b.qp_type,
                sq_sig_all: c_int::from(q.sq_sig_all),
            };
        }
        0
    })
}
export!("ibv_query_qp", "IBVERBS_1.1", query_qp);

unsafe extern "C" fn query_qp_data_in_order(_qp: *mut ibv_qp, _op: u32, _flags: u32) -> c_int {
    // Data of a message may be placed out of order under loss (go-back-N
    // rewrites): report no in-order guarantee.
    0
}
export!(
    "ibv_query_qp_data_in_order",
    "IBVERBS_1.14",
    query_qp_data_in_order
);

// ------------------------------------------------------------------- AH

pub(crate) unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("ibv_create_ah", ptr::null_mut(), || {
        let (Some(p), false) = (ours!(Pd, pd), attr.is_null()) else {
            return fail_null(libc::EINVAL);
        };
        let Some(c) = ctx_from(p.raw.context) else {
            return fail_null(libc::EINVAL);
        };
        // SAFETY: a readable ibv_ah_attr (caller's contract).
        match ah_index(c, unsafe { &*attr }) {
            Ok(index) => boxed(Ah {
                raw: ibv_ah {
                    context: p.raw.context,
                    pd,
                    handle: index,
                },
                index,
            })
            .cast(),
            Err(e) => fail_null(e),
        }
    })
}
export!("ibv_create_ah", "IBVERBS_1.1", create_ah);

unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard("ibv_destroy_ah", libc::EINVAL, || {
        let Some(a) = ours!(Ah, ah) else {
            return libc::EINVAL;
        };
        // The engine's entry goes too (one reference of the destination's).
        if let Some(c) = ctx_from(a.raw.context) {
            if let Err(e) = c.ctx.destroy_ah(a.index) {
                tracing::debug!("ibv_destroy_ah: {e}");
            }
        }
        // SAFETY: an AH of ours, freed once.
        unsafe { free(ah.cast::<Ah>()) };
        0
    })
}
export!("ibv_destroy_ah", "IBVERBS_1.1", destroy_ah);

const WC_GRH: u32 = 1;

unsafe extern "C" fn init_ah_from_wc(
    context: *mut ibv_context,
    port: u8,
    wc: *const ibv_wc,
    grh: *const u8,
    ah: *mut ibv_ah_attr,
) -> c_int {
    let Some(c) = ctx_from(context) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if wc.is_null() || ah.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a readable ibv_wc (caller's contract).
    let wc = unsafe { &*wc };
    if wc.wc_flags & WC_GRH == 0 || grh.is_null() {
        // RoCE: without the GRH there is no address to answer to.
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the GRH area is the first 40 bytes of the receive buffer.
    let g = unsafe { std::slice::from_raw_parts(grh, 40) };
    // RoCEv2 over IPv4 puts the IPv4 header in bytes 20..40.
    let (sgid, dgid) = if g[20] >> 4 == 4 {
        let src = std::net::Ipv4Addr::new(g[32], g[33], g[34], g[35]);
        let dst = std::net::Ipv4Addr::new(g[36], g[37], g[38], g[39]);
        (src.to_ipv6_mapped().octets(), dst.to_ipv6_mapped().octets())
    } else {
        let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
        s.copy_from_slice(&g[8..24]);
        d.copy_from_slice(&g[24..40]);
        (s, d)
    };
    // The reply leaves from the GID the packet came to (as rdma-core finds
    // it); a multicast group's members answer from the device's address.
    let sgid_index = c.ctx.sgid_index_for(dgid);
    let out = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: sgid,
            flow_label: 0,
            sgid_index,
            hop_limit: 0xff,
            traffic_class: 0,
        },
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: a writable ibv_ah_attr.
    unsafe { *ah = out };
    0
}
export!("ibv_init_ah_from_wc", "IBVERBS_1.1", init_ah_from_wc);

unsafe extern "C" fn create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *const ibv_wc,
    grh: *const u8,
    port: u8,
) -> *mut ibv_ah {
    let Some(p) = ours!(Pd, pd) else {
        return fail_null(libc::EINVAL);
    };
    let mut attr = ibv_ah_attr::default();
    // SAFETY: forwarded contract.
    if unsafe { init_ah_from_wc(p.raw.context, port, wc, grh, &mut attr) } != 0 {
        return ptr::null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { create_ah(pd, &mut attr) }
}
export!("ibv_create_ah_from_wc", "IBVERBS_1.1", create_ah_from_wc);

// --------------------------------------------------------------- events

// `enum ibv_event_type`.
const EVENT_CQ_ERR: u32 = 0;
const EVENT_QP_FATAL: u32 = 1;
const EVENT_QP_REQ_ERR: u32 = 2;
const EVENT_QP_ACCESS_ERR: u32 = 3;
const EVENT_COMM_EST: u32 = 4;
const EVENT_SQ_DRAINED: u32 = 5;
const EVENT_DEVICE_FATAL: u32 = 8;
const EVENT_PORT_ACTIVE: u32 = 9;
const EVENT_PORT_ERR: u32 = 10;
const EVENT_SRQ_LIMIT_REACHED: u32 = 15;
const EVENT_QP_LAST_WQE_REACHED: u32 = 16;

/// The `ibv_event_type` of a QP's event.
fn qp_event_type(e: QpEvent) -> u32 {
    match e {
        QpEvent::Fatal => EVENT_QP_FATAL,
        QpEvent::RequestError => EVENT_QP_REQ_ERR,
        QpEvent::AccessError => EVENT_QP_ACCESS_ERR,
        QpEvent::CommEstablished => EVENT_COMM_EST,
        QpEvent::SqDrained => EVENT_SQ_DRAINED,
        QpEvent::LastWqeReached => EVENT_QP_LAST_WQE_REACHED,
    }
}

/// The `ibv_async_event` for `ev`, or `None` when its object is gone (a QP
/// or SRQ destroyed since).
fn async_event_of(c: &Ctx, ev: AsyncEvent) -> Option<ibv_async_event> {
    let lookup = |m: &Mutex<HashMap<u32, usize>>, k: u32| {
        m.lock().unwrap_or_else(|e| e.into_inner()).get(&k).copied()
    };
    Some(match ev {
        AsyncEvent::SrqLimitReached(id) => {
            let p = lookup(&c.srqs, id.0)?;
            if let Some(s) = ours!(Srq, p as *mut ibv_srq) {
                // The limit disarms when it fires.
                s.attr.lock().unwrap_or_else(|e| e.into_inner()).srq_limit = 0;
            }
            ibv_async_event {
                element: p as *mut c_void,
                event_type: EVENT_SRQ_LIMIT_REACHED,
            }
        }
        AsyncEvent::Qp(qpn, e) => ibv_async_event {
            element: lookup(&c.qps, qpn.value())? as *mut c_void,
            event_type: qp_event_type(e),
        },
        AsyncEvent::DeviceFatal => ibv_async_event {
            // The union's `port_num` / `element` is unused for this event.
            element: ptr::null_mut(),
            event_type: EVENT_DEVICE_FATAL,
        },
        AsyncEvent::CqError(id) => ibv_async_event {
            element: lookup(&c.cqs, id.0)? as *mut c_void,
            event_type: EVENT_CQ_ERR,
        },
        AsyncEvent::Port { active } => ibv_async_event {
            // The union's `int port_num` (port 1; a pointer-sized zero
            // above it on little-endian hosts).
            element: ptr::without_provenance_mut(1),
            event_type: if active {
                EVENT_PORT_ACTIVE
            } else {
                EVENT_PORT_ERR
            },
        },
    })
}

unsafe extern "C" fn get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard("ibv_get_async_event", -1, || {
        let (Some(c), false) = (ctx_from(context), event.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        // The descriptor is readable while events are pending: read it as
        // rdma-core does (blocking unless the application made it
        // non-blocking), one count per event.
        loop {
            let Some(ev) = c.ctx.read_async_event() else {
                set_errno(libc::EAGAIN);
                return -1;
            };
            if let Some(e) = async_event_of(c, ev) {
                // SAFETY: a writable ibv_async_event (caller's contract).
                unsafe { *event = e };
                return 0;
            }
        }
    })
}
export!("ibv_get_async_event", "IBVERBS_1.1", get_async_event);

/// Counts the event in its object's `events_completed`, as rdma-core does
/// (applications and destroy paths read it).
unsafe extern "C" fn ack_async_event(event: *mut ibv_async_event) {
    guard("ibv_ack_async_event", (), || {
        if event.is_null() {
            return;
        }
        // SAFETY: an event filled by get_async_event (caller's contract).
        let e = unsafe { &*event };
        match e.event_type {
            EVENT_QP_FATAL
            | EVENT_QP_REQ_ERR
            | EVENT_QP_ACCESS_ERR
            | EVENT_COMM_EST
            | EVENT_SQ_DRAINED
            | EVENT_QP_LAST_WQE_REACHED
                if !e.element.is_null() =>
            {
                let q = e.element.cast::<ibv_qp>();
                // SAFETY: `element` is the live QP of ours the event named;
                // written through a raw pointer, as C owns the struct.
                unsafe { (*q).events_completed = (*q).events_completed.wrapping_add(1) };
            }
            EVENT_CQ_ERR if !e.element.is_null() => {
                let q = e.element.cast::<ibv_cq>();
                // SAFETY: as above, for the CQ the event named.
                unsafe {
                    (*q).async_events_completed = (*q).async_events_completed.wrapping_add(1)
                };
            }
            EVENT_SRQ_LIMIT_REACHED if !e.element.is_null() => {
                let s = e.element.cast::<ibv_srq>();
                // SAFETY: as above, for the SRQ the event named.
                unsafe { (*s).events_completed = (*s).events_completed.wrapping_add(1) };
            }
            _ => {}
        }
    })
}
export!("ibv_ack_async_event", "IBVERBS_1.1", ack_async_event);
