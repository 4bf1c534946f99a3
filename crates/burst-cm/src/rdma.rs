//! The conventions the RDMA CM (librdmacm and the kernel's `rdma_cm`)
//! layers on the IB CM for IP-addressed connections: service IDs made of a
//! port space and a port, and the 36-byte header at the start of a REQ's
//! (or SIDR_REQ's) private data carrying both IP addresses and ports.
//!
//! ```
//! use burst_cm::rdma::{CmaHeader, PortSpace};
//! use std::net::SocketAddr;
//! let id = PortSpace::Tcp.service_id(7174);
//! assert_eq!(id, 0x0000_0000_0106_1c06);
//! assert_eq!(PortSpace::from_service_id(id), Some((PortSpace::Tcp, 7174)));
//!
//! let hdr = CmaHeader {
//!     src: "198.18.0.1:40000".parse::<SocketAddr>().unwrap(),
//!     dst: "198.18.0.2".parse().unwrap(), // the port is in the service ID
//! };
//! let mut pd = [0u8; 92];
//! hdr.emit(&mut pd);
//! assert_eq!(CmaHeader::parse(&pd), Some(hdr));
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The Q_Key librdmacm gives UD QPs of `RDMA_PS_UDP`.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Length of the rdma_cm header in a REQ's private data.
pub const CMA_HEADER_LEN: usize = 36;

/// Private data an application may put in a REQ (92 minus the header).
pub const REQ_PRIVATE_DATA: usize = 92 - CMA_HEADER_LEN;
/// ... in a REP.
pub const REP_PRIVATE_DATA: usize = 196;
/// ... in a REJ.
pub const REJ_PRIVATE_DATA: usize = 148;
/// ... in a DREQ.
pub const DREQ_PRIVATE_DATA: usize = 220;
/// ... in a DREP.
pub const DREP_PRIVATE_DATA: usize = 224;
/// ... in an RTU.
pub const RTU_PRIVATE_DATA: usize = 224;
/// ... in a SIDR_REQ (216 minus the header).
pub const SIDR_REQ_PRIVATE_DATA: usize = 216 - CMA_HEADER_LEN;
/// ... in a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA: usize = 136;

/// The rdma_cm port spaces (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// IP over IB (UD).
    Ipoib,
    /// Reliable connections (`RDMA_PS_TCP`).
    Tcp,
    /// Datagrams (`RDMA_PS_UDP`).
    Udp,
    /// Any QP type (`RDMA_PS_IB`).
    Ib,
}

impl PortSpace {
    /// The port space's number in librdmacm's ABI.
    pub fn value(self) -> u32 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
        }
    }

    /// The port space numbered `v`.
    pub fn from_value(v: u32) -> Option<PortSpace> {
        Some(match v {
            0x0002 => PortSpace::Ipoib,
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            0x013f => PortSpace::Ib,
            _ => return None,
        })
    }

    /// Whether the space's connections use UD QPs (SIDR instead of REQ).
    pub fn is_datagram(self) -> bool {
        matches!(self, PortSpace::Udp | PortSpace::Ipoib)
    }

    /// The IB service ID of `port` in this space (the kernel's
    /// `rdma_get_service_id`: `RDMA_IB_IP_PS_*` plus the port).
    pub fn service_id(self, port: u16) -> u64 {
        (u64::from(self.value()) << 16) | u64::from(port)
    }

    /// The space and port a service ID names, if it is an rdma_cm one.
    pub fn from_service_id(id: u64) -> Option<(PortSpace, u16)> {
        if id >> 32 != 0 {
            return None;
        }
        PortSpace::from_value((id >> 16) as u32).map(|ps| (ps, id as u16))
    }
}

/// The header rdma_cm puts first in the private data of a REQ or SIDR_REQ
/// (`struct cma_hdr`: version 0, IP version in the high nibble, the
/// source port, then source and destination addresses, IPv4 in the last
/// four bytes of each 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// The requester's address and port.
    pub src: SocketAddr,
    /// The address requested (its port is the service ID's).
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Writes the header into the first [`CMA_HEADER_LEN`] bytes of `pd`.
    ///
    /// # Panics
    /// If `pd` is shorter than the header (the private data of a REQ or
    /// SIDR_REQ never is).
    pub fn emit(&self, pd: &mut [u8]) {
        let pd = &mut pd[..CMA_HEADER_LEN];
        pd.fill(0);
        pd[0] = 0; // CMA_VERSION
        pd[1] = if self.src.is_ipv4() { 4 << 4 } else { 6 << 4 };
        pd[2..4].copy_from_slice(&self.src.port().to_be_bytes());
        put_ip(&mut pd[4..20], self.src.ip());
        put_ip(&mut pd[20..36], self.dst);
    }

    /// The header at the start of `pd`; `None` unless it has rdma_cm's
    /// version and an IP version of 4 or 6.
    pub fn parse(pd: &[u8]) -> Option<CmaHeader> {
        let pd = pd.get(..CMA_HEADER_LEN)?;
        if pd[0] != 0 {
            return None;
        }
        let port = u16::from_be_bytes([pd[2], pd[3]]);
        let (src, dst) = match pd[1] >> 4 {
            4 => (
                IpAddr::V4(ipv4_at(&pd[16..20])),
                IpAddr::V4(ipv4_at(&pd[32..36])),
            ),
            6 => (
                IpAddr::V6(ipv6_at(&pd[4..20])),
                IpAddr::V6(ipv6_at(&pd[20..36])),
            ),
            _ => return None,
        };
        Some(CmaHeader {
            src: SocketAddr::new(src, port),
            dst,
        })
    }
}

fn put_ip(b: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => b[12..16].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => b.copy_from_slice(&v6.octets()),
    }
}

fn ipv4_at(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

fn ipv6_at(b: &[u8]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(b);
    Ipv6Addr::from(o)
}

pub use burst_wire::{gid_of, ip_of_gid};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_header_round_trips_and_bad_versions_are_refused() {
        let hdr = CmaHeader {
            src: "[fd00::1]:5".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        let mut pd = [0u8; 56];
        hdr.emit(&mut pd);
        assert_eq!(CmaHeader::parse(&pd), Some(hdr));
        pd[1] = 5 << 4;
        assert_eq!(CmaHeader::parse(&pd), None);
        pd[1] = 4 << 4;
        pd[0] = 1;
        assert_eq!(CmaHeader::parse(&pd), None);
        assert_eq!(CmaHeader::parse(&pd[..10]), None);
    }

    #[test]
    fn service_ids_of_other_spaces_are_not_rdma_cm_ones() {
        assert_eq!(PortSpace::Udp.service_id(7174), 0x0111_1c06);
        assert_eq!(PortSpace::from_service_id(0x1_0106_0001), None);
        assert_eq!(PortSpace::from_service_id(0x0999_0001), None);
        let ip: IpAddr = "198.18.0.7".parse().unwrap();
        assert_eq!(ip_of_gid(gid_of(ip)), ip);
    }
}
