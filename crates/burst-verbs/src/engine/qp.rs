//! Queue pairs and SRQs: create, modify, query, destroy, counters.

use std::sync::Arc;

use crate::shm::Segment;

use burst_mem::Pd;
use burst_transport::{QpAttr, QpType, VerbsError};
use burst_wire::Qpn;

use super::*;
use crate::{AsyncEvent, DeviceCounters, QpInit, SrqId, FIRST_QPN};

impl Context {
    /// Creates a QP with its rings (depth `depth` each) and default sizes;
    /// returns its number.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        pd: Pd,
        send_cq: CqId,
        recv_cq: CqId,
        depth: usize,
    ) -> Result<Qpn, PostError> {
        let mut init = QpInit::new(qp_type, pd);
        init.caps.max_send_wr = depth as u32;
        init.caps.max_recv_wr = depth as u32;
        self.create_qp_with(&init, send_cq, recv_cq)
            .map(|q| q.qpn())
            .map_err(|e| match e {
                CreateError::Post(p) => p,
                CreateError::Verbs(_) => PostError::Invalid,
            })
    }

    /// `ibv_create_qp`: a QP in RESET with rings sized by `init.caps`,
    /// completing into `send_cq` / `recv_cq`.
    pub fn create_qp_with(
        &self,
        init: &QpInit,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<QueuePair, CreateError> {
        self.cq_ref(send_cq)?;
        self.cq_ref(recv_cq)?;
        self.check_pd(init.pd)?;
        if let Some(srq) = init.srq {
            self.srq_ref(srq)?;
        }
        let init = *init;
        // Checked before any ring is mapped (the transport checks again).
        if init.caps.max_send_wr > crate::MAX_QP_WR || init.caps.max_recv_wr > crate::MAX_QP_WR {
            return Err(CreateError::Verbs(VerbsError::InvalidValue(
                "max_send_wr/max_recv_wr",
            )));
        }
        let rings = self.plane.create_qp(self, &init, (send_cq, recv_cq))?;
        let rings = Arc::new(rings);
        let i = (rings.qpn.value() - FIRST_QPN) as usize;
        let mut all = self.shared.rings.write().unwrap_or_else(|e| e.into_inner());
        if all.len() <= i {
            all.resize(i + 1, None);
        }
        all[i] = Some(Arc::clone(&rings));
        Ok(QueuePair {
            rings,
            ctx: self.clone(),
        })
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&self, qpn: Qpn) -> Result<(), CreateError> {
        let ring = self.ring(qpn)?;
        self.plane.destroy_qp(self, qpn)?;
        self.drop_completions_of(&ring);
        Ok(())
    }

    /// The completions QP `ring` left in its CQs are never polled: it was
    /// reset or destroyed (mlx5's libibverbs provider cleans its CQs the
    /// same way; a completion of a gone QP would name work the
    /// application already took back).
    fn drop_completions_of(&self, ring: &QpRings) {
        for cq in [ring.send_cq, ring.recv_cq] {
            if let Ok(q) = self.cq_ref(cq) {
                q.drop_completions_of(ring.qpn);
            }
        }
    }

    /// Drops QP `qpn` from this process's table (no more posts reach it).
    pub(crate) fn forget_qp(&self, qpn: Qpn) {
        let mut all = self.shared.rings.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = all.get_mut(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            *slot = None;
        }
    }

    /// The segment of a QP's rings, with their slots (send, receive) and
    /// its lane: burstd hands them to the client.
    pub fn qp_segment(&self, qpn: Qpn) -> Result<(Arc<Segment>, usize, usize, usize), PostError> {
        let r = self.ring(qpn)?;
        Ok((
            Arc::clone(r.send.segment()),
            r.send.capacity(),
            r.recv.capacity(),
            r.lane,
        ))
    }

    /// SRQ `srq`, if this handle may reach it.
    pub(super) fn srq_ref(&self, srq: SrqId) -> Result<Arc<SrqRing>, PostError> {
        let all = self.shared.srqs.read().unwrap_or_else(|e| e.into_inner());
        match all.get(srq.0 as usize) {
            Some(Some(s)) if s.owner == self.owner => Ok(Arc::clone(s)),
            _ => Err(PostError::NoSuch),
        }
    }

    /// The segment of an SRQ's ring, with its slots.
    pub fn srq_segment(&self, srq: SrqId) -> Result<(Arc<Segment>, usize), PostError> {
        let s = self.srq_ref(srq)?;
        Ok((Arc::clone(s.ring.segment()), s.ring.capacity()))
    }

    /// `ibv_query_qp`: state and creation config.
    pub fn query_qp(
        &self,
        qpn: Qpn,
    ) -> Result<(burst_transport::QpState, burst_transport::QpConfig), PostError> {
        self.ring(qpn)?;
        self.call_on(self.lane_of(qpn), |reply| Control::QueryQp { qpn, reply })?
            .ok_or(PostError::NoSuch)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(
        &self,
        pd: Pd,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SharedReceiveQueue, CreateError> {
        self.check_pd(pd)?;
        if max_wr > crate::MAX_QP_WR {
            return Err(CreateError::Verbs(VerbsError::InvalidValue("max_wr")));
        }
        let (id, ring) = self.plane.create_srq(self, pd, max_wr, max_sge)?;
        let ring = Arc::new(SrqRing {
            ring,
            max_sge,
            owner: self.owner,
        });
        let mut all = self.shared.srqs.write().unwrap_or_else(|e| e.into_inner());
        let i = id.0 as usize;
        if all.len() <= i {
            all.resize(i + 1, None);
        }
        all[i] = Some(Arc::clone(&ring));
        Ok(SharedReceiveQueue {
            id,
            ring,
            ctx: self.clone(),
        })
    }

    /// `ibv_destroy_srq` (EBUSY while QPs use it).
    pub fn destroy_srq(&self, srq: SrqId) -> Result<(), CreateError> {
        self.srq_ref(srq)?;
        self.call(|reply| Control::DestroySrq { srq, reply })?
            .map_err(CreateError::Verbs)?;
        let mut all = self.shared.srqs.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = all.get_mut(srq.0 as usize) {
            *slot = None;
        }
        Ok(())
    }

    /// `ibv_modify_srq`: resize and/or arm the limit event.
    pub fn modify_srq(
        &self,
        srq: SrqId,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), CreateError> {
        self.srq_ref(srq)?;
        self.call(|reply| Control::ModifySrq {
            srq,
            max_wr,
            limit,
            reply,
        })?
        .map_err(CreateError::Verbs)
    }

    /// The next asynchronous event, if one is pending (never blocks).
    #[must_use = "an event not taken is lost"]
    pub fn take_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.try_take()
    }

    /// `ibv_get_async_event` exactly: reads the event descriptor (blocking
    /// unless the application made it non-blocking) and returns its event.
    pub fn read_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.read()
    }

    /// The descriptor that is readable while asynchronous events are
    /// pending (the context's `async_fd`).
    pub fn async_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.shared.events.fd)
    }

    /// Test support for fault containment (see
    /// the device's `debug_panic_on_packet_for`).
    #[doc(hidden)]
    pub fn debug_panic_on_packet_for(&self, qpn: Option<Qpn>) -> Result<(), PostError> {
        for lane in 0..self.control.len() {
            self.call_on(lane, |reply| Control::DebugPanicFor { qpn, reply })?;
        }
        Ok(())
    }
}

impl Context {
    /// The GID table of port 1, as `ibv_query_gid` reads it: entry `i` is
    /// GID index `i` (`None`: an empty slot); read again from the interface
    /// when older than a tenth of a second, so it follows address changes.
    /// A device on an address of no interface has that address at 0.
    pub fn gid_table(&self) -> Result<Vec<Option<[u8; 16]>>, PostError> {
        let t = self.call(|reply| Control::Gids { reply })?;
        Ok(t.into_iter().map(|g| g.map(crate::gid_of)).collect())
    }

    /// The index of `gid` in the GID table, else of the device's own
    /// address (the source an address vector names when a packet came to
    /// no GID of the table, a multicast group's), else 0.
    pub fn sgid_index_for(&self, gid: [u8; 16]) -> u8 {
        let table = self.gid_table().unwrap_or_default();
        let at = |g: [u8; 16]| table.iter().position(|e| *e == Some(g));
        at(gid)
            .or_else(|| at(self.gid))
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(0)
    }

    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast` of UD QP `qpn`
    /// and multicast group `mgid`, on the QP's lane (whose port joins or
    /// leaves the group).
    pub fn multicast(
        &self,
        qpn: Qpn,
        mgid: [u8; 16],
        attach: bool,
    ) -> Result<Result<(), VerbsError>, PostError> {
        self.ring(qpn)?;
        self.call_on(self.lane_of(qpn), |reply| Control::Multicast {
            qpn,
            mgid,
            attach,
            reply,
        })
    }

    /// `ibv_modify_qp`, executed by the engine.
    pub fn modify_qp(&self, qpn: Qpn, attr: &QpAttr) -> Result<Result<(), VerbsError>, PostError> {
        let ring = self.ring(qpn)?;
        let attr = *attr;
        if let Err(e) = self.check_ah(&attr) {
            return Ok(Err(e));
        }
        let r = self.call_on(self.lane_of(qpn), |reply| Control::ModifyQp {
            qpn,
            attr,
            reply,
        })?;
        if let (Ok(()), Some(s)) = (&r, attr.state) {
            ring.words.set_state(s);
            if s == burst_transport::QpState::Reset {
                self.drop_completions_of(&ring);
            }
        }
        Ok(r)
    }

    /// A QP takes only an address handle its owner created (a daemon
    /// client cannot point its QP at another client's AH).
    pub(super) fn check_ah(&self, attr: &QpAttr) -> Result<(), VerbsError> {
        self.plane.check_ah(self, attr)
    }

    /// Several `ibv_modify_qp` transitions of `qpn` in one trip to the
    /// engine (a connection manager's INIT, RTR, RTS); the first refused
    /// stops the rest and is returned with its index.
    pub fn modify_qp_steps(
        &self,
        qpn: Qpn,
        attrs: &[QpAttr],
    ) -> Result<Result<(), (usize, VerbsError)>, PostError> {
        let ring = self.ring(qpn)?;
        if let Some((i, e)) = attrs
            .iter()
            .enumerate()
            .find_map(|(i, a)| self.check_ah(a).err().map(|e| (i, e)))
        {
            return Ok(Err((i, e)));
        }
        let steps = attrs.to_vec();
        let r = self.call_on(self.lane_of(qpn), |reply| Control::ModifyQpSteps {
            qpn,
            attrs: steps,
            reply,
        })?;
        // The state of the last transition that was made.
        let made = match &r {
            Ok(()) => attrs.len(),
            Err((i, _)) => *i,
        };
        if let Some(s) = attrs[..made].iter().rev().find_map(|a| a.state) {
            ring.words.set_state(s);
        }
        if attrs[..made]
            .iter()
            .any(|a| a.state == Some(burst_transport::QpState::Reset))
        {
            self.drop_completions_of(&ring);
        }
        Ok(r)
    }

    /// Takes RC QP `qpn` from RESET to RTS towards `peer`: an address
    /// handle for its GID, then the INIT, RTR and RTS transitions
    /// ([`crate::RcParams::transitions`]).
    pub fn connect_rc(
        &self,
        qpn: Qpn,
        peer: &crate::RcPeer,
        p: &crate::RcParams,
    ) -> Result<(), CreateError> {
        let ah = self.create_ah(peer.gid)?;
        for attr in p.transitions(ah, peer) {
            self.modify_qp(qpn, &attr)?.map_err(CreateError::Verbs)?;
        }
        Ok(())
    }

    /// Device counters.
    pub fn counters(&self) -> Result<DeviceCounters, PostError> {
        let mut total = self.call(|reply| Control::Counters { reply })?;
        for lane in 1..self.control.len() {
            total.add(&self.call_on(lane, |reply| Control::Counters { reply })?);
        }
        Ok(total)
    }

    /// One QP's counters (RXE's per-QP names).
    pub fn qp_counters(&self, qpn: Qpn) -> Result<burst_transport::Counters, PostError> {
        self.ring(qpn)?;
        self.call_on(self.lane_of(qpn), |reply| Control::QpCounters {
            qpn,
            reply,
        })?
        .ok_or(PostError::NoSuch)
    }

    /// The congestion control's state: the algorithm, each peer's window,
    /// each QP's DCQCN rate.
    pub fn congestion(&self) -> Result<crate::CongestionReport, PostError> {
        self.call(|reply| Control::Congestion { reply })
    }

    pub(super) fn ring(&self, qpn: Qpn) -> Result<Arc<QpRings>, PostError> {
        let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        match rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            Some(Some(r)) if r.owner == self.owner => Ok(Arc::clone(r)),
            _ => Err(PostError::NoSuch),
        }
    }
}
