//! The link's own control frames, for ports that own their link (DPDK):
//! ARP (RFC 826), IPv6 neighbour discovery (RFC 4861) and the ICMP echo a
//! peer's `ping` expects (RFC 792, RFC 4443), built and parsed with
//! etherparse. RoCE data frames never come here: their headers are written
//! and read in place by burst-wire (fixed offsets, a zero UDP checksum, the
//! ICRC's masks), once per packet on the hot path.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::icmpv6::{
    NdpOptionSlice, NeighborAdvertisementHeader, NeighborAdvertisementPayloadSlice,
    NeighborSolicitationPayloadSlice,
};
use etherparse::{
    ArpHardwareId, ArpOperation, ArpPacket, EtherType, Icmpv4Type, Icmpv6Type, LinkSlice, NetSlice,
    PacketBuilder, SlicedPacket, TransportSlice,
};

/// The hop limit (and TTL) of the echo replies sent.
const HOP_LIMIT: u8 = 64;
/// NDP's hop limit: messages with any other are not from the link (RFC
/// 4861 7.1.1).
const NDP_HOP_LIMIT: u8 = 255;
/// NDP option types: source and target link-layer address.
const SOURCE_LLA: u8 = 1;
const TARGET_LLA: u8 = 2;

/// A neighbour message (ARP or NDP) received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Neigh {
    /// The address whose MAC the message tells.
    pub who: IpAddr,
    /// That MAC.
    pub mac: [u8; 6],
    /// For a request/solicitation: the address asked about.
    pub asked: Option<IpAddr>,
}

/// A control frame received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    /// ARP or IPv6 neighbour discovery.
    Neigh(Neigh),
    /// An echo request to `local`: the reply frame to send.
    Echo(Vec<u8>),
}

/// What `frame` is, when it is a control frame this port handles: an ARP
/// message, a valid NS or NA, or (when `echo`: the port answers them) an
/// echo request to `local` (the reply is built here, from `mac`). `None`
/// for everything else.
pub(crate) fn parse(frame: &[u8], local: IpAddr, mac: [u8; 6], echo: bool) -> Option<Control> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let Some(LinkSlice::Ethernet2(eth)) = &p.link else {
        return None;
    };
    let peer_mac = eth.source();
    match (&p.net, &p.transport) {
        (Some(NetSlice::Arp(a)), _) => {
            let a = a.to_packet().try_eth_ipv4().ok()?;
            Some(Control::Neigh(Neigh {
                who: a.sender_ipv4_addr().into(),
                mac: a.sender_mac,
                asked: (a.operation == ArpOperation::REQUEST)
                    .then(|| IpAddr::from(a.target_ipv4_addr())),
            }))
        }
        (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(icmp))) if echo => {
            let h = ip.header();
            if IpAddr::V4(h.destination_addr()) != local || h.is_fragmenting_payload() {
                return None;
            }
            let Icmpv4Type::EchoRequest(echo) = icmp.icmp_type() else {
                return None;
            };
            if icmp.icmp_type().calc_checksum(icmp.payload()) != icmp.checksum() {
                return None;
            }
            let mut f = Vec::new();
            PacketBuilder::ethernet2(mac, peer_mac)
                .ipv4(h.destination(), h.source(), HOP_LIMIT)
                .icmpv4_echo_reply(echo.id, echo.seq)
                .write(&mut f, icmp.payload())
                .ok()?;
            Some(Control::Echo(f))
        }
        (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(icmp))) => {
            let h = ip.header();
            let (src, dst) = (h.source_addr(), h.destination_addr());
            if !icmp.is_checksum_valid(src.octets(), dst.octets()) {
                return None;
            }
            match icmp.icmp_type() {
                Icmpv6Type::EchoRequest(req) if echo && IpAddr::V6(dst) == local => {
                    let mut f = Vec::new();
                    PacketBuilder::ethernet2(mac, peer_mac)
                        .ipv6(dst.octets(), src.octets(), HOP_LIMIT)
                        .icmpv6_echo_reply(req.id, req.seq)
                        .write(&mut f, icmp.payload())
                        .ok()?;
                    Some(Control::Echo(f))
                }
                t @ (Icmpv6Type::NeighborSolicitation | Icmpv6Type::NeighborAdvertisement(_)) => {
                    if h.hop_limit() != NDP_HOP_LIMIT || icmp.code_u8() != 0 {
                        return None;
                    }
                    parse_ndp(&t, src, icmp.payload(), peer_mac).map(Control::Neigh)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// A valid NS or NA (RFC 4861 7.1.1/7.1.2; hop limit, code and checksum
/// checked by the caller) from `src`: its target must not be multicast; the
/// MAC is its link-layer address option (source in an NS, target in an
/// NA), else the Ethernet source `eth_src`.
fn parse_ndp(t: &Icmpv6Type, src: Ipv6Addr, payload: &[u8], eth_src: [u8; 6]) -> Option<Neigh> {
    let (target, options, want) = match t {
        Icmpv6Type::NeighborSolicitation => {
            let s = NeighborSolicitationPayloadSlice::from_slice(payload).ok()?;
            (s.target_address(), s.options_iterator(), SOURCE_LLA)
        }
        _ => {
            let s = NeighborAdvertisementPayloadSlice::from_slice(payload).ok()?;
            (s.target_address(), s.options_iterator(), TARGET_LLA)
        }
    };
    if target.is_multicast() {
        return None;
    }
    let mut mac = eth_src;
    for o in options {
        let lla = match o {
            Ok(NdpOptionSlice::SourceLinkLayerAddress(o)) if want == SOURCE_LLA => {
                o.link_layer_address()
            }
            Ok(NdpOptionSlice::TargetLinkLayerAddress(o)) if want == TARGET_LLA => {
                o.link_layer_address()
            }
            Ok(_) => continue,
            // A malformed option ends the list (what came before stands).
            Err(_) => break,
        };
        if let Ok(m) = <[u8; 6]>::try_from(lla) {
            mac = m;
        }
    }
    Some(if want == SOURCE_LLA {
        if src.is_unspecified() {
            return None; // duplicate address detection: not ours to answer
        }
        Neigh {
            who: src.into(),
            mac,
            asked: Some(target.into()),
        }
    } else {
        Neigh {
            who: target.into(),
            mac,
            asked: None,
        }
    })
}

/// An ARP frame: a request (`reply` false) or a reply.
pub(crate) fn arp(
    reply: bool,
    smac: [u8; 6],
    sip: Ipv4Addr,
    dmac: [u8; 6],
    tmac: [u8; 6],
    tip: Ipv4Addr,
) -> Vec<u8> {
    let op = if reply {
        ArpOperation::REPLY
    } else {
        ArpOperation::REQUEST
    };
    let a = ArpPacket::new(
        ArpHardwareId::ETHERNET,
        EtherType::IPV4,
        op,
        &smac,
        &sip.octets(),
        &tmac,
        &tip.octets(),
    )
    .expect("6-byte MACs and 4-byte addresses");
    let mut f = Vec::new();
    PacketBuilder::ethernet2(smac, dmac)
        .arp(a)
        .write(&mut f)
        .expect("a Vec takes every write");
    f
}

/// An NDP frame: a neighbour solicitation for `target` (`advert` false,
/// with our MAC as source link-layer option) or an advertisement of
/// `target` (solicited + override, our MAC as target link-layer option).
pub(crate) fn ndp(
    advert: bool,
    smac: [u8; 6],
    src: Ipv6Addr,
    dmac: [u8; 6],
    dst: Ipv6Addr,
    target: Ipv6Addr,
) -> Vec<u8> {
    let (t, option) = if advert {
        let h = NeighborAdvertisementHeader {
            router: false,
            solicited: true,
            r#override: true,
        };
        (Icmpv6Type::NeighborAdvertisement(h), TARGET_LLA)
    } else {
        (Icmpv6Type::NeighborSolicitation, SOURCE_LLA)
    };
    let mut payload = [0u8; 24];
    payload[..16].copy_from_slice(&target.octets());
    payload[16] = option;
    payload[17] = 1; // in units of 8 bytes
    payload[18..].copy_from_slice(&smac);
    let mut f = Vec::new();
    PacketBuilder::ethernet2(smac, dmac)
        .ipv6(src.octets(), dst.octets(), NDP_HOP_LIMIT)
        .icmpv6(t)
        .write(&mut f, &payload)
        .expect("a Vec takes every write");
    f
}

/// A solicitation for `target` to its solicited-node multicast address
/// (RFC 4291 2.7.1) and that group's MAC (RFC 2464 7).
pub(crate) fn ndp_solicit(smac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let dmac = [0x33, 0x33, 0xff, t[13], t[14], t[15]];
    ndp(false, smac, src, dmac, group, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    /// [`parse`] for a port that answers echo requests.
    fn parse_own(frame: &[u8], local: IpAddr, mac: [u8; 6]) -> Option<Control> {
        parse(frame, local, mac, true)
    }

    fn v6(last: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)
    }

    #[test]
    fn arp_requests_and_replies_parse_back() {
        let (a, b) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let req = arp(false, A, a, [0xff; 6], [0; 6], b);
        assert_eq!(req.len(), 14 + 28);
        let want = Neigh {
            who: a.into(),
            mac: A,
            asked: Some(b.into()),
        };
        assert_eq!(parse_own(&req, b.into(), B), Some(Control::Neigh(want)));
        let rep = arp(true, B, b, A, A, a);
        let want = Neigh {
            who: b.into(),
            mac: B,
            asked: None,
        };
        assert_eq!(parse_own(&rep, a.into(), A), Some(Control::Neigh(want)));
    }

    #[test]
    fn ndp_solicitations_and_adverts_parse_back_and_bad_ones_do_not() {
        let ns = ndp_solicit(A, v6(1), v6(2));
        let want = Neigh {
            who: v6(1).into(),
            mac: A,
            asked: Some(v6(2).into()),
        };
        assert_eq!(parse_own(&ns, v6(2).into(), B), Some(Control::Neigh(want)));
        let na = ndp(true, B, v6(2), A, v6(1), v6(2));
        let want = Neigh {
            who: v6(2).into(),
            mac: B,
            asked: None,
        };
        assert_eq!(parse_own(&na, v6(1).into(), A), Some(Control::Neigh(want)));
        // A flipped bit fails the checksum; a hop limit below 255 is
        // from off the link.
        let mut bad = na.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(parse_own(&bad, v6(1).into(), A), None);
        let mut routed = na;
        routed[14 + 7] = 254;
        assert_eq!(parse_own(&routed, v6(1).into(), A), None);
    }

    #[test]
    fn an_echo_request_to_us_is_answered_with_its_id_sequence_and_data() {
        let (a, b) = ([198, 18, 0, 1], [198, 18, 0, 2]);
        let mut req = Vec::new();
        PacketBuilder::ethernet2(A, B)
            .ipv4(a, b, 64)
            .icmpv4_echo_request(7, 9)
            .write(&mut req, b"ping data")
            .unwrap();
        let Some(Control::Echo(reply)) = parse_own(&req, Ipv4Addr::from(b).into(), B) else {
            panic!("no reply");
        };
        let p = SlicedPacket::from_ethernet(&reply).unwrap();
        let Some(LinkSlice::Ethernet2(e)) = &p.link else {
            panic!()
        };
        assert_eq!((e.source(), e.destination()), (B, A));
        let Some(NetSlice::Ipv4(ip)) = &p.net else {
            panic!()
        };
        assert_eq!((ip.header().source(), ip.header().destination()), (b, a));
        let Some(TransportSlice::Icmpv4(icmp)) = &p.transport else {
            panic!()
        };
        let Icmpv4Type::EchoReply(h) = icmp.icmp_type() else {
            panic!("{:?}", icmp.icmp_type())
        };
        assert_eq!((h.id, h.seq, icmp.payload()), (7, 9, &b"ping data"[..]));
        assert_eq!(
            icmp.icmp_type().calc_checksum(icmp.payload()),
            icmp.checksum()
        );
        // A port that does not answer echo requests builds no reply.
        assert_eq!(parse(&req, Ipv4Addr::from(b).into(), B, false), None);
        // Not to us, or a bad checksum: no reply.
        assert_eq!(parse_own(&req, Ipv4Addr::from(a).into(), B), None);
        let mut bad = req.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(parse_own(&bad, Ipv4Addr::from(b).into(), B), None);
        // IPv6 too.
        let mut req6 = Vec::new();
        PacketBuilder::ethernet2(A, B)
            .ipv6(v6(1).octets(), v6(2).octets(), 64)
            .icmpv6_echo_request(3, 4)
            .write(&mut req6, b"x")
            .unwrap();
        let Some(Control::Echo(r6)) = parse_own(&req6, v6(2).into(), B) else {
            panic!("no IPv6 reply");
        };
        let p = SlicedPacket::from_ethernet(&r6).unwrap();
        let Some(TransportSlice::Icmpv6(icmp)) = &p.transport else {
            panic!()
        };
        assert!(icmp.is_checksum_valid(v6(2).octets(), v6(1).octets()));
        assert!(matches!(icmp.icmp_type(), Icmpv6Type::EchoReply(h) if (h.id, h.seq) == (3, 4)));
    }

    #[test]
    fn no_input_panics() {
        // Every prefix of valid control frames, and each with every byte
        // flipped: parsed or refused, never a panic.
        let mut ping = Vec::new();
        PacketBuilder::ethernet2(A, B)
            .ipv6(v6(1).octets(), v6(2).octets(), 64)
            .icmpv6_echo_request(1, 1)
            .write(&mut ping, b"data")
            .unwrap();
        let frames = [
            arp(
                false,
                A,
                Ipv4Addr::new(1, 2, 3, 4),
                [0xff; 6],
                [0; 6],
                Ipv4Addr::new(5, 6, 7, 8),
            ),
            ndp_solicit(A, v6(1), v6(2)),
            ndp(true, B, v6(2), A, v6(1), v6(2)),
            ping,
        ];
        for f in frames {
            for n in 0..=f.len() {
                let _ = parse_own(&f[..n], v6(2).into(), B);
            }
            for i in 0..f.len() {
                let mut g = f.clone();
                g[i] ^= 0xff;
                let _ = parse_own(&g, v6(2).into(), B);
            }
        }
    }
}
