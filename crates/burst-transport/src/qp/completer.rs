//! The completer (IBA ch. 9.7, response handling; RXE's `rxe_comp.c`):
//! ACKs, NAKs, READ responses and atomic ACKs retire sent packets, place
//! READ data and atomic results, and complete work requests strictly in
//! posting order. An ACK of PSN n implicitly acknowledges every earlier
//! PSN except READ and atomic requests whose responses are missing, which
//! are asked for again; a PSN sequence error NAK goes back to its PSN; any
//! other NAK fails the oldest work request and moves the QP to the error
//! state.

use super::*;

impl Qp {
    /// Completes the oldest unfinished send WR with `status` and moves the QP
    /// to the error state (which flushes the rest).
    pub(super) fn fail_front(&mut self, status: WcStatus) {
        if let Some(w) = self.req.sq.iter_mut().find(|w| !w.done) {
            w.done = true;
            w.status = status;
        }
        self.complete_in_order();
        self.enter_error();
    }

    pub(super) fn complete_in_order(&mut self) {
        // Every PSN of a finished WQE is acknowledged, even when the
        // finishing response (an atomic ACK, the last READ response) came
        // while an older READ was still missing data.
        let floor = self
            .req
            .sq
            .iter()
            .find(|w| !w.done)
            .map_or(self.req.next_psn, |w| {
                // A READ's responses already placed are acknowledged too
                // (as `ack_upto` counts them): what is in flight starts at
                // its first missing one.
                let got = if matches!(w.wr.op, SendOp::Read { .. }) {
                    w.read_got
                } else {
                    0
                };
                w.first_psn.map_or(self.req.next_psn, |f| f + got)
            });
        if self.req.una_psn.distance_to(floor) > 0 {
            self.req.una_psn = floor;
            if floor == self.req.next_psn {
                self.req.timer = None;
            }
        }
        let qpn = self.cfg.qpn;
        while self.req.sq.front().is_some_and(|w| w.done) {
            let Some(w) = self.req.sq.pop_front() else {
                break;
            };
            self.req.send_idx = self.req.send_idx.saturating_sub(1);
            if w.first_psn.is_some() && w.wr.op.is_read_or_atomic() && w.status == WcStatus::Success
            {
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            }
            if w.first_psn.is_some() && w.wr.op.takes_receive() {
                self.req.acked_rsn = self.req.acked_rsn.wrapping_add(1);
            }
            // IBA 10.7.3.1: an error always generates a completion, even
            // for an unsignaled work request.
            if w.status != WcStatus::Success || w.wr.signaled {
                self.completions.push_back(WorkCompletion {
                    byte_len: if matches!(w.wr.op, SendOp::Read { .. })
                        || w.wr.op.is_atomic()
                        || w.wr.op.is_atomic_write()
                    {
                        w.len as u32
                    } else {
                        0
                    },
                    ..WorkCompletion::of(qpn, w.wr.wr_id, w.status, w.wr.op.wc_opcode())
                });
            }
            if w.status != WcStatus::Success && self.state != QpState::Err {
                self.enter_error();
                return;
            }
        }
    }

    /// Marks everything up to and including `psn` acknowledged.
    pub(super) fn ack_upto(&mut self, now: Nanos, psn: Psn) -> Option<Psn> {
        let mut lost_response = None;
        let mut progress = false;
        for w in self.req.sq.iter_mut() {
            let (Some(_first), Some(last)) = (w.first_psn, w.last_psn()) else {
                break;
            };
            if w.done {
                continue;
            }
            if last.distance_to(psn) < 0 {
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                // The responder went past a READ/atomic whose response we
                // lack: ask again from the first missing PSN.
                if lost_response.is_none() {
                    lost_response = Some(w.first_psn.unwrap_or_default() + w.read_got);
                }
                continue;
            }
            // Between burst peers what the responder acknowledged past a
            // missing response is done (only the hole is asked for again;
            // going back N resends it all anyway).
            if lost_response.is_none() || self.attrs.selective_repeat {
                w.done = true;
                progress = true;
            }
        }
        // The oldest unacknowledged PSN never passes a READ or atomic whose
        // response is missing, so the retransmit timer keeps guarding it.
        let new_una = match lost_response {
            Some(l) if l.distance_to(psn + 1) > 0 => l,
            _ => psn + 1,
        };
        if self.req.una_psn.distance_to(new_una) > 0 && new_una.distance_to(self.req.next_psn) >= 0
        {
            self.req.events.acked += u64::from(self.req.una_psn.distance_to(new_una) as u32);
            self.req.una_psn = new_una;
            progress = true;
            if let Some((p, t)) = self.req.rtt_probe {
                if p.distance_to(new_una) > 0 {
                    let rtt = now.saturating_sub(t);
                    self.req.events.rtt = Some(rtt);
                    self.req.rtt_probe = None;
                    // RFC 6298: gains of 1/8 and 1/4; the deviation keeps
                    // a queue that builds (thousands of QPs sharing one
                    // peer's window) from making probes spurious.
                    (self.req.srtt, self.req.rttvar) =
                        crate::smooth_rtt((self.req.srtt, self.req.rttvar), rtt);
                    self.req.rtt_seeded = false;
                }
            }
        }
        if progress && self.req.probes > 0 {
            // The answer to a probe: what it acknowledged was there, and
            // the next unacknowledged packet, sent before the probe, was
            // most likely lost with the rest of the tail.
            self.probe_oldest(true);
        }
        if progress {
            // Forward progress restores the retry counts and the timeout.
            self.req.retry_left = self.attrs.retry_cnt;
            self.req.rnr_left = self.attrs.rnr_retry;
            self.req.backoff = 0;
            self.req.timer = None;
            self.req.probe_from = now;
            self.req.probes = 0;
            if self.packets_in_flight() > 0 {
                self.req.timer = self.retransmit_deadline(now);
            }
        }
        lost_response
    }

    pub(super) fn handle_response(
        &mut self,
        now: Nanos,
        pkt: &IbPacket<&[u8]>,
        mem: &mut impl Memory,
    ) {
        if self.cfg.qp_type != QpType::Rc {
            return;
        }
        let psn = pkt.bth().psn();
        // Responses for PSNs never sent are ghosts.
        if psn.distance_to(self.req.next_psn) <= 0 || self.req.una_psn.distance_to(psn) < -(1 << 22)
        {
            self.counters.dropped_pkts += 1;
            return;
        }
        // Each kind of response says whether completions may be reaped.
        let go_on = match pkt.info().operation {
            Operation::Acknowledge => {
                let syndrome = pkt.aeth().map(|a| Syndrome::from_byte(a.syndrome()));
                self.on_ack(now, psn, syndrome)
            }
            Operation::AtomicAcknowledge => {
                let orig = pkt.atomic_ack_eth().map_or(0, |a| a.original());
                self.on_atomic_ack(now, psn, orig, mem)
            }
            Operation::RdmaReadResponse => self.on_read_response(now, psn, pkt, mem),
            _ => true,
        };
        if !go_on {
            return;
        }
        self.req.last_rewind = self
            .req
            .last_rewind
            .filter(|r| self.req.una_psn.distance_to(*r) >= 0);
        self.complete_in_order();
    }
    /// An ACK, RNR NAK or NAK: `false` when the QP stopped (retries spent).
    fn on_ack(&mut self, now: Nanos, psn: Psn, syndrome: Option<Syndrome>) -> bool {
        match syndrome {
            Some(Syndrome::Ack(_)) => {
                // An implied NAK: the responder went past a READ or
                // atomic whose response never came. Between burst peers a
                // READ's missing responses are asked for alone.
                if let Some(p) = self.ack_upto(now, psn) {
                    let read = self
                        .wqe_of(p)
                        .filter(|&i| matches!(self.req.sq[i].wr.op, SendOp::Read { .. }));
                    let go_on = match read {
                        Some(i) if self.attrs.selective_repeat => self.ask_read_hole(i),
                        _ => self.retry_from(p),
                    };
                    if !go_on {
                        return false;
                    }
                }
            }
            Some(Syndrome::RnrNak(t)) => {
                self.counters.rcvd_rnr_err += 1;
                // A READ or atomic before the NAKed PSN whose response is
                // missing is asked for again first.
                let lost = self.ack_upto(now, psn - 1);
                if self.req.rnr_left == 0 {
                    self.counters.retry_rnr_exceeded_err += 1;
                    self.fail_front(WcStatus::RnrRetryExcErr);
                } else {
                    if self.req.rnr_left != 7 {
                        self.req.rnr_left -= 1;
                    }
                    self.req.last_rewind = None;
                    self.rewind(lost.unwrap_or(psn));
                    self.req.rnr_until = Some(now + u64::from(RnrTimer(t.0).micros()) * 1000);
                    self.req.timer = None;
                }
            }
            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                self.counters.rcvd_seq_err += 1;
                let lost = self.ack_upto(now, psn - 1);
                let go_on = match lost {
                    None if self.attrs.selective_repeat => self.retry_selective(now, psn),
                    _ => self.retry_from(lost.unwrap_or(psn)),
                };
                if !go_on {
                    return false;
                }
            }
            Some(Syndrome::Nak(code)) => {
                self.counters.rcvd_err_nak += 1;
                let _ = self.ack_upto(now, psn - 1);
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvReqErr,
                };
                self.fail_front(status);
            }
            _ => self.counters.dropped_pkts += 1,
        }
        true
    }

    /// Selective repeat: the READ WQE whose response `psn` is missing, as
    /// an implied NAK names it (`None` for an atomic, or go-back-N).
    fn lost_read(&self, psn: Psn) -> Option<usize> {
        let i = self.wqe_of(psn).filter(|_| self.attrs.selective_repeat)?;
        matches!(self.req.sq[i].wr.op, SendOp::Read { .. }).then_some(i)
    }

    /// The send WQE whose PSNs include `psn`.
    fn wqe_of(&self, psn: Psn) -> Option<usize> {
        self.req.sq.iter().position(|w| w.contains(psn))
    }

    /// An atomic's response: `orig`, the original value, into the WR's
    /// buffer.
    fn on_atomic_ack(&mut self, now: Nanos, psn: Psn, orig: u64, mem: &mut impl Memory) -> bool {
        let Some(i) = self.wqe_of(psn) else {
            return false;
        };
        if !self.req.sq[i].wr.op.is_atomic() || self.req.sq[i].done {
            return false;
        }
        let _ = self.ack_upto(now, psn - 1);
        let res = mem.write_local(self.cfg.pd, self.req.sq.sges(i), 0, &orig.to_ne_bytes());
        let w = &mut self.req.sq[i];
        w.done = true;
        w.status = if res.is_ok() {
            WcStatus::Success
        } else {
            WcStatus::LocProtErr
        };
        let _ = self.ack_upto(now, psn);
        true
    }

    /// An ATOMIC WRITE's response, a zero-length READ RESPONSE ONLY at its
    /// PSN (IBA 1.5; RXE's `send_read_response_ack`): the write is done.
    fn on_atomic_write_response(
        &mut self,
        now: Nanos,
        i: usize,
        psn: Psn,
        pkt: &IbPacket<&[u8]>,
    ) -> bool {
        let only = pkt.info().position == Some(Position::Only);
        if !only || pkt.payload_len() != 0 || self.req.sq[i].first_psn != Some(psn) {
            self.counters.dropped_pkts += 1;
            return false;
        }
        let _ = self.ack_upto(now, psn - 1);
        let w = &mut self.req.sq[i];
        w.done = true;
        w.status = WcStatus::Success;
        let _ = self.ack_upto(now, psn);
        true
    }

    /// A READ response packet: in order, the right shape, placed.
    fn on_read_response(
        &mut self,
        now: Nanos,
        psn: Psn,
        pkt: &IbPacket<&[u8]>,
        mem: &mut impl Memory,
    ) -> bool {
        let Some(i) = self.wqe_of(psn) else {
            return false;
        };
        let mtu = self.attrs.mtu.bytes() as u64;
        let w = &self.req.sq[i];
        if w.wr.op.is_atomic_write() && !w.done {
            return self.on_atomic_write_response(now, i, psn, pkt);
        }
        if !matches!(w.wr.op, SendOp::Read { .. }) || w.done {
            return false;
        }
        let first = w.first_psn.unwrap_or_default();
        let expected = first + w.read_got;
        let d = expected.distance_to(psn);
        if d < 0 {
            return false; // duplicate response
        }
        if d > 0 {
            self.counters.rcvd_seq_err += 1;
            // Between burst peers the response is placed and only the hole
            // before it asked for again.
            if self.attrs.selective_repeat {
                if let Some(go_on) = self.hold_read_response(i, psn, pkt, mem) {
                    return go_on;
                }
            }
            // Asked for again once per READ until the ACK timer
            // expires: the replay's responses arrive behind the
            // rest of the original stream, whose every packet past
            // the gap would otherwise ask again from a new PSN and
            // start a replay of its own (a storm of replays, 82,000
            // packets for a 3 MiB READ: model seed 41568). RXE asks
            // for nothing here and waits for the timer.
            if !self.req.sq[i].read_rerequested {
                self.req.sq[i].read_rerequested = true;
                // A deliberate new request even when the last
                // go-back started at this PSN (a timeout's, whose
                // replay lost its first response): the dedup of
                // `last_rewind` is for a burst of NAKs, and here
                // it held every such re-request until the next
                // timeout, spending a retry each time (7 in a row
                // at 10% loss: RETRY_EXC_ERR, model seed 769).
                self.req.last_rewind = None;
                self.rewind(expected);
            }
            return false;
        }
        let k = w.read_got;
        let pos = pkt.info().position;
        let last = k + 1 == w.npsn;
        let len_ok = match pos {
            Some(Position::Only) => last && pkt.payload_len() as u64 == w.len,
            Some(Position::First) => k == 0 && !last && pkt.payload_len() as u64 == mtu,
            Some(Position::Middle) => k > 0 && !last && pkt.payload_len() as u64 == mtu,
            Some(Position::Last) => {
                k > 0 && last && pkt.payload_len() as u64 == w.len - u64::from(k) * mtu
            }
            None => false,
        };
        if !len_ok {
            // A response of the wrong shape: after a re-request the
            // responder restarts with FIRST/ONLY, which is fine when
            // it lines up with what we still miss. A hole's re-request
            // (selective repeat) also ends with LAST or ONLY anywhere: the
            // bytes of its place are what counts.
            let want = if last {
                w.len - u64::from(k) * mtu
            } else {
                mtu
            };
            let restart = (matches!(pos, Some(Position::First | Position::Only))
                && pkt.payload_len() as u64 <= w.len - u64::from(k) * mtu)
                || (self.attrs.selective_repeat && pkt.payload_len() as u64 == want);
            if !restart {
                self.counters.dropped_pkts += 1;
                return false;
            }
        }
        if k == 0 || matches!(pos, Some(Position::First | Position::Only)) {
            let lost = self.ack_upto(now, first - 1);
            // An implied NAK: an older READ's last responses never came
            // (nothing behind them in its own stream showed the gap).
            // Between burst peers its hole is asked for alone now; RXE
            // and go-back-N wait for the timer.
            if let Some(j) = lost.and_then(|p| self.lost_read(p)) {
                if !self.ask_read_hole(j) {
                    return false;
                }
            }
        }
        let placed = mem.write_local(
            self.cfg.pd,
            self.req.sq.sges(i),
            u64::from(k) * mtu,
            pkt.payload(),
        );
        let w = &mut self.req.sq[i];
        if placed.is_err() {
            w.done = true;
            w.status = WcStatus::LocProtErr;
        } else {
            w.read_got += 1;
            if w.read_got >= w.npsn {
                w.done = true;
            }
            // Responses held past this one count as received now.
            self.sweep_read(i);
            if self.attrs.selective_repeat {
                // A READ's progress, even behind an older READ or atomic
                // still missing its response (the oldest unacknowledged
                // PSN stays there): each hole asked for spent a round of
                // the retry count, and one filled gives it back, or holes
                // repaired one after another behind a lost atomic
                // response spend the count (sweep seed 1112853).
                self.req.retry_left = self.attrs.retry_cnt;
            }
        }
        // Gone when asking for the next hole spent the retry count (the
        // QP failed and flushed its queue).
        let Some(w) = self.req.sq.get(i) else {
            return false;
        };
        let got = first + w.read_got.max(k + 1);
        let _ = self.ack_upto(now, got - 1);
        true
    }
}
