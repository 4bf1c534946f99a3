//! Sealing with a payload CRC taken during the gather gives the same ICRC
//! as reading the whole packet.

use std::net::SocketAddr;

use burst_io::{seal, seal_with, PayloadCrc};
use proptest::prelude::*;

fn addrs(v6: bool) -> (SocketAddr, SocketAddr) {
    if v6 {
        (
            "[fd00::1]:49152".parse().unwrap(),
            "[fd00::2]:4791".parse().unwrap(),
        )
    } else {
        (
            "198.18.0.1:49152".parse().unwrap(),
            "198.18.0.2:4791".parse().unwrap(),
        )
    }
}

proptest! {
    #[test]
    fn a_payload_crc_seals_as_the_whole_packet(
        headers in 12usize..64,
        payload in proptest::collection::vec(any::<u8>(), 0..5000),
        pad in 0usize..4,
        ip_id in any::<u16>(),
        v6 in any::<bool>(),
        fill in any::<u8>(),
    ) {
        let (src, dst) = addrs(v6);
        let mut ib = vec![fill; headers];
        ib.extend_from_slice(&payload);
        ib.extend(std::iter::repeat_n(0u8, pad + 4));
        let mut whole = ib.clone();
        seal(src, dst, &mut whole, ip_id).unwrap();
        let p = PayloadCrc { at: headers, len: payload.len(), crc: crc32fast::hash(&payload) };
        seal_with(src, dst, &mut ib, ip_id, Some(p)).unwrap();
        prop_assert_eq!(ib, whole);
    }
}

#[test]
fn a_payload_range_past_the_icrc_is_refused() {
    let (src, dst) = addrs(false);
    let mut ib = vec![0u8; 40];
    let p = PayloadCrc {
        at: 12,
        len: 25,
        crc: 0,
    };
    assert!(seal_with(src, dst, &mut ib, 0, Some(p)).is_err());
    let p = PayloadCrc {
        at: 4,
        len: 0,
        crc: 0,
    };
    assert!(
        seal_with(src, dst, &mut ib, 0, Some(p)).is_err(),
        "inside the BTH"
    );
}
