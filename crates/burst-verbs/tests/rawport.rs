//! The engine over a whole-frame port ([`burst_io::raw::RawPort`]): burst
//! builds Ethernet, IP and UDP itself, resolves its peer with ARP of its
//! own, and checks every received ICRC over the headers as they came (their
//! CRC from the port, the rest in the pass that places the payload).
//! Two engines joined by an in-memory link, on the wall clock.

use std::time::{Duration, Instant};

use burst_io::raw::{MemLink, RawPort, Resolution};
use burst_mem::Access;
use burst_transport::*;
use burst_verbs::engine::{Context, Drive, Engine, EngineOptions};
use burst_verbs::{QpInit, RcParams, RcPeer};
use burst_wire::{Mtu, Psn};

mod common;
use common::CorruptingPort;

const ALL: Access = Access(1 | 2 | 4 | 8);

fn engine(link: MemLink, ip: &str) -> (Engine, Context) {
    engine_over(RawPort::new(link, ip.parse().unwrap(), Resolution::Own))
}

fn engine_over(port: impl burst_io::Port + Send + 'static) -> (Engine, Context) {
    let mut o = EngineOptions::new(Mtu::Mtu4096);
    o.drive = Drive::Caller;
    let e = Engine::with_port(port, o).unwrap();
    let c = e.context();
    (e, c)
}

#[test]
fn rc_send_write_and_read_over_whole_frames_with_arp() {
    transfer("198.18.0.1", "198.18.0.2", false);
}

#[test]
fn rc_over_ipv6_whole_frames_with_neighbour_discovery() {
    transfer("fd00::1", "fd00::2", false);
}

/// The links lend their frames (as DPDK's mbufs): every packet is built
/// in the frame it leaves in.
#[test]
fn rc_over_whole_frames_built_in_the_links_lent_frames() {
    transfer("198.18.0.1", "198.18.0.2", true);
    transfer("fd00::1", "fd00::2", true);
}

/// A payload the receiver placed while it checked the ICRC (the headers'
/// CRC from the port) is dropped when the check fails, and the resent one
/// lands: every byte of the SEND, WRITE and READ right.
#[test]
fn a_payload_placed_while_checked_over_whole_frames_is_dropped_when_corrupt_and_resent() {
    use burst_wire::Opcode;
    let hit = vec![
        (Opcode::RC_SEND_MIDDLE, 5),
        (Opcode::RC_RDMA_WRITE_MIDDLE, 20),
    ];
    let (ca, cb) = exchange("198.18.0.1", "198.18.0.2", false, hit);
    assert_eq!(cb.icrc_errors, 2, "{cb:?}");
    assert!(ca.qps.retransmitted_pkts >= 2, "{ca:?}");
    assert!(cb.copy.placed_fused_bytes > 100_000, "{:?}", cb.copy);
}

fn transfer(ipa: &str, ipb: &str, lends: bool) {
    let (ca, cb) = exchange(ipa, ipb, lends, Vec::new());
    // Every packet's ICRC was verified over the real headers (their CRC
    // from the port): none solved for, none unverified, none bad.
    for c in [&ca, &cb] {
        assert!(c.icrc_verified > 70, "{c:?}");
        assert_eq!(
            c.icrc_id_solved + c.icrc_unverified + c.icrc_errors,
            0,
            "{c:?}"
        );
        assert_eq!(c.port.rx_malformed + c.port.tx_unresolved, 0, "{c:?}");
        assert_eq!(c.port.resolved, 1, "{c:?}");
    }
    // The receiver checked most of the SEND's and the WRITE's payload in the
    // pass that placed it (the headers' CRC from the port).
    assert!(cb.copy.placed_fused_bytes > 100_000, "{cb:?}");
    // The requester asked with ARP and held its first packet; the responder
    // answered and learned the requester from the request.
    assert_eq!(
        (ca.port.arp_requests, cb.port.arp_replies),
        (1, 1),
        "{:?} {:?}",
        ca.port,
        cb.port
    );
    assert!(ca.port.tx_held >= 1, "{:?}", ca.port);
}

/// A SEND of 100,000 bytes, a WRITE of 200,000 and a READ of them back
/// between two engines over whole frames (B's received packets corrupted
/// as `hit` says), every byte checked; the two devices' counters.
fn exchange(
    ipa: &str,
    ipb: &str,
    lends: bool,
    hit: Vec<(burst_wire::Opcode, usize)>,
) -> (burst_verbs::DeviceCounters, burst_verbs::DeviceCounters) {
    let (mut la, mut lb) = MemLink::pair([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    (la.lends, lb.lends) = (lends, lends);
    let (_ea, a) = engine(la, ipa);
    let port_b = RawPort::new(lb, ipb.parse().unwrap(), Resolution::Own);
    let (_eb, b) = engine_over(CorruptingPort::new(port_b, hit));
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a
        .create_qp_with(&QpInit::new(QpType::Rc, pa), cqa, cqa)
        .unwrap();
    let qb = b
        .create_qp_with(&QpInit::new(QpType::Rc, pb), cqb, cqb)
        .unwrap();
    let params = |psn| {
        let mut p = RcParams::new(Psn::new(psn), Mtu::Mtu4096);
        p.access = QpAccess {
            remote_write: true,
            remote_read: true,
            remote_atomic: true,
        };
        p.timeout = 14;
        p.rd_atomic = 4;
        p
    };
    qa.connect_rc(
        &RcPeer {
            gid: b.gid(),
            qpn: qb.qpn(),
            psn: Psn::new(5),
        },
        &params(5),
    )
    .unwrap();
    qb.connect_rc(
        &RcPeer {
            gid: a.gid(),
            qpn: qa.qpn(),
            psn: Psn::new(5),
        },
        &params(5),
    )
    .unwrap();

    let size = 300_000usize;
    let mut src: Vec<u8> = (0..size as u32).map(|i| (i * 13) as u8).collect();
    let mut dst = vec![0u8; size];
    let mut back = vec![0u8; size];
    // SAFETY: the buffers outlive the engines' use of them (the engines
    // drop at the end of the test, after the last poll).
    let (ks, kb, kd) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), size, ALL).unwrap(),
            a.reg_mr(pa, back.as_mut_ptr(), size, ALL).unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), size, ALL).unwrap(),
        )
    };
    let sge = |k: burst_mem::MrKeys, off: u64, len: usize| {
        [Sge {
            addr: k.addr + off,
            length: len as u32,
            lkey: k.lkey,
        }]
        .into()
    };
    qb.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: sge(kd, 0, 100_000),
    })
    .unwrap();
    qa.post_send(&SendWr::new(1, SendOp::Send, sge(ks, 0, 100_000)))
        .unwrap();
    let write = SendOp::Write {
        remote_addr: kd.addr + 100_000,
        rkey: kd.rkey,
    };
    qa.post_send(&SendWr::new(2, write, sge(ks, 100_000, 200_000)))
        .unwrap();
    let read = SendOp::Read {
        remote_addr: kd.addr,
        rkey: kd.rkey,
    };
    qa.post_send(&SendWr::new(3, read, sge(kb, 0, size)))
        .unwrap();

    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(20);
    while (wa.len() < 3 || wb.is_empty()) && Instant::now() < end {
        a.progress();
        b.progress();
        while let Some(w) = a.take_completion(cqa) {
            wa.push(w);
        }
        while let Some(w) = b.take_completion(cqb) {
            wb.push(w);
        }
    }
    assert_eq!(wa.len(), 3, "requester completions {wa:?}");
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (9, WcStatus::Success, 100_000)
    );
    assert!(dst == src, "SEND and WRITE placed every byte");
    assert!(back == src, "READ brought every byte back");

    (a.counters().unwrap(), b.counters().unwrap())
}
