//! The byte layouts of the ring entries ([`crate::shm::Entry`]): send and
//! receive work requests, work completions, asynchronous events. Fixed
//! offsets, little-endian, decoded with every enum tag and length checked.

use burst_transport::{
    wr_opcode, InlineData, MwBind, NetworkHeader, QpEvent, RecvWr, SendOp, SendWr, SgList, Sge,
    UdDest, WcOpcode, WcStatus, WorkCompletion, MAX_INLINE, MAX_SGE,
};
use burst_wire::Qpn;

use crate::shm::{le, Entry};
use crate::{AsyncEvent, SrqId};

fn put_sges(b: &mut [u8], at: usize, l: &SgList) {
    b[at - 1] = l.len() as u8;
    for (i, s) in l.iter().enumerate() {
        let o = at + i * 16;
        le::put_u64(b, o, s.addr);
        le::put_u32(b, o + 8, s.length);
        le::put_u32(b, o + 12, s.lkey);
    }
}

fn sges(b: &[u8], at: usize) -> Option<SgList> {
    let n = usize::from(b[at - 1]);
    // More than the slot holds: written by a hostile peer, never by encode.
    if n > MAX_SGE || b.len() < at + n * 16 {
        return None;
    }
    let mut l = SgList::new();
    for i in 0..n {
        let o = at + i * 16;
        l.push(Sge {
            addr: le::u64(b, o),
            length: le::u32(b, o + 8),
            lkey: le::u32(b, o + 12),
        })
        .ok()?;
    }
    Some(l)
}

// SendWr: 0 wr_id | 8 op | 9 flags | 10 has-inline-data | 12 inline len |
// 16 remote_addr | 24 rkey | 28 imm/inv | 32 compare/add | 40 swap |
// 48 ud qpn | 52 qkey | 56 ah | 63 sge count | 64 sges or inline bytes.
// A window bind: 16 addr | 24 window rkey | 28 new rkey | 32 length |
// 40 region lkey | 44 access.
//
// As an RNIC's WQE (and RXE's), the SGEs and the inline bytes share one
// room: a WR whose data was captured inline needs its SGEs no more, and
// reads back with one SGE of its length (the transport takes the bytes
// from the capture). A QP's slots are as large as its capabilities need
// ([`send_entry_size`]), not as the largest WR any QP may post.
const BODY: usize = 64;

/// Bytes of a send ring entry for a QP allowing `max_sge` SGEs and
/// `max_inline` inline bytes (each within the device's limits).
pub(crate) fn send_entry_size(max_sge: u32, max_inline: u32) -> usize {
    let sges = (max_sge.max(1) as usize).min(MAX_SGE) * 16;
    BODY + sges.max((max_inline as usize).min(MAX_INLINE))
}

/// Bytes of a receive ring entry for a queue allowing `max_sge` SGEs.
pub(crate) fn recv_entry_size(max_sge: u32) -> usize {
    RECV_SGES + (max_sge.max(1) as usize).min(MAX_SGE) * 16
}

impl Entry for SendWr {
    const SIZE: usize = BODY
        + if MAX_SGE * 16 > MAX_INLINE {
            MAX_SGE * 16
        } else {
            MAX_INLINE
        };

    fn encoded_len(&self) -> usize {
        BODY + match &self.inline_data {
            Some(d) => d.len(),
            None => self.sg_list.len() * 16,
        }
    }

    fn encode(&self, b: &mut [u8]) {
        le::put_u64(b, 0, self.wr_id);
        let (addr, rkey, imm, a, s) = match self.op {
            SendOp::Send => (0, 0, 0, 0, 0),
            SendOp::SendWithImm(i) => (0, 0, i, 0, 0),
            SendOp::SendWithInv(k) => (0, 0, k, 0, 0),
            SendOp::Write { remote_addr, rkey } => (remote_addr, rkey, 0, 0, 0),
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (remote_addr, rkey, imm, 0, 0),
            SendOp::Read { remote_addr, rkey } | SendOp::AtomicWrite { remote_addr, rkey } => {
                (remote_addr, rkey, 0, 0, 0)
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => (remote_addr, rkey, 0, compare, swap),
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => (remote_addr, rkey, 0, add, 0),
            SendOp::BindMw(b) => (
                b.addr,
                b.mw_rkey,
                b.new_rkey,
                b.len,
                u64::from(b.mr_lkey) | u64::from(b.access) << 32,
            ),
            SendOp::LocalInv(k) => (0, 0, k, 0, 0),
        };
        b[8] = self.op.wr_opcode();
        b[9] = u8::from(self.inline)
            | u8::from(self.signaled) << 1
            | u8::from(self.fence) << 2
            | u8::from(self.solicited) << 3
            | u8::from(self.ud.is_some()) << 4;
        le::put_u64(b, 16, addr);
        le::put_u32(b, 24, rkey);
        le::put_u32(b, 28, imm);
        le::put_u64(b, 32, a);
        le::put_u64(b, 40, s);
        let ud = self.ud.unwrap_or(UdDest {
            remote_qpn: Qpn::default(),
            remote_qkey: 0,
            ah: 0,
        });
        le::put_u32(b, 48, ud.remote_qpn.value());
        le::put_u32(b, 52, ud.remote_qkey);
        le::put_u32(b, 56, ud.ah);
        match &self.inline_data {
            Some(d) => {
                b[10] = 1;
                le::put_u16(b, 12, d.len() as u16);
                b[BODY - 1] = 0;
                b[BODY..BODY + d.len()].copy_from_slice(d);
            }
            None => {
                b[10] = 0;
                put_sges(b, BODY, &self.sg_list);
            }
        }
    }

    fn decode(b: &[u8]) -> Option<SendWr> {
        let (addr, rkey, imm, a, s) = (
            le::u64(b, 16),
            le::u32(b, 24),
            le::u32(b, 28),
            le::u64(b, 32),
            le::u64(b, 40),
        );
        let op = match b[8] {
            wr_opcode::SEND => SendOp::Send,
            wr_opcode::SEND_WITH_IMM => SendOp::SendWithImm(imm),
            wr_opcode::SEND_WITH_INV => SendOp::SendWithInv(imm),
            wr_opcode::RDMA_WRITE => SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            wr_opcode::RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
                remote_addr: addr,
                rkey,
                imm,
            },
            wr_opcode::RDMA_READ => SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            wr_opcode::ATOMIC_WRITE => SendOp::AtomicWrite {
                remote_addr: addr,
                rkey,
            },
            wr_opcode::ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
                remote_addr: addr,
                rkey,
                compare: a,
                swap: s,
            },
            wr_opcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
                remote_addr: addr,
                rkey,
                add: a,
            },
            wr_opcode::BIND_MW => SendOp::BindMw(MwBind {
                mw_rkey: rkey,
                new_rkey: imm,
                mr_lkey: s as u32,
                addr,
                len: a,
                access: (s >> 32) as u32,
            }),
            wr_opcode::LOCAL_INV => SendOp::LocalInv(imm),
            _ => return None,
        };
        let f = b[9];
        let ud = if f & 16 != 0 {
            Some(UdDest {
                remote_qpn: Qpn::new(le::u32(b, 48))?,
                remote_qkey: le::u32(b, 52),
                ah: le::u32(b, 56),
            })
        } else {
            None
        };
        let (inline_data, sg_list) = match b[10] {
            0 => (None, sges(b, BODY)?),
            1 => {
                let n = le::u16(b, 12);
                let d = InlineData::try_from_slice(b.get(BODY..BODY + usize::from(n))?).ok()?;
                let mut l = SgList::new();
                if n > 0 {
                    l.push(Sge {
                        addr: 0,
                        length: u32::from(n),
                        lkey: 0,
                    })
                    .ok()?;
                }
                (Some(d), l)
            }
            _ => return None,
        };
        Some(SendWr {
            wr_id: le::u64(b, 0),
            op,
            sg_list,
            inline: f & 1 != 0,
            signaled: f & 2 != 0,
            fence: f & 4 != 0,
            solicited: f & 8 != 0,
            ud,
            inline_data,
        })
    }
}

// RecvWr: 0 wr_id | 15 sge count | 16 sges.
const RECV_SGES: usize = 16;

impl Entry for RecvWr {
    const SIZE: usize = RECV_SGES + MAX_SGE * 16;

    fn encoded_len(&self) -> usize {
        RECV_SGES + self.sg_list.len() * 16
    }

    fn encode(&self, b: &mut [u8]) {
        le::put_u64(b, 0, self.wr_id);
        put_sges(b, RECV_SGES, &self.sg_list);
    }

    fn decode(b: &[u8]) -> Option<RecvWr> {
        Some(RecvWr {
            wr_id: le::u64(b, 0),
            sg_list: sges(b, RECV_SGES)?,
        })
    }
}

fn status(v: u32) -> Option<WcStatus> {
    use WcStatus::*;
    [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocProtErr,
        WrFlushErr,
        MwBindErr,
        BadRespErr,
        LocAccessErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
    ]
    .into_iter()
    .find(|s| *s as u32 == v)
}

fn opcode(v: u32) -> Option<WcOpcode> {
    WcOpcode::ALL.into_iter().find(|o| *o as u32 == v)
}

// WorkCompletion: 0 wr_id | 8 status | 12 opcode | 16 byte_len | 20 imm |
// 24 invalidated rkey | 28 qp | 32 src qp | 36 flags.
impl Entry for WorkCompletion {
    const SIZE: usize = 40;

    fn encode(&self, b: &mut [u8]) {
        le::put_u64(b, 0, self.wr_id);
        le::put_u32(b, 8, self.status as u32);
        le::put_u32(b, 12, self.opcode as u32);
        le::put_u32(b, 16, self.byte_len);
        le::put_u32(b, 20, self.imm_data.unwrap_or(0));
        le::put_u32(b, 24, self.invalidated_rkey.unwrap_or(0));
        le::put_u32(b, 28, self.qp_num.value());
        le::put_u32(b, 32, self.src_qp.value());
        b[36] = u8::from(self.imm_data.is_some())
            | u8::from(self.invalidated_rkey.is_some()) << 1
            | u8::from(self.grh.is_some()) << 2
            | u8::from(self.grh == Some(NetworkHeader::Ipv6)) << 3;
    }

    fn decode(b: &[u8]) -> Option<WorkCompletion> {
        let f = b[36];
        Some(WorkCompletion {
            wr_id: le::u64(b, 0),
            status: status(le::u32(b, 8))?,
            opcode: opcode(le::u32(b, 12))?,
            byte_len: le::u32(b, 16),
            imm_data: (f & 1 != 0).then(|| le::u32(b, 20)),
            invalidated_rkey: (f & 2 != 0).then(|| le::u32(b, 24)),
            qp_num: Qpn::new(le::u32(b, 28))?,
            src_qp: Qpn::new(le::u32(b, 32))?,
            grh: (f & 4 != 0).then_some(if f & 8 != 0 {
                NetworkHeader::Ipv6
            } else {
                NetworkHeader::Ipv4
            }),
        })
    }
}

fn qp_event_code(e: QpEvent) -> u8 {
    match e {
        QpEvent::Fatal => 0,
        QpEvent::CommEstablished => 1,
        QpEvent::LastWqeReached => 2,
        QpEvent::SqDrained => 3,
        QpEvent::RequestError => 4,
        QpEvent::AccessError => 5,
    }
}

fn qp_event(code: u8) -> Option<QpEvent> {
    Some(match code {
        0 => QpEvent::Fatal,
        1 => QpEvent::CommEstablished,
        2 => QpEvent::LastWqeReached,
        3 => QpEvent::SqDrained,
        4 => QpEvent::RequestError,
        5 => QpEvent::AccessError,
        _ => return None,
    })
}

impl Entry for AsyncEvent {
    const SIZE: usize = 8;

    fn encode(&self, b: &mut [u8]) {
        let (tag, v) = match self {
            AsyncEvent::SrqLimitReached(s) => (1, s.0),
            AsyncEvent::Qp(q, _) => (2, q.value()),
            AsyncEvent::DeviceFatal => (3, 0),
            AsyncEvent::CqError(c) => (4, c.0),
            AsyncEvent::Port { active } => (5, u32::from(*active)),
        };
        b[0] = tag;
        b[1] = match self {
            AsyncEvent::Qp(_, e) => qp_event_code(*e),
            _ => 0,
        };
        le::put_u32(b, 4, v);
    }

    fn decode(b: &[u8]) -> Option<AsyncEvent> {
        let v = le::u32(b, 4);
        match b[0] {
            1 => Some(AsyncEvent::SrqLimitReached(SrqId(v))),
            2 => Some(AsyncEvent::Qp(Qpn::new(v)?, qp_event(b[1])?)),
            3 => Some(AsyncEvent::DeviceFatal),
            4 => Some(AsyncEvent::CqError(crate::engine::CqId(v))),
            5 => Some(AsyncEvent::Port { active: v != 0 }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round<T: Entry + PartialEq + std::fmt::Debug + Copy>(v: T) {
        round_in(v, T::SIZE);
    }

    /// Through a slot of `size` bytes (a ring sized by a QP's caps).
    fn round_in<T: Entry + PartialEq + std::fmt::Debug + Copy>(v: T, size: usize) {
        assert!(v.encoded_len() <= size);
        let mut b = vec![0u8; size];
        v.encode(&mut b);
        assert_eq!(T::decode(&b), Some(v));
    }

    fn sge() -> impl Strategy<Value = Sge> {
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, length, lkey)| Sge {
            addr,
            length,
            lkey,
        })
    }

    /// Any operation, through the ring's own decoding of its fields (a
    /// second table of operation numbers here would test itself).
    fn op() -> impl Strategy<Value = SendOp> {
        (
            prop_oneof![0u8..10, Just(wr_opcode::ATOMIC_WRITE)],
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(|(code, addr, rkey, imm, a, s)| {
                let mut b = vec![0u8; SendWr::SIZE];
                b[8] = code;
                le::put_u64(&mut b, 16, addr);
                le::put_u32(&mut b, 24, rkey);
                le::put_u32(&mut b, 28, imm);
                le::put_u64(&mut b, 32, a);
                le::put_u64(&mut b, 40, s);
                let op = SendWr::decode(&b).expect("every opcode decodes").op;
                assert_eq!(op.wr_opcode(), code, "one numbering");
                op
            })
    }

    proptest! {
        #[test]
        fn send_wrs_round_trip(
            wr_id in any::<u64>(),
            op in op(),
            sg in proptest::collection::vec(sge(), 0..=MAX_SGE),
            flags in any::<u8>(),
            ud in proptest::option::of((1u32..0xff_ffff, any::<u32>(), any::<u32>())),
            inline in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=MAX_INLINE)),
        ) {
            // A captured WR reads back with one SGE of its length.
            let sg_list = match &inline {
                Some(d) if d.is_empty() => SgList::new(),
                Some(d) => SgList::from([Sge { addr: 0, length: d.len() as u32, lkey: 0 }]),
                None => SgList::try_from(&sg[..]).unwrap(),
            };
            let wr = SendWr {
                wr_id,
                op,
                sg_list,
                inline: flags & 1 != 0,
                signaled: flags & 2 != 0,
                fence: flags & 4 != 0,
                solicited: flags & 8 != 0,
                ud: ud.map(|(q, qkey, ah)| UdDest { remote_qpn: Qpn::new(q).unwrap(), remote_qkey: qkey, ah }),
                inline_data: inline.as_ref().map(|d| InlineData::try_from_slice(d).unwrap()),
            };
            round(wr);
            // And through the smallest slot a QP allowing it has.
            let size = send_entry_size(sg.len() as u32, inline.map_or(0, |d| d.len() as u32));
            round_in(wr, size);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(b in proptest::collection::vec(any::<u8>(), SendWr::SIZE)) {
            // Never a panic, whatever a hostile peer wrote.
            let _ = SendWr::decode(&b);
            let _ = RecvWr::decode(&b[..RecvWr::SIZE]);
            let _ = WorkCompletion::decode(&b[..WorkCompletion::SIZE]);
            let _ = AsyncEvent::decode(&b[..8]);
        }

        #[test]
        fn recv_wrs_round_trip(wr_id in any::<u64>(), sg in proptest::collection::vec(sge(), 0..=MAX_SGE)) {
            let wr = RecvWr { wr_id, sg_list: SgList::try_from(&sg[..]).unwrap() };
            round(wr);
            round_in(wr, recv_entry_size(sg.len() as u32));
        }

        #[test]
        fn compact_slots_refuse_what_they_cannot_hold(
            slot_sges in 1u32..=MAX_SGE as u32,
            count in 0u8..=255,
            fill in any::<u8>(),
        ) {
            // A peer claiming more SGEs than its slot holds is refused,
            // never read past the slot.
            let size = recv_entry_size(slot_sges);
            let mut b = vec![fill; size];
            b[RECV_SGES - 1] = count;
            let r = RecvWr::decode(&b);
            prop_assert_eq!(r.is_some(), u32::from(count) <= slot_sges);
            let size = send_entry_size(slot_sges, 0);
            let mut b = vec![0u8; size];
            b[BODY - 1] = count;
            prop_assert_eq!(SendWr::decode(&b).is_some(), u32::from(count) <= slot_sges);
            b[BODY - 1] = 0;
            b[10] = 1;
            le::put_u16(&mut b, 12, u16::from(count));
            prop_assert_eq!(SendWr::decode(&b).is_some(), usize::from(count) <= size - BODY);
        }
    }

    #[test]
    fn slots_are_sized_as_the_caps_ask() {
        // perftest's QP (one SGE, inline raised to the SGE room as RXE
        // does): 80 bytes, where the largest WR takes 320.
        assert_eq!(send_entry_size(1, 16), 80);
        assert_eq!(send_entry_size(0, 0), 80);
        assert_eq!(send_entry_size(2, 220), 64 + 220);
        assert_eq!(
            send_entry_size(MAX_SGE as u32, MAX_INLINE as u32),
            SendWr::SIZE
        );
        assert_eq!(recv_entry_size(1), 32);
        assert_eq!(recv_entry_size(MAX_SGE as u32), RecvWr::SIZE);
    }

    #[test]
    fn completions_and_events_round_trip() {
        round(WorkCompletion {
            wr_id: 7,
            status: WcStatus::RetryExcErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm_data: Some(0x1234),
            invalidated_rkey: None,
            qp_num: Qpn::new(0x11).unwrap(),
            src_qp: Qpn::new(0x22).unwrap(),
            grh: Some(NetworkHeader::Ipv6),
        });
        round(AsyncEvent::DeviceFatal);
        round(AsyncEvent::Qp(Qpn::new(0x33).unwrap(), QpEvent::Fatal));
        round(AsyncEvent::Qp(
            Qpn::new(0x34).unwrap(),
            QpEvent::AccessError,
        ));
        round(AsyncEvent::Qp(
            Qpn::new(0x35).unwrap(),
            QpEvent::CommEstablished,
        ));
        round(AsyncEvent::SrqLimitReached(SrqId(4)));
        round(AsyncEvent::CqError(crate::engine::CqId(7)));
        round(AsyncEvent::Port { active: false });
        round(AsyncEvent::Port { active: true });
    }
}
