//! ICRC checking with unknown IPv4 IDs: what is accepted, from whom, and
//! that the caches stay bounded.

use std::net::SocketAddr;

use burst_wire::icrc::{for_udp_payload, Check, Checker, MAX_CACHED_LENGTHS, MAX_TRACKED_PEERS};

fn packet(src: SocketAddr, dst: SocketAddr, len: usize, id: u16) -> Vec<u8> {
    let mut ib = vec![0u8; len];
    ib[..12].copy_from_slice(&[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1]);
    let crc = for_udp_payload(src, dst, &ib, id).unwrap();
    ib[len - 4..].copy_from_slice(&crc.to_le_bytes());
    ib
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn a_counting_peer_starting_at_zero_is_always_accepted() {
    let (src, dst) = (addr("198.18.0.1:50000"), addr("198.18.0.2:4791"));
    let mut c = Checker::new();
    for id in 0..3000u16 {
        let p = packet(src, dst, 64, id);
        let want = if id == 0 {
            Check::Ok
        } else {
            Check::OkWithId(id)
        };
        assert_eq!(c.check(src, dst, &p, None), want, "id {id}");
    }
}

#[test]
fn a_gso_peer_is_held_to_the_gso_id_range() {
    let (src, dst) = (addr("198.18.0.1:50000"), addr("198.18.0.2:4791"));
    let mut c = Checker::new();
    // Runs of 8 packets, IDs 0..8 each: what burst's UDP port sends.
    for run in 0..20 {
        for id in 0..8 {
            let p = packet(src, dst, 100 + run, id);
            assert_ne!(c.check(src, dst, &p, None), Check::Bad);
        }
    }
    // A corruption that happens to look like ID 1000 is now refused ...
    assert_eq!(
        c.check(src, dst, &packet(src, dst, 64, 1000), None),
        Check::Bad
    );
    // ... while another peer is not affected.
    let other = addr("198.18.0.3:50000");
    assert_eq!(
        c.check(other, dst, &packet(other, dst, 64, 1000), None),
        Check::OkWithId(1000)
    );
}

#[test]
fn a_known_id_and_ipv6_are_checked_at_full_strength() {
    let (src, dst) = (addr("198.18.0.1:50000"), addr("198.18.0.2:4791"));
    let mut c = Checker::new();
    let p = packet(src, dst, 64, 5);
    assert_eq!(c.check(src, dst, &p, Some(5)), Check::Ok);
    assert_eq!(c.check(src, dst, &p, Some(6)), Check::Bad);
    let (s6, d6) = (addr("[fd00::1]:50000"), addr("[fd00::2]:4791"));
    let mut p6 = packet(s6, d6, 64, 0);
    assert_eq!(c.check(s6, d6, &p6, None), Check::Ok);
    p6[20] ^= 1;
    assert_eq!(c.check(s6, d6, &p6, None), Check::Bad);
    assert_eq!(c.check(src, d6, &p, None), Check::Unverifiable);
    assert_eq!(c.check(src, dst, &p[..10], None), Check::Unverifiable);
}

#[test]
fn the_caches_are_bounded() {
    let dst = addr("198.18.0.2:4791");
    let mut c = Checker::new();
    for i in 0..(MAX_TRACKED_PEERS as u32 + 100) {
        let src = SocketAddr::from(([198, 18, (i >> 8) as u8, i as u8], 50000));
        let len = 20 + (i as usize % (MAX_CACHED_LENGTHS + 50)) * 4;
        let p = packet(src, dst, len, 3);
        assert_eq!(c.check(src, dst, &p, None), Check::OkWithId(3));
        let (lengths, peers) = c.cached();
        assert!(lengths <= MAX_CACHED_LENGTHS && peers <= MAX_TRACKED_PEERS);
    }
}
