//! Synchronous endpoints: `rdma_create_ep`, `rdma_destroy_ep` and
//! `rdma_get_request` (an id without a channel waits in each call).

use std::ffi::c_int;
use std::ptr;

use super::abi::*;
use super::calls::{bind_addr, create_id_common, destroy_id, ep_port_space, migrate_id};
use super::calls::{resolve_addr, resolve_route};
use super::qp::{create_qp_on, rdma_destroy_qp, rdma_destroy_srq};
use super::*;

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
        let ps = ep_port_space(r, qp_type);
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
                this.ep().attr = Some((unsafe { *qp_init_attr }, pd));
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
                this.ep().connect = c.to_vec();
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
            unsafe { rdma_destroy_qp(id) };
        }
        let own_srq = this.ep().own_srq;
        if own_srq {
            // SAFETY: our id.
            unsafe { rdma_destroy_srq(id) };
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
        if id.is_null() || !l.sync.load(Ordering::Acquire) {
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
            if kind != CmEventKind::ConnectRequest.value() {
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
            let saved = l.ep().attr;
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
