//! burst-cm's events turned into rdma_cm events (on the CM's thread):
//! a request becomes a new id on the listener's channel, a reply readies
//! the active QP and sends the RTU, a reject or a disconnect reaches the
//! id it is for.

use std::net::SocketAddr;
use std::sync::Arc;

use burst_cm::rdma::{gid_of, CmaHeader, PortSpace, CMA_HEADER_LEN};
use burst_cm::{reason, CmEvent, ConnId};

use super::abi::*;
use super::*;

/// The listener that takes a request for `ps`/`port` to `dst`: bound to
/// that address, or to the wildcard.
fn listener_for(ps: PortSpace, port: u16, dst: IpAddr) -> Option<Arc<Id>> {
    with_reg(|r| {
        r.listeners
            .iter()
            .find(|l| {
                let st = l.lock();
                st.ps == ps
                    && st.src.is_some_and(|s| {
                        s.port() == port
                            && (s.ip().is_unspecified()
                                || s.ip().to_canonical() == dst.to_canonical())
                    })
            })
            .cloned()
    })
}

/// A child id of `listener` for a request from `peer` (inheriting its
/// channel, context, port space, QP type and synchronous mode).
fn child_of(listener: &Arc<Id>, d: &DevCm, conn: ConnId, hdr: &CmaHeader, port: u16) -> Arc<Id> {
    let l = listener.raw();
    // SAFETY: the listener is live (held by the registry).
    let (chan, context, qp_type) = unsafe { ((*l).channel, (*l).context, (*l).qp_type) };
    let ps = listener.lock().ps;
    let child = new_id(chan, context, ps, qp_type, listener.sync);
    {
        let mut st = child.lock();
        st.src = Some(SocketAddr::new(hdr.dst, port));
        st.dst = Some(hdr.src);
        st.peer = Some(hdr.src.ip());
        st.conn = Some(conn);
        st.phase = Phase::RequestRcvd;
        set_route(&child, &mut st, d);
    }
    register_conn(d.index, conn, &child);
    child
}

pub(super) fn on_cm_event(dev: usize, e: CmEvent) {
    let Ok(d) = devcm(dev) else { return };
    match e {
        CmEvent::Request { conn, peer, req } => on_request(&d, conn, peer, &req),
        CmEvent::SidrRequest { conn, peer, req } => on_sidr_request(&d, conn, peer, &req),
        CmEvent::Reply { conn, rep } => on_reply(dev, &d, conn, &rep),
        CmEvent::Established { conn } => {
            let Some(id) = conn_id(dev, conn) else { return };
            id.lock().phase = Phase::Established;
            post(&id, ev::ESTABLISHED, 0, |_| {});
        }
        CmEvent::Rejected { conn, rej } => {
            let Some(id) = conn_id(dev, conn) else { return };
            unregister_conn(dev, conn);
            {
                let mut st = id.lock();
                st.conn = None;
                st.phase = Phase::Disconnected;
            }
            qp_to_error(&id);
            post(&id, ev::REJECTED, c_int::from(rej.reason), |ev| {
                let n = rej.private_data.len();
                ev.data[..n].copy_from_slice(&rej.private_data);
                ev.raw.param.conn.private_data = ev.data.as_ptr().cast();
                ev.raw.param.conn.private_data_len = n as u8;
            });
        }
        CmEvent::Unreachable { conn } => {
            let Some(id) = conn_id(dev, conn) else { return };
            unregister_conn(dev, conn);
            {
                let mut st = id.lock();
                st.conn = None;
                st.phase = Phase::Disconnected;
            }
            post(&id, ev::UNREACHABLE, -libc::ETIMEDOUT, |_| {});
        }
        CmEvent::Disconnected { conn } => {
            let Some(id) = conn_id(dev, conn) else { return };
            id.lock().phase = Phase::Disconnected;
            post(&id, ev::DISCONNECTED, 0, |_| {});
        }
        CmEvent::TimeWaitExit { conn } => {
            // The kernel's RDMA CM reports it only for kernel QPs.
            unregister_conn(dev, conn);
            if let Some(id) = conn_id(dev, conn) {
                id.lock().conn = None;
            }
        }
        CmEvent::SidrReply { conn, rep } => on_sidr_reply(dev, conn, &rep),
    }
}

/// A REQ: a new id on the listener's channel (CONNECT_REQUEST), or a REJ
/// when nothing listens on its service and address.
fn on_request(d: &Arc<DevCm>, conn: ConnId, peer: std::net::IpAddr, req: &burst_cm::CmReq) {
    let found = PortSpace::from_service_id(req.service_id).zip(CmaHeader::parse(&req.private_data));
    let target =
        found.and_then(|((ps, port), hdr)| listener_for(ps, port, hdr.dst).map(|l| (l, hdr, port)));
    let Some((listener, hdr, port)) = target else {
        tracing::debug!(%peer, service = req.service_id, "REQ for no listener: rejected");
        let _ = d
            .svc
            .with(|cm, _| cm.reject(conn, reason::INVALID_SERVICE_ID, &[]));
        return;
    };
    let child = child_of(&listener, d, conn, &hdr, port);
    {
        let mut st = child.lock();
        // Our side of the QP is the mirror of theirs.
        st.neg = Negotiated {
            remote_qpn: req.local_qpn.value(),
            remote_psn: req.starting_psn.value(),
            // Chosen now: an application readying its own QP
            // (rdma_init_qp_attr before rdma_accept, rping -q)
            // needs it before the REP carries it.
            my_psn: random_psn(),
            mtu: req.path_mtu.clamp(1, d.mtu),
            responder_resources: req.initiator_depth.min(d.max_rd_atomic),
            initiator_depth: req.responder_resources.min(d.max_rd_atomic),
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            ack_timeout: match req.primary_path.local_ack_timeout {
                0 => DEFAULT_ACK_TIMEOUT,
                t => t,
            },
        };
    }
    let child_ptr = publish(Arc::clone(&child));
    let _ = child_ptr;
    post(&child, ev::CONNECT_REQUEST, 0, |ev| {
        ev.raw.listen_id = listener.raw();
        let n = req.private_data.len() - CMA_HEADER_LEN;
        ev.data[..n].copy_from_slice(&req.private_data[CMA_HEADER_LEN..]);
        ev.raw.param.conn = rdma_conn_param {
            private_data: ev.data.as_ptr().cast(),
            private_data_len: n as u8,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            flow_control: u8::from(req.end_to_end_flow_control),
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: u8::from(req.srq),
            qp_num: req.local_qpn.value(),
        };
    });
}

/// A SIDR_REQ: a new id on the listener's channel, or an UNSUPPORTED reply.
fn on_sidr_request(
    d: &Arc<DevCm>,
    conn: ConnId,
    peer: std::net::IpAddr,
    req: &burst_cm::CmSidrReq,
) {
    let found = PortSpace::from_service_id(req.service_id).zip(CmaHeader::parse(&req.private_data));
    let target =
        found.and_then(|((ps, port), hdr)| listener_for(ps, port, hdr.dst).map(|l| (l, hdr, port)));
    let Some((listener, hdr, port)) = target else {
        tracing::debug!(%peer, service = req.service_id, "SIDR_REQ for no listener");
        let rep = burst_cm::CmSidrRep {
            request_id: 0,
            status: burst_cm::sidr_status::UNSUPPORTED,
            add_info_length: 0,
            qpn: burst_verbs::Qpn::from_wire(0),
            service_id: req.service_id,
            qkey: 0,
            class_port_info: [0; 72],
            private_data: [0; 136],
        };
        let _ = d.svc.with(|cm, now| cm.sidr_reply(now, conn, rep));
        return;
    };
    let child = child_of(&listener, d, conn, &hdr, port);
    let _ = publish(Arc::clone(&child));
    post(&child, ev::CONNECT_REQUEST, 0, |ev| {
        ev.raw.listen_id = listener.raw();
        let n = req.private_data.len() - CMA_HEADER_LEN;
        ev.data[..n].copy_from_slice(&req.private_data[CMA_HEADER_LEN..]);
        ev.raw.param.ud.private_data = ev.data.as_ptr().cast();
        ev.raw.param.ud.private_data_len = n as u8;
    });
}

/// A REP: the QP made ready and established (ESTABLISHED), or handed to
/// the application first when it has none (CONNECT_RESPONSE).
fn on_reply(dev: usize, d: &Arc<DevCm>, conn: ConnId, rep: &burst_cm::CmRep) {
    let Some(id) = conn_id(dev, conn) else {
        let _ = d.svc.with(|cm, _| cm.reject(conn, reason::CONSUMER, &[]));
        return;
    };
    let has_qp = !id.qp().is_null();
    let ready = {
        let mut st = id.lock();
        st.neg.remote_qpn = rep.local_qpn.value();
        st.neg.remote_psn = rep.starting_psn.value();
        // The responder's resources bound our reads, its
        // initiator depth the reads we answer.
        st.neg.initiator_depth = st.neg.initiator_depth.min(rep.responder_resources);
        st.neg.responder_resources = st.neg.responder_resources.min(rep.initiator_depth);
        st.neg.rnr_retry_count = rep.rnr_retry_count;
        st.phase = Phase::RepRcvd;
        if has_qp {
            ready_qp(&id, &st)
        } else {
            Ok(())
        }
    };
    let fill = |ev: &mut Ev| {
        let n = rep.private_data.len();
        ev.data[..n].copy_from_slice(&rep.private_data);
        ev.raw.param.conn = rdma_conn_param {
            private_data: ev.data.as_ptr().cast(),
            private_data_len: n as u8,
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            flow_control: u8::from(rep.end_to_end_flow_control),
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count,
            srq: u8::from(rep.srq),
            qp_num: rep.local_qpn.value(),
        };
    };
    match ready {
        Ok(()) if has_qp => {
            if d.svc.with(|cm, now| cm.establish(now, conn)).is_ok() {
                id.lock().phase = Phase::Established;
                post(&id, ev::ESTABLISHED, 0, fill);
            }
        }
        Ok(()) => post(&id, ev::CONNECT_RESPONSE, 0, fill),
        Err(e) => {
            tracing::warn!(
                errno = e,
                "the QP could not take the peer's reply: rejected"
            );
            let _ = d.svc.with(|cm, _| cm.reject(conn, reason::CONSUMER, &[]));
            unregister_conn(dev, conn);
            id.lock().phase = Phase::Disconnected;
            post(&id, ev::CONNECT_ERROR, -e, |_| {});
        }
    }
}

/// A SIDR_REP: the peer's QPN and Q_Key as an address handle
/// (ESTABLISHED), or UNREACHABLE with its status.
fn on_sidr_reply(dev: usize, conn: ConnId, rep: &burst_cm::CmSidrRep) {
    let Some(id) = conn_id(dev, conn) else { return };
    unregister_conn(dev, conn);
    let (peer, sgid_index) = {
        let mut st = id.lock();
        st.conn = None;
        st.phase = if rep.status == burst_cm::sidr_status::OK {
            Phase::Established
        } else {
            Phase::Disconnected
        };
        (st.peer, st.sgid_index)
    };
    if rep.status != burst_cm::sidr_status::OK {
        post(&id, ev::UNREACHABLE, c_int::from(rep.status), |_| {});
        return;
    }
    let Some(peer) = peer else { return };
    post(&id, ev::ESTABLISHED, 0, |ev| {
        let n = rep.private_data.len();
        ev.data[..n].copy_from_slice(&rep.private_data);
        let mut ah = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        ah.grh.dgid = gid_of(peer);
        ah.grh.sgid_index = sgid_index;
        ah.grh.hop_limit = 64;
        ev.raw.param.ud = rdma_ud_param {
            private_data: ev.data.as_ptr().cast(),
            private_data_len: n as u8,
            ah_attr: ah,
            qp_num: rep.qpn.value(),
            qkey: rep.qkey,
        };
    });
}
