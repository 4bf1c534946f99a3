//! Base Transport Header (12 bytes), the first header of every RoCEv2 packet
//! after UDP.
//!
//! ```text
//!  0      opcode
//!  1      SE | M | PadCnt(2) | TVer(4)
//!  2..4   P_Key
//!  4      FECN | BECN | reserved(6)
//!  5..8   DestQP (24)
//!  8      AckReq | reserved(7)
//!  9..12  PSN (24)
//! ```

use crate::error::{check_len, Result};
use crate::field::{set_u16, set_u24, u16_at, u24_at};
use crate::{Error, Opcode, Psn, Qpn};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;

/// Where each BTH field lives (byte offsets; the diagram above), named
/// once as smoltcp's `wire` modules do.
mod field {
    /// Opcode.
    pub const OPCODE: usize = 0;
    /// SE, M, PadCnt, TVer.
    pub const FLAGS: usize = 1;
    /// P_Key (16 bits).
    pub const PKEY: usize = 2;
    /// FECN, BECN.
    pub const CONGESTION: usize = 4;
    /// DestQP (24 bits).
    pub const DEST_QP: usize = 5;
    /// AckReq.
    pub const ACK_REQ: usize = 8;
    /// PSN (24 bits).
    pub const PSN: usize = 9;
}

/// Bits of [`field::FLAGS`].
const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x3;
const TVER_MASK: u8 = 0x0f;
/// Bits of [`field::CONGESTION`].
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
/// Bits of [`field::ACK_REQ`].
const ACK_REQ: u8 = 0x80;
const RESV7_MASK: u8 = 0x7f;

/// Default partition key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// A read/write view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Prefer [`Bth::new_checked`].
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        check_len("BTH", buffer.as_ref(), BTH_LEN)?;
        Ok(Bth { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & SE != 0
    }
    /// Migration request.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & MIG_REQ != 0
    }
    /// Number of pad bytes (0..=3) after the payload.
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> PAD_SHIFT) & PAD_MASK
    }
    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & TVER_MASK
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        u16_at(self.b(), field::PKEY)
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[field::CONGESTION] & FECN != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[field::CONGESTION] & BECN != 0
    }
    /// Destination queue pair.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::from_wire(u24_at(self.b(), field::DEST_QP))
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & ACK_REQ != 0
    }
    /// The seven reserved bits after AckReq (IBA: sent as 0, not checked
    /// by a receiver; covered by the ICRC).
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK_REQ] & RESV7_MASK
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(u24_at(self.b(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    fn set_bit(&mut self, byte: usize, mask: u8, on: bool) {
        let b = &mut self.bm()[byte];
        *b = if on { *b | mask } else { *b & !mask };
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: Opcode) {
        self.bm()[field::OPCODE] = v.0;
    }
    /// Sets the solicited event bit.
    pub fn set_solicited(&mut self, v: bool) {
        self.set_bit(field::FLAGS, SE, v)
    }
    /// Sets the migration request bit.
    pub fn set_mig_req(&mut self, v: bool) {
        self.set_bit(field::FLAGS, MIG_REQ, v)
    }
    /// Sets the pad count (low two bits of `v`).
    pub fn set_pad_count(&mut self, v: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !(PAD_MASK << PAD_SHIFT)) | ((v & PAD_MASK) << PAD_SHIFT);
    }
    /// Sets the transport header version (low four bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.bm()[field::FLAGS];
        *b = (*b & !TVER_MASK) | (v & TVER_MASK);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        set_u16(self.bm(), field::PKEY, v)
    }
    /// Sets FECN.
    pub fn set_fecn(&mut self, v: bool) {
        self.set_bit(field::CONGESTION, FECN, v)
    }
    /// Sets BECN.
    pub fn set_becn(&mut self, v: bool) {
        self.set_bit(field::CONGESTION, BECN, v)
    }
    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, v: Qpn) {
        set_u24(self.bm(), field::DEST_QP, v.value())
    }
    /// Sets the acknowledge request bit.
    pub fn set_ack_req(&mut self, v: bool) {
        self.set_bit(field::ACK_REQ, ACK_REQ, v)
    }
    /// Sets the seven reserved bits after AckReq (low seven bits of `v`).
    pub fn set_resv7(&mut self, v: u8) {
        let b = &mut self.bm()[field::ACK_REQ];
        *b = (*b & !RESV7_MASK) | (v & RESV7_MASK);
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        set_u24(self.bm(), field::PSN, v.value())
    }
}

/// High-level BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request (APM; kernel RXE sends 0).
    pub mig_req: bool,
    /// Pad count. [`crate::IbRepr::emit`] derives it from the payload length.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The seven reserved bits after AckReq: 0 toward every peer (IBA),
    /// and 0 from RXE and RNICs. Two burst peers that agreed on selective
    /// repeat tag SEND packets there (burst-transport's selective repeat),
    /// so a responder can tell where a packet past a gap goes.
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the values kernel RXE sends (P_Key 0xffff, M clear, no
    /// congestion bits, TVer 0).
    #[must_use]
    pub fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parses a BTH view. Refuses a transport version other than 0.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        if bth.tver() != 0 {
            return Err(Error::UnsupportedTver(bth.tver()));
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            resv7: bth.resv7(),
            psn: bth.psn(),
        })
    }

    /// Writes the BTH; reserved bits are written as zero but for
    /// [`BthRepr::resv7`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.bm()[..BTH_LEN].fill(0);
        bth.set_opcode(self.opcode);
        bth.set_solicited(self.solicited);
        bth.set_mig_req(self.mig_req);
        bth.set_pad_count(self.pad_count);
        bth.set_tver(0);
        bth.set_pkey(self.pkey);
        bth.set_fecn(self.fecn);
        bth.set_becn(self.becn);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_resv7(self.resv7);
        bth.set_psn(self.psn);
    }
}

/// One line as packet tools print it: opcode, destination QP, PSN, flags.
///
/// ```
/// use burst_wire::{BthRepr, Opcode, Psn, Qpn};
/// let mut b = BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11).unwrap(), Psn::new(5));
/// b.ack_req = true;
/// assert_eq!(b.to_string(), "RC_SEND_ONLY qp=0x000011 psn=0x000005 A");
/// b.resv7 = 3;
/// assert_eq!(b.to_string(), "RC_SEND_ONLY qp=0x000011 psn=0x000005 A resv7=3");
/// ```
impl core::fmt::Display for BthRepr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} qp={} psn={}", self.opcode, self.dest_qp, self.psn)?;
        if self.ack_req {
            f.write_str(" A")?;
        }
        if self.solicited {
            f.write_str(" SE")?;
        }
        if self.fecn || self.becn {
            write!(
                f,
                " FECN={} BECN={}",
                u8::from(self.fecn),
                u8::from(self.becn)
            )?;
        }
        if self.pkey != DEFAULT_PKEY {
            write!(f, " pkey={:#06x}", self.pkey)?;
        }
        if self.resv7 != 0 {
            write!(f, " resv7={}", self.resv7)?;
        }
        Ok(())
    }
}
