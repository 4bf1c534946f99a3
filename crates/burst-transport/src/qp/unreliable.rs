//! The unreliable services on the receive side (IBA ch. 9.8 UC, 9.8/9.9
//! UD): no ACKs and no retries; a UC message with a lost packet is dropped
//! whole and its receive WQE reused, a UD datagram is checked against the
//! Q_Key and lands after its 40-byte GRH area.

use super::placement::Refusal;
use super::*;

impl Qp {
    pub(super) fn uc_request(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        let psn = pkt.bth().psn();
        let info = pkt.info();
        let pos = info.position.unwrap_or(Position::Only);
        let starts = matches!(pos, Position::First | Position::Only);
        let ends = matches!(pos, Position::Last | Position::Only);
        if self.resp.epsn.distance_to(psn) < 0 {
            // A duplicate: UC never retransmits, so it is the network's copy.
            self.counters.duplicate_request += 1;
            return;
        }
        if psn != self.resp.epsn
            || (starts && (self.resp.cur_recv.is_some() || self.resp.cur_write.is_some()))
        {
            // A lost packet drops the message in progress; its receive WQE
            // is reused by the next message.
            self.counters.out_of_seq_request += u64::from(psn != self.resp.epsn);
            if let Some(cur) = self.resp.cur_recv.take() {
                self.resp.rq.push_front(cur.wr);
            }
            self.resp.cur_write = None;
            self.resp.epsn = psn;
        }
        self.resp.epsn = psn + 1;
        if !starts && self.resp.cur_recv.is_none() && self.resp.cur_write.is_none() {
            self.counters.dropped_pkts += 1;
            return;
        }
        if self
            .attrs
            .mtu
            .check_payload(pkt.opcode(), pkt.payload_len())
            .is_err()
        {
            self.uc_drop();
            return;
        }
        let placed = match info.operation {
            Operation::Send => match self.place_send(pkt, starts, ends, mem) {
                Ok(Some(wc)) => {
                    self.completions.push_back(wc);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(why) => Err(why),
            },
            Operation::RdmaWrite => self.place_write(pkt, pos, mem).map(|_| ()),
            _ => {
                self.counters.dropped_pkts += 1;
                return;
            }
        };
        match placed {
            Ok(()) => {}
            // The receive completed with the error already.
            Err(Refusal::TooLong | Refusal::LocalProtection) => {}
            // Class D: the message is dropped.
            Err(Refusal::NoReceive | Refusal::RemoteAccess | Refusal::Length) => self.uc_drop(),
        }
    }

    pub(super) fn uc_drop(&mut self) {
        self.counters.dropped_pkts += 1;
        if let Some(cur) = self.resp.cur_recv.take() {
            self.resp.rq.push_front(cur.wr);
        }
        self.resp.cur_write = None;
    }

    pub(super) fn ud_request(
        &mut self,
        pkt: &IbPacket<&[u8]>,
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
    ) {
        let Some(deth) = pkt.deth() else { return };
        if deth.qkey() != self.attrs.qkey {
            self.counters.dropped_pkts += 1;
            return;
        }
        if pkt.payload_len() > self.attrs.mtu.bytes() {
            self.counters.dropped_pkts += 1;
            return;
        }
        let Some(wr) = self.resp.rq.pop_front() else {
            self.counters.dropped_pkts += 1;
            return;
        };
        let data = pkt.payload();
        let total = 40 + data.len() as u64;
        let mut wc = recv_wc(
            self.cfg.qpn,
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total as u32,
        );
        wc.src_qp = deth.src_qp();
        let zero = [0u8; 40];
        let area = grh.unwrap_or(&zero);
        wc.grh = Some(NetworkHeader::of_grh_area(area));
        wc.imm_data = pkt.imm_dt().map(|i| i.imm());
        if total > sg_len(&wr.sg_list) {
            wc.status = WcStatus::LocLenErr;
        } else {
            let pd = self.cfg.pd;
            if mem.write_local(pd, &wr.sg_list, 0, area).is_err()
                || mem.write_local(pd, &wr.sg_list, 40, data).is_err()
            {
                wc.status = WcStatus::LocProtErr;
            }
        }
        self.completions.push_back(wc);
    }
}
