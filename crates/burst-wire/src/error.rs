//! The one error type of the codec: every way a packet can be refused.

/// Why a buffer was refused by a parser, a verifier or an emitter.
///
/// Each kind of malformation has its own variant so that a receiver can count
/// drops by cause (RXE keeps similar counters) and tests can assert the cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the named header (or the ICRC) is complete.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which header or trailer was cut short.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The Ethernet frame carries neither IPv4 nor IPv6 (after an optional VLAN tag).
    #[error("not an IP packet (ether type {0:#06x})")]
    NotIp(u16),
    /// The IP header is malformed (bad version, IHL or length field).
    #[error("malformed IP header: {0}")]
    BadIpHeader(&'static str),
    /// The IPv4 header checksum is wrong.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// The IP packet is a fragment; RoCEv2 packets are never fragmented.
    #[error("IP fragment")]
    IpFragment,
    /// The IP packet does not carry UDP.
    #[error("not UDP (IP protocol {0})")]
    NotUdp(u8),
    /// The UDP header's length field disagrees with the IP payload length.
    #[error("UDP length {udp} disagrees with IP payload length {ip}")]
    BadUdpLength {
        /// Length in the UDP header.
        udp: u16,
        /// Length implied by the IP header.
        ip: usize,
    },
    /// UDP destination port is not the RoCEv2 port.
    #[error("UDP destination port {0} is not RoCEv2 (4791)")]
    WrongUdpPort(u16),
    /// BTH transport header version is not 0.
    #[error("unsupported BTH transport version {0}")]
    UnsupportedTver(u8),
    /// The BTH opcode is not one RoCEv2 RC/UC/UD or CNP uses.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The bytes between headers and ICRC are not a multiple of 4.
    #[error("payload plus pad ({0} bytes) is not a multiple of 4")]
    Unaligned(usize),
    /// The opcode carries no payload, but the packet has some.
    #[error("opcode {opcode:#04x} carries no payload but {len} bytes follow its headers")]
    UnexpectedPayload {
        /// BTH opcode.
        opcode: u8,
        /// Bytes found between the headers and the ICRC.
        len: usize,
    },
    /// The pad count is larger than the padded payload, or non-zero without payload.
    #[error("bad pad count {pad} for {padded} padded payload bytes")]
    BadPadCount {
        /// Pad count from the BTH.
        pad: u8,
        /// Bytes between the headers and the ICRC.
        padded: usize,
    },
    /// The payload length is impossible for this opcode at this path MTU.
    #[error("payload of {len} bytes invalid for opcode {opcode:#04x} at MTU {mtu}")]
    PayloadLength {
        /// BTH opcode.
        opcode: u8,
        /// Payload bytes.
        len: usize,
        /// Path MTU in bytes.
        mtu: usize,
    },
    /// The stored ICRC does not match the computed one.
    #[error("bad ICRC: stored {stored:#010x}, computed {computed:#010x}")]
    BadIcrc {
        /// ICRC in the packet.
        stored: u32,
        /// ICRC computed over the invariant fields.
        computed: u32,
    },
    /// A repr's extended headers do not match what its opcode requires.
    #[error("extended headers do not match opcode {0:#04x}")]
    HeaderMismatch(u8),
    /// The output buffer is too small for what is being emitted.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A field value does not fit the wire (for example a 24-bit QPN above 2^24).
    #[error("value out of range for {0}")]
    OutOfRange(&'static str),
    /// A management datagram is not a CM MAD this codec knows.
    #[error("not a CM MAD: {0}")]
    BadMad(&'static str),
}

/// Result with the codec's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

/// Checks that `buf` holds at least `need` bytes for `what`.
#[inline]
pub(crate) fn check_len(what: &'static str, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
