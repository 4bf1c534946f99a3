//! The CM exchange of an id: connect (REQ or SIDR_REQ), accept (REP or
//! SIDR_REP), reject, establish and disconnect.

use std::io;

use burst_cm::rdma::{self as cma, CmaHeader};
use burst_cm::{reason, sidr_status, CmSidrReq};

use super::id::Phase;
use super::qp::{Negotiated, DEFAULT_ACK_TIMEOUT};
use super::{errno, CmEventKind, CmId, ConnParam, EventParam};
use crate::{gid_of, Psn, QpType, Qpn};

/// 0xff means "the device's maximum"; anything above it is refused.
fn resources(v: u8, max: u8) -> io::Result<u8> {
    match v {
        0xff => Ok(max),
        v if v <= max => Ok(v),
        _ => Err(errno(libc::EINVAL)),
    }
}

/// The caller's private data, checked against what the message carries.
fn private_data(data: &[u8], max: usize) -> io::Result<&[u8]> {
    if data.len() > max {
        tracing::warn!(
            len = data.len(),
            max,
            "private data longer than the message carries"
        );
        return Err(errno(libc::EINVAL));
    }
    Ok(data)
}

impl CmId {
    /// `rdma_connect`: a REQ (a SIDR_REQ for UD) to the resolved peer;
    /// `None` asks for no READ resources and the most retries.
    pub fn connect(&self, p: Option<&ConnParam>) -> io::Result<()> {
        let cm = self.cm();
        let mut st = self.lock();
        if st.phase != Phase::RouteResolved {
            return Err(errno(libc::EINVAL));
        }
        let (Some(dev), Some(src), Some(dst), Some(peer)) = (st.dev, st.src, st.dst, st.peer)
        else {
            return Err(errno(libc::EINVAL));
        };
        let d = cm.device(dev)?;
        let max = if st.ps.is_datagram() {
            cma::SIDR_REQ_PRIVATE_DATA
        } else {
            cma::REQ_PRIVATE_DATA
        };
        let user = private_data(p.map_or(&[][..], |p| &p.private_data), max)?;
        let hdr = CmaHeader { src, dst: dst.ip() };
        let service_id = st.ps.service_id(dst.port());
        if st.ps.is_datagram() {
            let mut req = CmSidrReq {
                request_id: 0,
                pkey: 0xffff,
                service_id,
                private_data: [0; 216],
            };
            hdr.emit(&mut req.private_data);
            req.private_data[cma::CMA_HEADER_LEN..][..user.len()].copy_from_slice(user);
            let conn = d
                .svc
                .with(|c, now| c.sidr_request(now, peer, req))
                .map_err(|e| errno(e.errno()))?;
            st.conn = Some(conn);
            st.phase = Phase::Connecting;
            cm.register_conn(dev, conn, self);
            return Ok(());
        }
        let qp = self.qp();
        let qpn = match (&qp, p) {
            (Some(qp), _) => qp.qpn().value(),
            (None, Some(p)) if p.qp_num != 0 => p.qp_num,
            _ => return Err(errno(libc::EINVAL)),
        };
        let (rr, depth) = match p {
            Some(p) => (
                resources(p.responder_resources, d.max_rd_atomic)?,
                resources(p.initiator_depth, d.max_rd_atomic)?,
            ),
            None => (0, 0),
        };
        let my_psn = crate::random_psn().value();
        let mut req = burst_cm::req_template(
            service_id,
            Qpn::new(qpn).ok_or_else(|| errno(libc::EINVAL))?,
            Psn::new(my_psn),
        );
        req.responder_resources = rr;
        req.initiator_depth = depth;
        req.retry_count = p.map_or(7, |p| p.retry_count.min(7));
        req.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count.min(7));
        req.end_to_end_flow_control = p.is_none_or(|p| p.flow_control);
        req.srq = p.is_some_and(|p| p.srq);
        if qp.as_ref().is_some_and(|q| q.qp_type() == QpType::Uc) {
            req.transport = burst_cm::CmTransport::Uc;
        } else {
            // burst's ECE offer (selective repeat), or what the application
            // set (rdma_set_local_ece); the kernel's CM hands it to its
            // application, which has no use for ours.
            req.ece = super::qp::cm_ece(st.local_ece.unwrap_or(crate::Ece::offered()));
        }
        req.path_mtu = d.mtu;
        let ack_timeout = st.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT);
        req.primary_path.local_ack_timeout = ack_timeout;
        req.primary_path.local_gid = d.gid;
        req.primary_path.remote_gid = gid_of(peer);
        hdr.emit(&mut req.private_data);
        req.private_data[cma::CMA_HEADER_LEN..][..user.len()].copy_from_slice(user);
        st.neg = Negotiated {
            my_psn,
            mtu: d.mtu,
            responder_resources: rr,
            initiator_depth: depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            ack_timeout,
            ..Negotiated::default()
        };
        st.phase = Phase::Connecting;
        // Registered before the REQ leaves: the reply may beat this call's return.
        let conn = d.svc.with(|c, now| {
            let r = c.connect(now, peer, req);
            if let Ok(conn) = r {
                cm.register_conn(dev, conn, self);
            }
            r
        });
        match conn {
            Ok(c) => {
                st.conn = Some(c);
                Ok(())
            }
            Err(e) => {
                st.phase = Phase::RouteResolved;
                Err(errno(e.errno()))
            }
        }
    }

    /// `rdma_accept` on a request's id: the QP made ready and a REP (a
    /// SIDR_REP for UD); `None` keeps what the request asked for.
    pub fn accept(&self, p: Option<&ConnParam>) -> io::Result<()> {
        let cm = self.cm();
        let mut st = self.lock();
        if st.phase != Phase::RequestRcvd {
            return Err(errno(libc::EINVAL));
        }
        let (Some(dev), Some(conn)) = (st.dev, st.conn) else {
            return Err(errno(libc::EINVAL));
        };
        let d = cm.device(dev)?;
        let qp = self.qp();
        let qpn = match (&qp, p) {
            (Some(qp), _) => qp.qpn().value(),
            (None, Some(p)) if p.qp_num != 0 => p.qp_num,
            _ => return Err(errno(libc::EINVAL)),
        };
        let qpn = Qpn::new(qpn).ok_or_else(|| errno(libc::EINVAL))?;
        if st.ps.is_datagram() {
            let user = private_data(
                p.map_or(&[][..], |p| &p.private_data),
                cma::SIDR_REP_PRIVATE_DATA,
            )?;
            let mut rep = burst_cm::sidr_rep_template(sidr_status::OK, qpn, cma::RDMA_UDP_QKEY);
            rep.private_data[..user.len()].copy_from_slice(user);
            if let Some(sid) = st.src.map(|s| st.ps.service_id(s.port())) {
                rep.service_id = sid;
            }
            d.svc
                .with(|c, now| c.sidr_reply(now, conn, rep))
                .map_err(|e| errno(e.errno()))?;
            cm.unregister_conn(dev, conn);
            st.conn = None;
            st.phase = Phase::Established;
            return Ok(());
        }
        // The request's values were stored, swapped, at the request.
        if let Some(p) = p {
            if p.responder_resources != 0xff {
                st.neg.responder_resources = resources(p.responder_resources, d.max_rd_atomic)?;
            }
            if p.initiator_depth != 0xff {
                st.neg.initiator_depth = resources(p.initiator_depth, d.max_rd_atomic)?;
            }
        }
        let user = private_data(
            p.map_or(&[][..], |p| &p.private_data),
            cma::REP_PRIVATE_DATA,
        )?;
        // burst's one-round-trip setup when the REQ offered it and the
        // QP is ours to hold back until the active side is ready (an
        // application readying its own QP could not be held: standard).
        let fast = qp.is_some() && d.svc.with(|c, _| c.is_fast(conn));
        st.neg.fast_setup = fast;
        st.phase = Phase::Accepting;
        if let Err(e) = self.ready_qp(&st) {
            st.phase = Phase::RequestRcvd;
            tracing::warn!("rdma_accept: the QP could not be made ready: {e}");
            return Err(e);
        }
        let mut rep = burst_cm::rep_template(qpn, Psn::new(st.neg.my_psn));
        rep.responder_resources = st.neg.responder_resources;
        rep.initiator_depth = st.neg.initiator_depth;
        rep.rnr_retry_count = p.map_or(7, |p| p.rnr_retry_count.min(7));
        rep.end_to_end_flow_control = p.is_none_or(|p| p.flow_control);
        rep.srq = p.is_some_and(|p| p.srq);
        rep.private_data[..user.len()].copy_from_slice(user);
        // What both offered (nothing unless the REQ was burst's); an
        // application readying its own QP answers its QP's options under
        // the peer's vendor ID, as librdmacm does.
        rep.ece = super::qp::cm_ece(match st.local_ece {
            Some(l) => crate::Ece {
                vendor_id: st.remote_ece.vendor_id,
                options: l.options,
            },
            None => st.neg.ece,
        });
        let established = d
            .svc
            .with(|c, now| {
                if !fast {
                    c.decline_fast(conn);
                }
                c.accept(now, conn, rep)
            })
            .map_err(|e| errno(e.errno()))?;
        if established {
            // Set up fast: established with the REP, no RTU to wait for.
            st.phase = Phase::Established;
            drop(st);
            self.post(CmEventKind::Established, 0, None, EventParam::None);
        } else if fast {
            // The CM fell back to the standard exchange after the QP was
            // readied to wait for its peer: nothing would open it for a
            // protocol where this side speaks first.
            drop(st);
            self.peer_ready();
        }
        Ok(())
    }

    /// `rdma_reject` on a request's id: a REJ (consumer reason) or a
    /// SIDR_REP with status REJECT, carrying `private_data`.
    pub fn reject(&self, private: &[u8]) -> io::Result<()> {
        self.reject_for(private, reason::CONSUMER)
    }

    /// `rdma_reject_ece`: a REJ saying the REQ's ECE options are not
    /// supported (IBA reason 35), carrying `private_data`.
    pub fn reject_ece(&self, private: &[u8]) -> io::Result<()> {
        self.reject_for(private, reason::VENDOR_OPTION_NOT_SUPPORTED)
    }

    fn reject_for(&self, private: &[u8], why: u16) -> io::Result<()> {
        let cm = self.cm();
        let mut st = self.lock();
        let (Some(dev), Some(conn), Phase::RequestRcvd) = (st.dev, st.conn, st.phase) else {
            return Err(errno(libc::EINVAL));
        };
        let d = cm.device(dev)?;
        let r = if st.ps.is_datagram() {
            let pd = private_data(private, cma::SIDR_REP_PRIVATE_DATA)?;
            let mut rep = burst_cm::sidr_rep_template(sidr_status::REJECT, Qpn::from_wire(0), 0);
            rep.private_data[..pd.len()].copy_from_slice(pd);
            d.svc.with(|c, now| c.sidr_reply(now, conn, rep))
        } else {
            let pd = private_data(private, cma::REJ_PRIVATE_DATA)?;
            d.svc.with(|c, _| c.reject(conn, why, pd))
        };
        cm.unregister_conn(dev, conn);
        st.conn = None;
        st.phase = Phase::Disconnected;
        r.map_err(|e| errno(e.errno()))
    }

    /// `rdma_establish`: the active side without a QP (it got
    /// [`ConnectResponse`](super::CmEventKind::ConnectResponse) and readied its own) sends the RTU.
    pub fn establish(&self) -> io::Result<()> {
        if self.qp().is_some() {
            return Err(errno(libc::EINVAL));
        }
        let mut st = self.lock();
        let (Some(dev), Some(conn), Phase::RepRcvd) = (st.dev, st.conn, st.phase) else {
            return Err(errno(libc::EINVAL));
        };
        let d = self.cm().device(dev)?;
        d.svc
            .with(|c, now| c.establish(now, conn))
            .map_err(|e| errno(e.errno()))?;
        st.phase = Phase::Established;
        Ok(())
    }

    /// `rdma_notify`: the passive side saw traffic before the RTU; the
    /// connection is established (ESTABLISHED follows).
    pub fn notify(&self) {
        let st = self.lock();
        if let (Some(dev), Some(conn), Phase::Accepting) = (st.dev, st.conn, st.phase) {
            if let Ok(d) = self.cm().device(dev) {
                let _ = d.svc.with(|c, now| c.establish(now, conn));
            }
        }
    }

    /// `rdma_disconnect`: the QP to ERROR (its work flushes) and a DREQ;
    /// returns whether a DREQ left (a [`Disconnected`](super::CmEventKind::Disconnected)
    /// follows).
    pub fn disconnect(&self) -> io::Result<bool> {
        self.qp_to_error();
        let mut st = self.lock();
        match (st.phase, st.dev, st.conn) {
            (Phase::Disconnected, ..) => Ok(false),
            (Phase::Established | Phase::Accepting | Phase::RepRcvd, Some(dev), Some(conn))
                if !st.ps.is_datagram() =>
            {
                let d = self.cm().device(dev)?;
                match d.svc.with(|c, now| c.disconnect(now, conn, &[])) {
                    Ok(()) => Ok(true),
                    // Already gone from the CM (time-wait over).
                    Err(_) => {
                        st.phase = Phase::Disconnected;
                        Ok(false)
                    }
                }
            }
            (Phase::Established | Phase::Accepting | Phase::RepRcvd, ..) => Ok(false),
            _ => Err(errno(libc::EINVAL)),
        }
    }
}
