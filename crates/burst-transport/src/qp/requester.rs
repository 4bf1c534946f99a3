//! The requester (IBA ch. 9.7, send side; RXE's `rxe_req.c`): admits work
//! requests into the PSN space (fence, READ/atomic credits, the packet
//! window), builds request packets, and runs the ACK and RNR timers: a
//! local ACK timeout goes back to the oldest unacknowledged PSN and spends
//! one retry (`retry_cnt`), an RNR NAK waits its delay and spends one RNR
//! retry (`rnr_retry`, 7 meaning infinite).

use super::*;

impl Qp {
    pub(super) fn ack_timeout_ns(&self) -> Option<Nanos> {
        // 4.096 us * 2^timeout; 0 means infinite.
        (self.attrs.timeout != 0).then(|| 4096u64 << self.attrs.timeout.min(31))
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
        if self.req.timer.is_some_and(|t| t <= now) {
            self.req.timer = None;
            if self.state != QpState::Rts && self.state != QpState::Sqd {
                return;
            }
            if self.req.una_psn == self.req.next_psn {
                return;
            }
            self.counters.completer_retry_err += 1;
            if self.req.retry_left == 0 {
                self.counters.retry_exceeded_err += 1;
                self.fail_front(WcStatus::RetryExcErr);
                return;
            }
            self.req.retry_left -= 1;
            let una = self.req.una_psn;
            self.req.last_rewind = None;
            for w in self.req.sq.iter_mut() {
                w.read_rerequested = false;
            }
            self.rewind(una);
            self.req.timer = self.ack_timeout_ns().map(|d| now + d);
        }
    }

    /// The requester's liveness rule: an RC requester that may send and has
    /// unacknowledged packets always waits on a timer (the ACK timeout, or
    /// the RNR delay), or it could wait forever when its resends are held by
    /// the window: the local ACK timeout guards every unacknowledged packet.
    /// The RNR delay and the ACK timer never run together, so the end of an
    /// RNR delay is where the ACK timer is armed again.
    pub(super) fn guard_outstanding(&mut self, now: Nanos) {
        if self.outstanding_without_timer() {
            self.req.timer = self.ack_timeout_ns().map(|d| now + d);
        }
    }

    pub(super) fn outstanding_without_timer(&self) -> bool {
        self.cfg.qp_type == QpType::Rc
            && matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.req.una_psn != self.req.next_psn
            && self.req.timer.is_none()
            && self.req.rnr_until.is_none()
            && self.attrs.timeout != 0
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
        self.req.send_idx = i;
        self.counters.retransmits_started += 1;
        self.req.cwnd = (self.window() / 2).max(MIN_WINDOW);
    }

    /// The packet window now (see `Requester::cwnd`).
    pub(super) fn window(&self) -> u32 {
        let max = self.cfg.max_inflight_packets.max(1);
        match self.req.cwnd {
            0 => max,
            c => c.min(max),
        }
    }

    /// The send-queue index of the request packet that may go now, if any:
    /// skips finished WQEs, then applies the admission rules (fence, READ
    /// and atomic credits, the packet window).
    pub(super) fn next_request(&mut self) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_until.is_some() {
            return None;
        }
        let t = self.cfg.qp_type;
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
        let timeout = self.ack_timeout_ns();
        let qkey_own = self.attrs.qkey;
        let (dest_qpn, own_ah, own_qpn) = (self.attrs.dest_qpn, self.attrs.ah, self.cfg.qpn);
        let (window, una) = (self.window(), self.req.una_psn);
        let w = &mut self.req.sq[idx];
        if w.first_psn.is_none() {
            if t == QpType::Rc && w.wr.op.is_read_or_atomic() {
                self.req.rd_atomic_inflight += 1;
            }
            w.first_psn = Some(self.req.next_psn);
            self.req.next_psn += w.npsn;
        }
        let first = w.first_psn.unwrap_or_default();
        let k = w.next_pkt;
        let psn = first + k;
        if psn.distance_to(self.req.sent_high) > 0 {
            self.counters.retransmitted_pkts += 1;
        } else {
            let span = if w.wr.op.is_read_or_atomic() {
                w.npsn
            } else {
                1
            };
            self.req.sent_high = psn + span;
        }
        let dest = match w.wr.ud {
            Some(d) if t == QpType::Ud => d.remote_qpn,
            _ => dest_qpn,
        };
        let ah = w.wr.ud.map_or(own_ah, |d| d.ah);
        let mut bth = BthRepr::new(Opcode(0), dest, psn);
        bth.ack_req = t == QpType::Rc;
        let mut ib;
        let payload;
        match w.wr.op {
            SendOp::Read { remote_addr, rkey } => {
                // After a go-back the READ resumes at the first missing response.
                let off = u64::from(k) * mtu;
                bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                ib = IbRepr::new(bth);
                ib.reth = Some(RethRepr {
                    virtual_address: remote_addr + off,
                    rkey,
                    dma_length: (w.len - off) as u32,
                });
                payload = Payload::None;
                w.next_pkt = w.npsn;
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
                payload = Payload::None;
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
                payload = Payload::None;
                w.next_pkt = 1;
            }
            op => {
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
                // Also ask for an ACK on the last packet the window lets
                // out: the sender stops there, and a responder only ACKs
                // every few packets, or a duplicate that asks (after a
                // go-back, resends below its expected PSN would otherwise
                // draw no ACK and the retry count would run out).
                let fills_window = una.distance_to(psn + 1) >= window as i32;
                bth.ack_req &= end || fills_window;
                ib = IbRepr::new(bth);
                match op {
                    SendOp::Write { remote_addr, rkey }
                    | SendOp::WriteWithImm {
                        remote_addr, rkey, ..
                    } if matches!(pos, Position::First | Position::Only) => {
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
                        SendOp::SendWithImm(imm) | SendOp::WriteWithImm { imm, .. } => {
                            ib.imm = Some(imm)
                        }
                        SendOp::SendWithInv(rkey) => ib.ieth = Some(rkey),
                        _ => {}
                    }
                }
                if let (QpType::Ud, Some(d)) = (t, w.wr.ud) {
                    // A Q_Key with its high bit set means "use the QP's own".
                    let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
                        qkey_own
                    } else {
                        d.remote_qkey
                    };
                    ib.deth = Some(DethRepr {
                        qkey,
                        src_qp: own_qpn,
                    });
                }
                ib.payload_len = plen as usize;
                payload = if let (true, Some(d)) = (w.wr.inline, &w.wr.inline_data) {
                    Payload::Inline(&d[off as usize..(off + plen) as usize])
                } else {
                    Payload::Local {
                        sges: &w.wr.sg_list,
                        offset: off,
                    }
                };
                w.next_pkt += 1;
            }
        }
        if t != QpType::Rc && w.next_pkt >= w.request_pkts() {
            // Unreliable: done once the last packet is handed out; the
            // completion follows on `flush_unreliable`.
            w.done = true;
        }
        if t == QpType::Rc && self.req.timer.is_none() {
            self.req.timer = timeout.map(|d| now + d);
        }
        self.counters.sent_pkts += 1;
        self.counters.sent_bytes += ib.payload_len as u64;
        Some(Transmit { ib, payload, ah })
    }

    /// Produces the completions of unreliable sends handed out so far.
    pub fn flush_unreliable(&mut self) {
        if self.cfg.qp_type != QpType::Rc {
            self.complete_in_order();
        }
    }
}
