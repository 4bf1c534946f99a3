//! The requester (IBA ch. 9.7, send side; RXE's `rxe_req.c`): admits work
//! requests into the PSN space (fence, READ/atomic credits, the packet
//! window, the data plane's congestion credit), builds request packets,
//! and runs the ACK and RNR timers.
//!
//! Retries (IBA 9.7.5.2; the retry count `retry_cnt` of the QP): a local
//! ACK timeout, a NAK-sequence error and an implied NAK (an ACK past a
//! READ or atomic whose response is missing) each start a retry from the
//! first unacknowledged PSN and spend one; any forward progress (an ACK
//! or response that retires PSNs) restores the full count, so a responder
//! that keeps answering with progress never exhausts it. A NAK for the PSN
//! a retry already resends from starts nothing new (as RXE's completer,
//! which counts one per retry sequence). 7 is a count like any other for
//! `retry_cnt` (only `rnr_retry` 7 means infinite); kernel RXE treats
//! `retry_cnt` 7 as infinite too, burst follows the specification.
//!
//! The ACK timer runs while request packets are in flight: it starts with
//! the first packet sent after progress or a go-back, so time spent held
//! back by congestion control (nothing sent, nothing lost) spends no
//! retry. Consecutive timeouts double it, up to four times the QP's value,
//! with a per-QP jitter of up to 1/8 (QPs that lost packets together do
//! not retransmit together); progress restores it (NVIDIA's adaptive
//! retransmission likewise backs off and randomises the first timeout).

use super::*;

impl Qp {
    pub(super) fn ack_timeout_ns(&self) -> Option<Nanos> {
        // 4.096 us * 2^timeout; 0 means infinite.
        (self.attrs.timeout != 0).then(|| 4096u64 << self.attrs.timeout.min(31))
    }

    /// When the ACK timer started at `now` expires: the QP's timeout,
    /// doubled per consecutive timeout up to 4x, plus a jitter of up to
    /// 1/8 that depends on the QP number and the retries left.
    pub(super) fn retransmit_deadline(&self, now: Nanos) -> Option<Nanos> {
        let base = self.ack_timeout_ns()?;
        let mut h = u64::from(self.cfg.qpn.value()) << 8 | u64::from(self.req.retry_left);
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let jitter = (base / 8) * ((h >> 60) & 7) / 8;
        let d = (base << self.req.backoff.min(2)) + jitter;
        Some(now + d.min(4 * base))
    }

    /// Runs expired timers.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.run_timers(now);
        self.guard_outstanding(now);
    }

    pub(super) fn run_timers(&mut self, now: Nanos) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        if self.probe_deadline().is_some_and(|t| t <= now) {
            // Saturating: with a huge ACK timeout probes go on (each 256
            // floors apart at most) and the count must not wrap.
            self.req.probes = self.req.probes.saturating_add(1);
            self.req.probe_from = now;
            self.counters.sr_probes += 1;
            self.probe_oldest(false);
        }
        if self.req.timer.is_some_and(|t| t <= now) {
            self.req.timer = None;
            if self.state != QpState::Rts && self.state != QpState::Sqd {
                return;
            }
            if self.packets_in_flight() == 0 {
                // Nothing sent since the last go-back or progress: the
                // requester was held back, not unanswered.
                return;
            }
            self.counters.completer_retry_err += 1;
            self.count_retry_round();
            if self.req.retry_left == 0 {
                self.counters.retry_exceeded_err += 1;
                self.fail_front(WcStatus::RetryExcErr);
                return;
            }
            self.req.retry_left -= 1;
            self.req.backoff = self.req.backoff.saturating_add(1);
            self.req.events.timeouts += 1;
            let una = self.req.una_psn;
            self.req.last_rewind = None;
            for w in self.req.sq.iter_mut() {
                w.read_rerequested = false;
            }
            self.rewind(una);
        }
    }

    /// A NAK-sequence error or an implied NAK asks for everything from
    /// `psn` again: a retry, unless one from `psn` is under way. Returns
    /// false when the retry count was exhausted (the QP failed).
    pub(super) fn retry_from(&mut self, psn: Psn) -> bool {
        if !self.spend_retry(psn, false) {
            return false;
        }
        self.rewind(psn);
        true
    }

    /// Spends a round of the retry count on a retry from `psn`, unless one
    /// from `psn` is under way. `false` when the count was spent already
    /// (the QP failed). `hole`: a selective resend of the missing packets
    /// alone (told to congestion control as a hole, not a go-back).
    pub(super) fn spend_retry(&mut self, psn: Psn, hole: bool) -> bool {
        if self.req.last_rewind != Some(psn) {
            self.count_retry_round();
            if self.req.retry_left == 0 {
                self.counters.retry_exceeded_err += 1;
                self.fail_front(WcStatus::RetryExcErr);
                return false;
            }
            self.req.retry_left -= 1;
            if hole {
                self.req.events.holes += 1;
            } else {
                self.req.events.seq_errs += 1;
            }
        }
        true
    }

    /// Counts a round of the retry count, and whether it repeats one that
    /// brought no progress (progress restores the count).
    fn count_retry_round(&mut self) {
        self.counters.retry_rounds += 1;
        if self.req.retry_left < self.attrs.retry_cnt {
            self.counters.retry_rounds_repeated += 1;
        }
    }

    /// The requester's liveness rule: an RC requester with request packets
    /// in flight always waits on a timer (the ACK timeout, or the RNR
    /// delay), or it could wait forever for an answer that was lost. The
    /// RNR delay and the ACK timer never run together, so the end of an
    /// RNR delay is where the ACK timer is armed again. Unacknowledged
    /// PSNs not in flight (after a go-back) are the requester's to send:
    /// sending them starts the timer.
    pub(super) fn guard_outstanding(&mut self, now: Nanos) {
        if self.outstanding_without_timer() {
            self.req.timer = self.retransmit_deadline(now);
        }
    }

    pub(super) fn outstanding_without_timer(&self) -> bool {
        self.cfg.qp_type == QpType::Rc
            && matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.req.timer.is_none()
            && self.req.rnr_until.is_none()
            && self.attrs.timeout != 0
            && self.packets_in_flight() > 0
    }

    /// Go-back-N: retransmit from `psn`.
    pub(super) fn rewind(&mut self, psn: Psn) {
        if self.req.last_rewind == Some(psn) {
            return;
        }
        let Some(i) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        self.req.last_rewind = Some(psn);
        // Going back resends everything a selective range would.
        self.req.resend = None;
        let end = self.req.send_idx.max(i + 1).min(self.req.sq.len());
        for (j, w) in self.req.sq.iter_mut().enumerate().take(end).skip(i) {
            if w.done {
                w.next_pkt = w.request_pkts();
                continue;
            }
            w.next_pkt = if matches!(w.wr.op, SendOp::Read { .. }) {
                w.read_got
            } else if j == i && !w.wr.op.is_atomic() {
                w.first_psn.map_or(0, |f| f.distance_to(psn) as u32)
            } else {
                0
            };
        }
        // Never forward: resends pending before `i` (an earlier go-back
        // the window or the congestion credit holds) still go first.
        self.req.send_idx = self.req.send_idx.min(i);
        self.counters.retransmits_started += 1;
        // With nothing left in flight the timer starts again with the
        // first resend (what is still in flight keeps the running one); no
        // round trip is timed across a go-back (Karn).
        if self.packets_in_flight() == 0 {
            self.req.timer = None;
        }
        self.req.rtt_probe = None;
    }

    /// The QP's own packet window (`QpConfig::max_inflight_packets`);
    /// congestion control limits further through the request credit.
    pub(super) fn window(&self) -> u32 {
        self.cfg.max_inflight_packets.max(1)
    }

    /// The send-queue index of the request packet that may go now, if any:
    /// skips finished WQEs, then applies the admission rules (fence, READ
    /// and atomic credits, the packet window).
    pub(super) fn next_request(&mut self) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd)
            || self.req.rnr_until.is_some()
            || self.attrs.wait_for_peer
        {
            return None;
        }
        // A selective resend replaces a packet the network or the
        // responder dropped: packet conservation, so the congestion credit
        // (which counts what the responder holds past a hole as in flight,
        // and would wait for the ACK timer) does not hold it back.
        if let Some(i) = self.next_resend() {
            return Some(i);
        }
        let t = self.cfg.qp_type;
        if t != QpType::Ud && self.req.credit == Some(0) {
            return None;
        }
        // Skip over WQEs with nothing left to send.
        loop {
            let w = self.req.sq.get(self.req.send_idx)?;
            if w.done || w.next_pkt >= w.request_pkts() {
                self.req.send_idx += 1;
            } else {
                break;
            }
        }
        let idx = self.req.send_idx;
        let inflight = self.req.una_psn.distance_to(self.req.next_psn).max(0) as u32;
        let window = self.window();
        let w = &self.req.sq[idx];
        if w.first_psn.is_none() {
            // Admission of a new WQE.
            if self.state == QpState::Sqd {
                return None;
            }
            if t == QpType::Rc {
                let max_rd = u32::from(self.attrs.max_rd_atomic.max(1));
                if w.wr.fence && self.req.rd_atomic_inflight > 0 {
                    return None;
                }
                if w.wr.op.is_read_or_atomic() && self.req.rd_atomic_inflight >= max_rd {
                    return None;
                }
                if inflight > 0 && inflight + w.npsn.min(window) > window {
                    return None;
                }
                // A selective SEND's tag names its receive WQE modulo
                // SEND_TAG_SPAN: fewer than that unacknowledged keep the
                // name exact at the responder (`Qp::hold_send_ahead`).
                if self.attrs.selective_repeat
                    && w.wr.op.takes_receive()
                    && self.req.next_rsn.wrapping_sub(self.req.acked_rsn)
                        >= super::selective::SEND_TAG_SPAN - 1
                {
                    return None;
                }
            }
        } else if t == QpType::Rc && !w.wr.op.is_read_or_atomic() {
            // Every packet of an admitted WQE (first sends and go-back
            // resends alike) stays within the window of the oldest
            // unacknowledged PSN. Not a READ's re-request: the oldest
            // unacknowledged PSN stays at the READ's first one until its
            // last response is in, so a re-request far into a large READ
            // would wait forever.
            let psn = w.first_psn.unwrap_or_default() + w.next_pkt;
            if self.req.una_psn.distance_to(psn) >= window as i32 {
                return None;
            }
        }
        Some(idx)
    }

    /// Builds the next packet of WQE `idx` (admitted by [`Qp::next_request`]).
    pub(super) fn poll_request(&mut self, idx: usize, now: Nanos) -> Option<Transmit<'_>> {
        let t = self.cfg.qp_type;
        let mtu = self.attrs.mtu.bytes() as u64;
        let deadline = self.retransmit_deadline(now);
        let qkey_own = self.attrs.qkey;
        let (dest_qpn, own_ah, own_qpn) = (self.attrs.dest_qpn, self.attrs.ah, self.cfg.qpn);
        let (window, una, credit) = (self.window(), self.req.una_psn, self.req.credit);
        // A selective resend (`Qp::retry_selective`) sends one packet of
        // its range and leaves the WQE's position alone; a READ's
        // (`Qp::ask_read_hole`) is one request for the whole range.
        let selective = match self.req.resend {
            Some((p, n)) if self.req.sq[idx].contains(p) => {
                let read = matches!(self.req.sq[idx].wr.op, SendOp::Read { .. });
                self.req.resend = (n > 1 && !read).then(|| (p + 1, n - 1));
                Some((p, n))
            }
            _ => None,
        };
        let (w, sges, inline) = self.req.sq.entry_mut(idx)?;
        if w.first_psn.is_none() {
            if t == QpType::Rc && w.wr.op.is_read_or_atomic() {
                self.req.rd_atomic_inflight += 1;
            }
            w.first_psn = Some(self.req.next_psn);
            self.req.next_psn += w.npsn;
            if t == QpType::Rc && w.wr.op.takes_receive() {
                w.rsn = self.req.next_rsn;
                self.req.next_rsn = self.req.next_rsn.wrapping_add(1);
            }
        }
        let first = w.first_psn.unwrap_or_default();
        let k = selective.map_or(w.next_pkt, |(p, _)| first.distance_to(p) as u32);
        let psn = first + k;
        // Between burst peers a go-back's resends count as resent too: a
        // selective responder NAKs at once each hole it knows of (packets
        // held past it), so while a go-back walks up to what it holds,
        // every packet that arrives draws a NAK for the next one, which
        // the go-back is about to send (sweep seed 1131464: one NAK per
        // packet, each a new go-back, until the retry count ran out).
        let again = self.attrs.selective_repeat && psn.distance_to(self.req.sent_high) > 0;
        if selective.is_some() || again {
            self.req.resent = match self.req.resent {
                Some((lo, hi, _)) if hi + 1 == psn => Some((lo, psn, now)),
                _ => Some((psn, psn, now)),
            };
        }
        // PSNs this packet puts in flight: a READ request all its
        // responses from here on (a hole's request, those of the hole).
        let span = if matches!(w.wr.op, SendOp::Read { .. }) {
            let rest = w.npsn - k.min(w.npsn);
            selective.map_or(rest, |(_, n)| n.min(rest))
        } else {
            1
        };
        let resend = psn.distance_to(self.req.sent_high) > 0;
        if resend {
            self.counters.retransmitted_pkts += 1;
        } else {
            self.req.sent_high = psn + span;
            if t == QpType::Rc && self.req.rtt_probe.is_none() {
                self.req.rtt_probe = Some((psn + (span - 1), now));
            }
        }
        if let Some(c) = self.req.credit.as_mut() {
            *c = c.saturating_sub(span);
        }
        let dest = match w.wr.ud {
            Some(d) if t == QpType::Ud => d.remote_qpn,
            _ => dest_qpn,
        };
        let ah = w.wr.ud.map_or(own_ah, |d| d.ah);
        let mut bth = BthRepr::new(Opcode(0), dest, psn);
        bth.ack_req = t == QpType::Rc;
        let (ib, payload) = if w.wr.op.scatters() {
            let hole = selective.map(|_| span);
            (read_or_atomic_request(w, bth, k, hole, mtu), Payload::None)
        } else {
            // Also ask for an ACK on the last packet the window lets out:
            // the sender stops there, and a responder only ACKs every few
            // packets, or a duplicate that asks (after a go-back, resends
            // below its expected PSN would otherwise draw no ACK and the
            // retry count would run out). And on every resent packet: after
            // a loss congestion control lets only a few packets out per
            // round, and when the one that asked was lost, middle packets
            // taken in sequence drew no ACK, the round ended in a timeout
            // and 8 such rounds in a row spent the retry count at 9% loss
            // (core-sim sweep seeds 700929, 903860). Resends are rare; the
            // responder coalesces the ACKs they draw.
            let ask_ack = resend || una.distance_to(psn + 1) >= window as i32 || credit == Some(1);
            let qkey = w.wr.ud.filter(|_| t == QpType::Ud).map(|d| {
                // A Q_Key with its high bit set means "use the QP's own".
                if d.remote_qkey & 0x8000_0000 != 0 {
                    qkey_own
                } else {
                    d.remote_qkey
                }
            });
            let deth = qkey.map(|qkey| DethRepr {
                qkey,
                src_qp: own_qpn,
            });
            let advance = selective.is_none();
            // A selective SEND packet names its receive WQE or its index
            // in its message (`Qp::hold_send_ahead` reads it past a gap).
            let tag = (t == QpType::Rc
                && self.attrs.selective_repeat
                && matches!(
                    w.wr.op,
                    SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
                ))
            .then(|| super::selective::send_tag(k, w.rsn));
            let (mut ib, payload) = data_request(
                w,
                (sges, inline),
                t,
                bth,
                k,
                mtu,
                ask_ack,
                deth,
                self.cfg.pd,
                advance,
            );
            ib.bth.resv7 = tag.unwrap_or(0);
            (ib, payload)
        };
        if t == QpType::Rc && self.req.timer.is_none() {
            self.req.timer = deadline;
            self.req.probe_from = now;
            self.req.probes = 0;
        }
        self.counters.sent_pkts += 1;
        self.counters.sent_bytes += ib.payload_len as u64;
        self.req.events.sent_pkts += 1;
        self.req.events.sent_bytes += ib.buffer_len() as u64;
        Some(Transmit { ib, payload, ah })
    }

    /// Produces the completions of unreliable sends handed out so far.
    pub fn flush_unreliable(&mut self) {
        if self.cfg.qp_type != QpType::Rc {
            self.complete_in_order();
        }
    }
}

/// The request packet of a READ (from response `k` on, after a go-back;
/// `hole`: only that many responses, a selective resend, which leaves the
/// WQE's position alone) or an atomic.
fn read_or_atomic_request(
    w: &mut SendWqe,
    mut bth: BthRepr,
    k: u32,
    hole: Option<u32>,
    mtu: u64,
) -> IbRepr {
    let mut ib;
    match w.wr.op {
        SendOp::Read { remote_addr, rkey } => {
            // After a go-back the READ resumes at the first missing response.
            let off = u64::from(k) * mtu;
            let rest = w.len - off;
            let len = hole.map_or(rest, |n| (u64::from(n) * mtu).min(rest));
            bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
            ib = IbRepr::new(bth);
            ib.reth = Some(RethRepr {
                virtual_address: remote_addr + off,
                rkey,
                dma_length: len as u32,
            });
            if hole.is_none() {
                w.next_pkt = w.npsn;
            }
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            bth.opcode = Opcode::RC_COMPARE_SWAP;
            ib = IbRepr::new(bth);
            ib.atomic_eth = Some(AtomicEthRepr {
                virtual_address: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
            w.next_pkt = 1;
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            bth.opcode = Opcode::RC_FETCH_ADD;
            ib = IbRepr::new(bth);
            ib.atomic_eth = Some(AtomicEthRepr {
                virtual_address: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
            w.next_pkt = 1;
        }
        _ => {
            ib = IbRepr::new(bth);
            w.next_pkt = w.npsn;
        }
    }
    ib
}

/// Packet `k` of a SEND or WRITE (or the one of an ATOMIC WRITE): its
/// opcode by position, RETH on the first, immediate or IETH on the last,
/// DETH for UD, and where its payload is.
#[allow(clippy::too_many_arguments)]
fn data_request<'a>(
    w: &mut SendWqe,
    (sges, inline): (&'a [Sge], &'a [u8]),
    t: QpType,
    mut bth: BthRepr,
    k: u32,
    mtu: u64,
    ask_ack: bool,
    deth: Option<DethRepr>,
    pd: u32,
    advance: bool,
) -> (IbRepr, Payload<'a>) {
    let op = w.wr.op;
    let off = u64::from(k) * mtu;
    let plen = (w.len - off.min(w.len)).min(mtu);
    let pos = match (w.npsn, k) {
        (1, _) => Position::Only,
        (_, 0) => Position::First,
        (n, k) if k + 1 == n => Position::Last,
        _ => Position::Middle,
    };
    let end = matches!(pos, Position::Last | Position::Only);
    bth.opcode = request_opcode(t, &op, pos);
    bth.solicited = end && w.wr.solicited;
    bth.ack_req &= end || ask_ack;
    let mut ib = IbRepr::new(bth);
    match op {
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteWithImm {
            remote_addr, rkey, ..
        }
        | SendOp::AtomicWrite { remote_addr, rkey }
            if matches!(pos, Position::First | Position::Only) =>
        {
            ib.reth = Some(RethRepr {
                virtual_address: remote_addr,
                rkey,
                dma_length: w.len as u32,
            });
        }
        _ => {}
    }
    if end {
        match op {
            SendOp::SendWithImm(imm) | SendOp::WriteWithImm { imm, .. } => ib.imm = Some(imm),
            SendOp::SendWithInv(rkey) => ib.ieth = Some(rkey),
            _ => {}
        }
    }
    ib.deth = deth;
    ib.payload_len = plen as usize;
    if advance {
        w.next_pkt += 1;
    }
    if t != QpType::Rc && w.next_pkt >= w.request_pkts() {
        // Unreliable: done once the last packet is handed out; the
        // completion follows on `flush_unreliable`.
        w.done = true;
    }
    let payload = if w.wr.inline {
        Payload::Inline(
            inline
                .get(off as usize..(off + plen) as usize)
                .unwrap_or_default(),
        )
    } else {
        Payload::Local {
            pd,
            sges,
            offset: off,
        }
    };
    (ib, payload)
}
