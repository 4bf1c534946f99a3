//! Heap allocations per posted work request on the send path, counted by a
//! global allocator: posting (the application thread), the engine taking it
//! from the ring into the transport, the packets, the ACK and the
//! completion. The figure is printed (`cargo test -p burst-verbs --test
//! allocs -- --nocapture`): 0 once the queues reached their working size
//! (SGEs held inline in the WR, a bounded doorbell queue).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use burst_verbs::engine::Engine;
use burst_verbs::{
    Access, Mtu, Psn, QpAccess, QpCaps, QpInit, QpType, RcParams, RcPeer, SendOp, SendWr, Sge,
    WcStatus,
};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn allocations_per_posted_write() {
    let ea = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 89, 1)), Mtu::Mtu4096).unwrap();
    let eb = Engine::start(IpAddr::V4(Ipv4Addr::new(127, 0, 89, 2)), Mtu::Mtu4096).unwrap();
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(256), b.create_cq(256));
    let mut init = QpInit::new(QpType::Rc, pa);
    init.caps = QpCaps {
        max_send_wr: 128,
        ..QpCaps::default()
    };
    let qa = a.create_qp_with(&init, cqa, cqa).unwrap();
    let qb = b
        .create_qp_with(&QpInit::new(QpType::Rc, pb), cqb, cqb)
        .unwrap();
    let mut p = RcParams::new(Psn::new(1), Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    let peer = |gid, qpn| RcPeer {
        gid,
        qpn,
        psn: Psn::new(1),
    };
    qa.connect_rc(&peer(b.gid(), qb.qpn()), &p).unwrap();
    qb.connect_rc(&peer(a.gid(), qa.qpn()), &p).unwrap();
    let mut src = vec![3u8; 4096];
    let mut dst = vec![0u8; 4096];
    // SAFETY: both buffers outlive the engines (dropped first below).
    let (ks, kd) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), 4096, Access(1)).unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), 4096, Access(1 | 2)).unwrap(),
        )
    };
    let sge = [Sge {
        addr: ks.addr,
        length: 4096,
        lkey: ks.lkey,
    }];
    // Every eighth WRITE is a 64-byte inline one (its bytes captured into
    // the work request at post time, no buffer allocated).
    let desc = |id: u64| {
        let mut wr = SendWr::new(
            id,
            SendOp::Write {
                remote_addr: kd.addr,
                rkey: kd.rkey,
            },
            sge,
        );
        if id % 8 == 0 {
            wr.sg_list = [Sge {
                length: 64,
                ..sge[0]
            }]
            .into();
            wr.inline = true;
        }
        wr
    };
    let run = |n: u64, base: u64| {
        let start = ALLOCS.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut done = 0;
        for i in 0..n {
            // At most 64 outstanding: within the QP's send queue depth
            // (the ring admits more than the transport holds: issue 16).
            while i - done >= 64 {
                if let Some(wc) = a.poll_cq(cqa) {
                    assert_eq!(wc.status, WcStatus::Success);
                    done += 1;
                }
            }
            qa.post_send(&desc(base + i)).unwrap();
        }
        while done < n && Instant::now() < deadline {
            if let Some(wc) = a.poll_cq(cqa) {
                assert_eq!(wc.status, WcStatus::Success);
                done += 1;
            }
        }
        assert_eq!(done, n, "every WRITE completed");
        ALLOCS.load(Ordering::Relaxed) - start
    };
    // Warm-up: queues and buffers reach their working size.
    run(2000, 0);
    let n = 5000;
    let allocs = run(n, 1_000_000);
    let per_wr = allocs as f64 / n as f64;
    println!(
        "allocations per posted 4 KiB WRITE (post to completion, both engines): {per_wr:.3} ({allocs} in {n})"
    );
    // Was 1.03 (a Vec of SGEs per WR, a doorbell block per 31 pushes). At
    // most one per 100 WRs allows a bounded cache's rare growth, not one
    // per WR: on a loaded machine, GSO runs split differently and the
    // ICRC checker builds its IP-ID basis for a packet length it had not
    // seen (traced: `icrc::IdBasis::new`, 9 in 5000 once).
    assert!(allocs <= n / 100, "{allocs} allocations for {n} WRs");
    drop((qa, qb, ea, eb));
    assert_eq!(&dst[..16], &[3u8; 16]);
}
