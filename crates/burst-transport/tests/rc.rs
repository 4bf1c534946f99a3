//! RC scenarios, one behaviour each, over the simulator's world.

use burst_transport::sim::{Access, Faults, World};
use burst_transport::*;
use burst_wire::{Mtu, Opcode, Psn};

mod common;
use common::Pair;

fn pair(faults: Faults, mtu: Mtu, psn_a: u32) -> Pair {
    Pair::connected(7, faults, mtu, psn_a)
}

impl Pair {
    fn post_send(&mut self, wr: SendWr) {
        let (n, qp) = &mut self.w.qps[self.a];
        qp.post_send(wr, &mut self.w.mems[*n]).unwrap();
    }
    fn post_recv(&mut self, wr: RecvWr) {
        let (_, qp) = &mut self.w.qps[self.b];
        qp.post_recv(wr).unwrap();
    }
    fn run(
        &mut self,
        send_wcs: usize,
        recv_wcs: usize,
    ) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
        let (a, b) = (self.a, self.b);
        let ok = self.w.run(10_000_000_000, |w| {
            w.completions[a].len() >= send_wcs && w.completions[b].len() >= recv_wcs
        });
        let sa: Vec<_> = self.w.completions[a].drain(..).collect();
        let sb: Vec<_> = self.w.completions[b].drain(..).collect();
        assert!(
            ok,
            "not done: a={sa:?} b={sb:?} a={:?} b={:?}",
            self.w.qps[a].1.counters(),
            self.w.qps[b].1.counters()
        );
        (sa, sb)
    }
}

#[test]
fn send_single_and_multi_packet() {
    for (len, mtu) in [
        (0usize, Mtu::Mtu256),
        (100, Mtu::Mtu1024),
        (3001, Mtu::Mtu1024),
        (10000, Mtu::Mtu4096),
    ] {
        let mut p = pair(Faults::default(), mtu, 0xfffffe);
        let (sk, sa) = p.buf(0, len.max(1), 1);
        let (rk, ra) = p.buf(1, len + 10, 0);
        p.post_recv(RecvWr {
            wr_id: 9,
            sg_list: [Sge {
                addr: ra,
                length: (len + 10) as u32,
                lkey: rk,
            }]
            .into(),
        });
        p.post_send(SendWr::new(
            1,
            SendOp::SendWithImm(0xabcd),
            [Sge {
                addr: sa,
                length: len as u32,
                lkey: sk,
            }],
        ));
        let (s, r) = p.run(1, 1);
        assert_eq!(s[0].status, WcStatus::Success, "{s:?}");
        assert_eq!(r[0].status, WcStatus::Success, "{r:?}");
        assert_eq!(r[0].byte_len as usize, len);
        assert_eq!(r[0].imm_data, Some(0xabcd));
        assert_eq!(&p.w.mems[1].bytes(rk)[..len], &p.w.mems[0].bytes(sk)[..len]);
    }
}

#[test]
fn write_read_atomics() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 5);
    let (sk, sa) = p.buf(0, 5000, 1);
    let (rk, ra) = p.buf(1, 5000, 2);
    p.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        [Sge {
            addr: sa,
            length: 3000,
            lkey: sk,
        }],
    ));
    let (lk, la) = p.buf(0, 5000, 3);
    p.post_send(SendWr::new(
        2,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        [Sge {
            addr: la,
            length: 4000,
            lkey: lk,
        }],
    ));
    let (ck, ca) = p.buf(1, 8, 0);
    p.w.mems[1]
        .bytes_mut(ck)
        .copy_from_slice(&5u64.to_ne_bytes());
    let (ok_, oa) = p.buf(0, 8, 0);
    p.post_send(SendWr::new(
        3,
        SendOp::FetchAdd {
            remote_addr: ca,
            rkey: ck,
            add: 10,
        },
        [Sge {
            addr: oa,
            length: 8,
            lkey: ok_,
        }],
    ));
    let (s, _) = p.run(3, 0);
    for wc in &s {
        assert_eq!(wc.status, WcStatus::Success, "{s:?}");
    }
    assert_eq!(
        &p.w.mems[1].bytes(rk)[..3000],
        &p.w.mems[0].bytes(sk)[..3000]
    );
    assert_eq!(
        &p.w.mems[0].bytes(lk)[..4000],
        &p.w.mems[1].bytes(rk)[..4000]
    );
    assert_eq!(p.w.mems[0].bytes(ok_), &5u64.to_ne_bytes());
    assert_eq!(p.w.mems[1].bytes(ck), &15u64.to_ne_bytes());
}

fn sge(k: u32, a: u64, len: usize) -> SgList {
    [Sge {
        addr: a,
        length: len as u32,
        lkey: k,
    }]
    .into()
}

#[test]
fn retry_exhaustion_fails_the_first_wr_and_flushes_the_rest() {
    let mut p = pair(
        Faults {
            loss: 1.0,
            ..Faults::default()
        },
        Mtu::Mtu1024,
        1,
    );
    let (k, a) = p.buf(0, 64, 1);
    let (rk, ra) = p.buf(1, 64, 0);
    for id in 1..=3 {
        p.post_send(SendWr::new(
            id,
            SendOp::Write {
                remote_addr: ra,
                rkey: rk,
            },
            sge(k, a, 64),
        ));
    }
    let (s, _) = p.run(3, 0);
    assert_eq!(s[0].status, WcStatus::RetryExcErr);
    assert_eq!(s[0].wr_id, 1);
    assert!(
        s[1..].iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{s:?}"
    );
    let qp = &p.w.qps[p.a].1;
    assert_eq!(qp.state(), QpState::Err);
    // retry_cnt 7: the first transmission and 7 retries
    assert_eq!(qp.counters().completer_retry_err, 8);
    assert_eq!(qp.counters().retry_exceeded_err, 1);
    // posting to a QP in error completes with a flush at once
    p.post_send(SendWr::new(
        9,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 8),
    ));
    let wc = p.w.qps[p.a].1.poll_completion().unwrap();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WrFlushErr));
}

#[test]
fn rnr_exhaustion_and_rnr_recovery() {
    // rnr_retry 2 and no receive ever posted: RNR_RETRY_EXC_ERR.
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let attr = QpAttr {
        state: Some(QpState::Rts),
        rnr_retry: Some(2),
        ..Default::default()
    };
    p.w.qps[p.a].1.modify(&attr).unwrap();
    let (k, a) = p.buf(0, 64, 1);
    p.post_send(SendWr::new(1, SendOp::Send, sge(k, a, 64)));
    let (s, _) = p.run(1, 0);
    assert_eq!(s[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(p.w.qps[p.a].1.counters().rcvd_rnr_err, 3);
    assert_eq!(p.w.qps[p.b].1.counters().send_rnr_err, 3);

    // rnr_retry 7 (infinite): the send waits until a receive is posted.
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let (k, a) = p.buf(0, 3000, 1);
    p.post_send(SendWr::new(1, SendOp::Send, sge(k, a, 3000)));
    let (b, w) = (p.b, &mut p.w);
    assert!(!w.run(2_000_000, |w| !w.completions[0].is_empty()));
    assert!(w.qps[b].1.counters().send_rnr_err > 3);
    let (rk, ra) = p.buf(1, 4000, 0);
    p.post_recv(RecvWr {
        wr_id: 5,
        sg_list: sge(rk, ra, 4000),
    });
    let (s, r) = p.run(1, 1);
    assert_eq!(s[0].status, WcStatus::Success);
    assert_eq!((r[0].wr_id, r[0].byte_len), (5, 3000));
    assert_eq!(
        &p.w.mems[1].bytes(rk)[..3000],
        &p.w.mems[0].bytes(k)[..3000]
    );
}

#[test]
fn rkey_violations_are_nakked_and_break_both_qps() {
    for case in 0..5 {
        let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
        let (k, a) = p.buf(0, 64, 1);
        let (rk, ra) = p.buf(1, 64, 0);
        let (ro, roa) = p.w.mems[1].register(
            1,
            64,
            Access {
                local_write: true,
                remote_read: true,
                ..Access::default()
            },
        );
        let op = match case {
            0 => SendOp::Write {
                remote_addr: ra,
                rkey: rk ^ 0x100,
            }, // unknown rkey
            1 => SendOp::Write {
                remote_addr: ra + 32,
                rkey: rk,
            }, // past the end
            2 => SendOp::Write {
                remote_addr: roa,
                rkey: ro,
            }, // no REMOTE_WRITE
            _ => SendOp::Read {
                remote_addr: ra - 8,
                rkey: rk,
            }, // before the start
        };
        let before = p.w.mems[1].bytes(rk).to_vec();
        p.post_send(SendWr::new(1, op, sge(k, a, 64)));
        p.post_send(SendWr::new(
            2,
            SendOp::Write {
                remote_addr: ra,
                rkey: rk,
            },
            sge(k, a, 8),
        ));
        let (s, _) = p.run(2, 0);
        assert_eq!(s[0].status, WcStatus::RemAccessErr, "case {case}: {s:?}");
        assert_eq!(s[1].status, WcStatus::WrFlushErr, "case {case}");
        assert_eq!(p.w.qps[p.a].1.state(), QpState::Err);
        assert_eq!(p.w.qps[p.b].1.state(), QpState::Err);
        assert_eq!(
            p.w.mems[1].bytes(rk),
            &before[..],
            "case {case}: memory changed"
        );
    }
}

#[test]
fn psn_wraps_around_2_pow_24() {
    let mut p = pair(
        Faults {
            loss: 0.05,
            ..Faults::default()
        },
        Mtu::Mtu256,
        0x00ff_fff0,
    );
    let (k, a) = p.buf(0, 64 * 1024, 1);
    let (rk, ra) = p.buf(1, 64 * 1024, 0);
    p.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 64 * 1024),
    ));
    p.post_send(SendWr::new(
        2,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 8192),
    ));
    let (s, _) = p.run(2, 0);
    assert!(s.iter().all(|w| w.status == WcStatus::Success), "{s:?}");
    assert_eq!(p.w.mems[1].bytes(rk), p.w.mems[0].bytes(k));
    // 256 + 32 PSNs from 0xfffff0: the sequence wrapped
    let summary = p.w.qps[p.a].1.requester_summary();
    assert!(summary.contains("next_psn=Psn(0x000110)"), "{summary}");
}

#[test]
fn duplicate_atomic_replays_the_cached_result() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let (ck, ca) = p.buf(1, 8, 0);
    p.w.mems[1]
        .bytes_mut(ck)
        .copy_from_slice(&5u64.to_ne_bytes());
    let (ok_, oa) = p.buf(0, 8, 0);
    p.w.drop_next(burst_wire::Opcode::RC_ATOMIC_ACKNOWLEDGE, 1);
    p.post_send(SendWr::new(
        1,
        SendOp::FetchAdd {
            remote_addr: ca,
            rkey: ck,
            add: 10,
        },
        sge(ok_, oa, 8),
    ));
    let (s, _) = p.run(1, 0);
    assert_eq!(s[0].status, WcStatus::Success);
    assert_eq!(p.w.dropped_by_rule, 1);
    assert_eq!(p.w.qps[p.b].1.counters().duplicate_request, 1);
    assert_eq!(
        p.w.mems[0].bytes(ok_),
        &5u64.to_ne_bytes(),
        "original value replayed"
    );
    assert_eq!(p.w.mems[1].bytes(ck), &15u64.to_ne_bytes(), "executed once");
}

#[test]
fn duplicate_read_after_memory_changed_returns_current_data() {
    // The spec lets a responder re-execute a duplicate READ: the requester
    // sees the memory as it is when the retransmitted request arrives.
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let (rk, ra) = p.buf(1, 64, 7);
    let (lk, la) = p.buf(0, 64, 0);
    p.w.drop_next(burst_wire::Opcode::RC_RDMA_READ_RESPONSE_ONLY, 1);
    p.post_send(SendWr::new(
        1,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        sge(lk, la, 64),
    ));
    let mut changed = false;
    let a = p.a;
    assert!(p.w.run(10_000_000_000, |w| {
        if w.dropped_by_rule == 1 && !changed {
            w.mems[1].bytes_mut(rk).fill(0xee);
            changed = true;
        }
        !w.completions[a].is_empty()
    }));
    assert_eq!(p.w.completions[a][0].status, WcStatus::Success);
    assert!(p.w.mems[0].bytes(lk).iter().all(|&b| b == 0xee));
}

#[test]
fn one_nak_per_gap() {
    let mut p = pair(Faults::default(), Mtu::Mtu256, 1);
    let (k, a) = p.buf(0, 64 * 256, 1);
    let (rk, ra) = p.buf(1, 64 * 256, 0);
    p.w.drop_next(burst_wire::Opcode::RC_RDMA_WRITE_MIDDLE, 1);
    p.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 64 * 256),
    ));
    let (s, _) = p.run(1, 0);
    assert_eq!(s[0].status, WcStatus::Success);
    let c = p.w.qps[p.a].1.counters();
    assert_eq!(c.rcvd_seq_err, 1, "{c:?}");
    assert!(p.w.qps[p.b].1.counters().out_of_seq_request >= 1);
    assert_eq!(p.w.mems[1].bytes(rk), p.w.mems[0].bytes(k));
}

#[test]
fn fence_and_max_rd_atomic_hold_back_requests() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let attr = QpAttr {
        state: Some(QpState::Rts),
        max_rd_atomic: Some(1),
        ..Default::default()
    };
    p.w.qps[p.a].1.modify(&attr).unwrap();
    let (k, a) = p.buf(0, 64, 1);
    let (rk, ra) = p.buf(1, 64, 0);
    p.post_send(SendWr::new(
        1,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 8),
    ));
    p.post_send(SendWr::new(
        2,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 8),
    ));
    let mut fenced = SendWr::new(3, SendOp::Send, sge(k, a, 8));
    fenced.fence = true;
    p.post_send(fenced);
    let qp = &mut p.w.qps[p.a].1;
    let t = qp.poll_transmit(0).unwrap();
    assert_eq!(t.ib.bth.opcode, burst_wire::Opcode::RC_RDMA_READ_REQUEST);
    // the second READ waits for max_rd_atomic, and the fenced SEND behind it
    assert!(qp.poll_transmit(0).is_none());
}

#[test]
fn completions_in_posting_order_with_unsignaled_wrs() {
    let mut p = pair(
        Faults {
            loss: 0.05,
            reorder: 0.05,
            ..Faults::default()
        },
        Mtu::Mtu1024,
        1,
    );
    let (k, a) = p.buf(0, 8192, 1);
    let (rk, ra) = p.buf(1, 8192, 0);
    for id in 0..20u64 {
        let op = if id % 3 == 0 {
            SendOp::Read {
                remote_addr: ra,
                rkey: rk,
            }
        } else {
            SendOp::Write {
                remote_addr: ra,
                rkey: rk,
            }
        };
        let mut wr = SendWr::new(id, op, sge(k, a, 100 * id as usize));
        wr.signaled = id % 2 == 0;
        p.post_send(wr);
    }
    let (s, _) = p.run(10, 0);
    let ids: Vec<u64> = s.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..20).step_by(2).collect::<Vec<_>>());
    assert!(s.iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn send_with_invalidate_revokes_the_rkey() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let (k, a) = p.buf(0, 64, 1);
    // The region the peer will invalidate: a fast-registered MR or window
    // (a plain MR cannot be invalidated: see the next test).
    let (vk, va) = p.w.mems[1].register_invalidatable(1, 64, Access::ALL);
    let (rk, ra) = p.buf(1, 64, 0);
    p.post_recv(RecvWr {
        wr_id: 3,
        sg_list: sge(rk, ra, 64),
    });
    p.post_send(SendWr::new(1, SendOp::SendWithInv(vk), sge(k, a, 64)));
    let (s, r) = p.run(1, 1);
    assert_eq!(s[0].status, WcStatus::Success);
    assert_eq!(r[0].invalidated_rkey, Some(vk));
    assert_eq!(r[0].wc_flags() & 8, 8, "IBV_WC_WITH_INV");
    // the invalidated rkey no longer grants access
    p.post_send(SendWr::new(
        2,
        SendOp::Write {
            remote_addr: va,
            rkey: vk,
        },
        sge(k, a, 8),
    ));
    let (s, _) = p.run(1, 0);
    assert_eq!(s[0].status, WcStatus::RemAccessErr);
}

/// A receiver at a tenth of the link rate whose queue holds 64 packets,
/// against a 1024-packet QP window: the congestion window (burst-cc's loss
/// window, which the model runs per QP) halves on each NAK-sequence error,
/// so the transfer settles instead of overflowing the queue until the
/// retry count runs out (which is what a slow receiver behind a 16 MiB
/// socket buffer saw before).
#[test]
fn a_full_receive_queue_shrinks_the_window() {
    let mut p = pair(
        Faults {
            rx_queue: 64,
            rx_gbps: 10,
            ..Faults::default()
        },
        Mtu::Mtu4096,
        1,
    );
    // Eight 1 MiB WRITEs: 2048 packets.
    let len = 1 << 20;
    let (k, a) = p.buf(0, 8 * len, 3);
    let (rk, ra) = p.buf(1, 8 * len, 0);
    for i in 0..8u64 {
        p.post_send(SendWr::new(
            i,
            SendOp::Write {
                remote_addr: ra + i * len as u64,
                rkey: rk,
            },
            sge(k, a + i * len as u64, len),
        ));
    }
    let (s, _) = p.run(8, 0);
    assert!(s.iter().all(|w| w.status == WcStatus::Success), "{s:?}");
    assert_eq!(p.w.mems[1].bytes(rk), p.w.mems[0].bytes(k), "data intact");
    let c = p.w.qps[p.a].1.counters();
    assert!(p.w.stats.overflowed > 0, "the queue did overflow");
    // Without the shrinking window each go-back resent up to 1024 packets
    // into a 64-packet queue: 42751 retransmissions in 72 go-backs for this
    // run, against 1750 in 13 with it.
    assert!(
        c.retransmitted_pkts < 2 * 2048,
        "retransmitted {} packets for 2048, {} go-backs",
        c.retransmitted_pkts,
        c.retransmits_started
    );
}

/// Seeds that once left an RC requester in RTS with unacknowledged packets
/// and no timer: an RNR NAK stopped the ACK timer, the RNR delay ended, and
/// the go-back resend was held by the packet window, so nothing re-armed it.
/// The simulator now also checks that invariant at every step.
#[test]
fn rnr_delay_end_rearms_the_ack_timer() {
    use burst_transport::sim::{run_workload, WorkloadOptions};
    let o = WorkloadOptions {
        faults: Faults {
            loss: 0.05,
            reorder: 0.05,
            dup: 0.01,
            ..Faults::default()
        },
        ..WorkloadOptions::default()
    };
    for seed in [337, 1934, 4292] {
        let s = run_workload(seed, &o).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.ops > 0 && s.retransmitted > 0, "seed {seed}: {s:?}");
    }
}

/// A duplicate READ is answered only while it is one of the last
/// `max_dest_rd_atomic` READ/atomic requests (8 here): an older one (a
/// stale duplicate, or a peer replaying history) costs nothing.
#[test]
fn duplicate_reads_are_replayed_only_within_the_responder_resources() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 5);
    p.w.sent_log = Some(Vec::new());
    let (rk, ra) = p.buf(1, 10 * 2048, 3);
    let (lk, la) = p.buf(0, 10 * 2048, 0);
    for i in 0..10u64 {
        p.post_send(SendWr::new(
            i,
            SendOp::Read {
                remote_addr: ra + i * 2048,
                rkey: rk,
            },
            [Sge {
                addr: la + i * 2048,
                length: 2048,
                lkey: lk,
            }],
        ));
    }
    let (wa, _) = p.run(10, 0);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let reads: Vec<Vec<u8>> =
        p.w.sent_log
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(dst, b)| *dst == 1 && b.len() > 28 && b[28] == Opcode::RC_RDMA_READ_REQUEST.0)
            .map(|(_, b)| b)
            .collect();
    assert_eq!(reads.len(), 10, "one request per READ, no loss");
    let b = p.b;
    let sent_before = p.w.qps[b].1.counters().sent_pkts;
    // The first READ is no longer among the last 8: dropped, counted.
    for _ in 0..3 {
        p.w.inject(1, reads[0].clone());
    }
    p.w.run(1_000_000, |_| false);
    let c = *p.w.qps[b].1.counters();
    assert_eq!(c.dup_rd_atomic_dropped, 3);
    assert_eq!(c.sent_pkts, sent_before, "nothing replayed");
    // The last one still is: replayed (2 response packets), not executed twice.
    p.w.inject(1, reads[9].clone());
    p.w.run(1_000_000, |_| false);
    let c = *p.w.qps[b].1.counters();
    assert_eq!(c.dup_rd_atomic_dropped, 3);
    assert_eq!(c.sent_pkts, sent_before + 2);
    assert_eq!(c.duplicate_request, 4);
    // The requester takes the replayed responses as duplicates: no new
    // completion, the QP stays in RTS.
    assert!(p.w.completions[p.a].is_empty());
    assert_eq!(p.w.qps[p.a].1.state(), QpState::Rts);
}

/// With no responder resources (max_dest_rd_atomic 0), a READ is an invalid
/// request, as RXE answers it: the requester completes with REM_INV_REQ.
#[test]
fn a_read_without_responder_resources_is_an_invalid_request() {
    let mut p = Pair::connected_with(|is_b, attrs| {
        if is_b {
            attrs[1].max_dest_rd_atomic = Some(0);
        }
    });
    let (rk, ra) = p.buf(1, 64, 3);
    let (lk, la) = p.buf(0, 64, 0);
    p.post_send(SendWr::new(
        1,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        [Sge {
            addr: la,
            length: 64,
            lkey: lk,
        }],
    ));
    let (wa, _) = p.run(1, 0);
    assert_eq!(wa[0].status, WcStatus::RemInvReqErr, "{wa:?}");
}

/// SEND WITH INVALIDATE naming a plain MR's rkey (as `ibv_reg_mr` makes
/// them) is refused, as RXE and burst-mem refuse it, through the one shared
/// check: the receive completes with REM_INV_REQ_ERR and the sender is NAKed.
#[test]
fn send_with_invalidate_of_a_plain_mr_is_an_invalid_request() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let (k, a) = p.buf(0, 64, 1);
    let (vk, _) = p.buf(1, 64, 0);
    let (rk, ra) = p.buf(1, 64, 0);
    p.post_recv(RecvWr {
        wr_id: 3,
        sg_list: sge(rk, ra, 64),
    });
    p.post_send(SendWr::new(1, SendOp::SendWithInv(vk), sge(k, a, 64)));
    let (s, r) = p.run(1, 1);
    assert_eq!(s[0].status, WcStatus::RemInvReqErr);
    assert_eq!(r[0].status, WcStatus::RemInvReqErr);
}

/// C9-94: a READ request whose RETH DMA length is above 2^31 is an invalid
/// request (RXE answers it so): the responder NAKs it without reading, and
/// the requester completes with REM_INV_REQ_ERR.
#[test]
fn a_dma_length_above_2_pow_31_is_an_invalid_request() {
    use burst_wire::RoceFrame;
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 5);
    p.w.sent_log = Some(Vec::new());
    let (rk, ra) = p.buf(1, 64, 3);
    let (lk, la) = p.buf(0, 64, 0);
    p.post_send(SendWr::new(
        1,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        [Sge {
            addr: la,
            length: 64,
            lkey: lk,
        }],
    ));
    let (wa, _) = p.run(1, 0);
    assert_eq!(wa[0].status, WcStatus::Success);
    let mut read =
        p.w.sent_log
            .take()
            .unwrap_or_default()
            .into_iter()
            .find(|(dst, b)| *dst == 1 && b.len() > 28 && b[28] == Opcode::RC_RDMA_READ_REQUEST.0)
            .map(|(_, b)| b)
            .expect("the READ request was sent");
    // The same request, its DMA length (RETH bytes 12..16, after the
    // 20-byte IP, 8-byte UDP and 12-byte BTH headers) set to 2^31 + 1, at
    // the next PSN, ICRC sealed again.
    read[52..56].copy_from_slice(&(0x8000_0001u32).to_be_bytes());
    read[36..40].copy_from_slice(&(6u32 & 0xff_ffff).to_be_bytes());
    let crc = RoceFrame::parse_ip(&read).unwrap().computed_icrc();
    let n = read.len();
    read[n - 4..].copy_from_slice(&crc.to_le_bytes());
    let b = p.b;
    let before = *p.w.qps[b].1.counters();
    p.w.sent_log = Some(Vec::new());
    p.w.inject(1, read);
    p.w.run(1_000_000, |_| false);
    let naks: Vec<Vec<u8>> =
        p.w.sent_log
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(dst, _)| *dst == 0)
            .map(|(_, b)| b)
            .collect();
    assert_eq!(naks.len(), 1, "one answer");
    let f = RoceFrame::parse_ip(&naks[0]).unwrap();
    assert_eq!(f.ib.bth().opcode(), Opcode::RC_ACKNOWLEDGE);
    let aeth = f.ib.aeth().unwrap();
    assert_eq!(
        burst_wire::Syndrome::from_byte(aeth.syndrome()),
        burst_wire::Syndrome::Nak(burst_wire::NakCode::InvalidRequest)
    );
    // Nothing was read or replayed for it.
    let after = *p.w.qps[b].1.counters();
    assert_eq!(after.sent_pkts, before.sent_pkts + 1);
}

/// Model seed 41568 (sweep of seeds 40000-42999): a 3 MiB READ lost a
/// response packet; every later packet of the stream asked for the READ
/// again from a new PSN, each start of a replay behind the last, until
/// 82,000 packets had crossed and the requester ran out of retries. One
/// re-request per READ until the ACK timer expires (RXE asks for none).
#[test]
fn a_gap_in_read_responses_asks_for_the_read_once() {
    use burst_transport::sim::{run_workload, WorkloadOptions};
    let o = WorkloadOptions {
        faults: Faults {
            loss: 0.0567,
            reorder: 0.0335,
            dup: 0.0102,
            corrupt: 0.0068,
            ..Faults::default()
        },
        ops_per_pair: 40,
        max_size: 3 << 20,
        ..WorkloadOptions::default()
    };
    let s = run_workload(41568, &o).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.ops > 0 && s.retransmitted > 0, "{s:?}");
}

/// A 3-packet WRITE whose first packet is dropped `drops` times.
fn write_with_first_packet_dropped(p: &mut Pair, drops: u32, id: u64) -> WorkCompletion {
    let (k, a) = p.buf(0, 3000, 1);
    let (rk, ra) = p.buf(1, 3000, 0);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_FIRST, drops);
    p.post_send(SendWr::new(
        id,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 3000),
    ));
    let (s, _) = p.run(1, 0);
    s[0]
}

/// IBA 9.7.5.2: a NAK-sequence error starts a retry and spends one, as a
/// local ACK timeout does (NVIDIA's RNIC documentation: the retry count
/// covers timeouts, NAK-sequence errors and implied NAKs). The first
/// packet lost 7 times: one NAK (the later packets arrive) and then, the
/// responder quiet until the gap fills, 6 timeouts: 7 retries, all
/// `retry_cnt` 7 allows, and the 8th copy goes through. Lost 8 times: the
/// 7th timeout finds no retry left (it would be the 8th).
#[test]
fn a_nak_sequence_error_spends_a_retry() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let wc = write_with_first_packet_dropped(&mut p, 7, 1);
    assert_eq!(wc.status, WcStatus::Success);
    let c = *p.w.qps[p.a].1.counters();
    assert_eq!((c.rcvd_seq_err, c.completer_retry_err), (1, 6), "{c:?}");

    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let wc = write_with_first_packet_dropped(&mut p, 8, 1);
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    let c = *p.w.qps[p.a].1.counters();
    assert_eq!((c.rcvd_seq_err, c.completer_retry_err), (1, 7), "{c:?}");
    assert_eq!(c.retry_exceeded_err, 1);
}

/// Forward progress restores the retry count: two messages each needing
/// 5 retries (10 in all, more than `retry_cnt` 7) both complete.
#[test]
fn progress_restores_the_retry_count() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    assert_eq!(
        write_with_first_packet_dropped(&mut p, 5, 1).status,
        WcStatus::Success
    );
    assert_eq!(
        write_with_first_packet_dropped(&mut p, 5, 2).status,
        WcStatus::Success
    );
    assert_eq!(p.w.qps[p.a].1.counters().completer_retry_err, 8);
}

/// A go-back asks for an ACK on every packet it resends: after a loss
/// congestion control may let only a few out per round, and middle packets
/// taken in sequence otherwise draw no ACK when the one that asked is lost
/// (the round ends in a timeout; eight such rounds in a row spent the retry
/// count in the core-sim sweep at 9% loss). Rounds that repeat one without
/// progress are counted apart.
#[test]
fn resent_packets_ask_for_an_ack() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let (k, a) = p.buf(0, 8 * 1024, 1);
    let (rk, ra) = p.buf(1, 8 * 1024, 0);
    p.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 8 * 1024),
    ));
    let qp = &mut p.w.qps[p.a].1;
    let mut first = Vec::new();
    while let Some(t) = qp.poll_transmit(0) {
        first.push(t.ib.bth.ack_req);
    }
    // The first transmission asks on its last packet only.
    assert_eq!(
        first,
        [false, false, false, false, false, false, false, true]
    );
    for round in 1..=2u64 {
        let at = qp.poll_timeout().expect("the ACK timer runs");
        qp.handle_timeout(at);
        let mut resent = Vec::new();
        while let Some(t) = qp.poll_transmit(at) {
            resent.push(t.ib.bth.ack_req);
        }
        assert_eq!(resent, [true; 8], "round {round}");
        let c = qp.counters();
        assert_eq!(
            (c.retry_rounds, c.retry_rounds_repeated),
            (round, round - 1)
        );
    }
}

/// Consecutive ACK timeouts double the timer up to four times the QP's
/// (4.096 us * 2^9 here), each with a jitter of at most an eighth;
/// IBA's retry count still bounds the attempts.
#[test]
fn ack_timeouts_back_off_to_four_times_the_timeout() {
    let mut p = pair(
        Faults {
            loss: 1.0,
            ..Faults::default()
        },
        Mtu::Mtu1024,
        1,
    );
    let (k, a) = p.buf(0, 64, 1);
    let (rk, ra) = p.buf(1, 64, 0);
    p.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        sge(k, a, 64),
    ));
    let qa = p.a;
    let mut fired = Vec::new();
    let mut seen = 0;
    p.w.run(10_000_000_000, |w| {
        let n = w.qps[qa].1.counters().completer_retry_err;
        if n > seen {
            seen = n;
            fired.push(w.now);
        }
        !w.completions[qa].is_empty()
    });
    let base = 4096u64 << 9;
    let gaps: Vec<u64> = fired.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps.len(), 7, "{fired:?}");
    for (i, &g) in gaps.iter().enumerate() {
        let want = base << (i + 1).min(2);
        assert!(
            g >= want && g <= (want + base / 8).min(4 * base) + 10_000,
            "timeout {} after {g} ns, want {want} (+ jitter)",
            i + 2
        );
    }
}

/// Model seed 769 (top fault point, 10% loss and reordering): a READ's
/// replay after an ACK timeout lost its first response; the gap the rest
/// showed asked for the READ again, but the go-back bookkeeping took it
/// for the timeout's own go-back (same PSN) and dropped it, so each such
/// loss cost a whole timeout and a retry: RETRY_EXC_ERR after 7.
#[test]
fn a_replay_that_loses_its_first_response_is_asked_for_again_at_once() {
    use burst_transport::sim::{run_workload, WorkloadOptions};
    let o = WorkloadOptions {
        faults: Faults {
            loss: 0.1,
            reorder: 0.1,
            dup: 0.02,
            corrupt: 0.01,
            ..Faults::default()
        },
        ops_per_pair: 40,
        max_size: 3 << 20,
        ..WorkloadOptions::default()
    };
    let s = run_workload(769, &o).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.ops > 0 && s.retransmitted > 0, "{s:?}");
}

/// A SEND, a multi-packet READ and a SEND arriving together: the ACK
/// queued for the first SEND keeps its PSN, so it goes out before the READ's
/// responses without acknowledging the READ (the requester would take it as
/// an implied NAK and ask for the READ again: UCX's rendezvous stalled on
/// it, a retransmission timeout per message).
#[test]
fn an_ack_queued_before_read_responses_does_not_acknowledge_the_read() {
    fn setup(p: &mut Pair) -> (u32, u64, u32, u64) {
        let (rk, ra) = p.buf(1, 8192, 3);
        let (lk, la) = p.buf(0, 8192, 0);
        for i in 0..2 {
            p.post_recv(RecvWr {
                wr_id: 100 + i,
                sg_list: sge(rk, ra + 4096 + i * 64, 64),
            });
        }
        (rk, ra, lk, la)
    }
    // A's three requests, as they leave A.
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 5);
    p.w.sent_log = Some(Vec::new());
    let (rk, ra, lk, la) = setup(&mut p);
    p.post_send(SendWr::new(1, SendOp::Send, sge(lk, la, 16)));
    let read = SendOp::Read {
        remote_addr: ra,
        rkey: rk,
    };
    p.post_send(SendWr::new(2, read, sge(lk, la + 4096, 4096)));
    p.post_send(SendWr::new(3, SendOp::Send, sge(lk, la + 64, 16)));
    let (wa, _) = p.run(3, 2);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let requests: Vec<Vec<u8>> =
        p.w.sent_log
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(dst, _)| *dst == 1)
            .map(|(_, b)| b)
            .take(3)
            .collect();
    // The same B again, the three arriving at once.
    let mut q = pair(Faults::default(), Mtu::Mtu1024, 5);
    q.w.sent_log = Some(Vec::new());
    setup(&mut q);
    for r in requests {
        q.w.inject(1, r);
    }
    q.w.run(1_000_000, |_| false);
    let b = q.b;
    assert_eq!(
        q.w.qps[b].1.counters().rdma_recvs,
        2,
        "{:?}",
        q.w.qps[b].1.counters()
    );
    let psn = |b: &[u8]| u32::from_be_bytes([0, b[37], b[38], b[39]]);
    let out: Vec<(u8, u32)> =
        q.w.sent_log
            .take()
            .unwrap_or_default()
            .iter()
            .filter(|(dst, _)| *dst == 0)
            .map(|(_, b)| (b[28], psn(b)))
            .collect();
    // ACK 5 (the SEND), READ responses 6..9, ACK 10 (the second SEND).
    let ack = Opcode::RC_ACKNOWLEDGE.0;
    assert_eq!(out.first(), Some(&(ack, 5)), "{out:?}");
    assert_eq!(out.last(), Some(&(ack, 10)), "{out:?}");
    assert_eq!(out.len(), 6, "{out:?}");
}

/// The transport's asynchronous events: COMM_EST once for the first packet
/// in RTR, ACCESS_ERR when a responder meets a bad rkey, SQ_DRAINED when a
/// QP enters SQD with nothing outstanding, LAST_WQE_REACHED when a QP on an
/// SRQ enters the error state; and none for a UD QP's first packet.
#[test]
fn qp_async_events() {
    use burst_transport::sim::connect_attrs;
    let mut w = World::new(7, 2, Faults::default());
    let mtu = Mtu::Mtu1024;
    let a = w.add_qp(0, QpType::Rc, mtu);
    let b = w.add_qp(1, QpType::Rc, mtu);
    let (qa, qb) = (w.qps[a].1.qpn(), w.qps[b].1.qpn());
    for attr in connect_attrs(QpType::Rc, mtu, Psn::new(5), Some((1, qb, Psn::new(100)))) {
        w.qps[a].1.modify(&attr).unwrap();
    }
    // B stops in RTR, as a passive side waiting for the CM's RTU.
    let [init, rtr, _] = connect_attrs(QpType::Rc, mtu, Psn::new(100), Some((0, qa, Psn::new(5))));
    w.qps[b].1.modify(&init).unwrap();
    w.qps[b].1.modify(&rtr).unwrap();
    let mut p = Pair { w, a, b };
    let (rk, ra) = p.buf(1, 4096, 1);
    let (lk, la) = p.buf(0, 4096, 2);
    for i in 0..2 {
        p.post_recv(RecvWr {
            wr_id: i,
            sg_list: sge(rk, ra + i * 64, 64),
        });
        p.post_send(SendWr::new(10 + i, SendOp::Send, sge(lk, la, 32)));
        p.run(1, 1);
    }
    assert_eq!(p.w.qps[b].1.take_events(), vec![QpEvent::CommEstablished]);
    assert!(p.w.qps[a].1.take_events().is_empty(), "A was in RTS");
    // B to RTS (it cannot send in RTR), then a WRITE with a bad rkey.
    let [_, _, rts] = connect_attrs(QpType::Rc, mtu, Psn::new(100), Some((0, qa, Psn::new(5))));
    p.w.qps[b].1.modify(&rts).unwrap();
    let bad = SendOp::Write {
        remote_addr: ra,
        rkey: rk ^ 0xff00,
    };
    p.post_send(SendWr::new(20, bad, sge(lk, la, 32)));
    let (wa, _) = p.run(1, 0);
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.w.qps[b].1.take_events(), vec![QpEvent::AccessError]);
    assert_eq!(p.w.qps[b].1.state(), QpState::Err);

    // SQD with nothing outstanding: drained at once, once.
    let mut q = pair(Faults::default(), mtu, 5);
    let sqd = QpAttr {
        state: Some(QpState::Sqd),
        ..Default::default()
    };
    q.w.qps[q.a].1.modify(&sqd).unwrap();
    assert_eq!(q.w.qps[q.a].1.take_events(), vec![QpEvent::SqDrained]);
    q.w.run(1_000_000, |_| false);
    assert!(q.w.qps[q.a].1.take_events().is_empty());

    // A QP on an SRQ that enters the error state; a UD QP's first packet.
    let mut w = World::new(7, 2, Faults::default());
    let srq = w.add_srq(1, 16);
    let s = w.add_qp_on_srq(1, QpType::Rc, mtu, srq);
    let err = QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    };
    w.qps[s].1.modify(&err).unwrap();
    assert_eq!(w.qps[s].1.take_events(), vec![QpEvent::LastWqeReached]);
    let u = w.add_qp(0, QpType::Ud, mtu);
    let v = w.add_qp(1, QpType::Ud, mtu);
    let vq = w.qps[v].1.qpn();
    for attr in connect_attrs(QpType::Ud, mtu, Psn::new(0), None) {
        w.qps[u].1.modify(&attr).unwrap();
    }
    let [init, rtr, _] = connect_attrs(QpType::Ud, mtu, Psn::new(0), None);
    w.qps[v].1.modify(&init).unwrap();
    w.qps[v].1.modify(&rtr).unwrap();
    let (uk, ua) = w.mems[1].register(1, 4096, Access::ALL);
    let (sk, sa) = w.mems[0].register(1, 4096, Access::ALL);
    let (_, qv) = &mut w.qps[v];
    qv.post_recv(RecvWr {
        wr_id: 1,
        sg_list: sge(uk, ua, 4096),
    })
    .unwrap();
    let mut wr = SendWr::new(2, SendOp::Send, sge(sk, sa, 100));
    wr.ud = Some(UdDest {
        remote_qpn: vq,
        remote_qkey: 0x1111_1111,
        ah: 1,
    });
    let (n, qu) = &mut w.qps[u];
    qu.post_send(wr, &mut w.mems[*n]).unwrap();
    assert!(w.run(1_000_000_000, |w| !w.completions[v].is_empty()));
    assert!(w.qps[v].1.take_events().is_empty(), "no COMM_EST for UD");
}

#[test]
fn local_operations_complete_in_send_queue_order() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 0);
    let (k, a) = p.buf(0, 64, 1);
    let (rk, ra) = p.buf(1, 64, 0);
    let (ik, ia) = p.w.mems[0].register_invalidatable(1, 64, Access::ALL);
    p.post_recv(RecvWr {
        wr_id: 9,
        sg_list: sge(rk, ra, 64),
    });
    p.post_send(SendWr::new(1, SendOp::Send, sge(k, a, 64)));
    // Executed when posted, completed after the SEND before it is acknowledged.
    p.post_send(SendWr::new(2, SendOp::LocalInv(ik), SgList::new()));
    assert!(p.w.mems[0]
        .check_remote(
            QpScope {
                pd: 1,
                qpn: p.w.qps[p.b].1.qpn()
            },
            ik,
            ia,
            8,
            RemoteAccess::Read
        )
        .is_err());
    // The simulator's memory has no windows: the bind is refused, completes
    // in error and breaks the QP, flushing what follows.
    let bind = MwBind {
        mw_rkey: 0x100,
        new_rkey: 0x101,
        mr_lkey: k,
        addr: a,
        len: 64,
        access: 2,
    };
    p.post_send(SendWr::new(3, SendOp::BindMw(bind), SgList::new()));
    p.post_send(SendWr::new(4, SendOp::Send, sge(k, a, 64)));
    let (s, r) = p.run(4, 1);
    let got: Vec<_> = s.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::LocalInv),
            (3, WcStatus::MwBindErr, WcOpcode::BindMw),
            (4, WcStatus::WrFlushErr, WcOpcode::Send),
        ]
    );
    assert_eq!(r[0].status, WcStatus::Success);
}

/// A QP that waits for its peer ([`QpAttr::wait_for_peer`], burst's
/// one-round-trip connection setup) takes posts but sends nothing until a
/// packet from the peer arrives; then its WRITE goes, and the peer's goes
/// too. Clearing it by a transition lets a QP whose peer never speaks
/// send.
#[test]
fn a_qp_waiting_for_its_peer_sends_after_the_peer_speaks() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    let wait = QpAttr {
        state: Some(QpState::Rts),
        wait_for_peer: Some(true),
        ..QpAttr::default()
    };
    p.w.qps[p.b].1.modify(&wait).unwrap();
    let (k, a) = p.buf(1, 2048, 3);
    let (rk, ra) = p.buf(0, 2048, 0);
    let write = |id, k, a, rk, ra| {
        SendWr::new(
            id,
            SendOp::Write {
                remote_addr: ra,
                rkey: rk,
            },
            sge(k, a, 2048),
        )
    };
    {
        let (n, qp) = &mut p.w.qps[p.b];
        qp.post_send(write(7, k, a, rk, ra), &mut p.w.mems[*n])
            .unwrap();
        assert!(qp.waits_for_peer());
        assert!(!qp.has_transmit_pending(), "nothing to send yet");
        assert!(qp.poll_transmit(0).is_none());
    }
    // The peer's first packet (a's WRITE) opens b's requester.
    let (k2, a2) = p.buf(0, 2048, 5);
    let (rk2, ra2) = p.buf(1, 2048, 0);
    p.post_send(write(8, k2, a2, rk2, ra2));
    let (b, a_) = (p.b, p.a);
    let ok = p.w.run(1_000_000_000, |w| {
        !w.completions[a_].is_empty() && !w.completions[b].is_empty()
    });
    assert!(ok, "both WRITEs complete");
    assert!(!p.w.qps[p.b].1.waits_for_peer());
    assert_eq!(p.w.qps[p.b].1.counters().retransmitted_pkts, 0);
    assert_eq!(
        p.w.mems[0].bytes(rk).to_vec(),
        p.w.mems[1].bytes(k).to_vec()
    );

    // A transition clears it as well.
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 1);
    p.w.qps[p.b].1.modify(&wait).unwrap();
    let (k, a) = p.buf(1, 2048, 3);
    let (rk, ra) = p.buf(0, 2048, 0);
    let (n, qp) = &mut p.w.qps[p.b];
    qp.post_send(write(7, k, a, rk, ra), &mut p.w.mems[*n])
        .unwrap();
    assert!(qp.poll_transmit(0).is_none());
    qp.modify(&QpAttr {
        state: Some(QpState::Rts),
        wait_for_peer: Some(false),
        ..QpAttr::default()
    })
    .unwrap();
    assert!(qp.has_transmit_pending());
    assert!(qp.poll_transmit(0).is_some());

    // A reset forgets it: the QP connected again sends at once.
    qp.modify(&wait).unwrap();
    assert!(qp.waits_for_peer());
    qp.modify(&QpAttr {
        state: Some(QpState::Reset),
        ..QpAttr::default()
    })
    .unwrap();
    assert!(!qp.waits_for_peer(), "RESET clears it");
}
