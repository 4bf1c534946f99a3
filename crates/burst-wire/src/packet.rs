//! The InfiniBand transport packet of RoCEv2: everything in the UDP payload,
//! from the BTH through the extended headers, payload, pad and ICRC.

use crate::bth::{Bth, BthRepr, BTH_LEN};
use crate::error::{check_len, Result};
use crate::ext::*;
use crate::opcode::{HeaderSet, OpcodeInfo, Transport};
use crate::{Error, Opcode};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Reserved bytes a CNP carries after its BTH (RoCEv2 annex A17.9.2).
pub const CNP_RESERVED_LEN: usize = 16;

/// Bytes after the BTH that belong to the headers of `info`.
const fn ext_len(info: &OpcodeInfo) -> usize {
    match info.transport {
        Transport::Cnp => CNP_RESERVED_LEN,
        _ => info.headers.len(),
    }
}

/// A checked view of a RoCEv2 transport packet (a UDP payload).
///
/// [`IbPacket::new_checked`] validates the structure once: the opcode is known
/// and its headers are present, the payload and pad are 4-byte aligned, the pad
/// count fits, and header-only opcodes carry no payload. The ICRC is *not*
/// checked here because it covers the IP and UDP headers too; see
/// [`crate::icrc`] and [`crate::RoceFrame::verify_icrc`].
#[derive(Debug, Clone)]
pub struct IbPacket<T: AsRef<[u8]>> {
    buffer: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> IbPacket<T> {
    /// Wraps and validates a UDP payload.
    pub fn new_checked(buffer: T) -> Result<IbPacket<T>> {
        let b = buffer.as_ref();
        check_len("BTH", b, BTH_LEN)?;
        let bth = Bth::new_unchecked(b);
        if bth.tver() != 0 {
            return Err(Error::UnsupportedTver(bth.tver()));
        }
        let op = bth.opcode();
        let info = op.info().ok_or(Error::UnknownOpcode(op.0))?;
        let hdr = BTH_LEN + ext_len(info);
        check_len(info.name, b, hdr + ICRC_LEN)?;
        let padded = b.len() - hdr - ICRC_LEN;
        if padded % 4 != 0 {
            return Err(Error::Unaligned(padded));
        }
        let pad = bth.pad_count();
        if !info.has_payload && padded != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: op.0,
                len: padded,
            });
        }
        if usize::from(pad) > padded {
            return Err(Error::BadPadCount { pad, padded });
        }
        Ok(IbPacket { buffer, info })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole packet, BTH through ICRC.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The BTH.
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.buffer.as_ref()[..BTH_LEN])
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[0])
    }

    /// What the opcode table says about this packet.
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    /// Length of the BTH and the extended headers.
    pub fn header_len(&self) -> usize {
        BTH_LEN + ext_len(self.info)
    }

    fn ext(&self, h: HeaderSet, len: usize) -> Option<&[u8]> {
        if self.info.transport == Transport::Cnp || !self.info.headers.contains(h) {
            return None;
        }
        let at = BTH_LEN + self.info.headers.offset_of(h);
        Some(&self.buffer.as_ref()[at..at + len])
    }

    /// The DETH, if the opcode carries one.
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.ext(HeaderSet::DETH, DETH_LEN).map(Deth::new_unchecked)
    }
    /// The RETH, if the opcode carries one.
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.ext(HeaderSet::RETH, RETH_LEN).map(Reth::new_unchecked)
    }
    /// The AtomicETH, if the opcode carries one.
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.ext(HeaderSet::ATOMIC_ETH, ATOMIC_ETH_LEN)
            .map(AtomicEth::new_unchecked)
    }
    /// The AETH, if the opcode carries one.
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.ext(HeaderSet::AETH, AETH_LEN).map(Aeth::new_unchecked)
    }
    /// The AtomicAckETH, if the opcode carries one.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.ext(HeaderSet::ATOMIC_ACK_ETH, ATOMIC_ACK_ETH_LEN)
            .map(AtomicAckEth::new_unchecked)
    }
    /// The immediate data header, if the opcode carries one.
    pub fn imm_dt(&self) -> Option<ImmDt<&[u8]>> {
        self.ext(HeaderSet::IMM_DT, IMM_DT_LEN)
            .map(ImmDt::new_unchecked)
    }
    /// The IETH, if the opcode carries one.
    pub fn ieth(&self) -> Option<Ieth<&[u8]>> {
        self.ext(HeaderSet::IETH, IETH_LEN).map(Ieth::new_unchecked)
    }

    /// Payload bytes, without pad.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - ICRC_LEN - usize::from(self.bth().pad_count());
        &b[self.header_len()..end]
    }

    /// Length of the payload without pad.
    pub fn payload_len(&self) -> usize {
        self.buffer.as_ref().len()
            - ICRC_LEN
            - usize::from(self.bth().pad_count())
            - self.header_len()
    }

    /// The ICRC as stored (the wire holds it least significant byte first).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let n = b.len();
        u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]])
    }

    /// Everything the ICRC covers after the IP and UDP headers (BTH to pad).
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IbPacket<T> {
    /// Mutable payload bytes (without pad), for placing data in place.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let pad = usize::from(self.bth().pad_count());
        let b = self.buffer.as_mut();
        let end = b.len() - ICRC_LEN - pad;
        &mut b[start..end]
    }

    /// Stores an ICRC value.
    pub fn set_icrc(&mut self, v: u32) {
        let b = self.buffer.as_mut();
        let n = b.len();
        b[n - 4..].copy_from_slice(&v.to_le_bytes());
    }
}

/// High-level form of a transport packet: the BTH, each extended header the
/// opcode carries, and the payload length (the payload itself stays in place).
///
/// ```
/// use burst_wire::{IbRepr, BthRepr, Opcode, Qpn, Psn, RethRepr};
/// let mut ib = IbRepr::new(BthRepr::new(
///     Opcode::RC_RDMA_WRITE_ONLY,
///     Qpn::new(0x11).unwrap(),
///     Psn::new(7),
/// ));
/// ib.reth = Some(RethRepr { virtual_address: 0x1000, rkey: 0x42, dma_length: 5 });
/// ib.payload_len = 5;
/// assert_eq!(ib.header_len(), 12 + 16);
/// assert_eq!(ib.buffer_len(), 12 + 16 + 8 + 4); // 5 bytes padded to 8, then ICRC
/// let mut buf = vec![0u8; ib.buffer_len()];
/// ib.emit(&mut buf).unwrap();
/// let pkt = burst_wire::IbPacket::new_checked(&buf[..]).unwrap();
/// assert_eq!(IbRepr::parse(&pkt).unwrap(), IbRepr { bth: BthRepr { pad_count: 3, ..ib.bth }, ..ib });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH (WRITE first/only, READ request).
    pub reth: Option<RethRepr>,
    /// AtomicETH (compare-swap, fetch-add).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, atomic ACK, READ response first/last/only).
    pub aeth: Option<AethRepr>,
    /// Original value of an atomic ACK.
    pub atomic_ack: Option<u64>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// R_Key to invalidate.
    pub ieth: Option<u32>,
    /// Payload bytes (without pad).
    pub payload_len: usize,
}

impl IbRepr {
    /// A repr with only a BTH; add the extended headers its opcode needs.
    #[must_use]
    pub fn new(bth: BthRepr) -> IbRepr {
        IbRepr {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
            payload_len: 0,
        }
    }

    /// A RoCEv2 congestion notification packet for `dest_qp` (BECN set,
    /// PSN 0, as the annex specifies).
    pub fn cnp(dest_qp: crate::Qpn) -> IbRepr {
        let mut bth = BthRepr::new(Opcode::CNP, dest_qp, crate::Psn::new(0));
        bth.becn = true;
        IbRepr::new(bth)
    }

    /// Parses a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &IbPacket<T>) -> Result<IbRepr> {
        Ok(IbRepr {
            bth: BthRepr::parse(&p.bth())?,
            deth: p.deth().map(|v| DethRepr::parse(&v)),
            reth: p.reth().map(|v| RethRepr::parse(&v)),
            atomic_eth: p.atomic_eth().map(|v| AtomicEthRepr::parse(&v)),
            aeth: p.aeth().map(|v| AethRepr::parse(&v)),
            atomic_ack: p.atomic_ack_eth().map(|v| v.original()),
            imm: p.imm_dt().map(|v| v.imm()),
            ieth: p.ieth().map(|v| v.rkey()),
            payload_len: p.payload_len(),
        })
    }

    fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))
    }

    /// Extended headers present in this repr.
    pub fn headers(&self) -> HeaderSet {
        let mut h = HeaderSet::NONE;
        let mut add = |present: bool, f: HeaderSet| {
            if present {
                h = h.with(f);
            }
        };
        add(self.deth.is_some(), HeaderSet::DETH);
        add(self.reth.is_some(), HeaderSet::RETH);
        add(self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH);
        add(self.aeth.is_some(), HeaderSet::AETH);
        add(self.atomic_ack.is_some(), HeaderSet::ATOMIC_ACK_ETH);
        add(self.imm.is_some(), HeaderSet::IMM_DT);
        add(self.ieth.is_some(), HeaderSet::IETH);
        h
    }

    /// Pad bytes after the payload.
    pub fn pad_count(&self) -> u8 {
        ((4 - self.payload_len % 4) % 4) as u8
    }

    /// Length of BTH plus extended headers: where the payload starts.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.info().map_or(self.headers().len(), ext_len)
    }

    /// Length of the whole transport packet, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + usize::from(self.pad_count()) + ICRC_LEN
    }

    /// Writes headers and pad into `buf[..self.buffer_len()]`, leaving the
    /// payload bytes at `header_len()..` untouched (the caller places them,
    /// so payload is never copied through the codec) and the ICRC zeroed.
    /// The pad count is derived from `payload_len`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let info = self.info()?;
        let cnp = info.transport == Transport::Cnp;
        if (!cnp && self.headers() != info.headers) || (cnp && !self.headers().is_empty()) {
            return Err(Error::HeaderMismatch(self.bth.opcode.0));
        }
        if !info.has_payload && self.payload_len != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: self.bth.opcode.0,
                len: self.payload_len,
            });
        }
        if self.bth.dest_qp.value() > crate::psn::MASK_24
            || self.aeth.is_some_and(|a| a.msn > crate::psn::MASK_24)
        {
            return Err(Error::OutOfRange("24-bit field"));
        }
        let total = self.buffer_len();
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                need: total,
                have: buf.len(),
            });
        }
        let buf = &mut buf[..total];
        let mut bth = self.bth;
        bth.pad_count = self.pad_count();
        bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
        let hs = info.headers;
        let at = |h: HeaderSet, len: usize| {
            let o = BTH_LEN + hs.offset_of(h);
            o..o + len
        };
        if let Some(d) = &self.deth {
            d.emit(&mut Deth::new_unchecked(
                &mut buf[at(HeaderSet::DETH, DETH_LEN)],
            ));
        }
        if let Some(r) = &self.reth {
            r.emit(&mut Reth::new_unchecked(
                &mut buf[at(HeaderSet::RETH, RETH_LEN)],
            ));
        }
        if let Some(a) = &self.atomic_eth {
            a.emit(&mut AtomicEth::new_unchecked(
                &mut buf[at(HeaderSet::ATOMIC_ETH, ATOMIC_ETH_LEN)],
            ));
        }
        if let Some(a) = &self.aeth {
            a.emit(&mut Aeth::new_unchecked(
                &mut buf[at(HeaderSet::AETH, AETH_LEN)],
            ));
        }
        if let Some(v) = self.atomic_ack {
            AtomicAckEth::new_unchecked(
                &mut buf[at(HeaderSet::ATOMIC_ACK_ETH, ATOMIC_ACK_ETH_LEN)],
            )
            .set_original(v);
        }
        if let Some(v) = self.imm {
            ImmDt::new_unchecked(&mut buf[at(HeaderSet::IMM_DT, IMM_DT_LEN)]).set_imm(v);
        }
        if let Some(v) = self.ieth {
            Ieth::new_unchecked(&mut buf[at(HeaderSet::IETH, IETH_LEN)]).set_rkey(v);
        }
        if cnp {
            buf[BTH_LEN..BTH_LEN + CNP_RESERVED_LEN].fill(0);
        }
        let pad_start = self.header_len() + self.payload_len;
        buf[pad_start..].fill(0); // pad and ICRC
        Ok(())
    }
}

/// One line as packet tools print it: the BTH, each extended header in
/// brackets, the payload length (`pcap-check` prints packets this way).
///
/// ```
/// use burst_wire::{BthRepr, IbRepr, Opcode, Psn, Qpn, RethRepr};
/// let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(0x11).unwrap(), Psn::new(1)));
/// ib.reth = Some(RethRepr { virtual_address: 0x1000, rkey: 0x2a, dma_length: 64 });
/// ib.payload_len = 64;
/// assert_eq!(
///     ib.to_string(),
///     "RC_RDMA_WRITE_ONLY qp=0x000011 psn=0x000001 RETH[va=0x1000 rkey=0x2a len=64] payload=64"
/// );
/// ```
impl core::fmt::Display for IbRepr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.bth)?;
        if let Some(d) = self.deth {
            write!(f, " DETH[qkey={:#x} src_qp={}]", d.qkey, d.src_qp)?;
        }
        if let Some(r) = self.reth {
            write!(
                f,
                " RETH[va={:#x} rkey={:#x} len={}]",
                r.virtual_address, r.rkey, r.dma_length
            )?;
        }
        if let Some(a) = self.atomic_eth {
            write!(
                f,
                " AtomicETH[va={:#x} rkey={:#x} swap_add={:#x} cmp={:#x}]",
                a.virtual_address, a.rkey, a.swap_add, a.compare
            )?;
        }
        if let Some(a) = self.aeth {
            write!(f, " AETH[{} msn={}]", a.syndrome, a.msn)?;
        }
        if let Some(o) = self.atomic_ack {
            write!(f, " AtomicAckETH[orig={o:#x}]")?;
        }
        if let Some(i) = self.imm {
            write!(f, " ImmDt[{i:#010x}]")?;
        }
        if let Some(k) = self.ieth {
            write!(f, " IETH[rkey={k:#x}]")?;
        }
        write!(f, " payload={}", self.payload_len)
    }
}
