//! Bad input: each kind of malformation gives its own error value.

use std::net::Ipv4Addr;

use burst_wire::*;

fn frame_with(op: Opcode, payload: &[u8]) -> (FrameRepr, Vec<u8>) {
    let mut ib = IbRepr::new(BthRepr::new(op, Qpn::new(0x11).unwrap(), Psn::new(5)));
    let info = op.info().unwrap();
    if info.headers.contains(HeaderSet::RETH) {
        ib.reth = Some(RethRepr {
            virtual_address: 0x1000,
            rkey: 7,
            dma_length: payload.len() as u32,
        });
    }
    if info.headers.contains(HeaderSet::AETH) {
        ib.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack(Credits::UNLIMITED),
            msn: 1,
        });
    }
    ib.payload_len = payload.len();
    let f = FrameRepr {
        eth: Some(EthRepr::default()),
        ip: IpRepr::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)),
        udp: UdpRepr::new(49152),
        ib,
    };
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf, payload).unwrap();
    (f, buf)
}

/// Recomputes IPv4 checksum and ICRC after a test edited the frame.
fn refresh(f: &FrameRepr, buf: &mut [u8]) {
    let ip = f.ip_offset();
    buf[ip + 10] = 0;
    buf[ip + 11] = 0;
    let mut sum: u32 = buf[ip..ip + 20]
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    buf[ip + 10..ip + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let ib = f.ib_offset();
    let n = buf.len();
    let crc = icrc::compute(&buf[ip..ip + 20], &buf[ip + 20..ib], &buf[ib..n - 4]).unwrap();
    buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn good_frame_is_accepted() {
    let (_, buf) = frame_with(Opcode::RC_SEND_ONLY, b"hello");
    parse_verified(&buf).unwrap();
}

#[test]
fn truncation_at_every_length_is_a_truncated_error() {
    let (_, buf) = frame_with(Opcode::RC_RDMA_WRITE_ONLY, b"hello world!");
    for len in 0..buf.len() {
        match RoceFrame::parse_ethernet(&buf[..len]) {
            Err(Error::Truncated { .. }) => {}
            other => panic!("len {len}: {other:?}"),
        }
    }
}

#[test]
fn wrong_udp_port() {
    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"x");
    let udp = f.ip_offset() + 20;
    buf[udp + 2..udp + 4].copy_from_slice(&4792u16.to_be_bytes());
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::WrongUdpPort(4792)
    );
}

#[test]
fn unknown_opcode() {
    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"x");
    buf[f.ib_offset()] = 0x15;
    refresh(&f, &mut buf);
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::UnknownOpcode(0x15)
    );
}

#[test]
fn opcode_length_mismatch() {
    // An ACK followed by 4 bytes of payload.
    let (f, buf) = frame_with(Opcode::RC_ACKNOWLEDGE, b"");
    let ib = &buf[f.ib_offset()..];
    let mut longer = ib[..ib.len() - 4].to_vec();
    longer.extend_from_slice(&[1, 2, 3, 4, 0, 0, 0, 0]);
    assert_eq!(
        IbPacket::new_checked(&longer[..]).unwrap_err(),
        Error::UnexpectedPayload {
            opcode: 0x11,
            len: 4
        }
    );
    // A READ request cut inside its RETH.
    let (f, buf) = frame_with(Opcode::RC_RDMA_READ_REQUEST, b"");
    let ib = &buf[f.ib_offset()..];
    assert!(matches!(
        IbPacket::new_checked(&ib[..12 + 8]),
        Err(Error::Truncated { .. })
    ));
    // Payload not 4-byte aligned.
    let (f, buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    let ib = &buf[f.ib_offset()..];
    let mut odd = ib.to_vec();
    odd.insert(12, 0);
    assert_eq!(
        IbPacket::new_checked(&odd[..]).unwrap_err(),
        Error::Unaligned(5)
    );
}

#[test]
fn bad_pad_count() {
    // SEND ONLY with no payload but pad count 3.
    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"");
    buf[f.ib_offset() + 1] |= 0x30;
    refresh(&f, &mut buf);
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::BadPadCount { pad: 3, padded: 0 }
    );
}

#[test]
fn bad_icrc() {
    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    buf[f.payload_offset()] ^= 0x80;
    assert!(matches!(parse_verified(&buf), Err(Error::BadIcrc { .. })));
}

#[test]
fn bad_tver_fragment_protocol_checksum_and_udp_length() {
    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    buf[f.ib_offset() + 1] |= 0x01;
    refresh(&f, &mut buf);
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::UnsupportedTver(1)
    );

    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    buf[f.ip_offset() + 6] |= 0x20; // more fragments
    refresh(&f, &mut buf);
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::IpFragment
    );

    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    buf[f.ip_offset() + 9] = 6; // TCP
    refresh(&f, &mut buf);
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::NotUdp(6)
    );

    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    buf[f.ip_offset() + 8] ^= 1; // TTL changed, checksum not
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::BadIpChecksum
    );

    let (f, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    let udp = f.ip_offset() + 20;
    buf[udp + 5] -= 4;
    refresh(&f, &mut buf);
    assert!(matches!(
        RoceFrame::parse_ethernet(&buf),
        Err(Error::BadUdpLength { .. })
    ));

    let (_, mut buf) = frame_with(Opcode::RC_SEND_ONLY, b"abcd");
    buf[12..14].copy_from_slice(&0x0806u16.to_be_bytes()); // ARP
    assert_eq!(
        RoceFrame::parse_ethernet(&buf).unwrap_err(),
        Error::NotIp(0x0806)
    );
}

#[test]
fn emit_refuses_inconsistent_reprs() {
    let mut ib = IbRepr::new(BthRepr::new(
        Opcode::RC_RDMA_WRITE_ONLY,
        Qpn::new(1).unwrap(),
        Psn::new(0),
    ));
    let mut buf = [0u8; 64];
    assert_eq!(ib.emit(&mut buf), Err(Error::HeaderMismatch(0x0a)));
    ib.reth = Some(RethRepr::default());
    ib.emit(&mut buf).unwrap();
    ib.payload_len = 100;
    assert!(matches!(
        ib.emit(&mut buf),
        Err(Error::BufferTooSmall { .. })
    ));
    let mut ack = IbRepr::new(BthRepr::new(
        Opcode::RC_ACKNOWLEDGE,
        Qpn::new(1).unwrap(),
        Psn::new(0),
    ));
    ack.aeth = Some(AethRepr {
        syndrome: Syndrome::Ack(Credits(0)),
        msn: 0,
    });
    ack.payload_len = 4;
    assert!(matches!(
        ack.emit(&mut buf),
        Err(Error::UnexpectedPayload { .. })
    ));
}

#[test]
fn payload_length_per_mtu() {
    for mtu in Mtu::ALL {
        let m = mtu.bytes();
        assert!(mtu.check_payload(Opcode::RC_RDMA_WRITE_FIRST, m).is_ok());
        assert!(mtu
            .check_payload(Opcode::RC_RDMA_WRITE_FIRST, m - 4)
            .is_err());
        assert!(mtu
            .check_payload(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, m + 1)
            .is_err());
        assert!(mtu.check_payload(Opcode::RC_RDMA_WRITE_LAST, 1).is_ok());
        assert!(mtu
            .check_payload(Opcode::RC_RDMA_WRITE_LAST, m + 1)
            .is_err());
        assert!(mtu.check_payload(Opcode::UD_SEND_ONLY, m).is_ok());
        assert!(mtu.check_payload(Opcode::UD_SEND_ONLY, m + 1).is_err());
        assert!(mtu.check_payload(Opcode::RC_ACKNOWLEDGE, 0).is_ok());
        assert!(mtu.check_payload(Opcode::RC_COMPARE_SWAP, 8).is_err());
        assert_eq!(Mtu::from_ibv_mtu(mtu.ibv_mtu()), Some(mtu));
        assert_eq!(Mtu::from_bytes(m), Some(mtu));
    }
}

#[test]
fn cnp_has_sixteen_reserved_bytes() {
    let ib = IbRepr::cnp(Qpn::new(0x42).unwrap());
    assert_eq!(ib.buffer_len(), 12 + 16 + 4);
    let mut buf = vec![0u8; ib.buffer_len()];
    ib.emit(&mut buf).unwrap();
    let p = IbPacket::new_checked(&buf[..]).unwrap();
    assert_eq!(p.opcode(), Opcode::CNP);
    assert!(p.bth().becn());
    assert_eq!(p.payload_len(), 0);
    assert_eq!(IbRepr::parse(&p).unwrap(), ib);
    // a CNP without its reserved bytes is truncated
    assert!(matches!(
        IbPacket::new_checked(&buf[..12 + 4]),
        Err(Error::Truncated { .. })
    ));
}

#[test]
fn mad_errors() {
    use burst_wire::mad::*;
    assert!(matches!(
        CmMad::parse(&[0u8; 100]),
        Err(Error::Truncated { .. })
    ));
    let mut b = [0u8; MAD_LEN];
    b[0] = 1;
    b[1] = 0x81; // subnet management, not CM
    assert!(matches!(CmMad::parse(&b), Err(Error::BadMad(_))));
    b[1] = MGMT_CLASS_CM;
    b[16..18].copy_from_slice(&0x0019u16.to_be_bytes()); // LAP: not supported
    assert!(matches!(CmMad::parse(&b), Err(Error::BadMad(_))));
}
