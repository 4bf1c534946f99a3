//! The whole-frame port on crafted frames: what it sends (Ethernet, IP ID
//! sequence, ECT(0), an ICRC over the real headers), what it refuses and
//! counts, and its ARP.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use burst_io::raw::{MemLink, RawPort, Resolution, HELD_PER_PEER};
use burst_io::{PacketBuf, Port, PortCounters, RxBatch};
use burst_wire::{
    BthRepr, EthRepr, FrameRepr, IbRepr, IpRepr, Opcode, Psn, Qpn, RoceFrame, UdpRepr,
};

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

fn port_a() -> (RawPort<MemLink>, MemLink) {
    let (la, lb) = MemLink::pair(MAC_A, MAC_B);
    (RawPort::new(la, A.into(), Resolution::Own), lb)
}

/// A transport packet to QP 0x11 with `n` payload bytes, sealed for `id`.
fn packet(from: SocketAddr, to: SocketAddr, n: usize, id: u16) -> PacketBuf {
    let mut ib = IbRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11).unwrap(),
        Psn::new(1),
    ));
    ib.payload_len = n;
    let mut p = PacketBuf::new();
    p.len = ib.buffer_len();
    ib.emit(&mut p.data[..p.len]).unwrap();
    p.peer = to;
    p.ip_id = id;
    burst_io::seal(from, to, &mut p.data[..p.len], id).unwrap();
    p
}

/// A frame from B to A as a peer would send it.
fn frame_to_a(n: usize) -> Vec<u8> {
    let mut ib = IbRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11).unwrap(),
        Psn::new(1),
    ));
    ib.payload_len = n;
    let mut ip = IpRepr::v4(B, A);
    if let IpRepr::V4(v) = &mut ip {
        v.ident = 0x1234;
        v.ecn = 3; // CE
    }
    let f = FrameRepr {
        eth: Some(EthRepr {
            src: MAC_B,
            dst: MAC_A,
            vlan: None,
        }),
        ip,
        udp: UdpRepr::new(0xc001),
        ib,
    };
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf, &vec![5u8; n]).unwrap();
    buf
}

fn sa(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::new(ip.into(), 4791)
}

#[test]
fn sent_frames_carry_an_id_sequence_ect0_and_a_valid_icrc() {
    let (mut a, b) = port_a();
    a.set_neighbour(B.into(), MAC_B);
    let mut bufs: Vec<PacketBuf> = (0..3).map(|_| packet(sa(A), sa(B), 100, 0)).collect();
    a.assign_ip_ids(&mut bufs);
    assert_eq!(burst_io::seal_all(sa(A), &mut bufs), 3);
    assert_eq!(a.send_burst(&bufs).unwrap(), 3);
    let sent = b.take_received();
    assert_eq!(sent.len(), 3);
    let mut ids = Vec::new();
    for f in &sent {
        let r = burst_wire::parse_verified(f).expect("a valid RoCEv2 frame, ICRC included");
        assert_eq!(r.eth.unwrap().dst, MAC_B);
        assert_eq!(r.eth.unwrap().src, MAC_A);
        let IpRepr::V4(v) = r.ip else { panic!() };
        assert_eq!((v.src, v.dst, v.ecn, v.dont_frag), (A, B, 0b10, true));
        assert_eq!((r.udp.src_port, r.udp.dst_port), (4791, 4791));
        ids.push(v.ident);
    }
    assert_eq!(ids[1], ids[0].wrapping_add(1));
    assert_eq!(ids[2], ids[0].wrapping_add(2));
    assert_eq!(a.counters().tx_frames, 3);
}

/// Whether the ICRC of `bytes` (BTH to ICRC) checks with the headers' CRC
/// the port handed on.
fn icrc_ok(meta: &burst_io::RxMeta, bytes: &[u8]) -> bool {
    let pseudo = meta
        .pseudo_crc
        .expect("a whole-frame port hands on the headers' CRC");
    let at = bytes.len() - 4;
    burst_wire::icrc::Checker::new().check_after(pseudo, bytes, at, |c| c)
        == burst_wire::icrc::Check::Ok
}

#[test]
fn received_roce_gives_its_id_ecn_and_the_crc_of_its_headers() {
    let (mut a, b) = port_a();
    b.inject(&frame_to_a(64));
    let mut rx = RxBatch::default();
    assert_eq!(a.recv_batch(&mut rx).unwrap(), 1);
    let (meta, bytes) = rx.frames().next().unwrap();
    assert_eq!(meta.peer, SocketAddr::new(B.into(), 0xc001));
    assert_eq!(
        (meta.ip_id, meta.ecn, meta.icrc_verified),
        (Some(0x1234), 3, false)
    );
    assert!(
        icrc_ok(&meta, bytes),
        "the ICRC checks with the headers as received"
    );
    assert_eq!(bytes.len(), 12 + 64 + 4);
    // It also taught A the sender's MAC.
    assert_eq!(a.neighbour(B.into()), Some(MAC_B));
}

#[test]
fn frames_burst_cannot_use_are_counted_and_dropped_and_the_icrc_is_left_to_the_receiver() {
    let (mut a, b) = port_a();
    let good = frame_to_a(64);
    // Bad ICRC: one payload bit flipped.
    let mut bad = good.clone();
    bad[60] ^= 1;
    b.inject(&bad);
    // Truncated inside the BTH (lengths disagree with the IP header).
    b.inject(&good[..14 + 20 + 8 + 6]);
    // Truncated Ethernet header.
    b.inject(&good[..10]);
    // Other UDP (DNS) to A.
    let mut dns = good.clone();
    dns[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&53u16.to_be_bytes());
    b.inject(&dns);
    // RoCE for another IP address (checksum fixed up by re-emitting).
    let mut other = good.clone();
    other[14 + 16..14 + 20].copy_from_slice(&[198, 18, 0, 9]);
    b.inject(&other);
    // RoCE for another MAC.
    let mut mac = good.clone();
    mac[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    b.inject(&mac);
    // IP protocol TCP: not RoCE.
    let mut tcp = good.clone();
    tcp[14 + 9] = 6;
    b.inject(&tcp);
    b.inject(&good);
    let mut rx = RxBatch::default();
    assert_eq!(
        a.recv_batch(&mut rx).unwrap(),
        2,
        "the bad ICRC and the good frame are delivered"
    );
    // The ICRC is the receiver's to check, with the headers' CRC.
    let ok: Vec<bool> = rx.frames().map(|(m, b)| icrc_ok(&m, b)).collect();
    assert_eq!(ok, [false, true]);
    let c = a.counters();
    assert_eq!(
        c,
        PortCounters {
            rx_frames: 8,
            // cut BTH, cut Ethernet, changed address (its IP checksum is
            // now wrong)
            rx_malformed: 3,
            // DNS, TCP (the protocol is read before the checksum)
            rx_not_roce: 2,
            rx_not_ours: 1,
            resolved: 1,
            ..PortCounters::default()
        },
        "{c:?}"
    );
}

#[test]
fn arp_is_answered_for_our_address_only_and_peers_resolve() {
    let (mut a, b) = port_a();
    let req = |target: [u8; 4]| {
        let mut f = vec![0xffu8; 6];
        f.extend_from_slice(&MAC_B);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&MAC_B);
        f.extend_from_slice(&B.octets());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f
    };
    b.inject(&req([198, 18, 0, 7]));
    b.inject(&req(A.octets()));
    let mut rx = RxBatch::default();
    assert_eq!(a.recv_batch(&mut rx).unwrap(), 0);
    let replies = b.take_received();
    assert_eq!(replies.len(), 1, "one reply, for our own address");
    let r = &replies[0];
    assert_eq!(&r[0..6], &MAC_B);
    assert_eq!(&r[20..22], &[0, 2], "an ARP reply");
    assert_eq!(&r[22..28], &MAC_A);
    assert_eq!(&r[28..32], &A.octets());
    assert_eq!(a.neighbour(B.into()), Some(MAC_B), "the asker is learned");
    assert_eq!(
        (a.counters().arp_received, a.counters().arp_replies),
        (2, 1)
    );
}

#[test]
fn packets_to_an_unresolved_peer_are_held_up_to_a_limit_then_sent_on_resolution() {
    let (mut a, b) = port_a();
    let n = HELD_PER_PEER + 10;
    let mut bufs: Vec<PacketBuf> = (0..n).map(|_| packet(sa(A), sa(B), 8, 0)).collect();
    a.assign_ip_ids(&mut bufs);
    burst_io::seal_all(sa(A), &mut bufs);
    assert_eq!(
        a.send_burst(&bufs).unwrap(),
        n,
        "held packets count as taken"
    );
    let c = a.counters();
    assert_eq!(
        (c.tx_held, c.tx_unresolved, c.arp_requests),
        (HELD_PER_PEER as u64, 10, 1)
    );
    let sent = b.take_received();
    assert_eq!(sent.len(), 1, "only the ARP request left");
    assert_eq!(&sent[0][0..6], &[0xff; 6]);
    // The peer answers: the held packets go out in order.
    let mut reply = MAC_A.to_vec();
    reply.extend_from_slice(&MAC_B);
    reply.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
    reply.extend_from_slice(&MAC_B);
    reply.extend_from_slice(&B.octets());
    reply.extend_from_slice(&MAC_A);
    reply.extend_from_slice(&A.octets());
    b.inject(&reply);
    let mut rx = RxBatch::default();
    a.recv_batch(&mut rx).unwrap();
    let sent = b.take_received();
    assert_eq!(sent.len(), HELD_PER_PEER);
    let ids: Vec<u16> = sent
        .iter()
        .map(|f| match RoceFrame::parse_ethernet(f).unwrap().ip {
            IpRepr::V4(v) => v.ident,
            IpRepr::V6(_) => unreachable!(),
        })
        .collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0].wrapping_add(1)),
        "in order"
    );
    assert!(sent.iter().all(|f| burst_wire::parse_verified(f).is_ok()));
}

#[test]
fn a_full_link_takes_part_of_a_burst_and_the_caller_keeps_the_rest() {
    let (la, lb) = MemLink::pair(MAC_A, MAC_B);
    let mut la = la;
    la.room = 2;
    let mut a = RawPort::new(la, IpAddr::V4(A), Resolution::Own);
    a.set_neighbour(B.into(), MAC_B);
    let bufs: Vec<PacketBuf> = (0..5).map(|_| packet(sa(A), sa(B), 8, 0)).collect();
    assert_eq!(a.send_burst(&bufs).unwrap(), 2);
    assert_eq!(lb.take_received().len(), 2);
}

#[test]
fn ipv6_peers_resolve_by_neighbour_discovery_and_bad_solicitations_are_ignored() {
    let (la, lb) = MemLink::pair(MAC_A, MAC_B);
    let (a6, b6): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    let mut a = RawPort::new(la, a6, Resolution::Own);
    let mut b = RawPort::new(lb, b6, Resolution::Own);
    let mut p = packet(a.local_addr(), b.local_addr(), 40, 0);
    a.assign_ip_ids(std::slice::from_mut(&mut p));
    assert_eq!(a.send_burst(std::slice::from_ref(&p)).unwrap(), 1);
    let mut rx = RxBatch::default();
    // B sees the solicitation (to its solicited-node group) and answers.
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 0);
    assert_eq!(
        (b.counters().arp_received, b.counters().arp_replies),
        (1, 1)
    );
    assert_eq!(b.neighbour(a6), Some(MAC_A), "the solicitor is learned");
    // A learns B from the advertisement and sends the held packet.
    a.recv_batch(&mut rx).unwrap();
    assert_eq!(a.neighbour(b6), Some(MAC_B));
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 1);
    let (meta, bytes) = rx.frames().next().unwrap();
    assert!(icrc_ok(&meta, bytes), "over the IPv6 headers as received");
    assert_eq!((meta.peer, bytes), (a.local_addr(), p.bytes()));

    // A solicitation with a corrupted checksum is not answered.
    let (lc, ld) = MemLink::pair(MAC_A, MAC_B);
    let mut c = RawPort::new(lc, a6, Resolution::Own);
    let mut d = RawPort::new(ld, b6, Resolution::Own);
    c.send_burst(std::slice::from_ref(&p)).unwrap();
    let sent = d.link().take_received();
    assert_eq!(sent.len(), 1, "one solicitation");
    let mut bad = sent[0].clone();
    let n = bad.len();
    bad[n - 1] ^= 0xff; // inside the link-layer address option
    c.link().inject(&bad);
    assert_eq!(d.recv_batch(&mut rx).unwrap(), 0);
    assert_eq!(d.counters().arp_replies, 0);
    assert_eq!(d.neighbour(a6), None);
}

#[test]
fn a_lane_hands_frames_for_another_lanes_qp_over_and_shares_arp() {
    use burst_io::raw::Lanes;
    // Two lanes of one device (each with its own queue: a link here), a
    // peer on lane 0's queue only.
    let (l0, peer0) = MemLink::pair(MAC_A, MAC_B);
    let (l1, _peer1) = MemLink::pair(MAC_A, MAC_B);
    let mut group = Lanes::group(2, 0x11);
    let mut lane1 = RawPort::new(l1, A.into(), Resolution::Own);
    lane1.set_lanes(group.pop().unwrap());
    let mut lane0 = RawPort::new(l0, A.into(), Resolution::Own);
    lane0.set_lanes(group.pop().unwrap());
    // Frames for QPN 0x11 (lane 0) and 0x12 (lane 1) both arrive on lane 0.
    let mut f11 = frame_to_a(64);
    let mut f12 = frame_to_a(64);
    for (f, q) in [(&mut f11, 0x11u8), (&mut f12, 0x12)] {
        // Re-emit with the QPN changed (the ICRC covers it).
        let mut r = RoceFrame::parse_ethernet(f).unwrap().repr().unwrap();
        r.ib.bth.dest_qp = Qpn::new(u32::from(q)).unwrap();
        r.emit(f, &[5u8; 64]).unwrap();
    }
    peer0.inject(&f11);
    peer0.inject(&f12);
    let mut rx = RxBatch::default();
    assert_eq!(lane0.recv_batch(&mut rx).unwrap(), 1, "its own frame");
    assert_eq!(rx.frames().next().unwrap().1[7], 0x11);
    assert_eq!(lane0.counters().rx_handed_off, 1);
    assert_eq!(lane1.recv_batch(&mut rx).unwrap(), 1, "the handed frame");
    assert_eq!(rx.frames().next().unwrap().1[7], 0x12);
    let (meta, bytes) = rx.frames().next().unwrap();
    assert!(icrc_ok(&meta, bytes));
    // An ARP request on lane 0: lane 0 answers, lane 1 only learns.
    let mut req = vec![0xffu8; 6];
    req.extend_from_slice(&MAC_B);
    req.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    req.extend_from_slice(&MAC_B);
    req.extend_from_slice(&[198, 18, 0, 7]);
    req.extend_from_slice(&[0; 6]);
    req.extend_from_slice(&A.octets());
    peer0.inject(&req);
    lane0.recv_batch(&mut rx).unwrap();
    lane1.recv_batch(&mut rx).unwrap();
    assert_eq!(
        (lane0.counters().arp_replies, lane1.counters().arp_replies),
        (1, 0)
    );
    let asker: IpAddr = Ipv4Addr::new(198, 18, 0, 7).into();
    assert_eq!(
        (lane0.neighbour(asker), lane1.neighbour(asker)),
        (Some(MAC_B), Some(MAC_B))
    );
}

/// An ICMP echo request from B to `to`, as `ping` sends it.
fn ping(to: Ipv4Addr, seq: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_B, MAC_A)
        .ipv4(B.octets(), to.octets(), 64)
        .icmpv4_echo_request(0x77, seq)
        .write(&mut f, &[0xab; 56])
        .unwrap();
    f
}

#[test]
fn a_port_that_owns_its_link_answers_ping_and_a_flood_of_them_is_bounded() {
    let (mut a, b) = port_a();
    b.inject(&ping(A, 1));
    b.inject(&ping(Ipv4Addr::new(198, 18, 0, 9), 2)); // not ours
    let mut rx = RxBatch::default();
    assert_eq!(a.recv_batch(&mut rx).unwrap(), 0, "no RoCE packet");
    let replies = b.take_received();
    assert_eq!(replies.len(), 1, "one reply, to the ping for our address");
    let p = etherparse::SlicedPacket::from_ethernet(&replies[0]).unwrap();
    let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else {
        panic!("not IPv4")
    };
    assert_eq!(
        (ip.header().source_addr(), ip.header().destination_addr()),
        (A, B)
    );
    let Some(etherparse::TransportSlice::Icmpv4(icmp)) = &p.transport else {
        panic!("not ICMP")
    };
    assert!(matches!(
        icmp.icmp_type(),
        etherparse::Icmpv4Type::EchoReply(h) if (h.id, h.seq) == (0x77, 1)
    ));
    assert_eq!(icmp.payload(), &[0xab; 56][..]);
    assert_eq!(a.counters().echo_replies, 1);

    // A link that takes nothing: replies queue up to a bound, the rest are
    // dropped and counted.
    let (mut la, lb) = MemLink::pair(MAC_A, MAC_B);
    la.room = 0;
    let mut a = RawPort::new(la, A.into(), Resolution::Own);
    for round in 0..3u16 {
        for i in 0..200 {
            lb.inject(&ping(A, round * 200 + i));
        }
        let mut rx = RxBatch::default();
        for _ in 0..200 {
            assert_eq!(a.recv_batch(&mut rx).unwrap(), 0);
        }
    }
    let c = a.counters();
    assert_eq!(c.echo_replies + c.control_dropped, 600, "{c:?}");
    assert_eq!(c.echo_replies, 256, "{c:?}");
    assert!(lb.take_received().is_empty());
}

#[test]
fn packets_built_in_lent_frames_leave_in_them_and_unsent_frames_go_back() {
    let (mut la, b) = MemLink::pair(MAC_A, MAC_B);
    la.lends = true;
    la.room = 2;
    let mut a = RawPort::new(la, A.into(), Resolution::Own);
    a.set_neighbour(B.into(), MAC_B);
    let mut bufs: Vec<PacketBuf> = (0..3).map(|_| PacketBuf::new()).collect();
    a.lend_frames(&mut bufs);
    assert!(bufs.iter().all(|p| p.data.lent().is_some()));
    assert_eq!(a.link().lent, 3);
    // Built in place, as the data plane does.
    for (i, p) in bufs.iter_mut().enumerate() {
        let q = packet(sa(A), sa(B), 100 + i, 0);
        p.data[..q.len].copy_from_slice(q.bytes());
        (p.len, p.peer) = (q.len, q.peer);
    }
    let lent_at: Vec<*const u8> = bufs.iter().map(|p| p.data.as_ptr()).collect();
    a.assign_ip_ids(&mut bufs);
    assert_eq!(burst_io::seal_all(sa(A), &mut bufs), 3);
    // The link takes two: they leave in their frames; the third keeps its.
    assert_eq!(a.send_frames(&mut bufs).unwrap(), 2);
    assert!(bufs[..2].iter().all(|p| p.data.lent().is_none()));
    assert_eq!(bufs[2].data.as_ptr(), lent_at[2]);
    assert_eq!(a.link().lent, 1);
    let sent = b.take_received();
    assert_eq!(sent.len(), 2);
    for (i, f) in sent.iter().enumerate() {
        let r = burst_wire::parse_verified(f).expect("a valid RoCEv2 frame, ICRC included");
        assert_eq!((r.eth.unwrap().src, r.eth.unwrap().dst), (MAC_A, MAC_B));
        assert_eq!(r.ib.payload().len(), 100 + i);
    }
    assert_eq!(a.counters().tx_frames, 2);
    // Lending again fills only the buffers without a frame.
    a.lend_frames(&mut bufs);
    assert_eq!(a.link().lent, 3);
    assert_eq!(bufs[2].data.as_ptr(), lent_at[2]);
    // A buffer holding another port's frame, or none, is copied instead.
    let mut own = vec![packet(sa(A), sa(B), 10, 0)];
    a.assign_ip_ids(&mut own);
    burst_io::seal_all(sa(A), &mut own);
    assert_eq!(a.send_frames(&mut own).unwrap(), 1);
    assert_eq!(b.take_received().len(), 1);
    a.reclaim_frames(&mut bufs);
    assert!(bufs.iter().all(|p| p.data.lent().is_none()));
    assert_eq!(a.link().lent, 0, "every frame went back");
}

/// A packet to the port's own address (two QPs of one device) comes back
/// through its own receive, as RXE and RNICs loop it, with its ICRC
/// checked over the headers it would have had on the wire; the link never
/// carries it (the peer would drop a frame to an address not its own).
#[test]
fn a_packet_to_its_own_address_loops_back() {
    let (mut a, b) = port_a();
    let mut bufs = vec![packet(sa(A), sa(A), 100, 0)];
    a.assign_ip_ids(&mut bufs);
    assert_eq!(burst_io::seal_all(sa(A), &mut bufs), 1);
    assert_eq!(a.send_burst(&bufs).unwrap(), 1);
    assert!(b.take_received().is_empty(), "nothing on the link");
    let mut rx = RxBatch::default();
    assert_eq!(a.recv_batch(&mut rx).unwrap(), 1);
    let (meta, bytes) = rx.frames().next().unwrap();
    assert_eq!(meta.peer, sa(A));
    assert!(icrc_ok(&meta, bytes));
    assert_eq!(bytes, bufs[0].bytes());
    let c = a.counters();
    assert_eq!((c.looped_back, c.looped_dropped), (1, 0));
    // Our own address never becomes a neighbour to resolve.
    assert_eq!(a.neighbour(A.into()), None);
    assert_eq!(a.recv_batch(&mut rx).unwrap(), 0, "taken once");
}
