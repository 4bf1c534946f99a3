//! Extended transport headers: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt,
//! IETH and DETH. Each has a view over bytes (accessors and setters) and a
//! plain `Repr` value that parses from and emits into a view.

use crate::error::{check_len, Result};
use crate::field::{set_u24, set_u32, set_u64, u24_at, u32_at, u64_at};
use crate::Qpn;

/// Generates a view type with checked construction and typed accessors.
macro_rules! view {
    (
        $(#[$m:meta])* $name:ident, $len_const:ident = $len:expr, $what:expr;
        $( $get:ident / $set:ident : $ty:ident @ $off:expr, $doc:expr; )*
    ) => {
        #[doc = concat!("Length of the ", $what, ".")]
        pub const $len_const: usize = $len;

        $(#[$m])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without a length check (accessors may panic on
            /// a short buffer).
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }
            /// Wraps a buffer after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self> {
                check_len($what, buffer.as_ref(), $len)?;
                Ok(Self { buffer })
            }
            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
            $(
                #[doc = $doc]
                #[inline]
                pub fn $get(&self) -> view!(@ty $ty) {
                    view!(@get $ty, self.buffer.as_ref(), $off)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets: ", $doc)]
                #[inline]
                pub fn $set(&mut self, v: view!(@ty $ty)) {
                    view!(@set $ty, self.buffer.as_mut(), $off, v)
                }
            )*
        }
    };
    (@ty u8) => { u8 };
    (@ty u32) => { u32 };
    (@ty u64) => { u64 };
    (@ty u24) => { u32 };
    (@ty qpn) => { Qpn };
    (@get u8, $b:expr, $o:expr) => { $b[$o] };
    (@get u32, $b:expr, $o:expr) => { u32_at($b, $o) };
    (@get u64, $b:expr, $o:expr) => { u64_at($b, $o) };
    (@get u24, $b:expr, $o:expr) => { u24_at($b, $o) };
    (@get qpn, $b:expr, $o:expr) => { Qpn::from_wire(u24_at($b, $o)) };
    (@set u8, $b:expr, $o:expr, $v:expr) => { $b[$o] = $v };
    (@set u32, $b:expr, $o:expr, $v:expr) => { set_u32($b, $o, $v) };
    (@set u64, $b:expr, $o:expr, $v:expr) => { set_u64($b, $o, $v) };
    (@set u24, $b:expr, $o:expr, $v:expr) => { set_u24($b, $o, $v) };
    (@set qpn, $b:expr, $o:expr, $v:expr) => { set_u24($b, $o, $v.value()) };
}

view! {
    /// RDMA extended transport header: where a WRITE or READ goes.
    Reth, RETH_LEN = 16, "RETH";
    virtual_address / set_virtual_address: u64 @ 0, "Remote virtual address.";
    rkey / set_rkey: u32 @ 8, "Remote key.";
    dma_length / set_dma_length: u32 @ 12, "Length of the whole RDMA operation.";
}

view! {
    /// ACK extended transport header: syndrome and message sequence number.
    Aeth, AETH_LEN = 4, "AETH";
    syndrome / set_syndrome: u8 @ 0, "Raw syndrome byte (see [`Syndrome`]).";
    msn / set_msn: u24 @ 1, "Message sequence number (24 bits).";
}

view! {
    /// Atomic extended transport header of COMPARE SWAP and FETCH ADD.
    AtomicEth, ATOMIC_ETH_LEN = 28, "AtomicETH";
    virtual_address / set_virtual_address: u64 @ 0, "Remote virtual address (8-byte aligned).";
    rkey / set_rkey: u32 @ 8, "Remote key.";
    swap_add / set_swap_add: u64 @ 12, "Swap value (compare-swap) or addend (fetch-add).";
    compare / set_compare: u64 @ 20, "Compare value (compare-swap; zero for fetch-add).";
}

view! {
    /// Atomic ACK extended transport header: the value before the atomic.
    AtomicAckEth, ATOMIC_ACK_ETH_LEN = 8, "AtomicAckETH";
    original / set_original: u64 @ 0, "Original remote value.";
}

view! {
    /// Immediate data header.
    ImmDt, IMM_DT_LEN = 4, "ImmDt";
    imm / set_imm: u32 @ 0, "Immediate data, as a big-endian number (ibv_wc's imm_data holds these bytes).";
}

view! {
    /// Invalidate extended transport header of SEND WITH INVALIDATE.
    Ieth, IETH_LEN = 4, "IETH";
    rkey / set_rkey: u32 @ 0, "R_Key to invalidate.";
}

view! {
    /// Datagram extended transport header of UD packets.
    Deth, DETH_LEN = 8, "DETH";
    qkey / set_qkey: u32 @ 0, "Queue key.";
    src_qp / set_src_qp: qpn @ 5, "Source QP.";
}

/// RETH contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub virtual_address: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole RDMA operation.
    pub dma_length: u32,
}

impl RethRepr {
    /// Reads a RETH view.
    pub fn parse<T: AsRef<[u8]>>(v: &Reth<T>) -> RethRepr {
        RethRepr {
            virtual_address: v.virtual_address(),
            rkey: v.rkey(),
            dma_length: v.dma_length(),
        }
    }
    /// Writes into a RETH view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Reth<T>) {
        v.set_virtual_address(self.virtual_address);
        v.set_rkey(self.rkey);
        v.set_dma_length(self.dma_length);
    }
}

/// AtomicETH contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub virtual_address: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH view.
    pub fn parse<T: AsRef<[u8]>>(v: &AtomicEth<T>) -> AtomicEthRepr {
        AtomicEthRepr {
            virtual_address: v.virtual_address(),
            rkey: v.rkey(),
            swap_add: v.swap_add(),
            compare: v.compare(),
        }
    }
    /// Writes into an AtomicETH view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut AtomicEth<T>) {
        v.set_virtual_address(self.virtual_address);
        v.set_rkey(self.rkey);
        v.set_swap_add(self.swap_add);
        v.set_compare(self.compare);
    }
}

/// DETH contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Reads a DETH view (the reserved byte is ignored).
    pub fn parse<T: AsRef<[u8]>>(v: &Deth<T>) -> DethRepr {
        DethRepr {
            qkey: v.qkey(),
            src_qp: v.src_qp(),
        }
    }
    /// Writes into a DETH view (reserved byte zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Deth<T>) {
        v.set_qkey(self.qkey);
        v.buffer.as_mut()[4] = 0;
        v.set_src_qp(self.src_qp);
    }
}

/// AETH contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// Decoded syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads an AETH view.
    pub fn parse<T: AsRef<[u8]>>(v: &Aeth<T>) -> AethRepr {
        AethRepr {
            syndrome: Syndrome::from_byte(v.syndrome()),
            msn: v.msn(),
        }
    }
    /// Writes into an AETH view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Aeth<T>) {
        v.set_syndrome(self.syndrome.to_byte());
        v.set_msn(self.msn & crate::psn::MASK_24);
    }
}

/// NAK codes of the AETH syndrome (IBA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the responder expected an earlier PSN.
    PsnSequenceError,
    /// Invalid request (unsupported opcode, bad length, ...).
    InvalidRequest,
    /// Remote access error (rkey, bounds, permissions).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
    /// A reserved code (5..=31), kept so that re-emitting is lossless.
    Reserved(u8),
}

impl NakCode {
    fn from_bits(v: u8) -> NakCode {
        match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            v => NakCode::Reserved(v & 0x1f),
        }
    }
    fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(v) => v & 0x1f,
        }
    }
}

/// Decoded AETH syndrome.
///
/// ```
/// use burst_wire::{Syndrome, NakCode, RnrTimer, Credits};
/// assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack(Credits::UNLIMITED));
/// assert_eq!(Syndrome::from_byte(0x60), Syndrome::Nak(NakCode::PsnSequenceError));
/// let rnr = Syndrome::from_byte(0x2e);
/// assert_eq!(rnr, Syndrome::RnrNak(RnrTimer(14)));
/// assert_eq!(RnrTimer(14).micros(), 1280);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with the responder's credit count.
    Ack(Credits),
    /// Receiver not ready: retry after the encoded time.
    RnrNak(RnrTimer),
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Reserved syndrome type (bits 6..5 = 10, or bit 7 set), kept raw.
    Reserved(u8),
}

/// `ACK credits=N`, `RNR-NAK timer=T(Nus)`, `NAK PsnSequenceError`, ...
impl core::fmt::Display for Syndrome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Syndrome::Ack(c) => write!(f, "ACK credits={}", c.0),
            Syndrome::RnrNak(t) => write!(f, "RNR-NAK timer={}({}us)", t.0, t.micros()),
            Syndrome::Nak(n) => write!(f, "NAK {n:?}"),
            Syndrome::Reserved(b) => write!(f, "reserved {b:#x}"),
        }
    }
}

impl Syndrome {
    /// Decodes a syndrome byte.
    pub fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        let v = b & 0x1f;
        match (b >> 5) & 0x3 {
            0 => Syndrome::Ack(Credits(v)),
            1 => Syndrome::RnrNak(RnrTimer(v)),
            3 => Syndrome::Nak(NakCode::from_bits(v)),
            _ => Syndrome::Reserved(b),
        }
    }
    /// Encodes the syndrome byte.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack(c) => c.0 & 0x1f,
            Syndrome::RnrNak(t) => 0x20 | (t.0 & 0x1f),
            Syndrome::Nak(n) => 0x60 | n.bits(),
            Syndrome::Reserved(b) => b,
        }
    }
}

/// Encoded end-to-end credit count of an ACK (IBA 9.7.5.1.3): a 5-bit code
/// for a number of receive WQEs, with 31 meaning "invalid" (no credit limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Credits(pub u8);

const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl Credits {
    /// The "invalid credit count" code: the responder does not limit the requester.
    pub const UNLIMITED: Credits = Credits(31);

    /// The largest code whose credit count is at most `n` receive WQEs.
    pub fn from_count(n: u32) -> Credits {
        let code = CREDIT_TABLE.iter().rposition(|&c| c <= n).unwrap_or(0);
        Credits(code as u8)
    }

    /// Receive WQEs this code stands for; `None` for [`Credits::UNLIMITED`].
    pub fn count(self) -> Option<u32> {
        CREDIT_TABLE.get(usize::from(self.0 & 0x1f)).copied()
    }
}

/// Encoded RNR NAK timer (IBA table 45): how long a requester waits before
/// retrying after an RNR NAK, also the QP attribute `min_rnr_timer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RnrTimer(pub u8);

const RNR_TABLE_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

impl RnrTimer {
    /// Delay in microseconds.
    pub fn micros(self) -> u32 {
        RNR_TABLE_US[usize::from(self.0 & 0x1f)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_round_trip_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn credits_round_down() {
        assert_eq!(Credits::from_count(0).count(), Some(0));
        assert_eq!(Credits::from_count(5).count(), Some(4));
        assert_eq!(Credits::from_count(1_000_000).count(), Some(32768));
        assert_eq!(Credits::UNLIMITED.count(), None);
    }

    #[test]
    fn rnr_table_ends() {
        assert_eq!(RnrTimer(0).micros(), 655_360);
        assert_eq!(RnrTimer(1).micros(), 10);
        assert_eq!(RnrTimer(31).micros(), 491_520);
    }

    #[test]
    fn views_refuse_short_buffers() {
        assert!(Reth::new_checked(&[0u8; 15][..]).is_err());
        assert!(AtomicEth::new_checked(&[0u8; 27][..]).is_err());
        let mut b = [0u8; DETH_LEN];
        let mut d = Deth::new_checked(&mut b[..]).unwrap();
        d.set_src_qp(Qpn::from_wire(0x123456));
        d.set_qkey(0x1111_1111);
        assert_eq!(b, [0x11, 0x11, 0x11, 0x11, 0, 0x12, 0x34, 0x56]);
    }
}
