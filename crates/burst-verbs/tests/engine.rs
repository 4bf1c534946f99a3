//! The engine thread: applications post from several threads through rings
//! and doorbells, and read completions from CQ rings.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::engine::Engine;
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

mod common;
use common::{connect_rc, poll_n};

#[test]
fn two_threads_post_writes_and_sends_through_rings() {
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 1)), Mtu::Mtu4096).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 2)), Mtu::Mtu4096).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (scq, rcq) = (a.create_cq(256), b.create_cq(256));
    let qa = a.create_qp(QpType::Rc, pa, scq, scq, 256).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, rcq, rcq, 256).unwrap();
    connect_rc(&a, qa, b.gid(), qb, (10, 20), Mtu::Mtu4096);
    connect_rc(&b, qb, a.gid(), qa, (20, 10), Mtu::Mtu4096);

    let mut src: Vec<u8> = (0..64 * 1024u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    let mut dst = vec![0u8; 64 * 1024];
    // SAFETY: both buffers outlive the engines (dropped before them below).
    let (ks, kd) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), src.len(), Access(1 | 2 | 4 | 8))
                .unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), dst.len(), Access(1 | 2 | 4 | 8))
                .unwrap(),
        )
    };
    for i in 0..8u64 {
        b.post_recv(
            qb,
            &RecvWr {
                wr_id: 100 + i,
                sg_list: [Sge {
                    addr: kd.addr + i * 64,
                    length: 64,
                    lkey: kd.lkey,
                }]
                .into(),
            },
        )
        .unwrap();
    }
    // Two application threads share the QP's send ring (the MPSC doorbell).
    let a = Arc::new(a);
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let a = Arc::clone(&a);
            std::thread::spawn(move || {
                for k in 0..4u64 {
                    let off = 4096 + (t * 4 + k) * 4096;
                    let wr = SendWr::new(
                        t * 10 + k,
                        SendOp::Write {
                            remote_addr: kd.addr + off,
                            rkey: kd.rkey,
                        },
                        [Sge {
                            addr: ks.addr + off,
                            length: 4096,
                            lkey: ks.lkey,
                        }],
                    );
                    while a.post_send(qa, &wr).is_err() {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let w = poll_n(&a, scq, 8);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    // Inline SENDs: the bytes are captured at post time, then the buffer changes.
    for i in 0..8u64 {
        let mut wr = SendWr::new(
            50 + i,
            SendOp::Send,
            [Sge {
                addr: ks.addr + i * 64,
                length: 64,
                lkey: ks.lkey,
            }],
        );
        wr.inline = true;
        a.post_send(qa, &wr).unwrap();
    }
    let expected: Vec<u8> = src[..512].to_vec();
    src[..512].fill(0xee); // after the posts: must not reach the wire
    let w = poll_n(&a, scq, 8);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    let r = poll_n(&b, rcq, 8);
    assert_eq!(
        r.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (100..108).collect::<Vec<_>>()
    );
    assert!(a.counters().unwrap().sent_pkts > 0);
    drop((ea, eb));
    assert!(dst[..512] == expected[..], "inline SEND data differs");
    let pattern: Vec<u8> = (0..64 * 1024u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    assert!(
        dst[4096..4096 + 8 * 4096] == pattern[4096..4096 + 8 * 4096],
        "RDMA WRITE data differs"
    );
}

#[test]
fn completion_channel_wakes_a_waiting_thread_once_armed() {
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 85, 1)), Mtu::Mtu1024).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 85, 2)), Mtu::Mtu1024).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let ch = b.create_comp_channel().unwrap();
    assert!(ch.fd() >= 0);
    let scq = a.create_cq(16);
    let rcq = b.create_cq_with(16, Some(Arc::clone(&ch)));
    assert!(a.req_notify_cq(scq).is_err(), "no channel: EINVAL");
    let qa = a.create_qp(QpType::Rc, pa, scq, scq, 16).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, rcq, rcq, 16).unwrap();
    connect_rc(&a, qa, b.gid(), qb, (1, 2), Mtu::Mtu4096);
    connect_rc(&b, qb, a.gid(), qa, (2, 1), Mtu::Mtu4096);
    let mut sbuf = vec![7u8; 64];
    let mut rbuf = vec![0u8; 256];
    // SAFETY: both buffers outlive the engines (dropped first below).
    let (ks, kr) = unsafe {
        (
            a.reg_mr(pa, sbuf.as_mut_ptr(), 64, Access(1)).unwrap(),
            b.reg_mr(pb, rbuf.as_mut_ptr(), 256, Access(1)).unwrap(),
        )
    };
    for i in 0..2u64 {
        b.post_recv(
            qb,
            &RecvWr {
                wr_id: i,
                sg_list: [Sge {
                    addr: kr.addr + i * 128,
                    length: 128,
                    lkey: kr.lkey,
                }]
                .into(),
            },
        )
        .unwrap();
    }
    let send = |id| {
        SendWr::new(
            id,
            SendOp::Send,
            [Sge {
                addr: ks.addr,
                length: 64,
                lkey: ks.lkey,
            }],
        )
    };
    // Not armed: a completion arrives but raises no event.
    a.post_send(qa, &send(1)).unwrap();
    poll_n(&b, rcq, 1);
    assert_eq!(ch.get_cq_event(Duration::from_millis(200)), None);
    // Armed: a thread blocked on the channel wakes with the CQ.
    b.req_notify_cq(rcq).unwrap();
    let waiter = {
        let ch = Arc::clone(&ch);
        std::thread::spawn(move || ch.get_cq_event(Duration::from_secs(10)))
    };
    std::thread::sleep(Duration::from_millis(50));
    a.post_send(qa, &send(2)).unwrap();
    assert_eq!(waiter.join().unwrap(), Some(rcq));
    let wc = b
        .poll_cq(rcq)
        .expect("the completion that raised the event");
    assert_eq!((wc.wr_id, wc.byte_len), (1, 64));
    // One event per arming.
    assert_eq!(ch.get_cq_event(Duration::from_millis(100)), None);
    drop((ea, eb));
    assert_eq!(&rbuf[128..192], &[7u8; 64][..]);
}

#[test]
fn srq_shared_by_two_qps_through_typed_handles() {
    use burst_verbs::QpInit;
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 86, 1)), Mtu::Mtu1024).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 86, 2)), Mtu::Mtu1024).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (scq, rcq) = (a.create_cq(64), b.create_cq(64));
    let srq = b.create_srq(pb, 32, 1).unwrap();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for i in 0..2u32 {
        let qa = a
            .create_qp_with(&QpInit::new(QpType::Rc, pa), scq, scq)
            .unwrap();
        let mut init = QpInit::new(QpType::Rc, pb);
        init.srq = Some(srq.id());
        let qb = b.create_qp_with(&init, rcq, rcq).unwrap();
        connect_rc(&a, qa.qpn(), b.gid(), qb.qpn(), (100 * i, 7), Mtu::Mtu4096);
        connect_rc(&b, qb.qpn(), a.gid(), qa.qpn(), (7, 100 * i), Mtu::Mtu4096);
        senders.push(qa);
        receivers.push(qb);
    }
    let mut sbuf: Vec<u8> = (0..8 * 2048u32)
        .map(|i| (i * 13 + (i >> 11)) as u8)
        .collect();
    let mut rbuf = vec![0u8; 8 * 2048];
    // SAFETY: both buffers outlive the engines (dropped first below).
    let (ks, kr) = unsafe {
        (
            a.reg_mr(pa, sbuf.as_mut_ptr(), sbuf.len(), Access(1))
                .unwrap(),
            b.reg_mr(pb, rbuf.as_mut_ptr(), rbuf.len(), Access(1))
                .unwrap(),
        )
    };
    for i in 0..8u64 {
        srq.post_recv(&RecvWr {
            wr_id: 1000 + i,
            sg_list: [Sge {
                addr: kr.addr + i * 2048,
                length: 2048,
                lkey: kr.lkey,
            }]
            .into(),
        })
        .unwrap();
    }
    assert!(
        matches!(
            b.destroy_srq(srq.id()),
            Err(burst_verbs::engine::CreateError::Verbs(VerbsError::Busy(_)))
        ),
        "EBUSY while QPs use the SRQ"
    );
    for i in 0..8u64 {
        let wr = SendWr::new(
            i,
            SendOp::Send,
            [Sge {
                addr: ks.addr + i * 2048,
                length: 2000,
                lkey: ks.lkey,
            }],
        );
        senders[(i % 2) as usize].post_send(&wr).unwrap();
    }
    let s = poll_n(&a, scq, 8);
    assert!(s.iter().all(|w| w.status == WcStatus::Success), "{s:?}");
    let cq = b.cq(rcq).unwrap();
    let r = poll_n(&b, rcq, 8);
    assert!(cq.is_empty());
    let mut per_qp = [0; 2];
    for w in &r {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        assert_eq!(w.byte_len, 2000);
        let q = receivers.iter().position(|q| q.qpn() == w.qp_num).unwrap();
        per_qp[q] += 1;
    }
    assert_eq!(per_qp, [4, 4], "each QP consumed its messages from the SRQ");
    for q in &receivers {
        b.destroy_qp(q.qpn()).unwrap();
    }
    b.destroy_srq(srq.id()).unwrap();
    drop((ea, eb));
    // Every message landed whole in some SRQ buffer.
    let mut found = 0;
    for i in 0..8 {
        let msg = &sbuf[i * 2048..i * 2048 + 2000];
        if (0..8).any(|j| &rbuf[j * 2048..j * 2048 + 2000] == msg) {
            found += 1;
        }
    }
    assert_eq!(found, 8);
}

#[test]
fn start_up_errors_are_clear() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 87, 1));
    let first = Engine::start(ip, Mtu::Mtu1024).unwrap();
    let e = Engine::start(ip, Mtu::Mtu1024).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    let e = Engine::start(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 251)), Mtu::Mtu1024).unwrap_err();
    assert!(e.to_string().contains("not on this host"), "{e}");
    let c = first.context();
    assert_eq!(c.config().name, "burst0");
    assert_eq!(c.query_port().active_mtu, Mtu::Mtu1024);
    assert_eq!(c.query_device().vendor_id, burst_verbs::VENDOR_ID);
}

/// A work request is checked once, when posted, and refused there with the
/// errno rdma-core returns (EINVAL), never later as a completion.
#[test]
fn bad_work_requests_are_refused_at_post_with_rdma_cores_errno() {
    use burst_verbs::engine::PostError;
    use burst_verbs::{QpCaps, QpInit};
    let e = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 9)), Mtu::Mtu4096).unwrap();
    let c = e.context();
    let pd = c.alloc_pd();
    let cq = c.create_cq(16);
    let mut init = QpInit::new(QpType::Uc, pd);
    init.caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = c.create_qp_with(&init, cq, cq).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives its registration (deregistered below).
    let k = unsafe { c.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access(1)) }.unwrap();
    let sge = |len| Sge {
        addr: k.addr,
        length: len,
        lkey: k.lkey,
    };
    let refused = |r: Result<(), PostError>| {
        let e = r.expect_err("refused at post");
        assert!(matches!(e, PostError::Refused(_)), "{e:?}");
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    };
    // UC offers no READ.
    let read = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: 0,
            rkey: 1,
        },
        [sge(8)],
    );
    refused(qp.post_send(&read));
    // Three SGEs on a QP created for two.
    refused(qp.post_send(&SendWr::new(2, SendOp::Send, [sge(1), sge(1), sge(1)])));
    refused(qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: [sge(1), sge(1), sge(1)].into(),
    }));
    // 100 inline bytes on a QP created for 64.
    let mut inl = SendWr::new(4, SendOp::Send, [sge(100)]);
    inl.inline = true;
    refused(qp.post_send(&inl));
    // Nothing reached the transport: no completion appears.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(c.poll_cq(cq), None);
    c.dereg_mr(k.lkey).unwrap();
    drop(e);
}

#[test]
fn posts_follow_the_qp_state_and_the_queue_depth_like_rxe() {
    use burst_verbs::engine::PostError;
    use burst_verbs::{QpCaps, QpInit};
    let e = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 11)), Mtu::Mtu4096).unwrap();
    let c = e.context();
    let pd = c.alloc_pd();
    let cq = c.create_cq(64);
    let mut init = QpInit::new(QpType::Rc, pd);
    init.caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = c.create_qp_with(&init, cq, cq).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives its registration (deregistered below).
    let k = unsafe { c.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access(1)) }.unwrap();
    let sge = Sge {
        addr: k.addr,
        length: 8,
        lkey: k.lkey,
    };
    let send = |id| qp.post_send(&SendWr::new(id, SendOp::Send, [sge]));
    let recv = |id| {
        qp.post_recv(&RecvWr {
            wr_id: id,
            sg_list: [sge].into(),
        })
    };
    let errno = |r: Result<(), PostError>| r.expect_err("refused at post").errno();
    // RESET: nothing may be posted.
    assert_eq!(errno(send(1)), libc::EINVAL);
    assert_eq!(errno(recv(2)), libc::EINVAL);
    // A peer that never answers: sends stay outstanding until the retries
    // run out.
    let peer = RcPeer {
        gid: burst_wire::gid_of(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 12))),
        qpn: Qpn::new(0x99).unwrap(),
        psn: Psn::new(1),
    };
    let mut p = RcParams::new(Psn::new(1), Mtu::Mtu1024);
    p.timeout = 14;
    p.retry_cnt = 1;
    let ah = c.create_ah(peer.gid).unwrap();
    let steps = p.transitions(ah, &peer);
    qp.modify(&steps[0]).unwrap();
    // INIT: receives yes, as many as the queue holds; sends not yet.
    for id in 10..14 {
        recv(id).unwrap();
    }
    assert_eq!(
        errno(recv(14)),
        libc::ENOMEM,
        "a fifth receive in a queue of 4"
    );
    assert_eq!(errno(send(15)), libc::EINVAL, "a send in INIT");
    qp.modify(&steps[1]).unwrap();
    assert_eq!(errno(send(16)), libc::EINVAL, "a send in RTR");
    qp.modify(&steps[2]).unwrap();
    for id in 20..24 {
        send(id).unwrap();
    }
    assert_eq!(
        errno(send(24)),
        libc::ENOMEM,
        "a fifth send in a queue of 4"
    );
    // Retries exhausted: the QP fails, its WRs complete in error, and the
    // queues have room again; posts in ERR are taken and flushed.
    let done = poll_n(&c, cq, 8);
    assert!(
        done.iter().all(|w| w.status != WcStatus::Success),
        "{done:?}"
    );
    send(30).unwrap();
    recv(31).unwrap();
    let flushed = poll_n(&c, cq, 2);
    assert!(
        flushed.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{flushed:?}"
    );
    // Back to RESET: refused again.
    qp.modify(&QpAttr {
        state: Some(QpState::Reset),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(errno(recv(32)), libc::EINVAL);
    // RESET discards posted WRs without completions: their places are
    // free again once the QP is reused.
    let reset = QpAttr {
        state: Some(QpState::Reset),
        ..Default::default()
    };
    qp.modify(&steps[0]).unwrap();
    for id in 40..44 {
        recv(id).unwrap();
    }
    qp.modify(&reset).unwrap();
    qp.modify(&steps[0]).unwrap();
    for id in 50..54 {
        recv(id).unwrap();
    }
    assert_eq!(errno(recv(54)), libc::ENOMEM);
    c.dereg_mr(k.lkey).unwrap();
    drop(e);
}

/// A CQ too small for the completions coming (nobody polls) raises
/// IBV_EVENT_CQ_ERR once, as RXE on overflow; unlike RXE nothing is lost:
/// every completion arrives, in order, as the application polls.
#[test]
fn a_full_cq_raises_cq_err_once_and_loses_nothing() {
    let e = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 206, 1)), Mtu::Mtu1024).unwrap();
    let c = e.context();
    let pd = c.alloc_pd();
    let cq = c.create_cq(2);
    let q = c.create_qp(QpType::Ud, pd, cq, cq, 32).unwrap();
    for a in burst_verbs::ud_transitions(0x11, Psn::new(0)) {
        c.modify_qp(q, &a).unwrap().unwrap();
    }
    let ah = c.create_ah(c.gid()).unwrap();
    let mut buf = vec![1u8; 64];
    // SAFETY: `buf` outlives the engine (dropped after it below).
    let mr = unsafe { c.reg_mr(pd, buf.as_mut_ptr(), 64, Access(1)) }.unwrap();
    for i in 0..20u64 {
        let mut wr = SendWr::new(
            i,
            SendOp::Send,
            [Sge {
                addr: mr.addr,
                length: 64,
                lkey: mr.lkey,
            }],
        );
        // To a QPN nobody has: a UD send completes when it leaves.
        wr.ud = Some(UdDest {
            remote_qpn: Qpn::new(0x999).unwrap(),
            remote_qkey: 0x11,
            ah,
        });
        c.post_send(q, &wr).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ev = None;
    while ev.is_none() && Instant::now() < deadline {
        ev = c.take_async_event();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ev, Some(burst_verbs::AsyncEvent::CqError(cq)));
    let ids: Vec<u64> = poll_n(&c, cq, 20).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>(), "all, in order");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(c.take_async_event(), None, "one event for the overrun");
    drop((c, e));
    drop(buf);
}

/// A QP reset to be used again, or destroyed, leaves none of its
/// completions in its CQ to poll (as mlx5's provider cleans the CQ); the
/// other QPs' completions and the QP's own later ones stay.
#[test]
fn a_reset_or_destroyed_qp_leaves_no_completion_to_poll() {
    use burst_verbs::{QpAttr, QpInit};
    let e = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 13)), Mtu::Mtu4096).unwrap();
    let c = e.context();
    let pd = c.alloc_pd();
    let cq = c.create_cq(64);
    let q = c.cq(cq).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives the engine's use of it (the QPs are in error).
    let k = unsafe { c.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access(1)) }.unwrap();
    let recv = |id| RecvWr {
        wr_id: id,
        sg_list: [Sge {
            addr: k.addr,
            length: 8,
            lkey: k.lkey,
        }]
        .into(),
    };
    let state = |s| QpAttr {
        state: Some(s),
        ..QpAttr::default()
    };
    let peer = RcPeer {
        gid: burst_wire::gid_of(IpAddr::V4(Ipv4Addr::new(127, 0, 83, 14))),
        qpn: Qpn::new(0x99).unwrap(),
        psn: Psn::new(1),
    };
    let init = c
        .create_ah(peer.gid)
        .map(|ah| RcParams::new(Psn::new(1), Mtu::Mtu1024).transitions(ah, &peer)[0]);
    let init = init.unwrap();
    // Three QPs on one CQ, each with receives flushed into it.
    let qps: Vec<_> = (0..3)
        .map(|i| {
            let qp = c
                .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
                .unwrap();
            qp.modify(&init).unwrap();
            for n in 0..2 {
                qp.post_recv(&recv(10 * i + n)).unwrap();
            }
            qp.modify(&state(QpState::Err)).unwrap();
            qp
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while q.settled_len() < 6 {
        assert!(Instant::now() < deadline, "flushes never came");
    }
    // QP 0 reset, QP 2 destroyed: only QP 1's two flushes are polled.
    qps[0].modify(&state(QpState::Reset)).unwrap();
    let gone = qps[2].qpn();
    c.destroy_qp(gone).unwrap();
    let ids: Vec<u64> = std::iter::from_fn(|| q.poll()).map(|w| w.wr_id).collect();
    assert_eq!(ids, [10, 11]);
    // QP 0 used again: its new completions are polled.
    qps[0].modify(&init).unwrap();
    qps[0].post_recv(&recv(7)).unwrap();
    qps[0].modify(&state(QpState::Err)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let wc = loop {
        if let Some(w) = q.poll() {
            break w;
        }
        assert!(Instant::now() < deadline, "the new flush never came");
    };
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushErr));
    assert!(q.poll().is_none());
    drop(buf);
}
