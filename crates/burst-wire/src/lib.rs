#![doc = include_str!("../README.md")]
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
pub mod tally;

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
