//! Selective repeat between burst peers (`QpAttr::selective_repeat`), one
//! behaviour each, over the simulator's world; and that either end alone
//! stays correct.

use burst_cc::Controller;
use burst_transport::sim::{connect_attrs, run_workload, Faults, Repeat, WorkloadOptions, World};
use burst_transport::*;
use burst_wire::{Mtu, Opcode, Psn};

mod common;
use common::Pair;

fn pair(requester: bool, responder: bool) -> Pair {
    let mut p = Pair::connected(11, Faults::default(), Mtu::Mtu256, 0xff_fff0);
    for (q, on) in [(p.a, requester), (p.b, responder)] {
        let qp = &mut p.w.qps[q].1;
        let state = qp.state();
        qp.modify(&QpAttr {
            state: Some(state),
            selective_repeat: Some(on),
            ..QpAttr::default()
        })
        .unwrap();
        assert_eq!(qp.selective_repeat(), on);
    }
    p
}

impl Pair {
    /// Posts a WRITE of a fresh `len`-byte buffer; returns (source key,
    /// destination key).
    fn write(&mut self, id: u64, len: usize) -> (u32, u32) {
        self.post(id, len, false)
    }
    /// Runs until `n` send completions; all must succeed.
    fn complete(&mut self, n: usize) {
        let a = self.a;
        assert!(self.w.run(10_000_000_000, |w| w.completions[a].len() >= n));
        for c in self.w.completions[a].drain(..) {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
    }
    /// Posts a READ of a fresh `len`-byte remote buffer; returns (local
    /// destination key, remote source key).
    fn read(&mut self, id: u64, len: usize) -> (u32, u32) {
        self.post(id, len, true)
    }
    /// A WRITE (local buffer filled from `id`) or a READ (remote buffer
    /// filled from `id`) between fresh `len`-byte buffers; returns (local
    /// key, remote key).
    fn post(&mut self, id: u64, len: usize, read: bool) -> (u32, u32) {
        let (fill_local, fill_remote) = if read { (0, id as u8) } else { (id as u8, 0) };
        let (k, a) = self.buf(0, len, fill_local);
        let (rk, ra) = self.buf(1, len, fill_remote);
        let sge = Sge {
            addr: a,
            length: len as u32,
            lkey: k,
        };
        let (remote_addr, rkey) = (ra, rk);
        let op = if read {
            SendOp::Read { remote_addr, rkey }
        } else {
            SendOp::Write { remote_addr, rkey }
        };
        let (n, qp) = &mut self.w.qps[self.a];
        qp.post_send(SendWr::new(id, op, [sge]), &mut self.w.mems[*n])
            .unwrap();
        (k, rk)
    }
    /// Posts a receive of `len` zeroed bytes at the responder and a SEND
    /// of a fresh `len`-byte buffer into it; returns (source key,
    /// destination key).
    fn send(&mut self, id: u64, len: usize) -> (u32, u32) {
        let (k, a) = self.buf(0, len, id as u8);
        let (rk, ra) = self.buf(1, len, 0);
        self.w.mems[1].bytes_mut(rk).fill(0);
        let rwr = RecvWr {
            wr_id: id,
            sg_list: SgList::from([Sge {
                addr: ra,
                length: len as u32,
                lkey: rk,
            }]),
        };
        self.w.qps[self.b].1.post_recv(rwr).unwrap();
        let sge = Sge {
            addr: a,
            length: len as u32,
            lkey: k,
        };
        let (n, qp) = &mut self.w.qps[self.a];
        qp.post_send(SendWr::new(id, SendOp::Send, [sge]), &mut self.w.mems[*n])
            .unwrap();
        (k, rk)
    }
    /// The responder's receive completions so far: (wr_id, byte_len),
    /// each a success.
    fn received(&mut self) -> Vec<(u64, u32)> {
        let b = self.b;
        self.w.completions[b]
            .drain(..)
            .map(|c| {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                (c.wr_id, c.byte_len)
            })
            .collect()
    }
    fn same(&self, (k, rk): (u32, u32)) -> bool {
        self.w.mems[0].bytes(k) == self.w.mems[1].bytes(rk)
    }
    fn requester(&self) -> Counters {
        *self.w.qps[self.a].1.counters()
    }
    fn responder(&self) -> Counters {
        *self.w.qps[self.b].1.counters()
    }
}

/// A lost middle packet: the responder holds those behind it, NAKs the
/// gap once, and the requester resends that packet alone, telling
/// congestion control of one hole (a cut in proportion to the share lost);
/// go-back-N resends from the gap on and tells of a sequence error (a
/// halving).
#[test]
fn a_lost_middle_packet_is_resent_alone() {
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_MIDDLE, 1);
    let keys = p.write(1, 64 * 256);
    p.complete(1);
    assert!(p.same(keys));
    let (rq, rs) = (p.requester(), p.responder());
    assert_eq!(
        (
            rq.retransmitted_pkts,
            rq.rcvd_seq_err,
            rq.completer_retry_err
        ),
        (1, 1, 0),
        "{rq:?}"
    );
    assert!(rs.sr_held_pkts >= 1, "{rs:?}");
    let cc = p.w.loss_window(p.a);
    assert_eq!((cc.holes(), cc.state().cuts), (1, 1));

    let mut p = pair(false, false);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_MIDDLE, 1);
    let keys = p.write(1, 64 * 256);
    p.complete(1);
    assert!(p.same(keys));
    assert!(p.requester().retransmitted_pkts > 1);
    assert_eq!(p.responder().sr_held_pkts, 0);
    let cc = p.w.loss_window(p.a);
    assert_eq!((cc.holes(), cc.state().cuts), (0, 1));
}

/// A lost first packet leaves the rest of its message nowhere to go: the
/// requester resends the whole message, and a later message, whose first
/// packet came, is held and not resent.
#[test]
fn a_lost_first_packet_resends_its_message_only() {
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_FIRST, 1);
    let one = p.write(1, 4 * 256);
    let two = p.write(2, 4 * 256);
    p.complete(2);
    assert!(p.same(one) && p.same(two));
    let (rq, rs) = (p.requester(), p.responder());
    assert_eq!(
        (rq.retransmitted_pkts, rq.completer_retry_err),
        (4, 0),
        "{rq:?}"
    );
    assert_eq!(rs.sr_held_pkts, 4, "{rs:?}");
}

/// Packets past a hole reach the application's memory in PSN order where
/// it can tell: a WRITE's last packet, and a later one-packet WRITE (a
/// flag announcing the data), arrive ahead of a lost middle packet but
/// are placed only once it is resent, as go-back-N would have placed
/// them. An application that polls the last byte of a message or a flag
/// written after the data sees neither before the data.
#[test]
fn a_last_packet_past_a_hole_waits_for_it() {
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_MIDDLE, 1);
    let data = p.write(1, 4 * 256);
    let flag = p.write(2, 8);
    let (b, rs) = (p.b, data.1);
    for k in [rs, flag.1] {
        p.w.mems[1].bytes_mut(k).fill(0);
    }
    // The second middle, the last and the flag's only packet arrived out
    // of order; the resend has not (it needs the NAK's round trip).
    assert!(p
        .w
        .run(10_000_000_000, |w| w.qps[b].1.counters().out_of_seq_request
            >= 3));
    assert_eq!(p.responder().sr_held_pkts, 3);
    let mem = &p.w.mems[1];
    assert!(mem.bytes(rs)[2 * 256..3 * 256].iter().any(|&x| x != 0));
    assert!(
        mem.bytes(rs)[3 * 256..].iter().all(|&x| x == 0),
        "last packet placed ahead of the hole"
    );
    assert!(
        mem.bytes(flag.1).iter().all(|&x| x == 0),
        "flag placed ahead of the data"
    );
    p.complete(2);
    assert!(p.same(data) && p.same(flag));
    assert_eq!(p.requester().retransmitted_pkts, 1);
}

/// Two one-packet WRITEs to the same bytes, the first lost: the second,
/// held past the hole, lands after the first is resent, so the bytes end
/// as the second wrote them (a status word written twice).
#[test]
fn a_later_write_to_the_same_bytes_stays_last() {
    let mut p = pair(true, true);
    let (rk, ra) = p.buf(1, 64, 0);
    for id in [1u64, 2] {
        let (k, a) = p.buf(0, 64, id as u8);
        let sge = Sge {
            addr: a,
            length: 64,
            lkey: k,
        };
        let op = SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        };
        let (n, qp) = &mut p.w.qps[p.a];
        qp.post_send(SendWr::new(id, op, [sge]), &mut p.w.mems[*n])
            .unwrap();
    }
    p.w.drop_next(Opcode::RC_RDMA_WRITE_ONLY, 1);
    p.complete(2);
    let second: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(31).wrapping_add(2))
        .collect();
    assert_eq!(p.w.mems[1].bytes(rk), &second[..]);
    assert_eq!(p.requester().retransmitted_pkts, 1);
    assert_eq!(p.responder().sr_held_pkts, 1);
}

/// A lost middle SEND packet: the responder places those behind it in
/// the receive in progress (their tags give their index in the message),
/// and the requester resends the lost one alone.
#[test]
fn a_lost_send_packet_is_resent_alone() {
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_SEND_MIDDLE, 1);
    let keys = p.send(1, 64 * 256);
    p.complete(1);
    assert!(p.same(keys));
    assert_eq!(p.received(), [(1, 64 * 256)]);
    let (rq, rs) = (p.requester(), p.responder());
    assert_eq!(
        (rq.retransmitted_pkts, rq.completer_retry_err),
        (1, 0),
        "{rq:?}"
    );
    // Every packet that came past the gap was held.
    assert!(rs.sr_held_pkts >= 1, "{rs:?}");
    assert_eq!(rs.sr_held_pkts, rs.out_of_seq_request, "{rs:?}");

    let mut p = pair(false, false);
    p.w.drop_next(Opcode::RC_SEND_MIDDLE, 1);
    let keys = p.send(1, 64 * 256);
    p.complete(1);
    assert!(p.same(keys));
    assert!(p.requester().retransmitted_pkts > 1);

    // Longer than the tags' span (127 packets): the requester goes back.
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_SEND_MIDDLE, 1);
    let keys = p.send(1, 300 * 256);
    p.complete(1);
    assert!(p.same(keys));
    assert_eq!(p.received(), [(1, 300 * 256)]);
    assert!(p.requester().retransmitted_pkts > 1);
}

/// A SEND longer than the tags' span goes back N from a lost packet
/// while the responder holds the next SEND's packets past it, so it NAKs
/// at once each hole it knows of: every packet of the go-back that
/// arrives draws a NAK for the next one, which the go-back is already
/// sending. Those NAKs start no new go-back (before: one per packet, a
/// round of the retry count each; sweep seed 1131464 ran out of them).
#[test]
fn a_go_back_ignores_naks_for_what_it_resends() {
    let mut p = pair(true, true);
    let long = p.send(1, 160 * 256);
    let short = p.send(2, 200);
    // Lose a packet past the span, once the window has grown.
    let a = p.a;
    assert!(p
        .w
        .run(10_000_000_000, |w| w.qps[a].1.counters().sent_pkts >= 130));
    p.w.drop_next(Opcode::RC_SEND_MIDDLE, 1);
    p.complete(2);
    assert!(p.same(long) && p.same(short));
    assert_eq!(p.received(), [(1, 160 * 256), (2, 200)]);
    let (rq, rs) = (p.requester(), p.responder());
    assert!(rs.sr_held_pkts >= 1, "{rs:?}");
    assert!(rs.send_seq_nak > 3, "{rs:?}");
    assert!(rq.retransmits_started <= 2, "{rq:?}");
}

/// SENDs past a lost first packet go to their own receive WQEs (the
/// first packet's tag names which): only the message that lost its first
/// packet is sent again, and the receives complete in order, each with
/// its own bytes.
#[test]
fn sends_past_a_lost_first_packet_find_their_receives() {
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_SEND_FIRST, 1);
    let sends: Vec<_> = (1..=3).map(|id| p.send(id, 4 * 256)).collect();
    p.complete(3);
    assert!(sends.iter().all(|&k| p.same(k)));
    assert_eq!(p.received(), [(1, 1024), (2, 1024), (3, 1024)]);
    let (rq, rs) = (p.requester(), p.responder());
    assert_eq!(
        (rq.retransmitted_pkts, rq.completer_retry_err),
        (4, 0),
        "{rq:?}"
    );
    assert_eq!(rs.sr_held_pkts, 8, "{rs:?}");
}

/// One-packet SENDs past a lost one are held in the receives their tags
/// name; a requester that does not tag them (RXE, an RNIC, a burst that
/// did not agree on selective repeat) sends packets a selective responder
/// never holds, and both stay correct.
#[test]
fn only_sends_past_a_loss_are_held_when_tagged() {
    for requester in [true, false] {
        let mut p = pair(requester, true);
        p.w.drop_next(Opcode::RC_SEND_ONLY, 1);
        let sends: Vec<_> = (1..=5).map(|id| p.send(id, 200)).collect();
        p.complete(5);
        assert!(sends.iter().all(|&k| p.same(k)));
        let want: Vec<(u64, u32)> = (1..=5).map(|id| (id, 200)).collect();
        assert_eq!(p.received(), want);
        let (rq, rs) = (p.requester(), p.responder());
        if requester {
            assert_eq!(
                (rq.retransmitted_pkts, rs.sr_held_pkts),
                (1, 4),
                "{rq:?} {rs:?}"
            );
        } else {
            assert_eq!(rs.sr_held_pkts, 0, "{rs:?}");
            assert!(rq.retransmitted_pkts >= 5, "{rq:?}");
        }
    }
}

/// A SEND's first packet names its receive WQE modulo 127, so a
/// selective requester keeps fewer than 127 such messages unacknowledged:
/// once the window has grown past that, 300 one-packet SENDs behind a
/// lost one each land in their own receive (without the limit, those 127
/// or more past the loss went to the wrong one).
#[test]
fn many_sends_behind_a_loss_keep_their_receives_apart() {
    let mut p = pair(true, true);
    let warm: Vec<_> = (1..=400).map(|id| p.send(id, 100)).collect();
    p.complete(400);
    assert!(warm.iter().all(|&k| p.same(k)));
    assert_eq!(p.received().len(), 400);
    assert!(p.w.loss_window(p.a).window().unwrap() > 300);
    p.w.drop_next(Opcode::RC_SEND_ONLY, 1);
    let sends: Vec<_> = (1000..1300).map(|id| p.send(id, 100)).collect();
    p.complete(300);
    assert!(sends.iter().all(|&k| p.same(k)));
    let want: Vec<(u64, u32)> = (1000..1300).map(|id| (id, 100)).collect();
    assert_eq!(p.received(), want);
    let rs = p.responder();
    assert!((100..127).contains(&rs.sr_held_pkts), "{rs:?}");
}

/// Before its first round-trip sample a QP does not probe: the guess
/// would be the floor (16 us), which thousands of QPs starting at once
/// behind one peer's window all overrun (each probed once, spuriously, at
/// 10,240 QPs over veth). A first flight's lost tail waits for the ACK
/// timer instead, as go-back-N's does.
#[test]
fn no_probe_before_the_first_round_trip_sample() {
    let mut p = pair(true, true);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_LAST, 1);
    let keys = p.write(1, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    let rq = p.requester();
    assert_eq!((rq.sr_probes, rq.completer_retry_err), (0, 1), "{rq:?}");
}

/// A QP with no sample of its own whose round trip was seeded from its
/// peer's (the data plane's estimate from other QPs to that peer) probes a
/// lost tail of its first flight instead of spending a retry on the timer.
#[test]
fn a_seeded_round_trip_lets_a_first_flight_probe_its_lost_tail() {
    let rq = seeded_first_flight_losing_its_tail(20_000, 10_000);
    assert_eq!((rq.sr_probes, rq.completer_retry_err), (1, 0), "{rq:?}");
}

/// The requester's counters after a first WRITE of 4 packets, the last
/// lost, from a QP whose round trip was seeded with (`srtt`, `rttvar`) ns.
fn seeded_first_flight_losing_its_tail(srtt: u64, rttvar: u64) -> Counters {
    let mut p = pair(true, true);
    let a = p.a;
    p.w.qps[a].1.seed_rtt(srtt, rttvar);
    p.w.drop_next(Opcode::RC_RDMA_WRITE_LAST, 1);
    let keys = p.write(1, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    p.requester()
}

/// Four round trips longer than the ACK timeout (a queue milliseconds
/// deep: a 1 ms round trip against 2.1 ms here): the probe comes a quarter
/// timeout before the timer rather than never, and the lost tail costs no
/// retry (10,240 QPs over veth waited out 67 ms timeouts instead).
#[test]
fn a_round_trip_longer_than_a_quarter_timeout_still_probes_before_the_timer() {
    let rq = seeded_first_flight_losing_its_tail(1_000_000, 0);
    assert_eq!((rq.sr_probes, rq.completer_retry_err), (1, 0), "{rq:?}");
}

/// A lost last packet draws no NAK (nothing comes after it): the
/// requester's probe resends it after a few round trips, long before the
/// ACK timer (4.096 us * 2^9 = 2.1 ms here) would.
#[test]
fn a_probe_recovers_a_lost_tail_before_the_ack_timer() {
    let mut p = pair(true, true);
    // A first message times the round trip.
    let keys = p.write(1, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    let start = p.w.now;
    p.w.drop_next(Opcode::RC_RDMA_WRITE_LAST, 1);
    let keys = p.write(2, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    let rq = p.requester();
    // The probe resends the oldest unacknowledged packet (there); its ACK
    // shows the next one missing, resent at once.
    assert_eq!(
        (rq.sr_probes, rq.retransmitted_pkts, rq.completer_retry_err),
        (1, 2, 0),
        "{rq:?}"
    );
    assert!(p.w.now - start < 500_000, "took {} ns", p.w.now - start);

    // Go-back-N waits for the timer.
    let mut p = pair(false, false);
    let keys = p.write(1, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    p.w.drop_next(Opcode::RC_RDMA_WRITE_LAST, 1);
    let keys = p.write(2, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    assert_eq!(p.requester().completer_retry_err, 1);
}

/// A READ whose last response is lost: nothing behind it shows the gap,
/// so go-back-N (RXE, RNICs) waits for the ACK timer; a selective
/// requester's probe asks for the rest again after a few round trips,
/// spending no retry, and the READ completes with the right bytes.
#[test]
fn a_probe_asks_again_for_a_reads_lost_tail() {
    let run = |selective: bool| {
        let mut p = pair(selective, selective);
        // A first READ times the round trip.
        let keys = p.read(1, 4 * 256);
        p.complete(1);
        assert!(p.same(keys));
        let start = p.w.now;
        p.w.drop_next(Opcode::RC_RDMA_READ_RESPONSE_LAST, 1);
        let keys = p.read(2, 8 * 256);
        p.complete(1);
        assert!(p.same(keys));
        (p.requester(), p.w.now - start)
    };
    let (rq, took) = run(true);
    assert_eq!(
        (rq.sr_probes, rq.retransmitted_pkts, rq.completer_retry_err),
        (1, 1, 0),
        "{rq:?}"
    );
    assert!(took < 500_000, "took {took} ns");
    let (rq, took) = run(false);
    assert_eq!((rq.sr_probes, rq.completer_retry_err), (0, 1), "{rq:?}");
    assert!(took > 2_000_000, "took {took} ns");
}

/// A lost READ response in the middle of a READ: a selective requester
/// places the responses behind it where they go and asks again for the
/// missing one alone (a READ request of one MTU at its offset), so the
/// responder sends one response more; go-back-N asks for everything from
/// the gap on again.
#[test]
fn a_lost_read_response_is_asked_for_alone() {
    let run = |selective: bool| {
        let mut p = pair(selective, selective);
        p.w.sent_log = Some(Vec::new());
        p.w.drop_next(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1);
        let keys = p.read(1, 16 * 256);
        p.complete(1);
        assert!(p.same(keys));
        // READ requests' DMA lengths, in the order sent.
        let log = p.w.sent_log.take().unwrap();
        let asked: Vec<u32> = log
            .iter()
            .filter_map(|(_, f)| {
                let ib = burst_wire::RoceFrame::parse_ip(f).ok()?.ib;
                (ib.bth().opcode() == Opcode::RC_RDMA_READ_REQUEST)
                    .then(|| ib.reth().map(|r| r.dma_length()))
                    .flatten()
            })
            .collect();
        (p.requester(), p.responder(), asked)
    };
    let (rq, rs, asked) = run(true);
    assert_eq!(asked, [16 * 256, 256], "{rq:?}");
    assert_eq!(
        (rq.retransmitted_pkts, rq.completer_retry_err, rq.sr_probes),
        (1, 0, 0),
        "{rq:?}"
    );
    assert!(rq.sr_held_pkts >= 1, "{rq:?}");
    assert_eq!(rs.sent_bytes, 17 * 256, "{rs:?}");

    let (rq, rs, asked) = run(false);
    assert_eq!(rq.sr_held_pkts, 0, "{rq:?}");
    assert!(asked.len() == 2 && asked[1] > 256, "{asked:?}");
    assert!(rs.sent_bytes > 17 * 256, "{rs:?}");
}

/// A READ that loses its last response, and a READ behind it: the later
/// READ's first response shows the responder went past the first (an
/// implied NAK), so a selective requester asks for the lost response
/// alone at once, without waiting for a probe (before: one probe).
#[test]
fn a_later_reads_response_asks_for_a_lost_tail() {
    let mut p = pair(true, true);
    p.w.sent_log = Some(Vec::new());
    p.w.drop_next(Opcode::RC_RDMA_READ_RESPONSE_LAST, 1);
    let one = p.read(1, 4 * 256);
    let two = p.read(2, 4 * 256);
    p.complete(2);
    assert!(p.same(one) && p.same(two));
    let log = p.w.sent_log.take().unwrap();
    let asked: Vec<u32> = log
        .iter()
        .filter_map(|(_, f)| {
            let ib = burst_wire::RoceFrame::parse_ip(f).ok()?.ib;
            (ib.bth().opcode() == Opcode::RC_RDMA_READ_REQUEST)
                .then(|| ib.reth().map(|r| r.dma_length()))
                .flatten()
        })
        .collect();
    let rq = p.requester();
    assert_eq!(asked, [1024, 1024, 256], "{rq:?}");
    assert_eq!(
        (rq.retransmitted_pkts, rq.completer_retry_err, rq.sr_probes),
        (1, 0, 0),
        "{rq:?}"
    );
}

/// A READ that loses a middle response and its last one, and a WRITE
/// behind it: the middle hole is asked for when the responses behind it
/// show it, the lost tail when the WRITE's ACK shows the responder went
/// past it (an implied NAK), each alone; the WRITE that ACK acknowledged is
/// not sent again (before, it waited for the ACK timer and went back), and
/// both complete in order with the right bytes.
#[test]
fn read_holes_are_asked_for_alone_and_a_later_write_stays_done() {
    let mut p = pair(true, true);
    // A first READ times the round trip.
    let keys = p.read(1, 4 * 256);
    p.complete(1);
    assert!(p.same(keys));
    let start = p.w.now;
    let before = p.requester();
    p.w.drop_next(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1);
    p.w.drop_next(Opcode::RC_RDMA_READ_RESPONSE_LAST, 1);
    let read = p.read(2, 32 * 256);
    let write = p.write(3, 4 * 256);
    p.complete(2);
    assert!(p.same(read) && p.same(write));
    let rq = p.requester();
    let resent = rq.retransmitted_pkts - before.retransmitted_pkts;
    assert_eq!(
        (resent, rq.completer_retry_err, rq.sr_probes),
        (2, 0, 0),
        "{rq:?}"
    );
    let took = p.w.now - start;
    assert!(took < 500_000, "took {took} ns");
}

/// A selective responder keeps what it queued when a READ is asked for
/// again, but not without bound: a peer repeating one READ request 100
/// times draws a bounded number of streams, not 100 READs' worth of bytes.
#[test]
fn repeated_read_requests_draw_bounded_responses() {
    let mut p = pair(true, true);
    p.w.sent_log = Some(Vec::new());
    let keys = p.read(1, 64 * 256);
    p.complete(1);
    assert!(p.same(keys));
    let request =
        p.w.sent_log
            .take()
            .unwrap()
            .into_iter()
            .find(|(_, f)| {
                burst_wire::RoceFrame::parse_ip(f)
                    .is_ok_and(|r| r.ib.bth().opcode() == Opcode::RC_RDMA_READ_REQUEST)
            })
            .unwrap();
    let before = p.responder().sent_bytes;
    for _ in 0..100 {
        p.w.inject(request.0, request.1.clone());
    }
    let now = p.w.now;
    p.w.run(now + 10_000_000, |_| false);
    let drawn = p.responder().sent_bytes - before;
    assert!(drawn >= 64 * 256, "{drawn}");
    assert!(drawn <= 20 * 64 * 256, "{drawn} bytes for 100 repeats");
}

/// A WRITE WITH IMMEDIATE's last packet is never held (it takes a receive
/// in order): the message still completes once, with its immediate.
#[test]
fn write_with_immediate_completes_once_after_a_loss() {
    let mut p = pair(true, true);
    let (rk, ra) = p.buf(1, 8 * 256, 0);
    let (k, a) = p.buf(0, 8 * 256, 9);
    let (_, qp) = &mut p.w.qps[p.b];
    let wr = RecvWr {
        wr_id: 77,
        sg_list: SgList::default(),
    };
    qp.post_recv(wr).unwrap();
    p.w.drop_next(Opcode::RC_RDMA_WRITE_MIDDLE, 2);
    let sge = Sge {
        addr: a,
        length: 8 * 256,
        lkey: k,
    };
    let wr = SendWr::new(
        5,
        SendOp::WriteWithImm {
            remote_addr: ra,
            rkey: rk,
            imm: 0xabcd,
        },
        [sge],
    );
    let (n, qp) = &mut p.w.qps[p.a];
    qp.post_send(wr, &mut p.w.mems[*n]).unwrap();
    p.complete(1);
    let b = p.b;
    assert!(p.w.run(10_000_000, |w| !w.completions[b].is_empty()));
    let got: Vec<_> = p.w.completions[b].drain(..).collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].imm_data, Some(0xabcd));
    assert_eq!(got[0].status, WcStatus::Success);
    assert!(p.same((k, rk)));
}

/// Either end alone (a burst end toward a peer that did not negotiate it)
/// and both ends: the whole checked workload at 5% loss with reordering
/// and duplicates, every opcode.
#[test]
fn every_mix_of_ends_stays_correct_under_loss() {
    for repeat in [
        Repeat::Selective,
        Repeat::RequesterOnly,
        Repeat::ResponderOnly,
    ] {
        for seed in 1..=12 {
            let o = WorkloadOptions {
                faults: Faults {
                    loss: 0.05,
                    reorder: 0.03,
                    dup: 0.01,
                    ..Faults::default()
                },
                repeat,
                ..WorkloadOptions::default()
            };
            let s = run_workload(seed, &o).unwrap_or_else(|e| panic!("{repeat:?}: {e}"));
            assert!(
                s.ops > 0 || s.retry_exhausted,
                "{repeat:?} seed {seed}: {s:?}"
            );
        }
    }
}

/// The attribute is burst's, not IBA's: any transition may carry it, and
/// it only takes on RC.
#[test]
fn the_attribute_rides_any_transition_and_only_rc_takes_it() {
    let mut w = World::new(1, 2, Faults::default());
    let uc = w.add_qp(0, QpType::Uc, Mtu::Mtu1024);
    let qp = &mut w.qps[uc].1;
    let init = connect_attrs(
        QpType::Uc,
        Mtu::Mtu1024,
        Psn::new(1),
        Some((1, qp.qpn(), Psn::new(2))),
    )[0];
    qp.modify(&QpAttr {
        selective_repeat: Some(true),
        ..init
    })
    .unwrap();
    assert!(!qp.selective_repeat(), "UC has nothing to repeat");
}
