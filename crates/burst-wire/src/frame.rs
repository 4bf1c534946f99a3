//! Whole RoCEv2 frames: Ethernet II (optional 802.1Q tag), IPv4 or IPv6, UDP
//! to port 4791, then the transport packet.
//!
//! L2 to L4 are sliced with etherparse (zero-copy header slices); the codec
//! adds the RoCEv2 rules on top (no fragments, UDP length agreeing with IP,
//! destination port 4791) and the ICRC, which covers the IP and UDP headers.

use core::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2HeaderSlice, IpDscp, IpEcn, IpNumber, Ipv4Header, Ipv4HeaderSlice,
    Ipv6FlowLabel, Ipv6Header, Ipv6HeaderSlice, SingleVlanHeaderSlice, UdpHeaderSlice,
};

use crate::error::{check_len, Result};
use crate::packet::{IbPacket, ICRC_LEN};
use crate::{icrc, Error, IbRepr};

/// The IANA UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;
/// Length of an Ethernet II header.
pub const ETH_LEN: usize = 14;
/// Length of an 802.1Q tag.
pub const VLAN_LEN: usize = 4;
/// Length of an IPv4 header without options.
pub const IPV4_LEN: usize = 20;
/// Length of an IPv6 header.
pub const IPV6_LEN: usize = 40;
/// Length of a UDP header.
pub const UDP_LEN: usize = 8;
/// Size of the GRH area at the start of a UD receive buffer.
pub const GRH_LEN: usize = 40;

fn len_err(what: &'static str, e: &etherparse::err::LenError) -> Error {
    Error::Truncated {
        what,
        need: e.required_len,
        have: e.len,
    }
}

/// One's-complement sum over an IPv4 header: 0 when its checksum is right.
fn ipv4_checksum(h: &[u8]) -> u16 {
    // Once per received frame: whole 16-bit words (an IPv4 header has no
    // odd byte; one would be summed zero-padded, as RFC 1071 does).
    let words = h.chunks_exact(2);
    let tail = words.remainder().first().map_or(0, |&b| u32::from(b) << 8);
    let mut sum: u32 = words
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum::<u32>()
        + tail;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An 802.1Q VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VlanTag {
    /// Priority code point (3 bits): the L2 priority RoCE traffic classes map to.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// Ethernet II addressing of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthRepr {
    /// Source MAC.
    pub src: [u8; 6],
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Optional VLAN tag.
    pub vlan: Option<VlanTag>,
}

impl EthRepr {
    /// Bytes of L2 header this repr emits.
    pub fn header_len(&self) -> usize {
        ETH_LEN + if self.vlan.is_some() { VLAN_LEN } else { 0 }
    }
}

/// IPv4 fields of a RoCEv2 packet (no options: RoCEv2 never sends them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits): DCQCN marks congestion here.
    pub ecn: u8,
    /// Identification: covered by the ICRC, so the sender must know it.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
}

/// IPv6 fields of a RoCEv2 packet (no extension headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

/// The network layer of a RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// IPv4 with the values kernel RXE sends: TOS 0, TTL 64, DF set, ID 0.
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr) -> IpRepr {
        IpRepr::V4(Ipv4Repr {
            src,
            dst,
            dscp: 0,
            ecn: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        })
    }

    /// IPv6 with traffic class 0, flow label 0 and hop limit 64.
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr) -> IpRepr {
        IpRepr::V6(Ipv6Repr {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        })
    }

    /// Header length.
    pub fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_LEN,
            IpRepr::V6(_) => IPV6_LEN,
        }
    }

    /// Source address as a RoCE GID (IPv4-mapped for IPv4).
    pub fn src_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(v) => v.src.to_ipv6_mapped().octets(),
            IpRepr::V6(v) => v.src.octets(),
        }
    }

    /// Destination address as a RoCE GID (IPv4-mapped for IPv4).
    pub fn dst_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(v) => v.dst.to_ipv6_mapped().octets(),
            IpRepr::V6(v) => v.dst.octets(),
        }
    }

    /// Writes the header for `payload_len` bytes of UDP datagram into `buf`.
    fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        match self {
            IpRepr::V4(v) => {
                let mut h = Ipv4Header::new(
                    u16::try_from(payload_len).map_err(|_| Error::OutOfRange("IPv4 length"))?,
                    v.ttl,
                    IpNumber::UDP,
                    v.src.octets(),
                    v.dst.octets(),
                )
                .map_err(|_| Error::OutOfRange("IPv4 length"))?;
                h.dscp = IpDscp::try_new(v.dscp).map_err(|_| Error::OutOfRange("DSCP"))?;
                h.ecn = IpEcn::try_new(v.ecn).map_err(|_| Error::OutOfRange("ECN"))?;
                h.identification = v.ident;
                h.dont_fragment = v.dont_frag;
                h.header_checksum = h.calc_header_checksum();
                buf[..IPV4_LEN].copy_from_slice(&h.to_bytes());
            }
            IpRepr::V6(v) => {
                let h = Ipv6Header {
                    traffic_class: v.traffic_class,
                    flow_label: Ipv6FlowLabel::try_new(v.flow_label)
                        .map_err(|_| Error::OutOfRange("flow label"))?,
                    payload_length: u16::try_from(payload_len)
                        .map_err(|_| Error::OutOfRange("IPv6 payload length"))?,
                    next_header: IpNumber::UDP,
                    hop_limit: v.hop_limit,
                    source: v.src.octets(),
                    destination: v.dst.octets(),
                };
                buf[..IPV6_LEN].copy_from_slice(&h.to_bytes());
            }
        }
        Ok(())
    }
}

/// UDP fields of a RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port: RoCEv2 senders derive it from the QP for ECMP entropy.
    pub src_port: u16,
    /// Destination port, 4791.
    pub dst_port: u16,
    /// Checksum as sent; RoCEv2 senders (RXE, RNICs) send 0 and rely on the ICRC.
    pub checksum: u16,
}

impl UdpRepr {
    /// UDP to the RoCEv2 port with checksum 0.
    pub fn new(src_port: u16) -> UdpRepr {
        UdpRepr {
            src_port,
            dst_port: ROCEV2_PORT,
            checksum: 0,
        }
    }
}

/// A parsed RoCEv2 frame: L2 to L4 decoded, the transport packet checked.
#[derive(Debug, Clone)]
pub struct RoceFrame<'a> {
    /// Ethernet addressing, `None` when parsed from an IP packet.
    pub eth: Option<EthRepr>,
    /// Network layer.
    pub ip: IpRepr,
    /// UDP layer.
    pub udp: UdpRepr,
    /// The transport packet (BTH through ICRC).
    pub ib: IbPacket<&'a [u8]>,
    ip_header: &'a [u8],
    udp_header: &'a [u8],
}

impl<'a> RoceFrame<'a> {
    /// Parses an Ethernet II frame (without FCS). Bytes after the IP packet's
    /// length (Ethernet padding) are ignored.
    pub fn parse_ethernet(frame: &'a [u8]) -> Result<RoceFrame<'a>> {
        let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|e| len_err("Ethernet", &e))?;
        let mut et = eth.ether_type();
        let mut rest = &frame[ETH_LEN..];
        let mut vlan = None;
        if et == EtherType::VLAN_TAGGED_FRAME {
            let v = SingleVlanHeaderSlice::from_slice(rest).map_err(|e| len_err("VLAN tag", &e))?;
            vlan = Some(VlanTag {
                pcp: v.priority_code_point().value(),
                dei: v.drop_eligible_indicator(),
                vid: v.vlan_identifier().value(),
            });
            et = v.ether_type();
            rest = &rest[VLAN_LEN..];
        }
        if et != EtherType::IPV4 && et != EtherType::IPV6 {
            return Err(Error::NotIp(et.0));
        }
        let mut f = Self::parse_ip(rest)?;
        f.eth = Some(EthRepr {
            src: eth.source(),
            dst: eth.destination(),
            vlan,
        });
        Ok(f)
    }

    /// Parses an IP packet (IPv4 or IPv6, by its version nibble).
    pub fn parse_ip(l3: &'a [u8]) -> Result<RoceFrame<'a>> {
        check_len("IP header", l3, 1)?;
        let (ip, ip_header, ip_payload) = match l3[0] >> 4 {
            4 => {
                let h = Ipv4HeaderSlice::from_slice(l3).map_err(|e| match e {
                    etherparse::err::ipv4::HeaderSliceError::Len(l) => len_err("IPv4 header", &l),
                    etherparse::err::ipv4::HeaderSliceError::Content(_) => {
                        Error::BadIpHeader("IPv4 version or IHL")
                    }
                })?;
                let total = usize::from(h.total_len());
                let hl = h.slice().len();
                if total < hl {
                    return Err(Error::BadIpHeader("IPv4 total length below header length"));
                }
                check_len("IPv4 packet", l3, total)?;
                if h.more_fragments() || h.fragments_offset().value() != 0 {
                    return Err(Error::IpFragment);
                }
                if h.protocol() != IpNumber::UDP {
                    return Err(Error::NotUdp(h.protocol().0));
                }
                // Frames from AF_XDP/DPDK arrive unchecked by the kernel; the
                // ICRC masks the header checksum, so check it here.
                if ipv4_checksum(h.slice()) != 0 {
                    return Err(Error::BadIpChecksum);
                }
                let repr = IpRepr::V4(Ipv4Repr {
                    src: h.source_addr(),
                    dst: h.destination_addr(),
                    dscp: h.dcp().value(),
                    ecn: h.ecn().value(),
                    ident: h.identification(),
                    dont_frag: h.dont_fragment(),
                    ttl: h.ttl(),
                });
                (repr, h.slice(), &l3[hl..total])
            }
            6 => {
                let h = Ipv6HeaderSlice::from_slice(l3).map_err(|e| match e {
                    etherparse::err::ipv6::HeaderSliceError::Len(l) => len_err("IPv6 header", &l),
                    etherparse::err::ipv6::HeaderSliceError::Content(_) => {
                        Error::BadIpHeader("IPv6 version")
                    }
                })?;
                let total = IPV6_LEN + usize::from(h.payload_length());
                check_len("IPv6 packet", l3, total)?;
                if h.next_header() != IpNumber::UDP {
                    return Err(Error::NotUdp(h.next_header().0));
                }
                let repr = IpRepr::V6(Ipv6Repr {
                    src: h.source_addr(),
                    dst: h.destination_addr(),
                    traffic_class: h.traffic_class(),
                    flow_label: h.flow_label().value(),
                    hop_limit: h.hop_limit(),
                });
                (repr, h.slice(), &l3[IPV6_LEN..total])
            }
            _ => return Err(Error::BadIpHeader("IP version")),
        };
        let udp = UdpHeaderSlice::from_slice(ip_payload).map_err(|e| len_err("UDP header", &e))?;
        if usize::from(udp.length()) != ip_payload.len() {
            return Err(Error::BadUdpLength {
                udp: udp.length(),
                ip: ip_payload.len(),
            });
        }
        if udp.destination_port() != ROCEV2_PORT {
            return Err(Error::WrongUdpPort(udp.destination_port()));
        }
        let ib = IbPacket::new_checked(&ip_payload[UDP_LEN..])?;
        Ok(RoceFrame {
            eth: None,
            ip,
            udp: UdpRepr {
                src_port: udp.source_port(),
                dst_port: udp.destination_port(),
                checksum: udp.checksum(),
            },
            ib,
            ip_header,
            udp_header: udp.slice(),
        })
    }

    /// ICRC computed over this frame's invariant fields.
    pub fn computed_icrc(&self) -> u32 {
        // Lengths were checked while parsing, so this cannot fail.
        icrc::compute(self.ip_header, self.udp_header, self.ib.icrc_covered()).unwrap_or(0)
    }

    /// The ICRC's CRC over its masked prefix (this frame's IP and UDP
    /// headers; [`icrc::pseudo_header_crc`]), for a receiver that checks the
    /// transport packet later ([`icrc::Checker::check_after`]).
    pub fn pseudo_header_crc(&self) -> u32 {
        // Lengths were checked while parsing, so this cannot fail.
        icrc::pseudo_header_crc(self.ip_header, self.udp_header).unwrap_or(0)
    }

    /// Checks the stored ICRC.
    pub fn verify_icrc(&self) -> Result<()> {
        let stored = self.ib.icrc();
        let computed = self.computed_icrc();
        if stored == computed {
            Ok(())
        } else {
            Err(Error::BadIcrc { stored, computed })
        }
    }

    /// The whole high-level form (to inspect or to emit again).
    pub fn repr(&self) -> Result<FrameRepr> {
        Ok(FrameRepr {
            eth: self.eth,
            ip: self.ip,
            udp: self.udp,
            ib: IbRepr::parse(&self.ib)?,
        })
    }

    /// The 40 bytes rdma-core applications find at the start of a UD receive
    /// buffer: for IPv4, 20 zero bytes then the IPv4 header; for IPv6 the IPv6
    /// header (as RXE and RNICs place it).
    pub fn ud_grh(&self) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        match self.ip {
            IpRepr::V4(_) => g[20..].copy_from_slice(&self.ip_header[..IPV4_LEN]),
            IpRepr::V6(_) => g.copy_from_slice(&self.ip_header[..IPV6_LEN]),
        }
        g
    }
}

/// Parses an Ethernet frame and verifies its ICRC in one call.
///
/// ```
/// use burst_wire::*;
/// use std::net::Ipv4Addr;
/// let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11).unwrap(), Psn::new(1)));
/// ib.payload_len = 3;
/// let f = FrameRepr {
///     eth: Some(EthRepr::default()),
///     ip: IpRepr::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)),
///     udp: UdpRepr::new(0xc000),
///     ib,
/// };
/// let mut buf = vec![0u8; f.frame_len()];
/// f.emit(&mut buf, b"abc").unwrap();
/// let parsed = parse_verified(&buf).unwrap();
/// assert_eq!(parsed.ib.payload(), b"abc");
/// buf[f.payload_offset()] ^= 1;
/// assert!(matches!(parse_verified(&buf), Err(Error::BadIcrc { .. })));
/// ```
pub fn parse_verified(frame: &[u8]) -> Result<RoceFrame<'_>> {
    let f = RoceFrame::parse_ethernet(frame)?;
    f.verify_icrc()?;
    Ok(f)
}

/// Everything needed to build a RoCEv2 frame (or, with `eth: None`, an IP packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr {
    /// Ethernet addressing; `None` emits from the IP header on.
    pub eth: Option<EthRepr>,
    /// Network layer.
    pub ip: IpRepr,
    /// UDP layer.
    pub udp: UdpRepr,
    /// Transport packet.
    pub ib: IbRepr,
}

impl FrameRepr {
    /// Offset of the IP header.
    pub fn ip_offset(&self) -> usize {
        self.eth.map_or(0, |e| e.header_len())
    }

    /// Offset of the transport packet (the BTH).
    pub fn ib_offset(&self) -> usize {
        self.ip_offset() + self.ip.header_len() + UDP_LEN
    }

    /// Offset of the payload: where [`FrameRepr::emit_in_place`] expects it.
    pub fn payload_offset(&self) -> usize {
        self.ib_offset() + self.ib.header_len()
    }

    /// Length of the frame.
    pub fn frame_len(&self) -> usize {
        self.ib_offset() + self.ib.buffer_len()
    }

    /// Emits the frame with `payload` copied in; returns the frame length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.ib.payload_len {
            return Err(Error::OutOfRange("payload length differs from repr"));
        }
        let at = self.payload_offset();
        if buf.len() < self.frame_len() {
            return Err(Error::BufferTooSmall {
                need: self.frame_len(),
                have: buf.len(),
            });
        }
        buf[at..at + payload.len()].copy_from_slice(payload);
        self.emit_in_place(buf)
    }

    /// Emits every header, the pad and the ICRC around a payload the caller
    /// has already placed at [`FrameRepr::payload_offset`] (zero-copy send
    /// path). Returns the frame length.
    pub fn emit_in_place(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.emit_headers(buf)?;
        self.fill_icrc(&mut buf[..len])?;
        Ok(len)
    }

    /// Computes and stores the ICRC of a frame whose headers and payload are
    /// final (`buf` is exactly the frame).
    pub fn fill_icrc(&self, buf: &mut [u8]) -> Result<()> {
        let ip_at = self.ip_offset();
        let udp_at = ip_at + self.ip.header_len();
        let ib_at = udp_at + UDP_LEN;
        check_len("frame", buf, ib_at + crate::BTH_LEN + ICRC_LEN)?;
        let (head, ib) = buf.split_at_mut(ib_at);
        let n = ib.len();
        let crc = icrc::compute(&head[ip_at..udp_at], &head[udp_at..], &ib[..n - ICRC_LEN])?;
        ib[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Emits every header and the pad, but not the ICRC (left zero), around
    /// a payload already in place. Returns the frame length.
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.frame_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                need: len,
                have: buf.len(),
            });
        }
        let buf = &mut buf[..len];
        if let Some(e) = &self.eth {
            buf[0..6].copy_from_slice(&e.dst);
            buf[6..12].copy_from_slice(&e.src);
            let ip_type = match self.ip {
                IpRepr::V4(_) => EtherType::IPV4,
                IpRepr::V6(_) => EtherType::IPV6,
            };
            match e.vlan {
                Some(v) => {
                    if v.pcp > 7 || v.vid > 0x0fff {
                        return Err(Error::OutOfRange("VLAN tag"));
                    }
                    buf[12..14].copy_from_slice(&EtherType::VLAN_TAGGED_FRAME.0.to_be_bytes());
                    let tci = (u16::from(v.pcp) << 13) | (u16::from(v.dei) << 12) | v.vid;
                    buf[14..16].copy_from_slice(&tci.to_be_bytes());
                    buf[16..18].copy_from_slice(&ip_type.0.to_be_bytes());
                }
                None => buf[12..14].copy_from_slice(&ip_type.0.to_be_bytes()),
            }
        }
        let ip_at = self.ip_offset();
        let ib_at = self.ib_offset();
        self.ib.emit(&mut buf[ib_at..])?;
        emit_ip_udp(
            &self.ip,
            &self.udp,
            UDP_LEN + self.ib.buffer_len(),
            &mut buf[ip_at..ib_at],
        )?;
        Ok(len)
    }
}

/// The 40-byte GRH area of a UD receive buffer (see [`RoceFrame::ud_grh`])
/// for a packet of `ib_len` bytes (BTH through ICRC) that came from `src` to
/// `dst`, for ports that see only the UDP payload: the IP header a host
/// stack builds for it (IPv4 after 20 zero bytes, or IPv6). `None` when the
/// address families differ.
///
/// ```
/// use std::net::IpAddr;
/// let g = burst_wire::ud_grh_for("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap(), 48).unwrap();
/// assert_eq!(g[20] >> 4, 4);
/// assert_eq!(&g[32..36], &[198, 18, 0, 1]);
/// ```
pub fn ud_grh_for(
    src: std::net::IpAddr,
    dst: std::net::IpAddr,
    ib_len: usize,
) -> Option<[u8; GRH_LEN]> {
    use std::net::IpAddr;
    let ip = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::v4(s, d),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::v6(s, d),
        _ => return None,
    };
    let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
    let udp = UdpRepr::new(ROCEV2_PORT);
    emit_ip_udp(&ip, &udp, UDP_LEN + ib_len, &mut hdr).ok()?;
    let mut g = [0u8; GRH_LEN];
    match ip {
        IpRepr::V4(_) => g[20..].copy_from_slice(&hdr[..IPV4_LEN]),
        IpRepr::V6(_) => g.copy_from_slice(&hdr[..IPV6_LEN]),
    }
    Some(g)
}

/// Writes the IP and UDP headers of a RoCEv2 datagram whose UDP length
/// (header included) is `udp_len` into `out` (IP header length + 8 bytes);
/// returns the bytes written. The one place header layout lives: frames use
/// it, and so do ports that let the kernel build the real headers but need
/// them for the ICRC.
pub fn emit_ip_udp(ip: &IpRepr, udp: &UdpRepr, udp_len: usize, out: &mut [u8]) -> Result<usize> {
    let ip_len = ip.header_len();
    check_len("IP and UDP headers", out, ip_len + UDP_LEN).map_err(|_| Error::BufferTooSmall {
        need: ip_len + UDP_LEN,
        have: out.len(),
    })?;
    ip.emit(out, udp_len)?;
    let u = &mut out[ip_len..ip_len + UDP_LEN];
    u[0..2].copy_from_slice(&udp.src_port.to_be_bytes());
    u[2..4].copy_from_slice(&udp.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(
        &u16::try_from(udp_len)
            .map_err(|_| Error::OutOfRange("UDP length"))?
            .to_be_bytes(),
    );
    u[6..8].copy_from_slice(&udp.checksum.to_be_bytes());
    Ok(ip_len + UDP_LEN)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The receive-side check agrees with etherparse's checksum: a
        /// header carrying the checksum etherparse computes sums to 0, and
        /// one with any other value does not.
        #[test]
        fn ipv4_checksum_agrees_with_etherparse(
            src in any::<[u8; 4]>(),
            dst in any::<[u8; 4]>(),
            ttl in any::<u8>(),
            id in any::<u16>(),
            len in 0u16..9000,
            wrong in 1u16..,
        ) {
            let mut h = etherparse::Ipv4Header::new(len, ttl, etherparse::IpNumber::UDP, src, dst)
                .unwrap();
            h.identification = id;
            h.header_checksum = h.calc_header_checksum();
            let mut b = h.to_bytes().to_vec();
            prop_assert_eq!(super::ipv4_checksum(&b), 0);
            let c = h.header_checksum.wrapping_add(wrong);
            // 0x0000 and 0xffff are the same number in one's complement.
            prop_assume!(!matches!((h.header_checksum, c), (0, 0xffff) | (0xffff, 0)));
            b[10..12].copy_from_slice(&c.to_be_bytes());
            prop_assert_ne!(super::ipv4_checksum(&b), 0);
        }
    }
}
