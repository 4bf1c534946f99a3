//! The UDP port over loopback (127.0.0.0/8 addresses, so each test can own
//! port 4791 on its own address).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use burst_io::*;
use burst_wire::{BthRepr, IbRepr, Opcode, Psn, Qpn};

/// The ICRC check a receiver behind a UDP socket makes (the socket hides
/// the IP ID, so it is solved for): burst-wire's checker, fed the port's
/// address.
fn check(
    c: &mut burst_wire::icrc::Checker,
    port: &UdpPort,
    src: SocketAddr,
    ib: &[u8],
) -> IcrcCheck {
    c.check(src, port.local_addr(), ib, None)
}

fn packet(len: usize, psn: u32) -> Vec<u8> {
    let mut ib = IbRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11).unwrap(),
        Psn::new(psn),
    ));
    ib.payload_len = len;
    let mut b = vec![0u8; ib.buffer_len()];
    ib.emit(&mut b).unwrap();
    b
}

/// Receives until `want` packets arrived (or 5 s passed): (peer, bytes) and
/// the number of datagrams they came in.
fn receive(port: &mut UdpPort, want: usize) -> (Vec<(SocketAddr, Vec<u8>)>, usize) {
    let mut rx = RxBatch::default();
    let (mut got, mut datagrams) = (Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < want && Instant::now() < deadline {
        let n = port.recv_batch(&mut rx).unwrap();
        assert_eq!(rx.packets().count(), n);
        datagrams += rx.datagrams();
        got.extend(rx.packets().map(|(a, p)| (a, p.to_vec())));
    }
    (got, datagrams)
}

#[test]
fn burst_send_receive_with_icrc_sealed_for_ip_id_0() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 2));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    let mut ck = burst_wire::icrc::Checker::new();
    assert_eq!(a.local_addr(), SocketAddr::new(a_ip, 4791));
    let mut out: Vec<PacketBuf> = (0..40).map(|_| PacketBuf::new()).collect();
    for (i, p) in out.iter_mut().enumerate() {
        let bytes = packet(i * 100, i as u32);
        p.data[..bytes.len()].copy_from_slice(&bytes);
        p.len = bytes.len();
        p.peer = b.local_addr();
        a.seal(p.peer, &mut p.data[..p.len]).unwrap();
    }
    // Lengths all differ: no GSO run has two packets, every ID is 0.
    assert_eq!(a.send_burst(&out).unwrap(), 40);
    let (got, _) = receive(&mut b, 40);
    assert_eq!(got.len(), 40);
    for (i, (peer, g)) in got.iter().enumerate() {
        assert_eq!(*peer, a.local_addr());
        assert_eq!(check(&mut ck, &b, *peer, g), IcrcCheck::Ok);
        let p = burst_wire::IbPacket::new_checked(&g[..]).unwrap();
        assert_eq!(p.bth().psn().value(), i as u32);
        assert_eq!(p.payload_len(), i * 100);
    }
    // a corrupted packet does not verify for any IP ID
    let mut bad = got[3].1.clone();
    bad[13] ^= 1;
    assert_eq!(check(&mut ck, &b, a.local_addr(), &bad), IcrcCheck::Bad);
    // nothing pending: a non-blocking receive returns 0
    let mut rx = RxBatch::default();
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 0);
    assert_eq!(rx.packets().count(), 0);
}

/// Runs of equal-length packets leave as one GSO message each and arrive
/// coalesced (GRO); every packet's ICRC was sealed with its index in its run
/// as the IP ID, which the receiver's solver recovers.
#[test]
fn gso_runs_arrive_coalesced_with_their_ip_ids() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 76, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 76, 2));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    let mut ck = burst_wire::icrc::Checker::new();
    assert!(a.gso(), "this kernel supports UDP_SEGMENT");
    // 20 × 4096-byte payloads, a shorter one closing the run, then 79 of
    // 1024 (cut by the 64 KiB limit).
    let mut lens = vec![4096; 20];
    lens.push(100);
    lens.extend(std::iter::repeat_n(1024, 79));
    let mut out: Vec<PacketBuf> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let bytes = packet(len, i as u32);
            let mut p = PacketBuf::new();
            p.data[..bytes.len()].copy_from_slice(&bytes);
            p.len = bytes.len();
            p.peer = b.local_addr();
            p
        })
        .collect();
    let runs: Vec<usize> = {
        let (mut v, mut i) = (Vec::new(), 0);
        while i < out.len() {
            let r = gso_run(&out[i..], true);
            v.push(r);
            i += r;
        }
        v
    };
    // 4112-byte packets: 15 fit in 65507 bytes; then 5 + the short one;
    // 1040-byte packets: 62 fit, then the other 17.
    assert_eq!(runs, vec![15, 6, 62, 17]);
    assert_eq!(a.seal_burst(&mut out), 100);
    assert_eq!(a.send_burst(&out).unwrap(), 100);
    let (got, datagrams) = receive(&mut b, 100);
    assert_eq!(got.len(), 100);
    assert!(datagrams < 100, "GRO coalesced: {datagrams} datagrams");
    let mut expect_ids = Vec::new();
    for r in runs {
        expect_ids.extend(0..r as u16);
    }
    for (i, (peer, g)) in got.iter().enumerate() {
        let p = burst_wire::IbPacket::new_checked(&g[..]).unwrap();
        assert_eq!(p.bth().psn().value(), i as u32);
        assert_eq!(p.payload_len(), lens[i]);
        let want = match expect_ids[i] {
            0 => IcrcCheck::Ok,
            id => IcrcCheck::OkWithId(id),
        };
        assert_eq!(check(&mut ck, &b, *peer, g), want, "packet {i}");
    }
    // Without GSO every packet is its own datagram, sealed with ID 0.
    a.set_gso(false);
    assert_eq!(a.seal_burst(&mut out[..10]), 10);
    assert_eq!(a.send_burst(&out[..10]).unwrap(), 10);
    let (got, datagrams) = receive(&mut b, 10);
    assert_eq!((got.len(), datagrams), (10, 10));
    assert!(got
        .iter()
        .all(|(p, g)| check(&mut ck, &b, *p, g) == IcrcCheck::Ok));
}

#[test]
fn gso_run_rule() {
    let peer_a = SocketAddr::from(([127, 0, 0, 1], 4791));
    let peer_b = SocketAddr::from(([127, 0, 0, 2], 4791));
    let bufs = |spec: &[(usize, SocketAddr)]| -> Vec<PacketBuf> {
        spec.iter()
            .map(|&(len, peer)| {
                let mut p = PacketBuf::new();
                p.len = len;
                p.peer = peer;
                p
            })
            .collect()
    };
    assert_eq!(gso_run(&[], true), 0);
    let v = bufs(&[(100, peer_a), (100, peer_a), (100, peer_b)]);
    assert_eq!(gso_run(&v, true), 2, "another peer starts a run");
    assert_eq!(gso_run(&v, false), 1, "no GSO: one packet per message");
    let v = bufs(&[(100, peer_a), (100, peer_a), (50, peer_a), (50, peer_a)]);
    assert_eq!(gso_run(&v, true), 3, "a shorter packet closes the run");
    let v = bufs(&[(100, peer_a), (200, peer_a)]);
    assert_eq!(gso_run(&v, true), 1, "a longer packet starts a run");
    let v = bufs(&[(100, peer_a), (20, peer_a)]);
    assert_eq!(
        gso_run(&v, true),
        2,
        "a shorter one joins a lone packet (a reply and the ACK after it)"
    );
    let v = bufs(&[(100, peer_a), (20, peer_a), (20, peer_a)]);
    assert_eq!(gso_run(&v, true), 2, "and closes its run");
    let v = bufs(&vec![(10, peer_a); 100]);
    assert_eq!(gso_run(&v, true), MAX_GSO_SEGMENTS);
}

#[test]
fn clear_errors() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 78, 1));
    let _held = UdpPort::bind(ip).unwrap();
    let e = UdpPort::bind(ip).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    let e = UdpPort::bind(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 250))).unwrap_err();
    assert!(e.to_string().contains("not on this host"), "{e}");
}

/// A peer like kernel RXE sends IP IDs from a counter: the check solves for
/// the ID the ICRC was computed with.
#[test]
fn icrc_with_a_nonzero_ip_id_is_solved_for() {
    use burst_wire::{FrameRepr, IpRepr, UdpRepr};
    let a_ip = Ipv4Addr::new(127, 0, 79, 1);
    let b_ip = Ipv4Addr::new(127, 0, 79, 2);
    let b = UdpPort::bind(IpAddr::V4(b_ip)).unwrap();
    let mut ck = burst_wire::icrc::Checker::new();
    for (id, len) in [(0x1234u16, 100usize), (0xffff, 0), (1, 4096), (0x8001, 1)] {
        let mut ib = IbRepr::new(BthRepr::new(
            Opcode::RC_SEND_ONLY,
            Qpn::new(0x11).unwrap(),
            Psn::new(5),
        ));
        ib.payload_len = len;
        let mut ip = IpRepr::v4(a_ip, b_ip);
        if let IpRepr::V4(v) = &mut ip {
            v.ident = id;
        }
        let f = FrameRepr {
            eth: None,
            ip,
            udp: UdpRepr::new(4791),
            ib,
        };
        let mut frame = vec![0u8; f.frame_len()];
        f.emit_in_place(&mut frame).unwrap();
        let payload = &frame[f.ib_offset()..];
        let src = SocketAddr::new(IpAddr::V4(a_ip), 4791);
        assert_eq!(
            check(&mut ck, &b, src, payload),
            IcrcCheck::OkWithId(id),
            "id {id:#x} len {len}"
        );
        let mut bad = payload.to_vec();
        let n = bad.len();
        bad[n / 2] ^= 0x40;
        assert_eq!(
            check(&mut ck, &b, src, &bad),
            IcrcCheck::Bad,
            "id {id:#x} len {len}"
        );
    }
}

/// ECN through the UDP port: what it sends is ECN-capable (ECT(0), RFC
/// 3168), and the ECN bits of what arrives (CE set by a congested queue)
/// reach the receiver in [`RxMeta::ecn`], read from the IP TOS
/// (`IP_RECVTOS`).
#[test]
fn ecn_bits_are_sent_as_ect0_and_seen_on_receive() {
    use std::os::fd::AsRawFd;
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 21));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 22));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    let bytes = packet(64, 1);
    let mut p = PacketBuf::new();
    p.data[..bytes.len()].copy_from_slice(&bytes);
    p.len = bytes.len();
    p.peer = b.local_addr();
    a.seal(p.peer, &mut p.data[..p.len]).unwrap();
    assert_eq!(a.send_burst(std::slice::from_ref(&p)).unwrap(), 1);
    // A plain socket marking CE, as a congested switch would have.
    let ce = std::net::UdpSocket::bind((Ipv4Addr::new(127, 0, 77, 23), 0)).unwrap();
    let tos: libc::c_int = 0b11;
    // SAFETY: a valid fd, a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            ce.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_TOS,
            (&tos as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    ce.send_to(&bytes, b.local_addr()).unwrap();
    let mut rx = RxBatch::default();
    let mut ecn = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while ecn.len() < 2 && Instant::now() < deadline {
        b.recv_batch(&mut rx).unwrap();
        ecn.extend(rx.frames().map(|(m, _)| (m.peer.ip(), m.ecn)));
    }
    ecn.sort();
    assert_eq!(
        ecn,
        [
            (a_ip, 0b10),
            (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 23)), 0b11)
        ]
    );
}

/// A joined multicast group's datagrams arrive with the group as their
/// destination (what the ICRC covers), wake the port's readiness handle,
/// and stop after leaving. Over loopback: the sender names its interface
/// (IP_MULTICAST_IF) by its own address.
#[test]
fn a_joined_multicast_group_is_received_with_its_address() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 201, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 201, 2));
    let group = IpAddr::V4(Ipv4Addr::new(239, 255, 201, 1));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    assert!(b
        .join_multicast(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)))
        .is_err());
    let ready = b.readiness().unwrap();
    b.join_multicast(group).unwrap();
    b.join_multicast(group).unwrap(); // twice: one membership
    let mut ck = burst_wire::icrc::Checker::new();
    let to = SocketAddr::new(group, 4791);
    let send = |a: &mut UdpPort, psn: u32| {
        let mut p = PacketBuf::new();
        let bytes = packet(64, psn);
        p.data[..bytes.len()].copy_from_slice(&bytes);
        p.len = bytes.len();
        p.peer = to;
        a.seal(to, &mut p.data[..p.len]).unwrap();
        assert_eq!(a.send_burst(std::slice::from_ref(&p)).unwrap(), 1);
    };
    send(&mut a, 7);
    assert!(
        ready.wait(Duration::from_secs(5)).unwrap(),
        "readiness wakes"
    );
    let mut rx = RxBatch::default();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        b.recv_batch(&mut rx).unwrap();
        got.extend(rx.frames().map(|(m, p)| (m, p.to_vec())));
    }
    assert_eq!(got.len(), 1, "one copy");
    let (meta, bytes) = &got[0];
    assert_eq!(meta.dest, Some(group));
    assert_eq!(meta.peer, a.local_addr());
    assert_eq!(ck.check(meta.peer, to, bytes, None), IcrcCheck::Ok);
    b.leave_multicast(group).unwrap();
    send(&mut a, 8);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 0, "nothing after leaving");
}

/// RoCE v2 senders (kernel RXE, RNICs) leave the UDP checksum 0 over IPv6
/// too: the port takes such datagrams (Linux drops them by default).
#[test]
fn ipv6_datagrams_with_a_zero_udp_checksum_are_received() {
    use std::os::fd::AsRawFd;
    let ip: IpAddr = "::1".parse().unwrap();
    let mut port = UdpPort::bind_port(ip, 47_915).unwrap();
    let tx = std::net::UdpSocket::bind("[::1]:0").unwrap();
    // UDP_NO_CHECK6_TX (linux/udp.h): send with a zero checksum, as RXE.
    let one: libc::c_int = 1;
    // SAFETY: a live socket and a valid int option of its size.
    let rc = unsafe {
        libc::setsockopt(
            tx.as_raw_fd(),
            libc::SOL_UDP,
            101,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    let bytes = packet(100, 3);
    tx.send_to(&bytes, port.local_addr()).unwrap();
    let (got, _) = receive(&mut port, 1);
    assert_eq!(got.len(), 1, "the zero-checksum datagram arrived");
    assert_eq!(got[0].1, bytes);
}

/// A port serving a second address (a device's other GID): what is sent
/// to it arrives with it as destination, and packets whose source it is
/// leave from it (sealed for it, so the peer's ICRC check passes), in one
/// burst with packets from the port's own address.
#[test]
fn a_second_address_is_received_and_sent_from() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 204, 1));
    let a2_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 204, 2));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 204, 3));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    a.add_address(SocketAddr::new(a2_ip, 0)).unwrap();
    a.add_address(SocketAddr::new(a2_ip, 0)).unwrap(); // twice: one socket
    let ready = a.readiness().unwrap();
    let mut ck = burst_wire::icrc::Checker::new();
    let to_a2 = SocketAddr::new(a2_ip, 4791);

    // b -> a's second address: a GSO run of four, taken apart again.
    let mut run: Vec<PacketBuf> = (0..4)
        .map(|i| {
            let mut p = PacketBuf::new();
            let bytes = packet(1024, 1 + i);
            p.data[..bytes.len()].copy_from_slice(&bytes);
            p.len = bytes.len();
            p.peer = to_a2;
            p
        })
        .collect();
    b.assign_ip_ids(&mut run);
    assert_eq!(seal_all(b.local_addr(), &mut run), 4);
    assert_eq!(b.send_burst(&run).unwrap(), 4);
    assert!(
        ready.wait(Duration::from_secs(5)).unwrap(),
        "readiness wakes"
    );
    let mut rx = RxBatch::default();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < 4 && Instant::now() < deadline {
        a.recv_batch(&mut rx).unwrap();
        got.extend(rx.frames().map(|(m, p)| (m, p.to_vec())));
    }
    assert_eq!(got.len(), 4, "four packets, not one coalesced datagram");
    for (m, bytes) in &got {
        assert_eq!(m.dest, Some(a2_ip));
        assert_eq!(bytes.len(), run[0].len);
        let c = ck.check(m.peer, to_a2, bytes, None);
        assert!(matches!(c, IcrcCheck::Ok | IcrcCheck::OkWithId(_)), "{c:?}");
    }

    // a -> b: two packets from the second address between two from its own.
    let srcs = [None, Some(a2_ip), Some(a2_ip), None];
    let mut out: Vec<PacketBuf> = srcs
        .iter()
        .enumerate()
        .map(|(i, src)| {
            let mut p = PacketBuf::new();
            let bytes = packet(100, 10 + i as u32);
            p.data[..bytes.len()].copy_from_slice(&bytes);
            p.len = bytes.len();
            p.peer = b.local_addr();
            p.src = *src;
            p
        })
        .collect();
    assert_eq!(a.seal_burst(&mut out), 4);
    assert_eq!(a.send_burst(&out).unwrap(), 4);
    let (got, _) = receive(&mut b, 4);
    assert_eq!(got.len(), 4);
    for (i, (peer, bytes)) in got.iter().enumerate() {
        let psn = u32::from_be_bytes([0, bytes[9], bytes[10], bytes[11]]);
        let want = if srcs[(psn - 10) as usize].is_some() {
            a2_ip
        } else {
            a_ip
        };
        assert_eq!(
            peer.ip(),
            want,
            "packet {i} (PSN {psn}) left from its source"
        );
        // A GSO run's second packet carries IP ID 1 (solved for).
        let c = check(&mut ck, &b, *peer, bytes);
        assert!(matches!(c, IcrcCheck::Ok | IcrcCheck::OkWithId(_)), "{c:?}");
    }

    // Removed: no longer received.
    a.remove_address(a2_ip);
    assert!(
        std::net::UdpSocket::bind(to_a2).is_ok(),
        "the socket is closed"
    );
}

/// Datagrams the kernel drops for the port's socket (a receive buffer that
/// nobody drains) show in its counters: what a receiver that falls behind
/// a sender's window loses below burst, where no retransmission says why.
#[test]
fn a_full_receive_buffer_counts_its_drops() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 91));
    let port = UdpPort::bind(ip).unwrap();
    assert_eq!(port.counters().rx_dropped, 0);
    let tx = std::net::UdpSocket::bind((Ipv4Addr::new(127, 0, 77, 92), 0)).unwrap();
    let bytes = packet(4000, 1);
    // Well past the port's receive buffer (64 MiB where the buffer could be
    // forced, net.core.rmem_max otherwise): 200 MiB, bounded in time.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0usize;
    while sent < 200 << 20 && Instant::now() < deadline {
        tx.send_to(&bytes, port.local_addr()).unwrap();
        sent += bytes.len();
    }
    let dropped = port.counters().rx_dropped;
    assert!(dropped > 0, "no drop counted after {sent} bytes");
    assert!(dropped as usize <= sent / bytes.len());
}

/// The port's own socket is read without asking epoll first (a polled
/// step costs one system call), yet a datagram to its other address is
/// not starved by traffic that keeps the own socket busy: it arrives
/// within 16 receives, each of which also finds the own socket's traffic.
#[test]
fn another_address_is_served_while_the_own_socket_is_busy() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 205, 1));
    let a2_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 205, 2));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 205, 3));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    a.add_address(SocketAddr::new(a2_ip, 0)).unwrap();
    let send = |b: &mut UdpPort, to: IpAddr, psn: u32| {
        let mut p = PacketBuf::new();
        let bytes = packet(256, psn);
        p.data[..bytes.len()].copy_from_slice(&bytes);
        p.len = bytes.len();
        p.peer = SocketAddr::new(to, 4791);
        let mut one = [p];
        b.assign_ip_ids(&mut one);
        assert_eq!(seal_all(b.local_addr(), &mut one), 1);
        assert_eq!(b.send_burst(&one).unwrap(), 1);
    };
    send(&mut b, a2_ip, 1000);
    let mut rx = RxBatch::default();
    let mut seen_other = None;
    for i in 0..32u32 {
        // One datagram for the own address before each receive: loopback
        // delivers it before send returns.
        send(&mut b, a_ip, i);
        a.recv_batch(&mut rx).unwrap();
        let mut own = 0;
        for (m, _) in rx.frames() {
            match m.dest {
                Some(ip) if ip == a2_ip => seen_other = seen_other.or(Some(i)),
                _ => own += 1,
            }
        }
        assert_eq!(own, 1, "receive {i} found the own socket's datagram");
        if seen_other.is_some() {
            break;
        }
    }
    let at = seen_other.expect("the other address's datagram was never received");
    assert!(at < 16, "received only at receive {at}");
}
