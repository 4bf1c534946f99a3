//! The id calls: C arguments checked and translated, the Rust id called,
//! the C struct brought up to date, and synchronous ids completed.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use burst_verbs::rdma_cm::{ConnParam, PortSpace};
use burst_verbs::QpType;

use super::abi::*;
use super::*;
use crate::verbs::ibv_ece;

pub(super) fn create_id_common(
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
    let Some(ps) = port_space(ps) else {
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
    let Some(c) = chan_of(chan) else {
        return fail(libc::EINVAL);
    };
    let kind = match qp_type {
        Some(IBV_QPT_UC) => Some(QpType::Uc),
        Some(IBV_QPT_UD) => Some(QpType::Ud),
        Some(IBV_QPT_RC) => Some(QpType::Rc),
        _ => None,
    };
    let cm = match kind {
        Some(k) => rdma_cm().create_id_with(&c.ch, ps, k),
        None => rdma_cm().create_id(&c.ch, ps),
    };
    let qp_type = qp_type.unwrap_or_else(|| ibv_qp_type(cm.qp_type()));
    let new = new_id(cm, chan, context, qp_type, sync);
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

pub(super) unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        this.cm.destroy();
        // Sync ids: the last event is acked with the id.
        // SAFETY: our live id.
        unsafe {
            let raw = this.raw();
            if !(*raw).event.is_null() {
                ack_cm_event((*raw).event);
                (*raw).event = ptr::null_mut();
            }
        }
        // Fetched events must be acked first (rdma-core blocks the same way).
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
        let sync = this.sync.load(Ordering::Acquire);
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

pub(super) unsafe extern "C" fn bind_addr(id: *mut rdma_cm_id, sa: *mut libc::sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        let (Some(this), Some(a)) = (id_of(id), addr::read_sockaddr(sa)) else {
            return fail(libc::EINVAL);
        };
        if let Err(e) = this.cm.bind_addr(a) {
            return fail_io(&e);
        }
        this.sync_route();
        0
    })
}
export!("rdma_bind_addr", "RDMACM_1.0", bind_addr);

unsafe extern "C" fn listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        match this.cm.listen() {
            Ok(()) => {
                this.sync_route();
                0
            }
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_listen", "RDMACM_1.0", listen);

/// Sync ids wait for the call's event; the others return at once.
fn done(this: &Arc<Id>) -> c_int {
    if this.sync.load(Ordering::Acquire) {
        return complete(this);
    }
    0
}

pub(super) unsafe extern "C" fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        let (Some(this), Some(dst)) = (id_of(id), addr::read_sockaddr(dst)) else {
            return fail(libc::EINVAL);
        };
        if let Err(e) = this.cm.resolve_addr(addr::read_sockaddr(src), dst) {
            return fail_io(&e);
        }
        this.sync_route();
        done(&this)
    })
}
export!("rdma_resolve_addr", "RDMACM_1.0", resolve_addr);

pub(super) unsafe extern "C" fn resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if let Err(e) = this.cm.resolve_route() {
            return fail_io(&e);
        }
        // SAFETY: our live id.
        unsafe { (*this.raw()).route.num_paths = 1 };
        done(&this)
    })
}
export!("rdma_resolve_route", "RDMACM_1.0", resolve_route);

/// The application's private data (`len` bytes at `p`).
fn private_data(p: *const c_void, len: u8) -> Vec<u8> {
    if len == 0 || p.is_null() {
        return Vec::new();
    }
    // SAFETY: `len` readable bytes at `p` (caller's contract).
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), usize::from(len)) }.to_vec()
}

/// The Rust parameters for a C `rdma_conn_param` (NULL: `None`, unless
/// the id has an SRQ or saved private data, which only a parameter
/// carries: then `blank`, what NULL means, with them).
fn conn_param(
    p: Option<rdma_conn_param>,
    srq: bool,
    saved: Vec<u8>,
    blank: ConnParam,
) -> Option<ConnParam> {
    let mut out = match p {
        Some(p) => ConnParam {
            private_data: private_data(p.private_data, p.private_data_len),
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control != 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq != 0,
            qp_num: p.qp_num,
        },
        None if srq || !saved.is_empty() => blank,
        None => return None,
    };
    out.srq |= srq;
    if out.private_data.is_empty() {
        out.private_data = saved;
    }
    Some(out)
}

unsafe extern "C" fn connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_connect", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        qp::sync_qp(&this);
        // SAFETY: NULL or a readable conn param (caller's contract).
        let p = unsafe { param.as_ref() }.copied();
        // SAFETY: our live id.
        let srq = !unsafe { (*this.raw()).srq }.is_null();
        let saved = std::mem::take(&mut this.ep().connect);
        // What rdma_connect(id, NULL) asks for.
        let blank = ConnParam {
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        };
        if let Err(e) = this.cm.connect(conn_param(p, srq, saved, blank).as_ref()) {
            return fail_io(&e);
        }
        done(&this)
    })
}
export!("rdma_connect", "RDMACM_1.0", connect);

unsafe extern "C" fn accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_accept", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        qp::sync_qp(&this);
        // SAFETY: NULL or a readable conn param (caller's contract).
        let p = unsafe { param.as_ref() }.copied();
        // SAFETY: our live id.
        let srq = !unsafe { (*this.raw()).srq }.is_null();
        // What rdma_accept(id, NULL) means: keep what the request asked.
        let blank = ConnParam {
            responder_resources: 0xff,
            initiator_depth: 0xff,
            flow_control: true,
            rnr_retry_count: 7,
            ..ConnParam::default()
        };
        if let Err(e) = this
            .cm
            .accept(conn_param(p, srq, Vec::new(), blank).as_ref())
        {
            return fail_io(&e);
        }
        // A UD accept is the SIDR_REP: no event follows.
        if this.cm.port_space().is_datagram() {
            return 0;
        }
        done(&this)
    })
}
export!("rdma_accept", "RDMACM_1.0", accept);

unsafe extern "C" fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard("rdma_reject", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        match this.cm.reject(&private_data(data, len)) {
            Ok(()) => 0,
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_reject", "RDMACM_1.0", reject);

unsafe extern "C" fn reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard("rdma_reject_ece", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        match this.cm.reject_ece(&private_data(data, len)) {
            Ok(()) => 0,
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_reject_ece", "RDMACM_1.3", reject_ece);

/// `rdma_set_local_ece`: as librdmacm, EINVAL for an id with a QP, no
/// `ece`, vendor ID 0 or a completion mask.
unsafe extern "C" fn set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard("rdma_set_local_ece", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if ece.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a readable ibv_ece (caller's contract), checked non-null.
        let e = unsafe { ece.read() };
        if e.comp_mask != 0 {
            return fail(libc::EINVAL);
        }
        qp::sync_qp(&this);
        let ece = burst_verbs::Ece {
            vendor_id: e.vendor_id,
            options: e.options,
        };
        match this.cm.set_local_ece(ece) {
            Ok(()) => 0,
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_set_local_ece", "RDMACM_1.3", set_local_ece);

/// `rdma_get_remote_ece`: the ECE the peer's REQ or REP carried (EINVAL
/// for an id with a QP, as librdmacm).
unsafe extern "C" fn get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard("rdma_get_remote_ece", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        if ece.is_null() {
            return fail(libc::EINVAL);
        }
        qp::sync_qp(&this);
        match this.cm.remote_ece() {
            Ok(e) => {
                let out = ibv_ece {
                    vendor_id: e.vendor_id,
                    options: e.options,
                    comp_mask: 0,
                };
                // SAFETY: a writable ibv_ece (caller's contract), checked non-null.
                unsafe { ece.write(out) };
                0
            }
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_get_remote_ece", "RDMACM_1.3", get_remote_ece);

unsafe extern "C" fn establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        qp::sync_qp(&this);
        match this.cm.establish() {
            Ok(()) => 0,
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_establish", "RDMACM_1.2", establish);

unsafe extern "C" fn notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard("rdma_notify", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        this.cm.notify();
        0
    })
}
export!("rdma_notify", "RDMACM_1.0", notify);

unsafe extern "C" fn disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        let Some(this) = id_of(id) else {
            return fail(libc::EINVAL);
        };
        qp::sync_qp(&this);
        match this.cm.disconnect() {
            Ok(true) => done(&this),
            Ok(false) => 0,
            Err(e) => fail_io(&e),
        }
    })
}
export!("rdma_disconnect", "RDMACM_1.0", disconnect);

pub(super) unsafe extern "C" fn migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
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
        let Some(c) = chan_of(to) else {
            return fail(libc::EINVAL);
        };
        let old = this.channel();
        this.cm.migrate(&c.ch);
        // SAFETY: our live id.
        unsafe { (*this.raw()).channel = to };
        // As librdmacm: to the application's channel, the id becomes
        // asynchronous and its private channel goes; to none, it gets a
        // private one and waits for its events itself.
        let was_sync = this.sync.swap(channel.is_null(), Ordering::AcqRel);
        if was_sync && old != to && !old.is_null() {
            // SAFETY: the id's private channel, which nothing else uses
            // now that the id's events go to `to`.
            unsafe { destroy_event_channel(old) };
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
                this.cm.set_ack_timeout(unsafe { *optval.cast::<u8>() });
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
    let r = this.cm.route();
    let a = if dst { r.dst } else { r.src };
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

/// The port space for `rdma_create_ep`'s address info.
pub(super) fn ep_port_space(r: &rdma_addrinfo, qp_type: Option<u32>) -> u32 {
    if r.ai_port_space != 0 {
        r.ai_port_space as u32
    } else if qp_type == Some(IBV_QPT_UD) {
        PortSpace::Udp.value()
    } else {
        PortSpace::Tcp.value()
    }
}
