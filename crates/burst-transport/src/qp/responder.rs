//! The responder (IBA ch. 9.7, receive side; RXE's `rxe_resp.c`): checks
//! each request's PSN against the expected one, executes SENDs, WRITEs,
//! READs and atomics in PSN order, answers duplicates (ACKs again; READs
//! and atomics only from the last `max_dest_rd_atomic` requests kept),
//! and queues ACKs, NAKs, READ responses and atomic ACKs. After a PSN
//! sequence error NAK it stays quiet for new requests until the expected
//! PSN arrives, but still answers duplicates.

use super::placement::Refusal;
use super::*;

impl Qp {
    pub(super) fn credits(&self) -> Credits {
        if self.cfg.srq {
            // C9-151: a QP on an SRQ advertises the invalid credit count.
            return Credits::UNLIMITED;
        }
        Credits::from_count(self.resp.rq.len() as u32)
    }

    pub(super) fn poll_response(&mut self) -> Option<Transmit<'_>> {
        let mtu = self.attrs.mtu.bytes() as u64;
        let dest = self.attrs.dest_qpn;
        let ah = self.attrs.ah;
        let msn = self.resp.msn;
        let credits = self.credits();
        let front = self.resp.out.front_mut()?;
        let aeth = |syndrome| Some(AethRepr { syndrome, msn });
        let (ib, payload, pop) = match front {
            Out::Ack(psn) => {
                let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest, *psn));
                ib.aeth = aeth(Syndrome::Ack(credits));
                (ib, Payload::None, true)
            }
            Out::Nak(s, psn) => {
                let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest, *psn));
                ib.aeth = aeth(*s);
                (ib, Payload::None, true)
            }
            Out::AtomicAck { psn, orig } => {
                let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest, *psn));
                ib.aeth = aeth(Syndrome::Ack(credits));
                ib.atomic_ack = Some(*orig);
                (ib, Payload::None, true)
            }
            Out::AtomicWriteAck(psn) => {
                let op = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
                let mut ib = IbRepr::new(BthRepr::new(op, dest, *psn));
                ib.aeth = aeth(Syndrome::Ack(credits));
                (ib, Payload::None, true)
            }
            Out::Read(job) => {
                let k = job.next_pkt;
                let op = match (job.npkts, k) {
                    (1, _) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (_, 0) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (n, k) if k + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                let off = u64::from(k) * mtu;
                let len = (job.len - off.min(job.len)).min(mtu);
                // C9-96: READ response k carries the request's PSN + k.
                let mut ib = IbRepr::new(BthRepr::new(op, dest, job.first_psn + k));
                if op != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    ib.aeth = aeth(Syndrome::Ack(credits));
                }
                ib.payload_len = len as usize;
                job.next_pkt += 1;
                let done = job.next_pkt >= job.npkts;
                (
                    ib,
                    Payload::Remote {
                        rkey: job.rkey,
                        va: job.va + off,
                    },
                    done,
                )
            }
        };
        if pop {
            self.resp.out.pop_front();
        }
        self.counters.sent_bytes += ib.payload_len as u64;
        Some(Transmit { ib, payload, ah })
    }

    /// Queues an ACK of the last request taken (C9-95: an ACK carries the
    /// PSN of the most recent request packet it acknowledges).
    pub(super) fn queue_ack(&mut self) {
        let psn = self.resp.epsn - 1;
        self.resp.unacked_pkts = 0;
        // Coalesce with an ACK still waiting at the back only: nothing is
        // queued behind it, so moving its PSN skips no response.
        match self.resp.out.back_mut() {
            Some(Out::Ack(p)) => *p = psn,
            _ => self.resp.out.push_back(Out::Ack(psn)),
        }
    }

    /// Answers a payload that could not be placed: an RNR NAK when a
    /// receive WQE is missing (class B), else a NAK that moves the QP to
    /// the error state (class C).
    fn refuse(&mut self, why: Refusal) {
        match why {
            Refusal::NoReceive => self.rnr_nak(),
            Refusal::TooLong | Refusal::Length => self.nak(NakCode::InvalidRequest),
            Refusal::LocalProtection => self.nak(NakCode::RemoteOperationalError),
            Refusal::RemoteAccess => self.nak(NakCode::RemoteAccessError),
        }
    }

    /// Queues a NAK at the expected PSN (class C errors: invalid request,
    /// remote access, remote operational) and moves the QP to the error
    /// state (NAKs already owed still go out).
    pub(super) fn nak(&mut self, code: NakCode) {
        self.counters.send_err += 1;
        let psn = self.resp.epsn;
        self.resp.out.push_back(Out::Nak(Syndrome::Nak(code), psn));
        if self.state != QpState::Err {
            self.events.push(match code {
                NakCode::RemoteAccessError => QpEvent::AccessError,
                NakCode::InvalidRequest => QpEvent::RequestError,
                _ => QpEvent::Fatal,
            });
        }
        self.enter_error();
    }

    pub(super) fn rc_request(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        let bth = pkt.bth();
        let psn = bth.psn();
        let d = self.resp.epsn.distance_to(psn);
        if d < 0 {
            // C9-105: a duplicate is answered again, never executed again.
            self.rc_duplicate(pkt, mem);
            return;
        }
        if d > 0 {
            // Class B error (PSN sequence): dropped, with one NAK until
            // the expected PSN arrives (held when repeating selectively).
            self.counters.out_of_seq_request += 1;
            if self.attrs.selective_repeat {
                self.hold_ahead(pkt, d as u32, mem);
            }
            if !self.resp.nak_outstanding {
                self.nak_sequence();
            }
            return;
        }
        if self.state == QpState::Err {
            return;
        }
        let info = pkt.info();
        let pos = info.position.unwrap_or(Position::Only);
        let starts = matches!(pos, Position::First | Position::Only);
        let ends = matches!(pos, Position::Last | Position::Only);
        // C9-92: a first or middle packet carries exactly the path MTU, a
        // last one 1..=MTU, an only one at most MTU (class C: NAK invalid).
        if self
            .attrs
            .mtu
            .check_payload(pkt.opcode(), pkt.payload_len())
            .is_err()
            && !matches!(
                info.operation,
                Operation::RdmaReadRequest | Operation::CompareSwap | Operation::FetchAdd
            )
        {
            self.nak(NakCode::InvalidRequest);
            return;
        }
        // Each operation returns how far the expected PSN moves, or
        // `None` once it has NAKed (or dropped) the request.
        let step = match info.operation {
            Operation::Send => self.rc_send(pkt, starts, ends, mem),
            Operation::RdmaWrite => self.rc_write(pkt, starts, pos, mem),
            Operation::RdmaReadRequest => self.rc_read_request(pkt, mem),
            Operation::CompareSwap | Operation::FetchAdd => self.rc_atomic(pkt, mem),
            Operation::AtomicWrite => self.rc_atomic_write(pkt, mem),
            _ => {
                self.nak(NakCode::InvalidRequest);
                None
            }
        };
        let Some(epsn_step) = step else { return };
        self.resp.epsn += epsn_step;
        self.resp.nak_outstanding = false;
        self.resp.unacked_pkts += 1;
        let (swept, hole) = self.sweep_held(epsn_step, mem);
        if self.state == QpState::Err {
            return;
        }
        if hole {
            // Held packets past a hole that is known now: NAK it at once
            // (implicitly acknowledging everything before it).
            self.resp.unacked_pkts = 0;
            self.nak_sequence();
            return;
        }
        if swept > 0 {
            self.queue_ack();
            return;
        }
        let acked_by_response = matches!(
            info.operation,
            Operation::RdmaReadRequest
                | Operation::CompareSwap
                | Operation::FetchAdd
                | Operation::AtomicWrite
        );
        if acked_by_response {
            // READ responses and atomic ACKs acknowledge this PSN themselves.
            self.resp.unacked_pkts = 0;
        } else if bth.ack_req() || ends || self.resp.unacked_pkts >= self.cfg.ack_every {
            self.queue_ack();
        }
    }

    /// A SEND packet in sequence: placed into the current receive.
    fn rc_send(
        &mut self,
        pkt: &IbPacket<&[u8]>,
        starts: bool,
        ends: bool,
        mem: &mut impl Memory,
    ) -> Option<u32> {
        if starts == self.resp.cur_recv.is_some() || self.resp.cur_write.is_some() {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        match self.place_send(pkt, starts, ends, mem) {
            Ok(None) => {}
            Ok(Some(mut wc)) => {
                if let Some(i) = pkt.ieth() {
                    // Class J: an rkey that cannot be invalidated completes
                    // the receive in error (REM_INV_REQ).
                    if mem.invalidate(self.scope(), i.rkey()).is_err() {
                        self.completions.push_back(WorkCompletion {
                            status: WcStatus::RemInvReqErr,
                            ..wc
                        });
                        self.nak(NakCode::InvalidRequest);
                        return None;
                    }
                    wc.invalidated_rkey = Some(i.rkey());
                }
                self.completions.push_back(wc);
                self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
                self.counters.rdma_recvs += 1;
            }
            Err(why) => {
                self.refuse(why);
                return None;
            }
        }
        Some(1)
    }

    /// An RDMA WRITE packet in sequence: placed where its RETH says.
    fn rc_write(
        &mut self,
        pkt: &IbPacket<&[u8]>,
        starts: bool,
        pos: Position,
        mem: &mut impl Memory,
    ) -> Option<u32> {
        if self.resp.cur_recv.is_some() || starts == self.resp.cur_write.is_some() {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        match self.place_write(pkt, pos, mem) {
            Ok(true) => self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff,
            Ok(false) => {}
            Err(why) => {
                self.refuse(why);
                return None;
            }
        }
        Some(1)
    }

    /// Queues the responses of a READ of `len` bytes at `va` under `rkey`
    /// (`npkts` of them, from `first_psn`).
    fn queue_read(&mut self, rkey: u32, va: u64, len: u64, first_psn: Psn, npkts: u32) {
        self.resp.out.push_back(Out::Read(ReadJob {
            rkey,
            va,
            len,
            first_psn,
            npkts,
            next_pkt: 0,
        }));
    }

    /// Whether a READ of `len` bytes at `va` under `rkey` is allowed: the
    /// QP takes remote reads and, but for a zero-length READ, the key
    /// covers the range for reading (C9-88).
    fn read_allowed(&self, mem: &impl Memory, rkey: u32, va: u64, len: u64) -> bool {
        self.attrs.access.remote_read
            && (len == 0
                || mem
                    .check_remote(self.scope(), rkey, va, len, RemoteAccess::Read)
                    .is_ok())
    }

    /// Whether a READ or atomic may start here: not inside a SEND or
    /// WRITE, and with responder resources (none: an invalid request, as
    /// RXE answers it). NAKs and returns `None` when not.
    fn rd_atomic_allowed(&mut self) -> Option<()> {
        if self.resp.cur_recv.is_some()
            || self.resp.cur_write.is_some()
            || self.attrs.max_dest_rd_atomic == 0
        {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        Some(())
    }

    /// An RDMA READ request in sequence: checked, then queued as a read
    /// job whose responses take one PSN each.
    fn rc_read_request(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) -> Option<u32> {
        let psn = pkt.bth().psn();
        self.rd_atomic_allowed()?;
        let r = pkt.reth()?;
        let len = u64::from(r.dma_length());
        // C9-94: a DMA length above 2^31 is invalid.
        if len > MAX_MSG_SIZE {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        // C9-88 for a zero-length READ, as for a WRITE.
        if !self.read_allowed(mem, r.rkey(), r.virtual_address(), len) {
            self.nak(NakCode::RemoteAccessError);
            return None;
        }
        let npkts = ceil_div(len, self.attrs.mtu.bytes() as u64).max(1) as u32;
        self.keep_resource(RdResource::Read {
            first_psn: psn,
            npkts,
        });
        self.queue_read(r.rkey(), r.virtual_address(), len, psn, npkts);
        // C9-148: a READ counts in the MSN when it is accepted.
        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
        Some(npkts)
    }

    /// An atomic request in sequence: executed once, its original value
    /// kept for a duplicate.
    fn rc_atomic(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) -> Option<u32> {
        let psn = pkt.bth().psn();
        self.rd_atomic_allowed()?;
        let a = pkt.atomic_eth()?;
        if !self.attrs.access.remote_atomic {
            self.nak(NakCode::RemoteAccessError);
            return None;
        }
        if a.virtual_address() % 8 != 0 {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        let op = if pkt.info().operation == Operation::CompareSwap {
            AtomicOp::CompareSwap {
                compare: a.compare(),
                swap: a.swap_add(),
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add() }
        };
        self.execute_atomic(mem, a.rkey(), a.virtual_address(), op, |orig| {
            (
                RdResource::Atomic { psn, orig },
                Out::AtomicAck { psn, orig },
            )
        })
    }

    /// Executes an atomic (or atomic write) `op` at `va` under `rkey`, once,
    /// and queues its answer: `answer` of the original value gives the
    /// resource kept for a duplicate and the response. A refusal NAKs
    /// (misaligned: invalid request; else remote access).
    fn execute_atomic(
        &mut self,
        mem: &mut impl Memory,
        rkey: u32,
        va: u64,
        op: AtomicOp,
        answer: impl FnOnce(u64) -> (RdResource, Out),
    ) -> Option<u32> {
        match mem.atomic(self.scope(), rkey, va, op) {
            Ok(orig) => {
                let (kept, out) = answer(orig);
                self.keep_resource(kept);
                self.resp.out.push_back(out);
                self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
                Some(1)
            }
            Err(MemError::Misaligned) => {
                self.nak(NakCode::InvalidRequest);
                None
            }
            Err(_) => {
                self.nak(NakCode::RemoteAccessError);
                None
            }
        }
    }

    /// An RDMA ATOMIC WRITE in sequence (IBA 1.5; RXE's
    /// `atomic_write_reply`): a responder resource, the QP's remote write
    /// right, exactly 8 bytes to an 8-byte aligned address the rkey lets
    /// it write; stored as one 8-byte store after every earlier request,
    /// answered by a zero-length READ response, kept for a duplicate.
    fn rc_atomic_write(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) -> Option<u32> {
        let psn = pkt.bth().psn();
        self.rd_atomic_allowed()?;
        let r = pkt.reth()?;
        // RXE answers a QP without the right as an unsupported opcode.
        if !self.attrs.access.remote_write {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        let Ok(value) = <[u8; 8]>::try_from(pkt.payload()) else {
            self.nak(NakCode::InvalidRequest);
            return None;
        };
        if r.dma_length() != 8 || r.virtual_address() % 8 != 0 {
            self.nak(NakCode::InvalidRequest);
            return None;
        }
        let op = AtomicOp::Write {
            value: u64::from_ne_bytes(value),
        };
        self.execute_atomic(mem, r.rkey(), r.virtual_address(), op, |_| {
            (RdResource::AtomicWrite { psn }, Out::AtomicWriteAck(psn))
        })
    }

    /// A PSN sequence error NAK at the expected PSN (class B): the
    /// responder stays quiet for new requests until that PSN arrives.
    fn nak_sequence(&mut self) {
        self.resp.nak_outstanding = true;
        self.counters.send_seq_nak += 1;
        let e = self.resp.epsn;
        self.resp
            .out
            .push_back(Out::Nak(Syndrome::Nak(NakCode::PsnSequenceError), e));
    }

    pub(super) fn rnr_nak(&mut self) {
        self.counters.send_rnr_err += 1;
        self.resp.nak_outstanding = true;
        let psn = self.resp.epsn;
        self.resp.out.push_back(Out::Nak(
            Syndrome::RnrNak(RnrTimer(self.attrs.min_rnr_timer)),
            psn,
        ));
    }

    /// Keeps an executed READ/atomic for its duplicates: the last
    /// `max_dest_rd_atomic` only, the oldest replaced first.
    pub(super) fn keep_resource(&mut self, r: RdResource) {
        let max = usize::from(self.attrs.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= max {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(r);
    }

    pub(super) fn rc_duplicate(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        self.counters.duplicate_request += 1;
        let psn = pkt.bth().psn();
        let op = pkt.info().operation;
        let resource = self
            .resp
            .resources
            .iter()
            .find(|r| r.contains(psn))
            .copied();
        if matches!(
            op,
            Operation::RdmaReadRequest
                | Operation::CompareSwap
                | Operation::FetchAdd
                | Operation::AtomicWrite
        ) && resource.is_none()
        {
            // Older than the last max_dest_rd_atomic READ/atomic requests
            // (or never executed): nothing to answer from, so a peer cannot
            // make the responder replay arbitrary history.
            self.counters.dup_rd_atomic_dropped += 1;
            return;
        }
        match op {
            Operation::RdmaReadRequest => {
                // Replay by reading memory again (the spec lets a duplicate
                // READ return current data), from the requested PSN to the
                // end of the original READ at most.
                let Some(r) = pkt.reth() else { return };
                let Some(RdResource::Read { first_psn, npkts }) = resource else {
                    self.counters.dup_rd_atomic_dropped += 1;
                    return;
                };
                let left = (npkts - first_psn.distance_to(psn) as u32) as u64;
                let mtu = self.attrs.mtu.bytes() as u64;
                let len = u64::from(r.dma_length()).min(left * mtu);
                if !self.read_allowed(mem, r.rkey(), r.virtual_address(), len) {
                    return;
                }
                let npkts = ceil_div(len, mtu).max(1) as u32;
                // Streams queued at most: past that (a peer asking again and
                // again) a new request supersedes as below, so neither the
                // queue nor the bytes one request draws grow without bound.
                let max_jobs = 2 * usize::from(self.attrs.max_dest_rd_atomic.max(1));
                let jobs = self
                    .resp
                    .out
                    .iter()
                    .filter(|o| matches!(o, Out::Read(_)))
                    .count();
                if self.attrs.selective_repeat && jobs < max_jobs {
                    // A burst peer asks again for a hole only: what is queued
                    // past it is still wanted, and the hole goes first.
                    self.resp.out.push_front(Out::Read(ReadJob {
                        rkey: r.rkey(),
                        va: r.virtual_address(),
                        len,
                        first_psn: psn,
                        npkts,
                        next_pkt: 0,
                    }));
                    return;
                }
                // The new request supersedes what older streams would still
                // send from `psn` on: drop those, cut those that reach it.
                self.resp
                    .out
                    .retain(|o| !matches!(o, Out::Read(j) if psn.distance_to(j.first_psn) >= 0));
                for o in self.resp.out.iter_mut() {
                    if let Out::Read(j) = o {
                        let d = j.first_psn.distance_to(psn);
                        if d > 0 && (d as u32) < j.npkts {
                            j.npkts = d as u32;
                        }
                    }
                }
                self.resp
                    .out
                    .retain(|o| !matches!(o, Out::Read(j) if j.next_pkt >= j.npkts));
                self.queue_read(r.rkey(), r.virtual_address(), len, psn, npkts);
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                // Never execute twice: answer from the kept result.
                if let Some(RdResource::Atomic { psn, orig }) = resource {
                    self.resp.out.push_back(Out::AtomicAck { psn, orig });
                }
            }
            Operation::AtomicWrite => {
                if let Some(RdResource::AtomicWrite { psn }) = resource {
                    self.resp.out.push_back(Out::AtomicWriteAck(psn));
                }
            }
            _ => {
                // Every duplicate SEND or WRITE packet is ACKed again with
                // the latest ACK PSN, as RXE does (C9-105 of its comments),
                // not only those that ask: after a go-back resend below the
                // expected PSN, a lost ACK or a lost last packet of the
                // window otherwise drew no ACK until the next timeout, and
                // at 9.6% loss that lost a round to the retry count four
                // times in a row (core-sim sweep seed 6011). Consecutive
                // ACKs coalesce in the response queue.
                self.queue_ack();
            }
        }
    }
}
