//! # burst-wire: a zero-copy RoCEv2 codec
//!
//! Parse, inspect, build and verify RoCEv2 packets: Ethernet II (with an
//! optional 802.1Q tag), IPv4/IPv6, UDP to port 4791, the InfiniBand Base
//! Transport Header, every extended transport header RC, UC and UD use, the
//! invariant CRC, the RoCEv2 CNP, and the IB Communication Management MADs that
//! travel to QP1.
//!
//! The shape follows smoltcp's `wire` module: *views* (`Bth<T>`, `Reth<T>`,
//! [`IbPacket<T>`], ...) wrap `&[u8]`/`&mut [u8]`, validate lengths once in
//! `new_checked`, and then offer named accessors and setters; *reprs*
//! ([`BthRepr`], [`IbRepr`], [`FrameRepr`], ...) are plain values that `parse`
//! from a view and `emit` into a buffer. Nothing allocates, and no input makes
//! the parser panic: every malformation is a distinct [`Error`].
//!
//! ```
//! use burst_wire::*;
//! use std::net::Ipv4Addr;
//!
//! // Build an RDMA WRITE ONLY frame...
//! let mut ib = IbRepr::new(BthRepr::new(
//!     Opcode::RC_RDMA_WRITE_ONLY, Qpn::new(0x11).unwrap(), Psn::new(0xfffffe)));
//! ib.reth = Some(RethRepr { virtual_address: 0x7f00_0000_1000, rkey: 0x1234, dma_length: 4 });
//! ib.payload_len = 4;
//! let frame = FrameRepr {
//!     eth: Some(EthRepr { src: [2, 0, 0, 0, 0, 1], dst: [2, 0, 0, 0, 0, 2], vlan: None }),
//!     ip: IpRepr::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)),
//!     udp: UdpRepr::new(49152),
//!     ib,
//! };
//! let mut buf = [0u8; 128];
//! let n = frame.emit(&mut buf, b"data").unwrap();
//!
//! // ...and read it back, ICRC verified.
//! let rx = parse_verified(&buf[..n]).unwrap();
//! assert_eq!(rx.ib.opcode(), Opcode::RC_RDMA_WRITE_ONLY);
//! assert_eq!(rx.ib.reth().unwrap().rkey(), 0x1234);
//! assert_eq!(rx.ib.payload(), b"data");
//! assert_eq!(rx.repr().unwrap(), frame);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bth;
pub mod error;
pub mod ext;
mod field;
pub mod frame;
pub mod icrc;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;

pub use bth::{Bth, BthRepr, BTH_LEN, DEFAULT_PKEY};
pub use error::{Error, Result};
pub use ext::{
    Aeth, AethRepr, AtomicAckEth, AtomicEth, AtomicEthRepr, Credits, Deth, DethRepr, Ieth, ImmDt,
    NakCode, Reth, RethRepr, RnrTimer, Syndrome,
};
pub use frame::{
    emit_ip_udp, parse_verified, ud_grh_for, EthRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr,
    RoceFrame, UdpRepr, VlanTag, GRH_LEN, ROCEV2_PORT,
};
pub use opcode::{HeaderSet, Mtu, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use packet::{IbPacket, IbRepr, CNP_RESERVED_LEN, ICRC_LEN};
pub use psn::{Psn, Qpn};

/// The GID RoCE v2 uses for an IP address: the IPv6 address, or the
/// IPv4-mapped one.
///
/// ```
/// let ip = "198.18.0.7".parse().unwrap();
/// assert_eq!(burst_wire::ip_of_gid(burst_wire::gid_of(ip)), ip);
/// ```
pub fn gid_of(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v) => v.octets(),
    }
}

/// The IP address a RoCE v2 GID stands for.
pub fn ip_of_gid(gid: [u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    }
}
