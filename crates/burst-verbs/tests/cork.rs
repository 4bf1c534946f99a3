//! Corked posts (Nagle's rule for sends): a send posted to an RC QP with
//! packets in flight waits for the lane's next round, so a thread that
//! posts faster than a system call per message sends its messages in GSO
//! runs; nothing is left behind when the thread stops calling in, and a
//! send to a QP with nothing in flight (a ping-pong) still leaves at once.

use std::time::{Duration, Instant};

use burst_mem::{Access, MrKeys};
use burst_transport::*;
use burst_verbs::engine::Context;

mod common;
use common::{poll_n, readable, RcPair, Side};

/// Two engines on `127.0.148.{x}`/`{x+1}`, an RC pair; A writes into a
/// buffer of B's. A's CQ has a completion channel.
fn pair(x: u8) -> RcPair {
    RcPair::start(148, x, 256, 128, Side::A)
}

/// Registers `on_a` on A and `on_b` on B, both for local and remote
/// writes.
///
/// # Safety
/// Both buffers must outlive the engines.
unsafe fn register(p: &RcPair, on_a: &mut [u8], on_b: &mut [u8]) -> (MrKeys, MrKeys) {
    // SAFETY: passed on from the caller.
    unsafe { p.register((on_a, RW), (on_b, RW)) }
}

const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);

/// A WRITE of `len` bytes from `src` at `off` to `dst` at `off`.
fn write(id: u64, src: &MrKeys, dst: &MrKeys, off: u64, len: u32) -> SendWr {
    SendWr::new(
        id,
        SendOp::Write {
            remote_addr: dst.addr + off,
            rkey: dst.rkey,
        },
        [Sge {
            addr: src.addr + off,
            length: len,
            lkey: src.lkey,
        }],
    )
}

/// The first 64 bytes of the region `k` names.
fn sge(k: &MrKeys) -> Sge {
    Sge {
        addr: k.addr,
        length: 64,
        lkey: k.lkey,
    }
}

fn recv(wr_id: u64, k: &MrKeys) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: [sge(k)].into(),
    }
}

fn corked(c: &Context) -> u64 {
    c.counters().unwrap().corked_posts
}

#[test]
fn sends_posted_behind_packets_in_flight_leave_together_and_in_order() {
    // A bandwidth loop: 128 WRITEs of 64 B posted back to back, then
    // polled. The first leaves at once; those after it wait in the cork
    // and leave 64 packets to a round, in posting order.
    let p = pair(1);
    const N: usize = 128;
    let mut src: Vec<u8> = (0..N * 64).map(|i| (i / 64) as u8 ^ (i as u8)).collect();
    let mut dst = vec![0u8; N * 64];
    // SAFETY: both buffers outlive the engines (dropped with `p` first).
    let (ks, kd) = unsafe { register(&p, &mut src, &mut dst) };
    // A post that finds the engine thread stepping the lane goes through
    // the rings, uncorked: on a loaded machine a whole burst can, so a
    // few bursts until one corked.
    let mut bursts = 0;
    while corked(&p.a) == 0 && bursts < 8 {
        dst.fill(0);
        for i in 0..N as u64 {
            p.a.post_send(p.qa, &write(i, &ks, &kd, i * 64, 64))
                .unwrap();
        }
        let wcs = poll_n(&p.a, p.cqa, N);
        for (i, w) in wcs.iter().enumerate() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            assert_eq!(w.wr_id, i as u64, "completions in posting order");
        }
        // SAFETY: every WRITE completed: B placed them all, and nothing
        // writes `dst` until the next burst's posts.
        let placed = unsafe { std::slice::from_raw_parts(dst.as_ptr(), N * 64) };
        assert_eq!(placed, &src[..], "burst {bursts}: a WRITE landed wrong");
        bursts += 1;
    }
    let n = corked(&p.a);
    eprintln!(
        "{n} posts corked in {bursts} bursts of {N}, {} packets resent",
        p.a.counters().unwrap().qps.retransmitted_pkts
    );
    assert!(n > 0, "no post waited behind the packets in flight");
    let rb = p.b.counters().unwrap();
    assert!(rb.rcvd_pkts >= (N * bursts) as u64);
    drop(p);
    assert_eq!(src, dst);
}

#[test]
fn a_corked_send_leaves_when_its_thread_stops_calling_in() {
    // A thread posts two WRITEs and goes away (it computes, or spins on
    // memory) without polling: the second, corked behind the first, must
    // still land, sent by whoever steps the lane next (the engine thread,
    // once the thread's claim lapses).
    let p = pair(3);
    let mut src = vec![7u8; 64 * 256];
    let mut dst = vec![0u8; 64 * 256];
    // SAFETY: both buffers outlive the engines (dropped with `p` first).
    let (ks, kd) = unsafe { register(&p, &mut src, &mut dst) };
    let landed = |off: usize| {
        // SAFETY: B's engine places into `dst` while this reads it; a
        // volatile read of one byte per check, the buffer outlives `p`.
        unsafe { std::ptr::read_volatile(dst.as_ptr().add(off)) == 7 }
    };
    // One round: two WRITEs posted back to back into slot `round`, then
    // no call into burst until the second is in B's memory.
    let round = |round: u64| {
        let off = round * 256;
        // Claim the lane first (an empty poll), as a polling thread does.
        assert!(p.a.poll_cq(p.cqa).is_none());
        p.a.post_send(p.qa, &write(2 * round, &ks, &kd, off, 128))
            .unwrap();
        p.a.post_send(p.qa, &write(2 * round + 1, &ks, &kd, off + 128, 128))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !landed(off as usize + 255) {
            assert!(
                Instant::now() < deadline,
                "round {round}: a WRITE never left"
            );
            std::hint::spin_loop();
        }
        poll_n(&p.a, p.cqa, 2);
    };
    let before = corked(&p.a);
    let lapses = || p.a.counters().unwrap().cork_lapses;
    let mut rounds = 0u64;
    // The first post of a round may find the core busy (the engine
    // stepping at that moment) and go through the rings, uncorked; and a
    // corked post may leave with a step the engine takes for something
    // else (the first WRITE's ACK, on a loaded machine), before the claim
    // lapses: a few rounds until one corked and waited for the lapse.
    while (corked(&p.a) == before || lapses() == 0) && rounds < 56 {
        round(rounds);
        rounds += 1;
    }
    assert!(corked(&p.a) > before, "no round corked its second post");
    // That cork waited for the thread's claim to lapse (milliseconds, where
    // an RNIC sends at once): the lane corks no more. The same rounds again
    // send both WRITEs as they are posted.
    assert_eq!(lapses(), 1);
    let after = corked(&p.a);
    for _ in 0..8 {
        round(rounds);
        rounds += 1;
    }
    assert_eq!(corked(&p.a), after, "a post was corked after the lapse");
    assert_eq!(lapses(), 1);
    drop(p);
    assert!(dst[..rounds as usize * 256].iter().all(|&x| x == 7));
}

#[test]
fn a_send_to_a_qp_with_nothing_in_flight_is_never_corked() {
    // A ping-pong: each side's send finds its previous one acknowledged
    // (the ACK rode with the peer's reply), so every message leaves on its
    // post, at once.
    let p = pair(5);
    let mut abuf = vec![1u8; 256];
    let mut bbuf = vec![2u8; 256];
    // SAFETY: both buffers outlive the engines (dropped with `p` first).
    let (ka, kb) = unsafe { register(&p, &mut abuf, &mut bbuf) };
    p.b.post_recv(p.qb, &recv(0, &kb)).unwrap();
    let (b, qb, cqb) = (p.b.clone(), p.qb, p.cqb);
    const ROUNDS: u64 = 200;
    let echo = std::thread::spawn(move || {
        for i in 0..ROUNDS {
            // The message, then its reply.
            let w = loop {
                if let Some(w) = b.poll_cq(cqb) {
                    if w.opcode == WcOpcode::Recv {
                        break w;
                    }
                }
            };
            assert_eq!(w.status, WcStatus::Success);
            b.post_recv(qb, &recv(i + 1, &kb)).unwrap();
            b.post_send(qb, &SendWr::new(i, SendOp::Send, [sge(&kb)]))
                .unwrap();
        }
        // The last reply's completion.
        while b.poll_cq(cqb).is_some_and(|w| w.opcode == WcOpcode::Recv) {}
    });
    for i in 0..ROUNDS {
        p.a.post_recv(p.qa, &recv(i, &ka)).unwrap();
        p.a.post_send(p.qa, &SendWr::new(i, SendOp::Send, [sge(&ka)]))
            .unwrap();
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while got < 2 {
            assert!(Instant::now() < deadline, "round {i} never completed");
            if let Some(w) = p.a.poll_cq(p.cqa) {
                assert_eq!(w.status, WcStatus::Success);
                got += 1;
            }
        }
    }
    echo.join().unwrap();
    assert_eq!((corked(&p.a), corked(&p.b)), (0, 0));
    drop(p);
    drop((abuf, bbuf));
}

#[test]
fn arming_a_cq_sends_the_cork_before_the_thread_waits() {
    // A thread that posts and then arms its CQ is about to wait, maybe in
    // its own poll(2) on the channel (UCX, libfabric): what it corked goes
    // out as it arms, not one ACK later through the engine.
    let p = pair(7);
    let mut src = vec![9u8; 32 * 256];
    let mut dst = vec![0u8; 32 * 256];
    // SAFETY: both buffers outlive the engines (dropped with `p` first).
    let (ks, kd) = unsafe { register(&p, &mut src, &mut dst) };
    let sent = |c: &Context| c.counters().unwrap().sent_pkts;
    let mut checked = 0;
    // Rounds until a few corked (a post that finds the engine stepping
    // goes through the rings, uncorked).
    let mut rounds = 0;
    for round in 0..32u64 {
        if checked == 3 {
            break;
        }
        rounds += 1;
        let off = round * 256;
        assert!(p.a.poll_cq(p.cqa).is_none());
        let before = (corked(&p.a), sent(&p.a));
        p.a.post_send(p.qa, &write(2 * round, &ks, &kd, off, 128))
            .unwrap();
        p.a.post_send(p.qa, &write(2 * round + 1, &ks, &kd, off + 128, 128))
            .unwrap();
        let was_corked = corked(&p.a) > before.0;
        p.a.req_notify_cq(p.cqa).unwrap();
        if was_corked {
            // Both WRITEs left by the time arming returned (had the engine
            // sent the second on the first one's ACK, it left too).
            assert!(
                sent(&p.a) >= before.1 + 2,
                "round {round}: the corked WRITE was still corked after arming"
            );
            checked += 1;
        }
        // Wait the Verbs way, in poll(2) on the channel.
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while got < 2 {
            assert!(Instant::now() < deadline, "round {round}: no completion");
            while let Some(w) = p.a.poll_cq(p.cqa) {
                assert_eq!(w.status, WcStatus::Success);
                got += 1;
            }
            if got < 2 && readable(p.ch.fd(), 100) {
                let _ = p.a.wait_cq_event(&p.ch, Duration::ZERO);
                p.a.req_notify_cq(p.cqa).unwrap();
            }
        }
    }
    assert!(checked > 0, "no round corked its second WRITE");
    drop(p);
    assert!(dst[..rounds * 256].iter().all(|&x| x == 9));
}

#[test]
fn a_list_of_work_requests_leaves_together_at_its_last() {
    // `ibv_post_send` with a list (and `ibv_wr_complete`'s batch): an RNIC
    // takes it at one doorbell. The WRs before the last wait for it, even
    // to a QP with nothing in flight, and leave with it; a list cut short
    // by a refused WR sends what it posted.
    let p = pair(9);
    let mut src = vec![5u8; 32 * 512];
    let mut dst = vec![0u8; 32 * 512];
    // SAFETY: both buffers outlive the engines (dropped with `p` first).
    let (ks, kd) = unsafe { register(&p, &mut src, &mut dst) };
    let qp = p.a.qp(p.qa).unwrap();
    let sent = |c: &Context| c.counters().unwrap().sent_pkts;
    let mut whole = 0;
    let mut rounds = 0;
    for round in 0..31u64 {
        if whole == 3 {
            break;
        }
        rounds += 1;
        assert!(p.a.poll_cq(p.cqa).is_none());
        let before = (corked(&p.a), sent(&p.a));
        let off = round * 512;
        for i in 0..15 {
            qp.post_send_more(&write(i, &ks, &kd, off + i * 32, 32))
                .unwrap();
        }
        qp.post_send(&write(15, &ks, &kd, off + 15 * 32, 32))
            .unwrap();
        // Went through the core (not the rings, when the engine held it):
        // the first fifteen waited for the last, and all left with it.
        if corked(&p.a) == before.0 + 15 {
            assert!(
                sent(&p.a) >= before.1 + 16,
                "round {round}: a list left short"
            );
            whole += 1;
        }
        poll_n(&p.a, p.cqa, 16);
    }
    assert!(whole > 0, "no list went through the core");
    // Cut short: three posted with more to follow, then the poster stops
    // (as the drop-in does when a WR of the list is refused) and sends
    // what it posted.
    let before = sent(&p.a);
    for i in 0..3 {
        qp.post_send_more(&write(100 + i, &ks, &kd, 31 * 512 + i * 32, 32))
            .unwrap();
    }
    qp.send_posted();
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent(&p.a) < before + 3 {
        assert!(Instant::now() < deadline, "a list cut short was never sent");
        std::thread::yield_now();
    }
    poll_n(&p.a, p.cqa, 3);
    drop(p);
    assert!(dst[..rounds * 512].iter().all(|&x| x == 5));
    assert!(dst[31 * 512..31 * 512 + 96].iter().all(|&x| x == 5));
}

#[test]
fn posts_to_qps_parked_behind_their_peers_full_window_wait_in_the_cork() {
    // Many QPs to one peer, each posting a few WRITEs in turn (perftest's
    // order with many QPs): once the peer's window (16 packets at first)
    // is full, the next QPs are parked until an ACK opens it. A post to a
    // parked QP cannot leave before then either: it is corked like one
    // behind its own packets in flight, instead of running a transmit
    // round that finds the window full again.
    const QPS: usize = 32;
    const PER_QP: u64 = 4;
    let mut whole = false;
    for attempt in 0..4u8 {
        let p = pair(11 + 2 * attempt);
        let mut src = vec![3u8; QPS * PER_QP as usize * 64];
        let mut dst = vec![0u8; QPS * PER_QP as usize * 64];
        // SAFETY: both buffers outlive the engines (dropped with `p` first).
        let (ks, kd) = unsafe { register(&p, &mut src, &mut dst) };
        let qps: Vec<_> = (0..QPS)
            .map(|_| {
                let qa = p.a.create_qp(QpType::Rc, p.pa, p.cqa, p.cqa, 16).unwrap();
                let qb = p.b.create_qp(QpType::Rc, p.pb, p.cqb, p.cqb, 16).unwrap();
                common::connect_rc(&p.a, qa, p.b.gid(), qb, (5, 9), burst_wire::Mtu::Mtu1024);
                common::connect_rc(&p.b, qb, p.a.gid(), qa, (9, 5), burst_wire::Mtu::Mtu1024);
                qa
            })
            .collect();
        assert!(p.a.poll_cq(p.cqa).is_none());
        let before = (corked(&p.a), p.a.counters().unwrap().cc.parks);
        for (q, &qa) in qps.iter().enumerate() {
            for k in 0..PER_QP {
                let off = (q as u64 * PER_QP + k) * 64;
                p.a.post_send(qa, &write(off, &ks, &kd, off, 64)).unwrap();
            }
        }
        let after = (corked(&p.a), p.a.counters().unwrap().cc.parks);
        let wcs = poll_n(&p.a, p.cqa, QPS * PER_QP as usize);
        // Each QP's WRITEs complete in its posting order.
        let mut last = vec![None; QPS];
        for w in &wcs {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            let q = (w.wr_id / 64 / PER_QP) as usize;
            assert!(last[q] < Some(w.wr_id), "QP {q} completed out of order");
            last[q] = Some(w.wr_id);
        }
        drop(p);
        assert_eq!(src, dst);
        eprintln!(
            "attempt {attempt}: {} posts corked, {} parks",
            after.0 - before.0,
            after.1 - before.1
        );
        // Every post but each QP's first waited: the first QPs' behind
        // their packets in flight, the rest behind the full window.
        if after.1 > before.1 && after.0 - before.0 == (QPS as u64) * (PER_QP - 1) {
            whole = true;
            break;
        }
    }
    assert!(whole, "posts to parked QPs were not corked");
}
