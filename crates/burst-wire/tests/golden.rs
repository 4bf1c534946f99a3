//! Golden packets from kernel RXE (recorded with the RXE lab into
//! tests/fixtures/rxe): every RoCEv2 packet parses, its ICRC verifies, and
//! re-emitting its repr gives back the very same bytes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burst_wire::mad::{CmMad, CmMessage, GSI_QKEY};
use burst_wire::{IpRepr, NakCode, Opcode, Qpn, RoceFrame, Syndrome};

#[path = "support/capture.rs"]
mod capture;

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rxe");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcapng"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 10,
        "expected the recorded fixtures in {}",
        dir.display()
    );
    v
}

/// Every RoCEv2 frame of one fixture file.
fn frames(name: &str) -> Vec<capture::Captured> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rxe")
        .join(name);
    capture::read_capture(&p).unwrap()
}

#[test]
fn every_packet_parses_verifies_and_reemits_identically() {
    let mut total = 0;
    for path in fixtures() {
        let caps = capture::read_capture(&path).unwrap();
        let mut n = 0;
        for (i, c) in caps.iter().enumerate() {
            let f = match c.parse() {
                Ok(f) => f,
                Err(burst_wire::Error::NotIp(_) | burst_wire::Error::WrongUdpPort(_)) => continue,
                Err(e) => panic!("{} #{}: {e}", path.display(), i + 1),
            };
            f.verify_icrc()
                .unwrap_or_else(|e| panic!("{} #{}: {e}", path.display(), i + 1));
            let repr = f.repr().unwrap();
            let mut out = vec![0u8; repr.frame_len()];
            let len = repr.emit(&mut out, f.ib.payload()).unwrap();
            assert_eq!(
                &out[..len],
                &c.data[..len],
                "{} #{}: re-emitted bytes differ",
                path.display(),
                i + 1
            );
            n += 1;
        }
        assert!(n > 0, "{}: no RoCEv2 packet", path.display());
        total += n;
    }
    assert!(total > 100, "only {total} packets");
}

#[test]
fn fixtures_cover_the_opcodes_rxe_produces() {
    let mut seen = BTreeSet::new();
    let mut naks = BTreeSet::new();
    let mut full_4096 = false;
    for path in fixtures() {
        for c in capture::read_capture(&path).unwrap() {
            let Ok(f) = c.parse() else { continue };
            seen.insert(f.ib.opcode().0);
            if let Some(a) = f.ib.aeth() {
                if let Syndrome::Nak(n) = Syndrome::from_byte(a.syndrome()) {
                    naks.insert(format!("{n:?}"));
                }
            }
            full_4096 |= f.ib.payload_len() == 4096;
        }
    }
    let want = [
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
        Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        Opcode::RC_SEND_ONLY,
        Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
        Opcode::RC_COMPARE_SWAP,
        Opcode::RC_FETCH_ADD,
        Opcode::UC_SEND_FIRST,
        Opcode::UC_SEND_MIDDLE,
        Opcode::UC_SEND_LAST,
        Opcode::UC_RDMA_WRITE_FIRST,
        Opcode::UC_RDMA_WRITE_MIDDLE,
        Opcode::UC_RDMA_WRITE_LAST,
        Opcode::UD_SEND_ONLY,
    ];
    let missing: Vec<&str> = want
        .iter()
        .filter(|o| !seen.contains(&o.0))
        .map(|o| o.name())
        .collect();
    assert!(
        missing.is_empty(),
        "opcodes missing from fixtures: {missing:?}"
    );
    assert!(full_4096, "no 4096-byte payload (MTU 4096) in fixtures");
    assert!(
        naks.contains(&format!("{:?}", NakCode::PsnSequenceError)),
        "no PSN sequence error NAK in fixtures: {naks:?}"
    );
}

#[test]
fn ud_packets_carry_deth_and_a_grh_for_the_receive_buffer() {
    let caps = frames("ud_send.pcapng");
    let mut n = 0;
    for c in &caps {
        let Ok(f) = c.parse() else { continue };
        assert_eq!(f.ib.opcode(), Opcode::UD_SEND_ONLY);
        let deth = f.ib.deth().expect("DETH");
        assert_ne!(deth.src_qp(), Qpn::new(0).unwrap());
        assert_eq!(f.ib.payload_len(), 999);
        assert_eq!(f.ib.bth().pad_count(), 1);
        let grh = f.ud_grh();
        // IPv4: 20 zero bytes, then the IPv4 header as received.
        assert_eq!(&grh[..20], &[0u8; 20]);
        assert_eq!(grh[20] >> 4, 4);
        let IpRepr::V4(ip) = f.ip else {
            panic!("IPv4 expected")
        };
        assert_eq!(&grh[32..36], &ip.src.octets());
        assert_eq!(&grh[36..40], &ip.dst.octets());
        n += 1;
    }
    assert!(n >= 2);
}

#[test]
fn rdma_cm_connection_is_decoded_from_qp1_mads() {
    let mut kinds = Vec::new();
    let mut req = None;
    let mut rep = None;
    for c in frames("cm_rping.pcapng") {
        let Ok(f) = c.parse() else { continue };
        if f.ib.bth().dest_qp() != Qpn::GSI {
            continue;
        }
        assert_eq!(f.ib.opcode(), Opcode::UD_SEND_ONLY);
        assert_eq!(f.ib.deth().unwrap().qkey(), GSI_QKEY);
        let mad = CmMad::parse(f.ib.payload()).unwrap();
        // re-emitting the MAD gives the same 256 bytes
        let mut out = [0u8; 256];
        mad.emit(&mut out).unwrap();
        assert_eq!(&out[..], &f.ib.payload()[..256]);
        kinds.push(mad.message.attr());
        match mad.message {
            CmMessage::Req(r) if req.is_none() => req = Some((r, f.ip)),
            CmMessage::Rep(r) if rep.is_none() => rep = Some(r),
            _ => {}
        }
    }
    use burst_wire::mad::CmAttr::*;
    for k in [Req, Rep, Rtu, Dreq, Drep] {
        assert!(kinds.contains(&k), "no {k:?} in {kinds:?}");
    }
    let (req, ip) = req.unwrap();
    let rep = rep.unwrap();
    // The REQ's primary path names the two hosts' RoCE GIDs.
    assert_eq!(req.primary_path.local_gid, ip.src_gid());
    assert_eq!(req.primary_path.remote_gid, ip.dst_gid());
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_ne!(req.local_qpn.value(), 0);
    assert_ne!(rep.local_qpn.value(), 0);
}

/// Decoded form of the first packet of each opcode in a few captures.
#[test]
fn snapshots_of_decoded_packets() {
    for name in [
        "rc_send_mtu1024.pcapng",
        "ud_send.pcapng",
        "rc_read_mtu1024.pcapng",
        "rc_fetch_add.pcapng",
        "rc_imm.pcapng",
        "rc_write_mtu4096.pcapng",
    ] {
        let mut seen = BTreeSet::new();
        let mut out = String::new();
        for c in frames(name) {
            let Ok(f) = c.parse() else { continue };
            if !seen.insert(f.ib.opcode().0) {
                continue;
            }
            out.push_str(&format!("{:#?}\n", f.repr().unwrap()));
        }
        insta::assert_snapshot!(name.trim_end_matches(".pcapng"), out);
    }
}

#[test]
fn loss_capture_shows_retransmission() {
    // Under loss RXE's requester goes back: some request PSN appears twice.
    let mut psns = BTreeSet::new();
    let mut dup = false;
    for c in frames("rc_write_loss.pcapng") {
        let Ok(f) = RoceFrame::parse_ethernet(&c.data) else {
            continue;
        };
        if f.ib.opcode().is_request() {
            dup |= !psns.insert((f.ib.bth().dest_qp(), f.ib.bth().psn().value()));
        }
    }
    assert!(dup, "no retransmitted request PSN in the loss capture");
}
