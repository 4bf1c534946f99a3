//! rdma_cm multicast: `rdma_join_multicast{,_ex}` and
//! `rdma_leave_multicast`, as librdmacm does them over the kernel's CM on
//! RoCE: the group's GID is its IP address, the join event carries the
//! group's address vector, QPN 0xFFFFFF and the Q_Key, and the id's UD QP
//! is attached to the group when the application takes that event
//! (detached when it leaves; never for a send-only member).

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;

use super::abi::*;
use super::{addr, fail, fail_io, id_of, Id};
use crate::guard;

/// A group an id joined.
pub(super) struct Joined {
    addr: SocketAddr,
    mgid: [u8; 16],
    flags: u32,
    context: usize,
}

fn join(id: *mut rdma_cm_id, sa: *mut libc::sockaddr, flags: u32, context: *mut c_void) -> c_int {
    let (Some(this), Some(group)) = (id_of(id), addr::read_sockaddr(sa)) else {
        return fail(libc::EINVAL);
    };
    let mut joined = this.mcast.lock().unwrap_or_else(|e| e.into_inner());
    if joined.iter().any(|j| j.addr == group) {
        return fail(libc::EADDRINUSE);
    }
    match this.cm.join_multicast(group) {
        Ok(mgid) => {
            joined.push(Joined {
                addr: group,
                mgid,
                flags,
                context: context as usize,
            });
            0
        }
        Err(e) => {
            tracing::warn!(%group, "rdma_join_multicast refused: {e}");
            fail_io(&e)
        }
    }
}

/// The join event as the application takes it: the join's context in
/// `param.ud.private_data`, the QP attached (a failure turns the event
/// into `RDMA_CM_EVENT_MULTICAST_ERROR` with the errno, as librdmacm's).
pub(super) fn on_join(id: &Id, ev: &mut rdma_cm_event) {
    // SAFETY: the union's UD member, written by c_event for this event.
    let mgid = unsafe { ev.param.ud.ah_attr.grh.dgid };
    let joined = id.mcast.lock().unwrap_or_else(|e| e.into_inner());
    let Some(j) = joined.iter().rev().find(|j| j.mgid == mgid) else {
        return;
    };
    ev.param.ud.private_data = j.context as *const c_void;
    ev.param.ud.private_data_len = 0;
    let qp = id.qp();
    if qp.is_null() || j.flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return;
    }
    let rc = crate::verbs::multicast(qp, &j.mgid, true);
    if rc != 0 {
        ev.event = burst_verbs::rdma_cm::CmEventKind::MulticastError.value();
        ev.status = -rc;
    }
}

unsafe extern "C" fn join_multicast(
    id: *mut rdma_cm_id,
    sa: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard("rdma_join_multicast", -1, || {
        join(id, sa, RDMA_MC_JOIN_FLAG_FULLMEMBER, context)
    })
}
export!("rdma_join_multicast", "RDMACM_1.0", join_multicast);

unsafe extern "C" fn join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard("rdma_join_multicast_ex", -1, || {
        // SAFETY: NULL or a readable attribute struct (caller's contract).
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // librdmacm's checks, in its order.
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return fail(libc::ENOTSUP);
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return fail(libc::EINVAL);
        }
        join(id, a.addr, a.join_flags, context)
    })
}
export!("rdma_join_multicast_ex", "RDMACM_1.1", join_multicast_ex);

unsafe extern "C" fn leave_multicast(id: *mut rdma_cm_id, sa: *mut libc::sockaddr) -> c_int {
    guard("rdma_leave_multicast", -1, || {
        let (Some(this), Some(group)) = (id_of(id), addr::read_sockaddr(sa)) else {
            return fail(libc::EINVAL);
        };
        let j = {
            let mut joined = this.mcast.lock().unwrap_or_else(|e| e.into_inner());
            let Some(i) = joined.iter().position(|j| j.addr == group) else {
                return fail(libc::EADDRNOTAVAIL);
            };
            joined.remove(i)
        };
        let qp = this.qp();
        if !qp.is_null() && j.flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
            let _ = crate::verbs::multicast(qp, &j.mgid, false);
        }
        0
    })
}
export!("rdma_leave_multicast", "RDMACM_1.0", leave_multicast);
