//! Two devices on loopback addresses talk RoCEv2 over real UDP sockets.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::{Device, RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn connect(
    d: &mut Device,
    qpn: Qpn,
    peer_gid: [u8; 16],
    peer_qpn: Qpn,
    my_psn: u32,
    peer_psn: u32,
) {
    let mut p = RcParams::new(Psn::new(my_psn), Mtu::Mtu1024);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    p.timeout = 12;
    p.min_rnr_timer = 1;
    p.rd_atomic = 4;
    d.connect_rc(
        qpn,
        RcPeer {
            gid: peer_gid,
            qpn: peer_qpn,
            psn: Psn::new(peer_psn),
        },
        &p,
    )
    .unwrap();
}

fn wait(
    a: &mut Device,
    qa: Qpn,
    b: &mut Device,
    qb: Qpn,
    na: usize,
    nb: usize,
) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while (ra.len() < na || rb.len() < nb) && Instant::now() < deadline {
        if let Some(w) = a.poll_cq(qa) {
            ra.push(w);
        }
        if let Some(w) = b.poll_cq(qb) {
            rb.push(w);
        }
    }
    assert!(ra.len() >= na && rb.len() >= nb, "timed out: {ra:?} {rb:?}");
    (ra, rb)
}

#[test]
fn rc_send_write_read_atomic_over_udp_with_loss() {
    let mut a = Device::open(IpAddr::V4(Ipv4Addr::new(127, 0, 80, 1)), Mtu::Mtu4096).unwrap();
    let mut b = Device::open(IpAddr::V4(Ipv4Addr::new(127, 0, 80, 2)), Mtu::Mtu4096).unwrap();
    a.set_drop_every(13);
    b.set_drop_every(17);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let qa = a.create_qp(QpType::Rc, pa);
    let qb = b.create_qp(QpType::Rc, pb);
    let (ga, gb) = (a.gid(), b.gid());
    connect(&mut a, qa, gb, qb, 0xfffff0, 77);
    connect(&mut b, qb, ga, qa, 77, 0xfffff0);

    let mut src: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; 200_000];
    let mut rbuf = vec![0u8; 200_000];
    let mut atom = vec![0u64; 1];
    let mut orig = vec![0u64; 1];
    // SAFETY: every buffer outlives both devices (dropped at the end of the test).
    let (ks, kd, kr, ka, ko) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), src.len(), ALL).unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), dst.len(), ALL).unwrap(),
            a.reg_mr(pa, rbuf.as_mut_ptr(), rbuf.len(), ALL).unwrap(),
            b.reg_mr(pb, atom.as_mut_ptr().cast(), 8, ALL).unwrap(),
            a.reg_mr(pa, orig.as_mut_ptr().cast(), 8, ALL).unwrap(),
        )
    };
    b.post_recv(
        qb,
        RecvWr {
            wr_id: 50,
            sg_list: vec![Sge {
                addr: kd.addr,
                length: 100_000,
                lkey: kd.lkey,
            }],
        },
    )
    .unwrap();
    let sge = |k: burst_mem::MrKeys, off: u64, len: u32| {
        vec![Sge {
            addr: k.addr + off,
            length: len,
            lkey: k.lkey,
        }]
    };
    a.post_send(
        qa,
        SendWr::new(1, SendOp::SendWithImm(0x1234), sge(ks, 0, 100_000)),
    )
    .unwrap();
    a.post_send(
        qa,
        SendWr::new(
            2,
            SendOp::Write {
                remote_addr: kd.addr + 100_000,
                rkey: kd.rkey,
            },
            sge(ks, 100_000, 100_000),
        ),
    )
    .unwrap();
    a.post_send(
        qa,
        SendWr::new(
            3,
            SendOp::Read {
                remote_addr: kd.addr,
                rkey: kd.rkey,
            },
            sge(kr, 0, 200_000),
        ),
    )
    .unwrap();
    a.post_send(
        qa,
        SendWr::new(
            4,
            SendOp::FetchAdd {
                remote_addr: ka.addr,
                rkey: ka.rkey,
                add: 42,
            },
            sge(ko, 0, 8),
        ),
    )
    .unwrap();
    let (wa, wb) = wait(&mut a, qa, &mut b, qb, 4, 1);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(
        (wb[0].wr_id, wb[0].byte_len, wb[0].imm_data),
        (50, 100_000, Some(0x1234))
    );
    assert!(a.counters().test_dropped > 0 && b.counters().test_dropped > 0);
    // burst to burst: every ICRC verifies (both send IP ID 0)
    assert_eq!(
        a.counters().icrc_unverified + b.counters().icrc_unverified,
        0
    );
    drop((a, b));
    assert_eq!(dst, src);
    assert_eq!(rbuf, src);
    assert_eq!((atom[0], orig[0]), (42, 0));
}
