//! The XDP steering program, run in the kernel on crafted frames
//! (`BPF_PROG_TEST_RUN`). Needs root (CAP_BPF); skipped, loudly, without it.
#![cfg(feature = "af-xdp")]

use std::net::{Ipv4Addr, Ipv6Addr};

use burst_io::xdp::{XdpProgram, XdpStats};
use burst_wire::{BthRepr, EthRepr, FrameRepr, IbRepr, IpRepr, Opcode, Psn, Qpn, UdpRepr};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

fn program() -> Option<XdpProgram> {
    match XdpProgram::load() {
        Ok(p) => Some(p),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("SKIPPED: cannot load BPF programs here: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn roce(ip: IpRepr, qpn: u32) -> Vec<u8> {
    let mut ib = IbRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(qpn).unwrap(),
        Psn::new(1),
    ));
    ib.payload_len = 64;
    let f = FrameRepr {
        eth: Some(EthRepr {
            src: [2, 0, 0, 0, 0, 2],
            dst: [2, 0, 0, 0, 0, 1],
            vlan: None,
        }),
        ip,
        udp: UdpRepr::new(0xc001),
        ib,
    };
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf, &[7u8; 64]).unwrap();
    buf
}

const ME: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

#[test]
fn roce_to_a_local_address_goes_to_its_queues_socket_and_the_rest_passes() {
    let Some(p) = program() else { return };
    let me6: Ipv6Addr = "fd00::1".parse().unwrap();
    p.add_local_addr(ME.into()).unwrap();
    p.add_local_addr(me6.into()).unwrap();
    p.set_qpn_slot(0x11, 3).unwrap();

    p.set_qpn_slot(0x12, 0).unwrap();

    // A test run's frame arrives on queue 0: to slot 0 whatever its QP
    // (no socket there: the fallback drops). A QP of lane 3 is counted as
    // landing on another lane's queue, one of lane 0 is not.
    assert_eq!(
        p.test_run(&roce(IpRepr::v4(PEER, ME), 0x11)).unwrap(),
        XDP_DROP
    );
    assert_eq!(
        p.test_run(&roce(IpRepr::v4(PEER, ME), 0x12)).unwrap(),
        XDP_DROP
    );
    assert_eq!((p.slot_hits(0), p.slot_hits(3)), (2, 0));
    // RoCE to an unknown QPN: slot 0, counted.
    assert_eq!(
        p.test_run(&roce(IpRepr::v4(PEER, ME), 0x99)).unwrap(),
        XDP_DROP
    );
    assert_eq!(p.slot_hits(0), 3);
    // RoCE over IPv6 to a local address, known QPN.
    let v6 = IpRepr::v6("fd00::2".parse().unwrap(), me6);
    assert_eq!(p.test_run(&roce(v6, 0x11)).unwrap(), XDP_DROP);
    assert_eq!(p.slot_hits(0), 4);
    // RoCE to an address that is not the device's: the kernel's.
    let other = IpRepr::v4(PEER, Ipv4Addr::new(198, 18, 0, 9));
    assert_eq!(p.test_run(&roce(other, 0x11)).unwrap(), XDP_PASS);

    // Other UDP to the device's address: the kernel's.
    let mut dns = roce(IpRepr::v4(PEER, ME), 0x11);
    let udp_dport = 14 + 20 + 2;
    dns[udp_dport..udp_dport + 2].copy_from_slice(&53u16.to_be_bytes());
    assert_eq!(p.test_run(&dns).unwrap(), XDP_PASS);
    // ARP: the kernel's.
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 2, 0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[
        2, 0, 0, 0, 0, 2, 198, 18, 0, 2, 0, 0, 0, 0, 0, 0, 198, 18, 0, 1,
    ]);
    assert_eq!(p.test_run(&arp).unwrap(), XDP_PASS);
    // A frame cut inside its IP header: the kernel's (it is not RoCE that
    // the program can see).
    assert_eq!(
        p.test_run(&roce(IpRepr::v4(PEER, ME), 0x11)[..30]).unwrap(),
        XDP_PASS
    );
    // RoCE cut after its UDP header, before a whole BTH: to burst's slot 0,
    // which counts and drops it.
    let cut = &roce(IpRepr::v4(PEER, ME), 0x11)[..14 + 20 + 8 + 4];
    assert_eq!(p.test_run(cut).unwrap(), XDP_DROP);
    assert_eq!(p.slot_hits(0), 5);

    assert_eq!(
        p.stats(),
        XdpStats {
            passed: 4,
            steered: 5,
            unknown_qpn: 1,
            truncated: 1,
            other_lane: 2,
        }
    );
    // A forgotten QPN is owned by no lane.
    p.clear_qpn(0x11);
    p.test_run(&roce(IpRepr::v4(PEER, ME), 0x11)).unwrap();
    assert_eq!((p.stats().unknown_qpn, p.stats().other_lane), (2, 2));
}

#[test]
fn a_missing_interface_is_named_in_the_error() {
    let cfg = burst_io::xsk::XskConfig::new("nosuch0");
    let e = burst_io::xsk::XskLink::open(&cfg, ME.into())
        .err()
        .expect("no such interface");
    assert!(e.to_string().contains("nosuch0"), "{e}");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
}
