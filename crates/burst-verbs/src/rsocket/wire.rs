//! What rsockets put on the wire: the connection data in the CM's private
//! data, the 32-bit messages in a WRITE's immediate data, and the SGEs one
//! side writes into the other's target list. Layouts are rdma-core's
//! (`librdmacm/rsocket.c`), so a burst rsocket talks to one on RXE or an
//! RNIC.

/// The protocol version both sides must carry.
pub const VERSION: u8 = 1;

/// Connection flag: the sender's SGEs are in network byte order (a
/// big-endian host).
pub const FLAG_NET: u8 = 1 << 0;
/// Connection flag: the sender has an iomap area after its target SGL.
pub const FLAG_IOMAP: u8 = 1 << 1;

/// The receive ring's space advertised at once: SGEs in the target list.
pub const SGL_SIZE: usize = 2;

/// Bytes of one SGE as written into a target list (`struct rs_sge`:
/// address, key, length).
pub const SGE_BYTES: usize = 16;

/// Bytes of one iomap entry (`struct rs_iomap`: the offset the mapping
/// answers to, then its SGE).
pub const IOMAP_BYTES: usize = 24;

/// Bytes of [`ConnData`] in the private data (an AF_INET/AF_INET6 id has no
/// header before it).
pub const CONN_DATA_BYTES: usize = 40;

/// Message kinds, in the immediate data's top three bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Stream bytes landed in the receive ring (low bits: how many).
    Data,
    /// A `riowrite` (never on the wire: a plain WRITE; only in our own
    /// completions' wr_id, low bits: how many bytes).
    Write,
    /// Credits, and maybe a new target SGE (low bits: the sender's new
    /// credit limit).
    Sgl,
    /// An iomap entry was written (low bits: its index).
    IomapSgl,
    /// A control message (low bits: [`Ctrl`]).
    Ctrl,
    /// A kind this side does not know (rdma-core's reserved ones).
    Other(u32),
}

/// Control messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctrl {
    /// The sender closed both directions.
    Disconnect = 0,
    /// Keep-alive: nothing to do.
    Keepalive = 1,
    /// The sender will send no more.
    Shutdown = 2,
}

const OP_DATA: u32 = 0;
const OP_WRITE: u32 = 2;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;
const DATA_MASK: u32 = 0x1FFF_FFFF;

/// One immediate value: an [`Op`] and its 29 bits of data.
///
/// ```
/// use burst_verbs::rsocket::wire::{msg, parse, Op};
/// let m = msg(Op::Data, 4096);
/// assert_eq!(m, 4096);
/// assert_eq!(parse(msg(Op::Sgl, 400)), (Op::Sgl, 400));
/// ```
pub fn msg(op: Op, data: u32) -> u32 {
    let op = match op {
        Op::Data => OP_DATA,
        Op::Write => OP_WRITE,
        Op::Sgl => OP_SGL,
        Op::IomapSgl => OP_IOMAP_SGL,
        Op::Ctrl => OP_CTRL,
        Op::Other(o) => o & 7,
    };
    (op << 29) | (data & DATA_MASK)
}

/// The [`Op`] and data of an immediate value.
pub fn parse(imm: u32) -> (Op, u32) {
    let op = match imm >> 29 {
        OP_DATA => Op::Data,
        OP_WRITE => Op::Write,
        OP_SGL => Op::Sgl,
        OP_IOMAP_SGL => Op::IomapSgl,
        OP_CTRL => Op::Ctrl,
        o => Op::Other(o),
    };
    (op, imm & DATA_MASK)
}

/// A remote buffer: address, rkey, length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteSge {
    /// Address in the peer's space.
    pub addr: u64,
    /// Its rkey.
    pub key: u32,
    /// Bytes (for a target list: how many SGEs it has).
    pub length: u32,
}

impl RemoteSge {
    /// The 16 bytes written into a peer's target list, in the byte order
    /// the peer reads (`big`: a peer with [`FLAG_NET`]).
    pub fn to_bytes(self, big: bool) -> [u8; SGE_BYTES] {
        let mut b = [0u8; SGE_BYTES];
        if big {
            b[..8].copy_from_slice(&self.addr.to_be_bytes());
            b[8..12].copy_from_slice(&self.key.to_be_bytes());
            b[12..].copy_from_slice(&self.length.to_be_bytes());
        } else {
            b[..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..].copy_from_slice(&self.length.to_le_bytes());
        }
        b
    }
}

/// A buffer a peer may write into directly (`riowrite`): the offsets
/// `offset..offset + sge.length` land at `sge.addr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoMap {
    /// The first offset the mapping answers to.
    pub offset: u64,
    /// Where it is in the mapper's memory.
    pub sge: RemoteSge,
}

impl IoMap {
    /// The 24 bytes written into a peer's iomap table (byte order as for
    /// [`RemoteSge::to_bytes`]).
    pub fn to_bytes(self, big: bool) -> [u8; IOMAP_BYTES] {
        let mut b = [0u8; IOMAP_BYTES];
        b[..8].copy_from_slice(&if big {
            self.offset.to_be_bytes()
        } else {
            self.offset.to_le_bytes()
        });
        b[8..].copy_from_slice(&self.sge.to_bytes(big));
        b
    }
}

/// The connection data each side puts in its REQ or REP (`struct
/// rs_conn_data`, big-endian fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// [`VERSION`].
    pub version: u8,
    /// [`FLAG_NET`], [`FLAG_IOMAP`].
    pub flags: u8,
    /// Messages the sender can take at once (its receive queue).
    pub credits: u16,
    /// The sender's iomap entries, scaled (8-bit rsocket scale).
    pub target_iomap_size: u8,
    /// Where the peer writes new target SGEs (length: how many).
    pub target_sgl: RemoteSge,
    /// The first half of the sender's receive ring.
    pub data_buf: RemoteSge,
}

impl ConnData {
    /// The private data bytes.
    pub fn to_bytes(&self) -> [u8; CONN_DATA_BYTES] {
        let mut b = [0u8; CONN_DATA_BYTES];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        for (at, s) in [(8, self.target_sgl), (24, self.data_buf)] {
            b[at..at + 8].copy_from_slice(&s.addr.to_be_bytes());
            b[at + 8..at + 12].copy_from_slice(&s.key.to_be_bytes());
            b[at + 12..at + 16].copy_from_slice(&s.length.to_be_bytes());
        }
        b
    }

    /// Reads a peer's connection data: `None` when it is too short.
    ///
    /// ```
    /// use burst_verbs::rsocket::wire::{ConnData, RemoteSge, VERSION};
    /// let c = ConnData {
    ///     version: VERSION,
    ///     flags: 2,
    ///     credits: 384,
    ///     target_iomap_size: 0,
    ///     target_sgl: RemoteSge { addr: 0x1000, key: 7, length: 2 },
    ///     data_buf: RemoteSge { addr: 0x2000, key: 8, length: 65536 },
    /// };
    /// assert_eq!(ConnData::parse(&c.to_bytes()), Some(c));
    /// assert_eq!(ConnData::parse(&c.to_bytes()[..39]), None);
    /// ```
    pub fn parse(b: &[u8]) -> Option<ConnData> {
        let b: &[u8; CONN_DATA_BYTES] = b.get(..CONN_DATA_BYTES)?.try_into().ok()?;
        let sge = |at: usize| RemoteSge {
            addr: u64::from_be_bytes(b[at..at + 8].try_into().unwrap_or_default()),
            key: u32::from_be_bytes(b[at + 8..at + 12].try_into().unwrap_or_default()),
            length: u32::from_be_bytes(b[at + 12..at + 16].try_into().unwrap_or_default()),
        };
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        })
    }
}

/// rsocket's 8-bit size scale: values up to 127 as they are, larger ones
/// as a multiple of 256 with the top bit set.
pub fn value_to_scale(value: u32) -> u8 {
    if value <= 127 {
        value as u8
    } else {
        (0x80 | ((value >> 8) & 0x7f)) as u8
    }
}

/// The inverse of [`value_to_scale`].
pub fn scale_to_value(scale: u8) -> u32 {
    if scale <= 127 {
        u32::from(scale)
    } else {
        u32::from(scale & 0x7f) << 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_cores_layout() {
        // Bytes as rdma-core's rs_format_conn_data lays them out.
        let c = ConnData {
            version: 1,
            flags: FLAG_IOMAP,
            credits: 0x0180,
            target_iomap_size: 0,
            target_sgl: RemoteSge {
                addr: 0x1122_3344_5566_7788,
                key: 0xaabb_ccdd,
                length: 2,
            },
            data_buf: RemoteSge {
                addr: 0x10,
                key: 0x20,
                length: 0x10000,
            },
        };
        let b = c.to_bytes();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..20], &[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(&b[20..24], &[0, 0, 0, 2]);
        assert_eq!(&b[36..40], &[0, 1, 0, 0]);
    }

    #[test]
    fn messages_keep_29_bits() {
        assert_eq!(parse(msg(Op::Ctrl, Ctrl::Shutdown as u32)), (Op::Ctrl, 2));
        assert_eq!(parse(msg(Op::Data, u32::MAX)), (Op::Data, 0x1FFF_FFFF));
        assert_eq!(parse(0x2000_0000).0, Op::Other(1));
        assert_eq!(parse(msg(Op::Write, 9)), (Op::Write, 9));
    }

    #[test]
    fn scale_round_trips_what_it_can_hold() {
        for v in [0, 1, 127] {
            assert_eq!(scale_to_value(value_to_scale(v)), v);
        }
        assert_eq!(scale_to_value(value_to_scale(1024)), 1024);
        assert_eq!(scale_to_value(value_to_scale(1000)), 768);
    }
}
