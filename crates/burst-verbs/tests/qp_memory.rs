//! What an idle QP costs: heap bytes of engine and front-end state (a
//! global allocator that tracks live bytes) and the shared memory of its
//! rings (resident), for connected RC QPs in RTS that have moved no data,
//! at depths 128 and 1024, and for QPs that filled their send queue once
//! and then stayed idle. The figures are printed (`cargo test -p
//! burst-verbs --test qp_memory -- --nocapture`); the bound (16 KiB
//! of engine state per idle QP of depth 128) is asserted.
//!
//! Its own test binary: the allocator counts for this file only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicI64, Ordering};

use burst_verbs::engine::{Context, CqId, Engine, QueuePair};
use burst_verbs::{
    Access, Mtu, Pd, Psn, QpAccess, QpCaps, QpInit, QpType, RcParams, RcPeer, SendOp, SendWr, Sge,
    WcStatus,
};

struct Counting;

/// Heap bytes live (allocated and not freed).
static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The tests count one process-wide figure: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Resident bytes of this process, and of them its shared memory's
/// (`/proc/self/status`: `VmRSS`, `RssShmem`).
fn resident() -> (i64, i64) {
    // The QP segments are memfds (shared memory). Not statm's "shared",
    // which also counts file pages: library code run for the first time
    // while the QPs were made (16 such pages, 64 bytes per QP, over the
    // bound in one full `cargo test` run).
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = |key: &str| -> i64 {
        let line = s.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<i64>()
            .unwrap()
            * 1024
    };
    (kb("VmRSS:"), kb("RssShmem:"))
}

/// Two RC QPs of `caps`, one on each side (PD, CQ), connected in RTS.
fn connected_pair(
    (a, pa, cqa): (&Context, Pd, CqId),
    (b, pb, cqb): (&Context, Pd, CqId),
    caps: QpCaps,
    p: &RcParams,
) -> (QueuePair, QueuePair) {
    let mut init = QpInit::new(QpType::Rc, pa);
    init.caps = caps;
    let qa = a.create_qp_with(&init, cqa, cqa).unwrap();
    init.pd = pb;
    let qb = b.create_qp_with(&init, cqb, cqb).unwrap();
    let peer = |gid, qpn| RcPeer {
        gid,
        qpn,
        psn: Psn::new(1),
    };
    qa.connect_rc(&peer(b.gid(), qb.qpn()), p).unwrap();
    qb.connect_rc(&peer(a.gid(), qa.qpn()), p).unwrap();
    (qa, qb)
}

/// Per QP over `n` connected pairs (2n QPs) of `caps`: (heap bytes,
/// resident bytes, of which shared).
fn per_qp(n: usize, caps: QpCaps) -> (i64, i64, i64) {
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 160, 1)), Mtu::Mtu4096).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 160, 2)), Mtu::Mtu4096).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    // Let the engines' threads reach their working size first.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (heap0, (rss0, shared0)) = (LIVE.load(Ordering::Relaxed), resident());
    let mut qps: Vec<(QueuePair, QueuePair)> = Vec::with_capacity(n);
    let p = RcParams::new(Psn::new(1), Mtu::Mtu4096);
    for _ in 0..n {
        qps.push(connected_pair((&a, pa, cqa), (&b, pb, cqb), caps, &p));
    }
    // The engines settle the QPs' modifications on their own threads.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let heap = LIVE.load(Ordering::Relaxed) - heap0;
    let (rss, shared) = resident();
    let q = 2 * n as i64;
    let out = (heap / q, (rss - rss0) / q, (shared - shared0) / q);
    drop(qps);
    out
}

#[test]
fn an_idle_qp_costs_little_engine_state_and_its_rings_nothing_resident() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = 512;
    let one_sge = |depth| QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    for (name, caps) in [
        ("depth 128, 1 SGE (perftest)", one_sge(128)),
        (
            "depth 128, default caps (8 SGEs, 256 inline)",
            QpCaps {
                max_send_wr: 128,
                max_recv_wr: 128,
                ..QpCaps::default()
            },
        ),
        ("depth 1024, 1 SGE", one_sge(1024)),
    ] {
        let (heap, rss, shared) = per_qp(n, caps);
        println!(
            "idle RC QP, {name}: heap {heap} bytes, resident {rss} bytes (shared {shared}) per QP over {} QPs",
            2 * n
        );
        // The bound: at most 16 KiB of engine state per idle QP.
        assert!(heap <= 16 << 10, "{name}: {heap} heap bytes per idle QP");
        // Rings laid out in fresh (zero) memory and never used touch no
        // slot: of the QP's segment, two pages are resident (the shared
        // words with the send ring's header, the receive ring's header);
        // the private growth is the heap's and the allocator's rounding.
        assert!(
            shared <= 2 * 4096,
            "{name}: {shared} shared bytes per idle QP"
        );
        assert!(
            rss - shared <= heap + 4096,
            "{name}: {rss} resident bytes per idle QP with {heap} on the heap"
        );
    }
}

/// QPs that filled their send queue once keep its room while busy and give
/// it back once idle (the engine trims queues empty for a second).
#[test]
fn a_qp_idle_after_work_gives_its_queues_memory_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 160, 3)), Mtu::Mtu4096).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 160, 4)), Mtu::Mtu4096).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let n = 64usize;
    let depth = 128u32;
    let (cqa, cqb) = (a.create_cq(2 * n), b.create_cq(2 * n));
    let mut src = vec![5u8; 4096];
    let mut dst = vec![0u8; 4096];
    // SAFETY: both buffers outlive the engines (dropped first below).
    let (ks, kd) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), 4096, Access(1)).unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), 4096, Access(1 | 2)).unwrap(),
        )
    };
    let mut p = RcParams::new(Psn::new(1), Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: false,
        remote_atomic: false,
    };
    let caps = QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let pair = || connected_pair((&a, pa, cqa), (&b, pb, cqb), caps, &p);
    // A full queue of 64-byte WRITEs on each QP, the last one signaled.
    let fill = |qps: &[(QueuePair, QueuePair)]| {
        for (qa, _) in qps {
            for k in 0..depth {
                let mut wr = SendWr::new(
                    u64::from(k),
                    SendOp::Write {
                        remote_addr: kd.addr,
                        rkey: kd.rkey,
                    },
                    [Sge {
                        addr: ks.addr,
                        length: 64,
                        lkey: ks.lkey,
                    }],
                );
                wr.signaled = k == depth - 1;
                qa.post_send(&wr).unwrap();
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut done = 0;
        while done < qps.len() && std::time::Instant::now() < deadline {
            if let Some(wc) = a.poll_cq(cqa) {
                assert_eq!(wc.status, WcStatus::Success);
                done += 1;
            }
        }
        assert_eq!(done, qps.len(), "every queue completed");
    };
    // Warm the engines' own buffers and pools with one pair first.
    let warm = [pair()];
    fill(&warm);
    let heap0 = LIVE.load(Ordering::Relaxed);
    let qps: Vec<_> = (0..n).map(|_| pair()).collect();
    fill(&qps);
    let per = |h: i64| (h - heap0) / (2 * n as i64);
    let busy = per(LIVE.load(Ordering::Relaxed));
    // Idle past the trim delay (1 s); the engines' threads trim on their own.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let idle = per(LIVE.load(Ordering::Relaxed));
    println!(
        "RC QP of depth {depth} after a full send queue: heap {busy} bytes per QP just after, {idle} idle a second later"
    );
    assert!(idle <= 16 << 10, "{idle} heap bytes per idle QP after work");
    assert!(idle < busy, "trimming gave nothing back ({busy} -> {idle})");
    // A full receive queue posted on every QP, as a server keeps its
    // idle connections: held compactly (32 bytes per one-SGE receive).
    for (qa, qb) in &qps {
        for (q, k) in [(qa, ks), (qb, kd)] {
            for id in 0..u64::from(depth) {
                let sge = Sge {
                    addr: k.addr,
                    length: 64,
                    lkey: k.lkey,
                };
                q.post_recv(&burst_verbs::RecvWr {
                    wr_id: id,
                    sg_list: [sge].into(),
                })
                .unwrap();
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let posted = per(LIVE.load(Ordering::Relaxed));
    println!("the same QPs idle with {depth} receives posted each: heap {posted} bytes per QP");
    assert!(
        posted <= 16 << 10,
        "{posted} heap bytes per idle QP with its receives"
    );
    drop((qps, warm, ea, eb));
    assert_eq!(&dst[..4], &[5u8; 4]);
}
