//! burst-cm's events turned into rdma_cm events (on the CM's thread): a
//! request becomes a new id on the listener's channel, a reply readies
//! the active QP and sends the RTU, a reject or a disconnect reaches the
//! id it is for.

use std::net::IpAddr;
use std::sync::Arc;

use burst_cm::rdma::{CmaHeader, PortSpace, CMA_HEADER_LEN};
use burst_cm::{reason, sidr_status, CmEvent, CmRep, CmReq, CmSidrRep, CmSidrReq, ConnId};

use super::id::Phase;
use super::qp::{ece_of, Negotiated, DEFAULT_ACK_TIMEOUT};
use super::{AddressVector, CmEventKind, CmId, ConnParam, Device, EventParam, Shared, UdParam};
use crate::{gid_of, Qpn};

pub(super) fn on_cm_event(cm: &Arc<Shared>, dev: usize, e: CmEvent) {
    let Ok(d) = cm.device(dev) else { return };
    match e {
        CmEvent::Request { conn, peer, req } => on_request(cm, &d, conn, peer, &req),
        CmEvent::SidrRequest { conn, peer, req } => on_sidr_request(cm, &d, conn, peer, &req),
        CmEvent::Reply { conn, rep } => on_reply(cm, &d, conn, &rep),
        CmEvent::Established { conn } => {
            let Some(id) = cm.conn_id(dev, conn) else {
                return;
            };
            id.lock().phase = Phase::Established;
            id.post(CmEventKind::Established, 0, None, EventParam::None);
        }
        CmEvent::PeerReady { conn } => {
            // A connection set up fast: the active side's QP receives now,
            // so ours may send (it may already: the peer's first packet
            // opens it too).
            if let Some(id) = cm.conn_id(dev, conn) {
                id.peer_ready();
            }
        }
        CmEvent::Rejected { conn, rej } => {
            let Some(id) = lost(cm, dev, conn) else {
                return;
            };
            id.qp_to_error();
            let param = EventParam::Conn(ConnParam {
                private_data: rej.private_data.to_vec(),
                ..ConnParam::default()
            });
            id.post(CmEventKind::Rejected, i32::from(rej.reason), None, param);
        }
        CmEvent::Unreachable { conn } => {
            let Some(id) = lost(cm, dev, conn) else {
                return;
            };
            id.post(
                CmEventKind::Unreachable,
                -libc::ETIMEDOUT,
                None,
                EventParam::None,
            );
        }
        CmEvent::Disconnected { conn } => {
            let Some(id) = cm.conn_id(dev, conn) else {
                return;
            };
            id.lock().phase = Phase::Disconnected;
            id.post(CmEventKind::Disconnected, 0, None, EventParam::None);
        }
        CmEvent::TimeWaitExit { conn } => {
            // The kernel's RDMA CM reports it only for kernel QPs.
            if let Some(id) = cm.conn_id(dev, conn) {
                id.lock().conn = None;
            }
            cm.unregister_conn(dev, conn);
        }
        CmEvent::SidrReply { conn, rep } => on_sidr_reply(cm, dev, conn, &rep),
    }
}

/// The id of a connection that ended before it was set up (rejected,
/// unreachable), unregistered.
fn lost(cm: &Shared, dev: usize, conn: ConnId) -> Option<CmId> {
    let id = cm.conn_id(dev, conn)?;
    cm.unregister_conn(dev, conn);
    let mut st = id.lock();
    st.conn = None;
    st.phase = Phase::Disconnected;
    drop(st);
    Some(id)
}

/// The listener that takes a request for `ps`/`port` to `dst`: bound to
/// that address, or to the wildcard.
fn listener_for(cm: &Shared, ps: PortSpace, port: u16, dst: IpAddr) -> Option<CmId> {
    cm.with_reg(|r| {
        r.listeners
            .iter()
            .find(|l| {
                let st = l.lock();
                st.ps == ps
                    && st.src.is_some_and(|s| {
                        s.port() == port
                            && (s.ip().is_unspecified() || super::addr::same(s.ip(), dst))
                    })
            })
            .cloned()
    })
}

/// The listener a request's service ID and rdma_cm header name.
fn target(cm: &Shared, service_id: u64, private: &[u8]) -> Option<(CmId, CmaHeader, u16)> {
    let ((ps, port), hdr) =
        PortSpace::from_service_id(service_id).zip(CmaHeader::parse(private))?;
    listener_for(cm, ps, port, hdr.dst).map(|l| (l, hdr, port))
}

/// A REQ: a new id on the listener's channel (CONNECT_REQUEST), or a REJ
/// when nothing listens on its service and address.
fn on_request(cm: &Arc<Shared>, d: &Device, conn: ConnId, peer: IpAddr, req: &CmReq) {
    let Some((listener, hdr, port)) = target(cm, req.service_id, &req.private_data) else {
        tracing::debug!(%peer, service = req.service_id, "REQ for no listener: rejected");
        let _ = d
            .svc
            .with(|c, _| c.reject(conn, reason::INVALID_SERVICE_ID, &[]));
        return;
    };
    let child = CmId::child(&listener, d, conn, &hdr, port);
    child.lock().remote_ece = ece_of(req.ece);
    // Our side of the QP is the mirror of theirs.
    child.lock().neg = Negotiated {
        remote_qpn: req.local_qpn.value(),
        remote_psn: req.starting_psn.value(),
        // Chosen now: an application readying its own QP
        // (rdma_init_qp_attr before rdma_accept, rping -q) needs it
        // before the REP carries it.
        my_psn: crate::random_psn().value(),
        mtu: req.path_mtu.clamp(1, d.mtu),
        responder_resources: req.initiator_depth.min(d.max_rd_atomic),
        initiator_depth: req.responder_resources.min(d.max_rd_atomic),
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        ack_timeout: match req.primary_path.local_ack_timeout {
            0 => DEFAULT_ACK_TIMEOUT,
            t => t,
        },
        ece: match req.transport {
            burst_cm::CmTransport::Rc => crate::Ece::offered().agree(&ece_of(req.ece)),
            _ => crate::Ece::default(),
        },
        // Decided at rdma_accept (it needs the id's QP).
        fast_setup: false,
    };
    let param = EventParam::Conn(ConnParam {
        private_data: req.private_data[CMA_HEADER_LEN..].to_vec(),
        responder_resources: req.initiator_depth,
        initiator_depth: req.responder_resources,
        flow_control: req.end_to_end_flow_control,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        srq: req.srq,
        qp_num: req.local_qpn.value(),
    });
    child.post(CmEventKind::ConnectRequest, 0, Some(listener), param);
}

/// A SIDR_REQ: a new id on the listener's channel, or an UNSUPPORTED reply.
fn on_sidr_request(cm: &Arc<Shared>, d: &Device, conn: ConnId, peer: IpAddr, req: &CmSidrReq) {
    let Some((listener, hdr, port)) = target(cm, req.service_id, &req.private_data) else {
        tracing::debug!(%peer, service = req.service_id, "SIDR_REQ for no listener");
        let rep = CmSidrRep {
            service_id: req.service_id,
            ..burst_cm::sidr_rep_template(sidr_status::UNSUPPORTED, Qpn::from_wire(0), 0)
        };
        let _ = d.svc.with(|c, now| c.sidr_reply(now, conn, rep));
        return;
    };
    let child = CmId::child(&listener, d, conn, &hdr, port);
    let param = EventParam::Ud(UdParam {
        private_data: req.private_data[CMA_HEADER_LEN..].to_vec(),
        ..UdParam::default()
    });
    child.post(CmEventKind::ConnectRequest, 0, Some(listener), param);
}

/// A REP: the QP made ready and established (ESTABLISHED), or handed to
/// the application first when it has none (CONNECT_RESPONSE).
fn on_reply(cm: &Arc<Shared>, d: &Device, conn: ConnId, rep: &CmRep) {
    let Some(id) = cm.conn_id(d.index, conn) else {
        let _ = d.svc.with(|c, _| c.reject(conn, reason::CONSUMER, &[]));
        return;
    };
    let has_qp = id.qp().is_some();
    let ready = {
        let mut st = id.lock();
        st.neg.remote_qpn = rep.local_qpn.value();
        st.neg.remote_psn = rep.starting_psn.value();
        // The responder's resources bound our reads, its initiator depth
        // the reads we answer.
        st.neg.initiator_depth = st.neg.initiator_depth.min(rep.responder_resources);
        st.neg.responder_resources = st.neg.responder_resources.min(rep.initiator_depth);
        st.neg.rnr_retry_count = rep.rnr_retry_count;
        st.remote_ece = ece_of(rep.ece);
        st.neg.ece = crate::Ece::offered().agree(&ece_of(rep.ece));
        st.phase = Phase::RepRcvd;
        id.ready_qp(&st)
    };
    let param = EventParam::Conn(ConnParam {
        private_data: rep.private_data.to_vec(),
        responder_resources: rep.initiator_depth,
        initiator_depth: rep.responder_resources,
        flow_control: rep.end_to_end_flow_control,
        retry_count: 0,
        rnr_retry_count: rep.rnr_retry_count,
        srq: rep.srq,
        qp_num: rep.local_qpn.value(),
    });
    match ready {
        Ok(()) if has_qp => {
            if d.svc.with(|c, now| c.establish(now, conn)).is_ok() {
                id.lock().phase = Phase::Established;
                id.post(CmEventKind::Established, 0, None, param);
            }
        }
        Ok(()) => id.post(CmEventKind::ConnectResponse, 0, None, param),
        Err(e) => {
            tracing::warn!("the QP could not take the peer's reply: rejected ({e})");
            let _ = d.svc.with(|c, _| c.reject(conn, reason::CONSUMER, &[]));
            cm.unregister_conn(d.index, conn);
            id.lock().phase = Phase::Disconnected;
            let status = -e.raw_os_error().unwrap_or(libc::EINVAL);
            id.post(CmEventKind::ConnectError, status, None, EventParam::None);
        }
    }
}

/// A SIDR_REP: the peer's QPN and Q_Key with an address vector
/// (ESTABLISHED), or UNREACHABLE with its status.
fn on_sidr_reply(cm: &Shared, dev: usize, conn: ConnId, rep: &CmSidrRep) {
    let Some(id) = cm.conn_id(dev, conn) else {
        return;
    };
    cm.unregister_conn(dev, conn);
    let ok = rep.status == sidr_status::OK;
    let (peer, sgid_index) = {
        let mut st = id.lock();
        st.conn = None;
        st.phase = if ok {
            Phase::Established
        } else {
            Phase::Disconnected
        };
        (st.peer, st.sgid_index)
    };
    if !ok {
        id.post(
            CmEventKind::Unreachable,
            i32::from(rep.status),
            None,
            EventParam::None,
        );
        return;
    }
    let Some(peer) = peer else { return };
    let param = EventParam::Ud(UdParam {
        private_data: rep.private_data.to_vec(),
        av: AddressVector {
            dgid: gid_of(peer),
            sgid_index,
            hop_limit: 64,
        },
        qp_num: rep.qpn.value(),
        qkey: rep.qkey,
    });
    id.post(CmEventKind::Established, 0, None, param);
}
