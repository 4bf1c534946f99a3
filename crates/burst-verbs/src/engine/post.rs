//! Posting work requests and polling completions.

use burst_transport::{QpState, RecvWr, SendWr, VerbsError, WorkCompletion};
use burst_wire::Qpn;

use super::*;

impl Context {
    /// `ibv_post_send`: checks the work request ([`crate::QpConfig::check_send`],
    /// errors returned now with rdma-core's errno), captures inline data
    /// as `ibv_post_send` does, then hands it to the transport: directly
    /// when this thread can hold the core (and steps it to transmit), else
    /// through the QP's ring and a doorbell. (A [`QueuePair`] handle does
    /// the same without looking the QP up.)
    pub fn post_send(&self, qpn: Qpn, wr: &SendWr) -> Result<(), PostError> {
        self.post_send_to(&*self.ring(qpn)?, wr)
    }

    pub(super) fn post_send_to(&self, ring: &QpRings, wr: &SendWr) -> Result<(), PostError> {
        self.post_send_in_list(ring, wr, false)
    }

    /// [`Context::post_send_to`] of one WR of an `ibv_post_send` list;
    /// `more`: WRs follow, whose last post (or the caller's
    /// [`Context::send_posted`] if the list stops short) sends them all.
    pub(super) fn post_send_in_list(
        &self,
        ring: &QpRings,
        wr: &SendWr,
        more: bool,
    ) -> Result<(), PostError> {
        let wr = *wr;
        let len = ring.cfg.check_send(&wr).map_err(PostError::Refused)?;
        if self.plane.gone() {
            return Err(PostError::Stopped);
        }
        // As RXE: sends need RTS (or later: in SQD, SQE and ERR they queue,
        // in ERR to be flushed); the queue's depth bounds outstanding WRs.
        let state = ring.words.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostError::Refused(VerbsError::InvalidState(state)));
        }
        if !ring.words.reserve(false, ring.cfg.max_send_wr) {
            return Err(PostError::Refused(VerbsError::QueueFull));
        }
        let r = self.post_send_reserved(ring, wr, len, more);
        if r.is_err() {
            ring.words.unreserve(false);
        }
        r
    }

    pub(super) fn post_send_reserved(
        &self,
        ring: &QpRings,
        mut wr: SendWr,
        len: u64,
        more: bool,
    ) -> Result<(), PostError> {
        if wr.inline && wr.inline_data.is_none() {
            self.plane.gather_inline(self, ring.cfg.pd, &mut wr, len)?;
        }
        match self.step_with(ring.lane, Round::Post, Stepper::Poster, |core| {
            core.post_send_now(ring, wr, len, more)
        }) {
            Some((_, Some(r))) => r,
            // A fault contained while posting: the QPs are in error now.
            Some((_, None)) => Err(PostError::Stopped),
            None => {
                ring.send.push(wr).map_err(|_| PostError::Full)?;
                self.shared.doorbells[ring.lane].ring(ring.qpn.value());
                // Whoever holds the core takes it at its next step; if
                // that thread just let go, this step takes it.
                self.progress_transmit();
                Ok(())
            }
        }
    }

    /// Sends what posts of this thread left in the cork of `lane` (an
    /// `ibv_post_send` list refused part-way: the WRs before the refused
    /// one were posted as "more to follow").
    pub(super) fn send_posted(&self, lane: usize) {
        let _ = self.step_with(lane, Round::Transmit, Stepper::Poster, |_| ());
    }

    /// `ibv_post_recv`: checked now ([`crate::QpConfig::check_recv`]), then into
    /// the transport directly when the core is free, else through the ring.
    pub fn post_recv(&self, qpn: Qpn, wr: &RecvWr) -> Result<(), PostError> {
        self.post_recv_to(&*self.ring(qpn)?, wr)
    }

    pub(super) fn post_recv_to(&self, ring: &QpRings, wr: &RecvWr) -> Result<(), PostError> {
        ring.cfg.check_recv(wr).map_err(PostError::Refused)?;
        if self.device_failed() {
            return Err(PostError::Stopped);
        }
        // Receives may be posted from INIT on (IBA C10-49; in ERR they are
        // flushed); the queue's depth bounds outstanding WRs.
        let state = ring.words.state();
        if state == QpState::Reset {
            return Err(PostError::Refused(VerbsError::InvalidState(state)));
        }
        if !ring.words.reserve(true, ring.cfg.max_recv_wr) {
            return Err(PostError::Refused(VerbsError::QueueFull));
        }
        let r = self.post_recv_reserved(ring, wr);
        if r.is_err() {
            ring.words.unreserve(true);
        }
        r
    }

    pub(super) fn post_recv_reserved(&self, ring: &QpRings, wr: &RecvWr) -> Result<(), PostError> {
        // No step: the next post_send or poll of an empty CQ steps. Stepping
        // here would send the deferred ACK of the message just received
        // alone, a system call before the reply the application is about to
        // post and it could ride with (ping-pong: four sends per round trip
        // instead of two).
        let sh = &*self.shared;
        if let Some(Ok(mut core)) = sh.cores.get(ring.lane).map(|c| c.try_lock()) {
            if let Some(r) = core.contained(sh, |c| c.post_recv_now(ring, *wr)) {
                return r;
            }
            return Err(PostError::Stopped);
        }
        ring.recv.push(*wr).map_err(|_| PostError::Full)?;
        sh.doorbells[ring.lane].ring(ring.qpn.value());
        Ok(())
    }

    /// Takes a completion from a CQ ring (never blocks; steps the data
    /// plane once when the ring is empty, unless this is the first empty
    /// poll since the CQ was armed: see `Cq::poll_may_skip_step`).
    #[must_use = "a completion not taken is lost"]
    pub fn poll_cq(&self, cq: CqId) -> Option<WorkCompletion> {
        self.poll_one(&*self.cq_ref(cq).ok()?)
    }

    /// [`Context::poll_cq`] on a CQ already looked up (a
    /// [`CompletionQueue`] handle's poll too).
    pub(super) fn poll_one(&self, q: &Cq) -> Option<WorkCompletion> {
        let wc = q.pop().or_else(|| {
            if q.poll_may_skip_step() {
                return None;
            }
            self.progress();
            q.pop()
        });
        if wc.is_some() {
            self.took_completion(q);
        }
        wc
    }

    /// A poll took a completion from `q`: if that was its last one and no
    /// QP of the lanes has work outstanding, the polling thread's claims
    /// end soon ([`drivers::Drivers::shorten`]).
    pub(super) fn took_completion(&self, q: &Cq) {
        if !q.ring.is_empty() || self.shared.drivers.iter().all(|d| d.ready.is_none()) {
            return;
        }
        if self.work_outstanding() {
            return;
        }
        // What its steps left for the next round goes now (the ACK of the
        // message it just took: with nothing left to poll for, this thread
        // may not step again, and the peer's send would wait for traffic
        // or its retransmission timer). No claim: it is handing over.
        for lane in 0..self.shared.cores.len() {
            let _ = self.step_with(lane, Round::Transmit, Stepper::Leaving, |_| ());
        }
        self.hand_over();
    }

    /// The calling thread has nothing left to poll for (it took its last
    /// completion, or armed a CQ to wait for an event): its claims end and
    /// the engine threads watch the ports ([`drivers::Drivers::shorten`]).
    pub(super) fn hand_over(&self) {
        let sh = &*self.shared;
        // No engine thread (a simulation, a daemon client): nobody to hand to.
        if sh.drivers.iter().all(|d| d.ready.is_none()) {
            return;
        }
        // Sends corked behind packets in flight would go with the ACK
        // that the engine now waits for; the thread is about to wait for
        // their completions, so they go now.
        for (lane, core) in sh.cores.iter().enumerate() {
            let corked = core
                .try_lock()
                .is_ok_and(|c| c.dev.as_ref().is_some_and(Device::corked));
            if corked {
                let _ = self.step_with(lane, Round::Transmit, Stepper::Leaving, |_| ());
            }
        }
        let now = sh.clock.now();
        for d in sh.drivers.iter() {
            d.shorten(now);
        }
    }

    /// Whether a QP of this handle's owner has posted work not yet retired
    /// (looks at 64 QPs at most: more than that, it assumes so).
    fn work_outstanding(&self) -> bool {
        let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        let mine = rings.iter().flatten().filter(|r| r.owner == self.owner);
        let mut seen = 0;
        for r in mine {
            seen += 1;
            if seen > 64 || r.words.outstanding() {
                return true;
            }
        }
        false
    }

    /// Takes a completion already in a CQ ring, without stepping the data
    /// plane (a caller that steps it itself, such as a simulator).
    #[must_use = "a completion not taken is lost"]
    pub fn take_completion(&self, cq: CqId) -> Option<WorkCompletion> {
        self.cq_ref(cq).ok()?.pop()
    }

    /// A handle on QP `qpn` that posts without any lookup.
    pub fn qp(&self, qpn: Qpn) -> Option<QueuePair> {
        self.ring(qpn).ok().map(|rings| QueuePair {
            rings,
            ctx: self.clone(),
        })
    }

    /// A handle on CQ `cq` that polls without any lookup.
    pub fn cq(&self, cq: CqId) -> Option<CompletionQueue> {
        self.cq_ref(cq).ok().map(|q| CompletionQueue {
            id: cq,
            cq: q,
            ctx: self.clone(),
        })
    }
}
