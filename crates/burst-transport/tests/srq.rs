//! Shared receive queues over the simulator: several QPs consume one SRQ.

use burst_transport::sim::{Access, Faults, World};
use burst_transport::*;
use burst_wire::{Mtu, Psn};

const MTU: Mtu = Mtu::Mtu1024;

/// Node 0: senders `a[i]`; node 1: receivers `b[i]`, all on one SRQ.
struct Setup {
    w: World,
    a: Vec<usize>,
    b: Vec<usize>,
    srq: usize,
}

fn setup(faults: Faults, pairs: usize, depth: u32) -> Setup {
    let mut w = World::new(11, 2, faults);
    let srq = w.add_srq(1, depth);
    let mut a = Vec::new();
    let mut b = Vec::new();
    for i in 0..pairs {
        let x = w.add_qp(0, QpType::Rc, MTU);
        let y = w.add_qp_on_srq(1, QpType::Rc, MTU, srq);
        w.connect(x, Some(y), MTU, Psn::new(10 * i as u32), Psn::new(500))
            .unwrap();
        a.push(x);
        b.push(y);
    }
    Setup { w, a, b, srq }
}

/// A receive WR of one SGE: `len` bytes at `addr` under `lkey`.
fn recv_wr(wr_id: u64, addr: u64, len: u32, lkey: u32) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: [Sge {
            addr,
            length: len,
            lkey,
        }]
        .into(),
    }
}

impl Setup {
    fn post_srq(&mut self, wr_id: u64, len: u32) -> (u32, u64) {
        let (k, addr) = self.w.mems[1].register(1, len as usize, Access::ALL);
        let wr = recv_wr(wr_id, addr, len, k);
        let (_, srq) = &mut self.w.srqs[self.srq];
        srq.post_recv(wr).unwrap();
        (k, addr)
    }

    fn send(&mut self, from: usize, wr_id: u64, data: &[u8]) {
        let (k, addr) = self.w.mems[0].register(1, data.len().max(1), Access::ALL);
        self.w.mems[0].bytes_mut(k)[..data.len()].copy_from_slice(data);
        let wr = SendWr::new(
            wr_id,
            SendOp::Send,
            [Sge {
                addr,
                length: data.len() as u32,
                lkey: k,
            }],
        );
        let (_, qp) = &mut self.w.qps[from];
        qp.post_send(wr, &mut self.w.mems[0]).unwrap();
    }

    fn recv_wcs(&self) -> usize {
        self.b.iter().map(|&b| self.w.completions[b].len()).sum()
    }
}

fn message(sender: usize, n: usize) -> Vec<u8> {
    (0..1000 + 700 * n)
        .map(|i| (i * 7 + sender * 31 + n) as u8)
        .collect()
}

#[test]
fn two_qps_consume_one_srq_in_arrival_order_under_loss() {
    let faults = Faults {
        loss: 0.05,
        reorder: 0.02,
        ..Default::default()
    };
    let mut s = setup(faults, 2, 64);
    let mut bufs = Vec::new();
    for id in 0..6u64 {
        bufs.push(s.post_srq(100 + id, 8192));
    }
    for n in 0..3 {
        for q in 0..2 {
            let a = s.a[q];
            s.send(a, (q * 10 + n) as u64, &message(q, n));
        }
    }
    let ok = s.w.run(5_000_000_000, |w| {
        (0..4).map(|i| w.completions[i].len()).sum::<usize>() >= 12
    });
    assert!(ok, "not all completions arrived");
    assert!(s.w.srqs[s.srq].1.is_empty());
    let mut used = Vec::new();
    for (q, &b) in s.b.iter().enumerate() {
        let wcs: Vec<_> = s.w.completions[b].drain(..).collect();
        assert_eq!(wcs.len(), 3, "QP {q} got {wcs:?}");
        for (n, wc) in wcs.iter().enumerate() {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.opcode, WcOpcode::Recv);
            // The completion names the QP that consumed the SRQ WQE.
            assert_eq!(wc.qp_num, s.w.qps[b].1.qpn());
            let idx = (wc.wr_id - 100) as usize;
            let want = message(q, n);
            assert_eq!(wc.byte_len as usize, want.len());
            let got = &s.w.mems[1].bytes(bufs[idx].0)[..want.len()];
            assert_eq!(got, &want[..], "QP {q} message {n} in WQE {idx}");
            used.push(wc.wr_id);
        }
    }
    used.sort_unstable();
    assert_eq!(used, (100..106).collect::<Vec<_>>(), "each WQE used once");
}

#[test]
fn empty_srq_rnr_naks_until_a_wqe_is_posted() {
    let mut s = setup(Faults::default(), 1, 8);
    let a = s.a[0];
    s.send(a, 1, &message(0, 0));
    // Nothing to receive into: the responder RNR-NAKs, the requester waits.
    s.w.run(2_000_000, |_| false);
    assert_eq!(s.recv_wcs(), 0);
    let b = s.b[0];
    assert!(s.w.qps[b].1.counters().send_rnr_err > 0);
    assert!(s.w.completions[a].is_empty(), "send must not complete yet");
    s.post_srq(7, 4096);
    assert!(s.w.run(1_000_000_000, |w| !w.completions[a].is_empty()));
    assert_eq!(s.w.completions[a][0].status, WcStatus::Success);
    assert_eq!(s.w.completions[b][0].wr_id, 7);
}

#[test]
fn qp_on_srq_refuses_post_recv_and_advertises_no_credits() {
    let mut s = setup(Faults::default(), 1, 8);
    let b = s.b[0];
    let (k, addr) = s.w.mems[1].register(1, 64, Access::ALL);
    let wr = recv_wr(1, addr, 64, k);
    let (_, qp) = &mut s.w.qps[b];
    assert!(matches!(qp.post_recv(wr), Err(VerbsError::InvalidValue(_))));
    // EINVAL, as RXE's post_recv answers for a QP on an SRQ.
    assert_eq!(VerbsError::InvalidValue("x").errno(), 22);

    // The ACK of a SEND into the SRQ carries the invalid credit code.
    s.post_srq(1, 4096);
    let a = s.a[0];
    s.send(a, 1, &message(0, 0));
    let mut acks = Vec::new();
    s.w.run(1_000_000_000, |w| {
        let now = w.now;
        while let Some(t) = w.qps[b].1.poll_transmit(now) {
            acks.extend(t.ib.aeth.map(|x| x.syndrome));
        }
        !acks.is_empty()
    });
    assert_eq!(
        acks,
        vec![burst_wire::Syndrome::Ack(burst_wire::Credits::UNLIMITED)]
    );
}

#[test]
fn limit_event_fires_once_when_the_srq_falls_below_it() {
    let mut s = setup(Faults::default(), 1, 8);
    for id in 0..4 {
        s.post_srq(id, 4096);
    }
    s.w.srqs[s.srq].1.set_limit(3).unwrap();
    assert!(
        s.w.srqs[s.srq].1.set_limit(9).is_err(),
        "limit beyond depth"
    );
    let a = s.a[0];
    s.send(a, 1, &message(0, 0));
    assert!(s.w.run(1_000_000_000, |w| !w.completions[a].is_empty()));
    // 3 left: not below the limit yet.
    assert!(!s.w.srqs[s.srq].1.take_limit_event());
    s.send(a, 2, &message(0, 1));
    assert!(s.w.run(1_000_000_000, |w| w.completions[a].len() >= 2));
    let srq = &mut s.w.srqs[s.srq].1;
    assert!(srq.take_limit_event(), "2 < 3 must fire");
    assert!(!srq.take_limit_event(), "fires once");
    assert_eq!(srq.limit(), 0, "and disarms");
}

#[test]
fn a_qp_in_error_leaves_the_srq_wqes_to_the_others() {
    let mut s = setup(Faults::default(), 2, 8);
    for id in 0..3 {
        s.post_srq(id, 4096);
    }
    let b0 = s.b[0];
    s.w.qps[b0]
        .1
        .modify(&QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        })
        .unwrap();
    s.w.run(1_000_000, |_| false);
    assert!(s.w.completions[b0].is_empty(), "no SRQ WQE flushed by QP 0");
    assert_eq!(s.w.srqs[s.srq].1.len(), 3);
    let a1 = s.a[1];
    s.send(a1, 1, &message(1, 0));
    assert!(s.w.run(1_000_000_000, |w| !w.completions[a1].is_empty()));
    let b1 = s.b[1];
    assert_eq!(s.w.completions[b1][0].status, WcStatus::Success);
    assert_eq!(s.w.srqs[s.srq].1.len(), 2);
}

#[test]
fn a_bad_lkey_in_an_srq_wqe_fails_the_qp_that_takes_it_not_the_post() {
    // As RXE: ibv_post_srq_recv takes the WQE; the QP that consumes it
    // completes it with LOC_PROT_ERR and NAKs the sender (remote
    // operational error); the SRQ's other WQEs stay for the other QPs.
    let mut s = setup(Faults::default(), 2, 8);
    let (k, addr) = s.w.mems[1].register(1, 4096, Access::ALL);
    let bad = recv_wr(66, addr, 4096, k ^ 0xff00);
    let (_, srq) = &mut s.w.srqs[s.srq];
    srq.post_recv(bad).unwrap();
    s.post_srq(67, 4096);
    let (a0, b0) = (s.a[0], s.b[0]);
    s.send(a0, 1, &message(0, 0));
    assert!(s.w.run(1_000_000_000, |w| !w.completions[a0].is_empty()));
    assert_eq!(s.w.completions[a0][0].status, WcStatus::RemOpErr);
    assert_eq!(s.w.completions[b0][0].wr_id, 66);
    assert_eq!(s.w.completions[b0][0].status, WcStatus::LocProtErr);
    assert_eq!(s.w.qps[b0].1.state(), QpState::Err);
    // The good WQE went to nobody yet, and serves the other pair.
    assert_eq!(s.w.srqs[s.srq].1.len(), 1);
    let (a1, b1) = (s.a[1], s.b[1]);
    s.send(a1, 2, &message(1, 0));
    assert!(s.w.run(1_000_000_000, |w| !w.completions[a1].is_empty()));
    assert_eq!(s.w.completions[a1][0].status, WcStatus::Success);
    assert_eq!(s.w.completions[b1][0].wr_id, 67);
}
