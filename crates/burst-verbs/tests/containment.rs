//! Faults inside the data plane are contained: the QP involved goes to the
//! error state with its work requests flushed and an asynchronous event,
//! the application does not unwind, and the device keeps serving the rest.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::engine::{Context, Engine};
use burst_verbs::{AsyncEvent, RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

mod common;
use common::{poll_n, readable};

/// `fast_fail`: a 1 ms ACK timeout and one retry, so a QP whose peer is
/// gone fails quickly; else the defaults (robust on a loaded machine).
fn connect(c: &Context, qpn: Qpn, peer_gid: [u8; 16], peer_qpn: Qpn, fast_fail: bool) {
    let mut p = RcParams::new(Psn::new(1), Mtu::Mtu1024);
    if fast_fail {
        p.timeout = 8;
        p.retry_cnt = 1;
    }
    let peer = RcPeer {
        gid: peer_gid,
        qpn: peer_qpn,
        psn: Psn::new(1),
    };
    let ah = c.create_ah(peer_gid).unwrap();
    for a in p.transitions(ah, &peer) {
        c.modify_qp(qpn, &a).unwrap().unwrap();
    }
}

#[test]
fn a_fault_handling_one_qp_fails_that_qp_only() {
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 88, 1)), Mtu::Mtu1024).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 88, 2)), Mtu::Mtu1024).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let mk = |fast_fail| {
        let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, 16).unwrap();
        let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, 16).unwrap();
        connect(&a, qa, b.gid(), qb, fast_fail);
        connect(&b, qb, a.gid(), qa, fast_fail);
        (qa, qb)
    };
    let (qa1, qb1) = mk(true);
    let (qa2, qb2) = mk(false);
    let mut sbuf = vec![9u8; 64];
    let mut rbuf = vec![0u8; 512];
    // SAFETY: both buffers outlive the engines (dropped first below).
    let (ks, kr) = unsafe {
        (
            a.reg_mr(pa, sbuf.as_mut_ptr(), 64, Access(1)).unwrap(),
            b.reg_mr(pb, rbuf.as_mut_ptr(), 512, Access(1)).unwrap(),
        )
    };
    let recv = |id: u64, off: u64| RecvWr {
        wr_id: id,
        sg_list: [Sge {
            addr: kr.addr + off,
            length: 128,
            lkey: kr.lkey,
        }]
        .into(),
    };
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
    for (i, q) in [(1, qb1), (2, qb1), (3, qb2)] {
        b.post_recv(q, &recv(i, i * 128)).unwrap();
    }
    let efd = b.async_fd().as_raw_fd();
    assert!(!readable(efd, 0), "no event yet");

    // The next packet for qb1 makes the data plane panic while handling it.
    b.debug_panic_on_packet_for(Some(qb1)).unwrap();
    a.post_send(qa1, &send(10)).unwrap();
    assert!(readable(efd, 10_000), "the async fd becomes readable");
    assert_eq!(
        b.take_async_event(),
        Some(AsyncEvent::Qp(qb1, QpEvent::Fatal))
    );
    assert_eq!(b.take_async_event(), None);
    assert!(!readable(efd, 0), "one count per event");
    assert_eq!(b.query_qp(qb1).unwrap().0, QpState::Err);
    // Its two receives are flushed.
    let flushed = poll_n(&b, cqb, 2);
    assert!(
        flushed.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{flushed:?}"
    );
    // The sender gets no answer: retries exhausted (retry_cnt 1).
    let wa = poll_n(&a, cqa, 1);
    assert_eq!(wa[0].status, WcStatus::RetryExcErr, "{wa:?}");

    // The device serves its other QP as before.
    b.debug_panic_on_packet_for(None).unwrap();
    a.post_send(qa2, &send(20)).unwrap();
    let wb = poll_n(&b, cqb, 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (3, WcStatus::Success, 64)
    );
    let wa = poll_n(&a, cqa, 1);
    assert_eq!((wa[0].wr_id, wa[0].status), (20, WcStatus::Success));
    assert_eq!(b.query_qp(qb2).unwrap().0, QpState::Rts);
    drop((ea, eb));
    assert_eq!(&rbuf[384..448], &[9u8; 64][..]);
}
