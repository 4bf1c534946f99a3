//! Placing a request's payload, shared by the RC responder and the UC
//! receiver: a SEND into the current receive WQE, a WRITE into the region
//! its RETH names. The two services differ only in what a refusal costs:
//! RC answers it with a NAK (and the error state for class C errors), UC
//! drops the message.

use super::*;
use crate::memory::Placement;

/// Why a packet's payload was not placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The message needs a receive WQE and none is posted (RC: RNR NAK,
    /// class B), checked before any side effect.
    NoReceive,
    /// The message overflows its receive WQE: completed with LOC_LEN_ERR.
    TooLong,
    /// A receive SGE failed its local check: completed with LOC_PROT_ERR.
    LocalProtection,
    /// The RETH's rights, rkey or range are refused (RC: class C, NAK
    /// remote access error).
    RemoteAccess,
    /// The lengths disagree (RC: class C, NAK invalid request): a RETH DMA
    /// length above 2^31 (C9-94), an only packet that is not the whole
    /// message, a first packet of a message that fits in one, payload past
    /// the RETH's length.
    Length,
}

impl Qp {
    /// Where [`Qp::handle_packet`] would write `pkt`'s payload, for the
    /// packets whose destination follows from the QP's state alone (not
    /// from the packet's own headers, which its ICRC has not vouched for
    /// yet): the next middle packet of the RC WRITE in progress, and the
    /// next middle or last packet of the SEND in progress (its receive
    /// buffer is the QP's until it completes). A receiver may place such a
    /// payload while it checks the ICRC, in one pass: if the packet turns
    /// out bad, its bytes lie where the good packet's will be written, in
    /// a message not complete yet. A WRITE's last packet is left out (an
    /// application may poll its last byte), and so is anything out of
    /// order, on another service, or that the transport would refuse.
    pub fn in_order_placement<'a>(&'a self, pkt: &IbPacket<&[u8]>) -> Option<Placement<'a>> {
        let bth = pkt.bth();
        if self.cfg.qp_type != QpType::Rc
            || !matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            || bth.dest_qp() != self.cfg.qpn
            || bth.psn() != self.resp.epsn
            || self
                .attrs
                .mtu
                .check_payload(pkt.opcode(), pkt.payload_len())
                .is_err()
        {
            return None;
        }
        let info = pkt.info();
        let len = pkt.payload_len() as u64;
        match (info.transport, info.operation, info.position?) {
            (Transport::Rc, Operation::RdmaWrite, Position::Middle) => {
                let w = self.resp.cur_write.filter(|w| len < w.remaining)?;
                (self.resp.cur_recv.is_none()).then_some(Placement::Remote {
                    rkey: w.rkey,
                    va: w.va,
                })
            }
            (Transport::Rc, Operation::Send, Position::Middle | Position::Last) => {
                let cur = self.resp.cur_recv.as_ref()?;
                (self.resp.cur_write.is_none() && cur.offset + len <= sg_len(&cur.wr.sg_list))
                    .then_some(Placement::Local {
                        pd: self.cfg.pd,
                        sges: &cur.wr.sg_list,
                        offset: cur.offset,
                    })
            }
            _ => None,
        }
    }

    /// Whether a WRITE of `len` bytes at `va` under `rkey` is allowed: the
    /// QP takes remote writes and the key covers the range for writing
    /// (C9-88: a zero-length WRITE names no memory, so its rkey and address
    /// are not checked).
    pub(super) fn write_allowed(&self, mem: &impl Memory, rkey: u32, va: u64, len: u64) -> bool {
        self.attrs.access.remote_write
            && (len == 0
                || mem
                    .check_remote(self.scope(), rkey, va, len, RemoteAccess::Write)
                    .is_ok())
    }

    /// Places a SEND packet in the current receive WQE (a first packet
    /// takes one from the receive queue). At the last packet, returns the
    /// receive's completion (with its immediate), not yet queued: the
    /// caller adds what its service does at the end of a message.
    pub(super) fn place_send(
        &mut self,
        pkt: &IbPacket<&[u8]>,
        starts: bool,
        ends: bool,
        mem: &mut impl Memory,
    ) -> Result<Option<WorkCompletion>, Refusal> {
        if starts {
            let wr = self.resp.rq.pop_front().ok_or(Refusal::NoReceive)?;
            self.resp.rsn = self.resp.rsn.wrapping_add(1);
            self.resp.cur_recv = Some(RecvInProgress { wr, offset: 0 });
        }
        let Some(cur) = self.resp.cur_recv.as_mut() else {
            return Ok(None);
        };
        let data = pkt.payload();
        let refused = if cur.offset + data.len() as u64 > sg_len(&cur.wr.sg_list) {
            Some((Refusal::TooLong, WcStatus::LocLenErr))
        } else if mem
            .write_local(self.cfg.pd, &cur.wr.sg_list, cur.offset, data)
            .is_err()
        {
            Some((Refusal::LocalProtection, WcStatus::LocProtErr))
        } else {
            None
        };
        if let Some((why, status)) = refused {
            let wr_id = cur.wr.wr_id;
            self.resp.cur_recv = None;
            self.completions
                .push_back(recv_wc(self.cfg.qpn, wr_id, status, WcOpcode::Recv, 0));
            return Err(why);
        }
        cur.offset += data.len() as u64;
        if !ends {
            return Ok(None);
        }
        let Some(cur) = self.resp.cur_recv.take() else {
            return Ok(None);
        };
        Ok(Some(self.recv_done(&cur, pkt.imm_dt().map(|i| i.imm()))))
    }

    /// The successful completion of receive `cur`, whose message ended
    /// (with immediate data `imm`): its bytes are those placed.
    pub(super) fn recv_done(&self, cur: &RecvInProgress, imm: Option<u32>) -> WorkCompletion {
        let mut wc = recv_wc(
            self.cfg.qpn,
            cur.wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            cur.offset as u32,
        );
        wc.imm_data = imm;
        wc
    }

    /// Places a WRITE packet in the region its message's RETH names (the
    /// first packet checks the rights, rkey and range: burst-mem's one
    /// check). At the last packet of a WRITE WITH IMMEDIATE, consumes a
    /// receive WQE and queues its RECV_RDMA_WITH_IMM completion. Returns
    /// whether the message ended.
    pub(super) fn place_write(
        &mut self,
        pkt: &IbPacket<&[u8]>,
        pos: Position,
        mem: &mut impl Memory,
    ) -> Result<bool, Refusal> {
        let starts = matches!(pos, Position::First | Position::Only);
        let ends = matches!(pos, Position::Last | Position::Only);
        // WRITE WITH IMM needs a receive WQE: refused before any side effect.
        if ends && pkt.imm_dt().is_some() && self.resp.rq.is_empty() {
            return Err(Refusal::NoReceive);
        }
        let data = pkt.payload();
        if starts {
            let Some(r) = pkt.reth() else {
                return Ok(false);
            };
            let len = u64::from(r.dma_length());
            if len > MAX_MSG_SIZE {
                return Err(Refusal::Length);
            }
            if !self.write_allowed(mem, r.rkey(), r.virtual_address(), len) {
                return Err(Refusal::RemoteAccess);
            }
            let mtu = self.attrs.mtu.bytes() as u64;
            if (pos == Position::Only && data.len() as u64 != len)
                || (pos == Position::First && len <= mtu)
            {
                return Err(Refusal::Length);
            }
            self.resp.cur_write = Some(WriteInProgress {
                rkey: r.rkey(),
                va: r.virtual_address(),
                remaining: len,
                total: len,
            });
        }
        let Some(mut w) = self.resp.cur_write else {
            return Ok(false);
        };
        if data.len() as u64 > w.remaining || (ends && data.len() as u64 != w.remaining) {
            self.resp.cur_write = None;
            return Err(Refusal::Length);
        }
        if !data.is_empty() && mem.write_remote(w.rkey, w.va, data).is_err() {
            self.resp.cur_write = None;
            return Err(Refusal::RemoteAccess);
        }
        w.va += data.len() as u64;
        w.remaining -= data.len() as u64;
        self.resp.cur_write = (!ends).then_some(w);
        if let (true, Some(imm)) = (ends, pkt.imm_dt()) {
            if let Some(wr) = self.resp.rq.pop_front() {
                self.resp.rsn = self.resp.rsn.wrapping_add(1);
                let mut wc = recv_wc(
                    self.cfg.qpn,
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    w.total as u32,
                );
                wc.imm_data = Some(imm.imm());
                self.completions.push_back(wc);
            }
        }
        Ok(ends)
    }
}
