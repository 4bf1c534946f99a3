//! Two devices on loopback addresses talk RoCEv2 over real UDP sockets.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use burst_io::{LossyPort, UdpPort};
use burst_mem::Access;
use burst_transport::*;
use burst_verbs::engine::{Context, CqId, Engine, EngineOptions};
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn};

mod common;
use common::connect_rc;

const ALL: Access = Access(1 | 2 | 4 | 8);

fn wait(
    a: &Context,
    qa: CqId,
    b: &Context,
    qb: CqId,
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
    // Loss from a wrapper port: the engine has no loss code of its own.
    let lossy = |ip, every| {
        let udp = UdpPort::bind(IpAddr::V4(ip)).unwrap();
        Engine::with_port(LossyPort::new(udp, every), EngineOptions::new(Mtu::Mtu4096)).unwrap()
    };
    let ea = lossy(Ipv4Addr::new(127, 0, 80, 1), 13);
    let eb = lossy(Ipv4Addr::new(127, 0, 80, 2), 17);
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, 64).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, 64).unwrap();
    let (ga, gb) = (a.gid(), b.gid());
    connect_rc(&a, qa, gb, qb, (0xfffff0, 77), Mtu::Mtu1024);
    connect_rc(&b, qb, ga, qa, (77, 0xfffff0), Mtu::Mtu1024);

    let mut src: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; 200_000];
    let mut rbuf = vec![0u8; 200_000];
    let mut atom = vec![0u64; 1];
    let mut orig = vec![0u64; 1];
    // SAFETY: every buffer outlives both engines (dropped before them below).
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
        &RecvWr {
            wr_id: 50,
            sg_list: [Sge {
                addr: kd.addr,
                length: 100_000,
                lkey: kd.lkey,
            }]
            .into(),
        },
    )
    .unwrap();
    let sge = |k: burst_mem::MrKeys, off: u64, len: u32| {
        [Sge {
            addr: k.addr + off,
            length: len,
            lkey: k.lkey,
        }]
    };
    a.post_send(
        qa,
        &SendWr::new(1, SendOp::SendWithImm(0x1234), sge(ks, 0, 100_000)),
    )
    .unwrap();
    a.post_send(
        qa,
        &SendWr::new(
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
        &SendWr::new(
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
        &SendWr::new(
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
    let (wa, wb) = wait(&a, cqa, &b, cqb, 4, 1);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(
        (wb[0].wr_id, wb[0].byte_len, wb[0].imm_data),
        (50, 100_000, Some(0x1234))
    );
    // The losses show in the QP counters the device sums: A retransmitted
    // after sequence NAKs or timeouts, B saw out-of-sequence requests.
    let (da, db) = (a.counters().unwrap(), b.counters().unwrap());
    let (ca, cb) = (da.qps, db.qps);
    assert!(
        ca.retransmits_started > 0 && ca.retransmitted_pkts > 0,
        "{ca:?}"
    );
    assert!(ca.rcvd_seq_err + ca.completer_retry_err > 0, "{ca:?}");
    assert!(cb.out_of_seq_request > 0 && cb.send_seq_nak > 0, "{cb:?}");
    assert_eq!(cb.rcvd_seq_err, ca.send_seq_nak, "no requests from B to A");
    // A sent the SEND's and the WRITE's payload at least once (plus what
    // it resent: how much depends on the loss draws and the congestion
    // window, so it is not a bound).
    assert!(
        ca.sent_bytes >= 2 * 100_000 && cb.rcvd_bytes >= 100_000,
        "{ca:?} {cb:?}"
    );
    assert_eq!(ca.send_err + cb.send_err + ca.rcvd_err_nak, 0);
    // burst to burst: every ICRC verifies (both send IP ID 0)
    assert_eq!(da.icrc_unverified + db.icrc_unverified, 0);
    drop((ea, eb));
    assert_eq!(dst, src);
    assert_eq!(rbuf, src);
    assert_eq!((atom[0], orig[0]), (42, 0));
}

/// Two QPs of the same device (same GID) connected to each other, as RNICs
/// and RXE allow: RC and UC SEND/WRITE, and UD datagrams.
#[test]
fn qps_on_one_device_talk_to_each_other() {
    let e = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 84, 1)), Mtu::Mtu1024).unwrap();
    let d = e.context();
    let pd = d.alloc_pd();
    let mut src: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; 3 * 5000 + 2048];
    // SAFETY: both buffers outlive the engine (dropped first).
    let (ks, kd) = unsafe {
        (
            d.reg_mr(pd, src.as_mut_ptr(), src.len(), ALL).unwrap(),
            d.reg_mr(pd, dst.as_mut_ptr(), dst.len(), ALL).unwrap(),
        )
    };
    let gid = d.gid();
    let mut got = Vec::new();
    for (n, t) in [QpType::Rc, QpType::Uc].into_iter().enumerate() {
        let (cqa, cqb) = (d.create_cq(16), d.create_cq(16));
        let qa = d.create_qp(t, pd, cqa, cqa, 16).unwrap();
        let qb = d.create_qp(t, pd, cqb, cqb, 16).unwrap();
        let mut p = RcParams::new(Psn::new(1), Mtu::Mtu1024);
        p.access = QpAccess {
            remote_write: true,
            remote_read: true,
            remote_atomic: true,
        };
        if t == QpType::Uc {
            // UC has no RTR/RTS timers or read resources: plain transitions.
            for (me, peer) in [(qa, qb), (qb, qa)] {
                let ah = d.create_ah(gid).unwrap();
                d.modify_qp(
                    me,
                    &QpAttr {
                        state: Some(QpState::Init),
                        pkey_index: Some(0),
                        port: Some(1),
                        access: Some(p.access),
                        ..Default::default()
                    },
                )
                .unwrap()
                .unwrap();
                d.modify_qp(
                    me,
                    &QpAttr {
                        state: Some(QpState::Rtr),
                        ah: Some(ah),
                        path_mtu: Some(Mtu::Mtu1024),
                        dest_qpn: Some(peer),
                        rq_psn: Some(Psn::new(1)),
                        ..Default::default()
                    },
                )
                .unwrap()
                .unwrap();
                d.modify_qp(
                    me,
                    &QpAttr {
                        state: Some(QpState::Rts),
                        sq_psn: Some(Psn::new(1)),
                        ..Default::default()
                    },
                )
                .unwrap()
                .unwrap();
            }
        } else {
            d.connect_rc(
                qa,
                &RcPeer {
                    gid,
                    qpn: qb,
                    psn: Psn::new(1),
                },
                &p,
            )
            .unwrap();
            d.connect_rc(
                qb,
                &RcPeer {
                    gid,
                    qpn: qa,
                    psn: Psn::new(1),
                },
                &p,
            )
            .unwrap();
        }
        let off = n as u64 * 5000;
        d.post_recv(
            qb,
            &RecvWr {
                wr_id: 7,
                sg_list: [Sge {
                    addr: kd.addr + off,
                    length: 5000,
                    lkey: kd.lkey,
                }]
                .into(),
            },
        )
        .unwrap();
        d.post_send(
            qa,
            &SendWr::new(
                1,
                SendOp::Send,
                [Sge {
                    addr: ks.addr,
                    length: 5000,
                    lkey: ks.lkey,
                }],
            ),
        )
        .unwrap();
        let (sa, rb) = {
            let deadline = Instant::now() + Duration::from_secs(10);
            let (mut sa, mut rb) = (None, None);
            while (sa.is_none() || rb.is_none()) && Instant::now() < deadline {
                if let Some(w) = d.poll_cq(cqa) {
                    sa = Some(w);
                }
                if let Some(w) = d.poll_cq(cqb) {
                    rb = Some(w);
                }
            }
            (
                sa.expect("send completion"),
                rb.expect("receive completion"),
            )
        };
        assert_eq!(sa.status, WcStatus::Success, "{t:?}");
        assert_eq!((rb.status, rb.byte_len), (WcStatus::Success, 5000), "{t:?}");
        got.push(t);
    }
    // UD: a datagram to another UD QP of the same device.
    let (ucqa, ucqb) = (d.create_cq(16), d.create_cq(16));
    let ua = d.create_qp(QpType::Ud, pd, ucqa, ucqa, 16).unwrap();
    let ub = d.create_qp(QpType::Ud, pd, ucqb, ucqb, 16).unwrap();
    for q in [ua, ub] {
        for a in burst_verbs::ud_transitions(0x22, Psn::new(0)) {
            d.modify_qp(q, &a).unwrap().unwrap();
        }
    }
    let ah = d.create_ah(gid).unwrap();
    d.post_recv(
        ub,
        &RecvWr {
            wr_id: 9,
            sg_list: [Sge {
                addr: kd.addr + 10_000,
                length: 2048,
                lkey: kd.lkey,
            }]
            .into(),
        },
    )
    .unwrap();
    let mut wr = SendWr::new(
        3,
        SendOp::Send,
        [Sge {
            addr: ks.addr,
            length: 1000,
            lkey: ks.lkey,
        }],
    );
    wr.ud = Some(UdDest {
        remote_qpn: ub,
        remote_qkey: 0x22,
        ah,
    });
    d.post_send(ua, &wr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut r = None;
    while r.is_none() && Instant::now() < deadline {
        r = d.poll_cq(ucqb);
    }
    let r = r.expect("UD receive");
    assert_eq!(
        (r.status, r.byte_len, r.src_qp, r.grh),
        (WcStatus::Success, 1040, ua, Some(NetworkHeader::Ipv4))
    );
    drop((d, e));
    assert_eq!(&dst[..5000], &src[..]);
    assert_eq!(&dst[5000..10_000], &src[..]);
    assert_eq!(&dst[10_040..11_040], &src[..1000]);
    assert_eq!(got, [QpType::Rc, QpType::Uc]);
}

#[test]
fn queries_report_what_the_stack_enforces() {
    let e = Engine::start(
        IpAddr::V4(Ipv4Addr::new(127, 0, 86, 1)),
        burst_verbs::active_mtu_for(1500),
    )
    .unwrap();
    let d = e.context();
    let a = d.query_device();
    assert_eq!(a.vendor_id, burst_verbs::VENDOR_ID);
    assert_eq!(a.max_qp_rd_atom, u32::from(MAX_RD_ATOMIC));
    let p = d.query_port();
    assert!(p.active && p.link_layer_ethernet);
    assert_eq!(p.active_mtu, Mtu::Mtu1024, "RXE: 1500 -> 1024");
    assert_eq!(burst_verbs::active_mtu_for(9000), Mtu::Mtu4096);
    let gid = d.gid();
    assert_eq!(
        &gid[..12],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff],
        "IPv4-mapped RoCE v2 GID"
    );
    assert_eq!(&gid[12..], &[127, 0, 86, 1]);
}
