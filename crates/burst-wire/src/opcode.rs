//! The BTH opcode table of RoCEv2 for RC, UC and UD, plus the CNP.
//!
//! An opcode is a 3-bit transport prefix and a 5-bit operation. The table
//! below says which extended headers follow the BTH (in the spec's fixed
//! order DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH) and whether a
//! payload may follow; the packet view derives every header offset from it.

use core::fmt;

/// Transport service of an opcode (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// RoCEv2 congestion notification packet (opcode 0x81).
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (possibly with immediate or invalidate).
    Send,
    /// RDMA WRITE (possibly with immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// Acknowledge (ACK or NAK).
    Acknowledge,
    /// Atomic acknowledge (carries the original value).
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// RDMA ATOMIC WRITE (IBA 1.5, memory placement extensions): 8 bytes
    /// written as one store; answered by a zero-length READ response.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Set of extended headers following the BTH, as bit flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u8);

impl HeaderSet {
    /// Datagram extended transport header (8 bytes).
    pub const DETH: HeaderSet = HeaderSet(1);
    /// RDMA extended transport header (16 bytes).
    pub const RETH: HeaderSet = HeaderSet(1 << 1);
    /// Atomic extended transport header (28 bytes).
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 2);
    /// ACK extended transport header (4 bytes).
    pub const AETH: HeaderSet = HeaderSet(1 << 3);
    /// Atomic ACK extended transport header (8 bytes).
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 4);
    /// Immediate data (4 bytes).
    pub const IMM_DT: HeaderSet = HeaderSet(1 << 5);
    /// Invalidate extended transport header (4 bytes).
    pub const IETH: HeaderSet = HeaderSet(1 << 6);
    /// No extended header.
    pub const NONE: HeaderSet = HeaderSet(0);

    /// Union of two sets.
    pub const fn with(self, other: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | other.0)
    }

    /// True when every header of `other` is in `self`.
    pub const fn contains(self, other: HeaderSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// Byte offset (from the end of the BTH) of header `h` within a packet
    /// carrying `self`: the summed lengths of the headers before it. The
    /// flags are in wire order, so that is the length of the subset of
    /// `self` below `h`'s bit (a table lookup: this runs per packet).
    pub const fn offset_of(self, h: HeaderSet) -> usize {
        let below = if h.0 == 0 { 0 } else { h.0 - 1 };
        LEN_TABLE[(self.0 & below & 0x7f) as usize] as usize
    }

    /// Total length of the extended headers in `self`.
    pub const fn len(self) -> usize {
        LEN_TABLE[(self.0 & 0x7f) as usize] as usize
    }

    /// True when the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Length of every subset of the seven extended headers, by flag bits.
const LEN_TABLE: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut set = 0;
    while set < 128 {
        let mut n = 0;
        let mut i = 0;
        while i < ORDER.len() {
            if set & ORDER[i].0 .0 as usize != 0 {
                n += ORDER[i].1;
            }
            i += 1;
        }
        t[set] = n as u8;
        set += 1;
    }
    t
};

/// Spec order of the extended headers and their lengths.
const ORDER: [(HeaderSet, usize); 7] = [
    (HeaderSet::DETH, 8),
    (HeaderSet::RETH, 16),
    (HeaderSet::ATOMIC_ETH, 28),
    (HeaderSet::AETH, 4),
    (HeaderSet::ATOMIC_ACK_ETH, 8),
    (HeaderSet::IMM_DT, 4),
    (HeaderSet::IETH, 4),
];

/// Static description of a known opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// Name as in the IBA spec and Wireshark (`RC_SEND_FIRST`).
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub operation: Operation,
    /// Position in the message, for operations that can span packets.
    pub position: Option<Position>,
    /// Extended headers after the BTH.
    pub headers: HeaderSet,
    /// Whether a payload may follow the headers.
    pub has_payload: bool,
}

/// A BTH opcode byte.
///
/// ```
/// use burst_wire::{Opcode, HeaderSet};
/// let op = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
/// let info = op.info().unwrap();
/// assert_eq!(info.name, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
/// assert!(info.headers.contains(HeaderSet::RETH.with(HeaderSet::IMM_DT)));
/// assert!(Opcode(0x15).info().is_none()); // RD RESYNC: not RoCEv2 RC/UC/UD
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($($konst:ident = $val:expr, $tr:ident, $op:ident, $pos:expr, [$($h:ident),*], $payload:expr;)*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($konst), "`")]
                pub const $konst: Opcode = Opcode($val);
            )*

            /// Description of a known opcode, `None` for opcodes RoCEv2 RC/UC/UD do not use.
            pub const fn info(self) -> Option<&'static OpcodeInfo> {
                match self.0 {
                    $(
                        $val => {
                            const INFO: OpcodeInfo = OpcodeInfo {
                                name: stringify!($konst),
                                transport: Transport::$tr,
                                operation: Operation::$op,
                                position: $pos,
                                headers: HeaderSet::NONE $(.with(HeaderSet::$h))*,
                                has_payload: $payload,
                            };
                            Some(&INFO)
                        }
                    )*
                    _ => None,
                }
            }

            /// Every opcode the codec knows, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode($val)),*];
        }
    };
}

use Position::{First, Last, Middle, Only};

opcodes! {
    RC_SEND_FIRST = 0x00, Rc, Send, Some(First), [], true;
    RC_SEND_MIDDLE = 0x01, Rc, Send, Some(Middle), [], true;
    RC_SEND_LAST = 0x02, Rc, Send, Some(Last), [], true;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Rc, Send, Some(Last), [IMM_DT], true;
    RC_SEND_ONLY = 0x04, Rc, Send, Some(Only), [], true;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Rc, Send, Some(Only), [IMM_DT], true;
    RC_RDMA_WRITE_FIRST = 0x06, Rc, RdmaWrite, Some(First), [RETH], true;
    RC_RDMA_WRITE_MIDDLE = 0x07, Rc, RdmaWrite, Some(Middle), [], true;
    RC_RDMA_WRITE_LAST = 0x08, Rc, RdmaWrite, Some(Last), [], true;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Rc, RdmaWrite, Some(Last), [IMM_DT], true;
    RC_RDMA_WRITE_ONLY = 0x0a, Rc, RdmaWrite, Some(Only), [RETH], true;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, Rc, RdmaWrite, Some(Only), [RETH, IMM_DT], true;
    RC_RDMA_READ_REQUEST = 0x0c, Rc, RdmaReadRequest, Some(Only), [RETH], false;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, Rc, RdmaReadResponse, Some(First), [AETH], true;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, Rc, RdmaReadResponse, Some(Middle), [], true;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, Rc, RdmaReadResponse, Some(Last), [AETH], true;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, Rc, RdmaReadResponse, Some(Only), [AETH], true;
    RC_ACKNOWLEDGE = 0x11, Rc, Acknowledge, None, [AETH], false;
    RC_ATOMIC_ACKNOWLEDGE = 0x12, Rc, AtomicAcknowledge, None, [AETH, ATOMIC_ACK_ETH], false;
    RC_COMPARE_SWAP = 0x13, Rc, CompareSwap, Some(Only), [ATOMIC_ETH], false;
    RC_FETCH_ADD = 0x14, Rc, FetchAdd, Some(Only), [ATOMIC_ETH], false;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Rc, Send, Some(Last), [IETH], true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Rc, Send, Some(Only), [IETH], true;
    RC_ATOMIC_WRITE = 0x1d, Rc, AtomicWrite, Some(Only), [RETH], true;
    UC_SEND_FIRST = 0x20, Uc, Send, Some(First), [], true;
    UC_SEND_MIDDLE = 0x21, Uc, Send, Some(Middle), [], true;
    UC_SEND_LAST = 0x22, Uc, Send, Some(Last), [], true;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Uc, Send, Some(Last), [IMM_DT], true;
    UC_SEND_ONLY = 0x24, Uc, Send, Some(Only), [], true;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Uc, Send, Some(Only), [IMM_DT], true;
    UC_RDMA_WRITE_FIRST = 0x26, Uc, RdmaWrite, Some(First), [RETH], true;
    UC_RDMA_WRITE_MIDDLE = 0x27, Uc, RdmaWrite, Some(Middle), [], true;
    UC_RDMA_WRITE_LAST = 0x28, Uc, RdmaWrite, Some(Last), [], true;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Uc, RdmaWrite, Some(Last), [IMM_DT], true;
    UC_RDMA_WRITE_ONLY = 0x2a, Uc, RdmaWrite, Some(Only), [RETH], true;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, Uc, RdmaWrite, Some(Only), [RETH, IMM_DT], true;
    UD_SEND_ONLY = 0x64, Ud, Send, Some(Only), [DETH], true;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Ud, Send, Some(Only), [DETH, IMM_DT], true;
    CNP = 0x81, Cnp, Cnp, None, [], false;
}

impl Opcode {
    /// Name of the opcode, or `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    /// True for packets a requester sends (as opposed to ACKs and READ responses).
    pub fn is_request(self) -> bool {
        self.info().is_some_and(|i| {
            !matches!(
                i.operation,
                Operation::Acknowledge
                    | Operation::AtomicAcknowledge
                    | Operation::RdmaReadResponse
                    | Operation::Cnp
            )
        })
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Path MTU of a connection: the largest payload one packet may carry.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// Every path MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    pub const fn bytes(self) -> usize {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The `enum ibv_mtu` value (1 = 256 ... 5 = 4096).
    pub const fn ibv_mtu(self) -> u8 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// From an `enum ibv_mtu` value.
    pub const fn from_ibv_mtu(v: u8) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// From a byte count that is exactly one of the five MTUs.
    pub const fn from_bytes(v: usize) -> Option<Mtu> {
        match v {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// Checks a payload length against what `opcode` allows at this MTU:
    /// FIRST and MIDDLE packets carry exactly one MTU, LAST carries 1..=MTU,
    /// ONLY (and single-packet operations) 0..=MTU, and header-only opcodes 0.
    ///
    /// ```
    /// use burst_wire::{Mtu, Opcode};
    /// assert!(Mtu::Mtu1024.check_payload(Opcode::RC_SEND_MIDDLE, 1024).is_ok());
    /// assert!(Mtu::Mtu1024.check_payload(Opcode::RC_SEND_MIDDLE, 1000).is_err());
    /// assert!(Mtu::Mtu1024.check_payload(Opcode::RC_SEND_ONLY, 0).is_ok());
    /// assert!(Mtu::Mtu1024.check_payload(Opcode::RC_SEND_LAST, 0).is_err());
    /// ```
    pub fn check_payload(self, opcode: Opcode, len: usize) -> crate::Result<()> {
        let info = opcode.info().ok_or(crate::Error::UnknownOpcode(opcode.0))?;
        let mtu = self.bytes();
        let ok = if !info.has_payload {
            len == 0
        } else {
            match info.position {
                Some(Position::First) | Some(Position::Middle) => len == mtu,
                Some(Position::Last) => (1..=mtu).contains(&len),
                Some(Position::Only) | None => len <= mtu,
            }
        };
        if ok {
            Ok(())
        } else {
            Err(crate::Error::PayloadLength {
                opcode: opcode.0,
                len,
                mtu,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for &op in Opcode::ALL {
            let i = op.info().unwrap();
            assert_eq!(op.name(), i.name);
            let prefix = match i.transport {
                Transport::Rc => 0x00,
                Transport::Uc => 0x20,
                Transport::Ud => 0x60,
                Transport::Cnp => 0x80,
            };
            assert_eq!(op.0 & 0xe0, prefix, "{op:?}");
            // UC and RC share the operation code points
            if i.transport == Transport::Uc {
                let rc = Opcode(op.0 & 0x1f).info().unwrap();
                assert_eq!(rc.headers, i.headers);
                assert_eq!(rc.operation, i.operation);
            }
        }
        assert_eq!(Opcode::ALL.len(), 24 + 12 + 2 + 1);
    }

    #[test]
    fn header_offsets_follow_spec_order() {
        let h = HeaderSet::RETH.with(HeaderSet::IMM_DT);
        assert_eq!(h.offset_of(HeaderSet::RETH), 0);
        assert_eq!(h.offset_of(HeaderSet::IMM_DT), 16);
        assert_eq!(h.len(), 20);
        let a = HeaderSet::AETH.with(HeaderSet::ATOMIC_ACK_ETH);
        assert_eq!(a.offset_of(HeaderSet::ATOMIC_ACK_ETH), 4);
        assert_eq!(a.len(), 12);
        let d = HeaderSet::DETH.with(HeaderSet::IMM_DT);
        assert_eq!(d.offset_of(HeaderSet::IMM_DT), 8);
    }

    #[test]
    fn unknown_opcodes() {
        for v in [0x15u8, 0x18, 0x1f, 0x2c, 0x40, 0x60, 0x80, 0xa0, 0xff] {
            assert!(Opcode(v).info().is_none(), "{v:#x}");
        }
    }
}
