//! The UDP port over loopback (127.0.0.0/8 addresses, so each test can own
//! port 4791 on its own address).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use burst_io::*;
use burst_wire::{BthRepr, IbRepr, Opcode, Psn, Qpn};

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

#[test]
fn burst_send_receive_with_icrc_sealed_for_ip_id_0() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, 2));
    let mut a = UdpPort::bind(a_ip).unwrap();
    let mut b = UdpPort::bind(b_ip).unwrap();
    assert_eq!(a.local_addr(), SocketAddr::new(a_ip, 4791));
    let mut out: Vec<PacketBuf> = (0..40).map(|_| PacketBuf::new()).collect();
    for (i, p) in out.iter_mut().enumerate() {
        let bytes = packet(i * 100, i as u32);
        p.data[..bytes.len()].copy_from_slice(&bytes);
        p.len = bytes.len();
        p.peer = b.local_addr();
        a.seal(p.peer, &mut p.data[..p.len]).unwrap();
    }
    assert_eq!(a.send_burst(&out).unwrap(), 40);
    let mut got = Vec::new();
    let mut rx: Vec<PacketBuf> = (0..BURST).map(|_| PacketBuf::new()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 40 && Instant::now() < deadline {
        let n = b.recv_burst(&mut rx).unwrap();
        for r in &rx[..n] {
            assert_eq!(r.peer, a.local_addr());
            assert_eq!(b.check_icrc(r.peer, r.bytes()), IcrcCheck::Ok);
            got.push(r.bytes().to_vec());
        }
    }
    assert_eq!(got.len(), 40);
    for (i, g) in got.iter().enumerate() {
        let p = burst_wire::IbPacket::new_checked(&g[..]).unwrap();
        assert_eq!(p.bth().psn().value(), i as u32);
        assert_eq!(p.payload_len(), i * 100);
    }
    // a corrupted packet does not verify for any IP ID
    let mut bad = got[3].clone();
    bad[13] ^= 1;
    assert_eq!(b.check_icrc(a.local_addr(), &bad), IcrcCheck::Bad);
    // nothing pending: a non-blocking receive returns 0
    assert_eq!(b.recv_burst(&mut rx).unwrap(), 0);
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
    let mut b = UdpPort::bind(IpAddr::V4(b_ip)).unwrap();
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
            b.check_icrc(src, payload),
            IcrcCheck::OkWithId(id),
            "id {id:#x} len {len}"
        );
        let mut bad = payload.to_vec();
        let n = bad.len();
        bad[n / 2] ^= 0x40;
        assert_eq!(
            b.check_icrc(src, &bad),
            IcrcCheck::Bad,
            "id {id:#x} len {len}"
        );
    }
}
